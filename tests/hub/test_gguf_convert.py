"""The streaming GGUF conversion (`accel.hub.gguf_convert`) on tiny synthetic GGUFs written here with the `gguf`
package as llama.cpp's convert_hf_to_gguf.py writes them (Qwen2 with q/k/v biases; Llama with q/k permuted for
llama.cpp's RoPE; Q8_0 and F32 tensors; a byte-level BPE vocabulary with merges and a chat template): the folder
it writes is the model transformers builds from the same GGUF in memory, tensor for tensor, with the same
tokenizer and the file's chat template."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel.hub.gguf_convert import convert
from tests.conftest import make_tiny_tokenizer
from tests.hub.gguf_writing import add_tensor, decoder_writer, finish

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (q/k rows reordered for llama.cpp's interleaved RoPE)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch: str, model, tok) -> None:
    c = model.config
    w = decoder_writer(path, arch, c, 1e6)
    vocab = tok.backend_tokenizer.get_vocab()
    pieces = [p for p, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(tok.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list(pieces)
    w.add_token_types([3 if p in special else 1 for p in pieces])
    import json

    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tok.convert_tokens_to_ids("<|im_start|>"))
    w.add_eos_token_id(tok.convert_tokens_to_ids("<|im_end|>"))
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    for name, t in model.state_dict().items():
        a = t.float().numpy()
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            _, _, i, *mod, suffix = name.split(".")
            g = f"blk.{i}.{_NAMES['.'.join(mod)]}.{suffix}"
            if arch == "llama" and g.endswith(("attn_q.weight", "attn_k.weight")):
                a = _permute(a, c.num_attention_heads if "attn_q" in g else c.num_key_value_heads)
        add_tensor(w, g, a, a.ndim == 2 and a.shape[1] % 32 == 0 and g != "output.weight")
    finish(w)


def tiny(arch: str, vocab_size: int):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
              tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
              initializer_range=0.2)
    config = Qwen2Config(**kw) if arch == "qwen2" else LlamaConfig(**kw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_streamed_folder_is_transformers_model_of_the_gguf(tmp_path, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = make_tiny_tokenizer()
    gguf_path = tmp_path / "tiny.gguf"
    write_gguf(gguf_path, arch, tiny(arch, len(tok)), tok)
    out = tmp_path / "out"
    out.mkdir()
    convert(gguf_path, out, "tiny")
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_path.name, dtype=torch.float32)
    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    theirs_state, ours_state = direct.state_dict(), ours.state_dict()
    assert theirs_state.keys() == ours_state.keys()
    for k in theirs_state:
        assert torch.equal(theirs_state[k], ours_state[k]), k
    assert ours.config.architectures == [type(direct).__name__] and ours.config.dtype == torch.float32
    text = "def add(a, b):\n    return a + b  # The quick brown fox"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == \
        AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf_path.name)(text).input_ids
    assert AutoTokenizer.from_pretrained(out).chat_template == TEMPLATE


def test_conversion_holds_one_tensor_not_the_model(tmp_path, monkeypatch):
    """Each tensor is written before the next is made: the writer never sees two made tensors alive at once."""
    import weakref

    import accel.hub.gguf_convert as gc_mod

    tok = make_tiny_tokenizer()
    gguf_path = tmp_path / "tiny.gguf"
    write_gguf(gguf_path, "qwen2", tiny("qwen2", len(tok)), tok)
    alive: list[weakref.ref] = []
    most = []
    real = gc_mod.dequantize

    def tracked(t):
        out = real(t)
        most.append(sum(r() is not None for r in alive))
        alive.append(weakref.ref(out))
        return out

    monkeypatch.setattr(gc_mod, "dequantize", tracked)
    (tmp_path / "out").mkdir()
    convert(gguf_path, tmp_path / "out", "tiny")
    assert len(most) > 10 and max(most) == 0
