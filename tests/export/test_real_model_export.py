"""The real model's export runs the same weights in every loader: transformers' greedy tokens equal accel's runtime
on held-out prompts, and vLLM's own loaders read identical values (when its side venv is there)."""

from __future__ import annotations

import pytest
import torch

from accel.runtime.sampling_params import SamplingParams

pytestmark = pytest.mark.integration
PROMPTS = ["The history of the Roman Empire", "def fibonacci(n):", "Photosynthesis is the process by which",
           "To make a cup of tea, first", "The capital of Australia is", "In mathematics, a prime number is"]


@pytest.fixture(scope="module")
def export(real_model_path, tmp_path_factory):
    """RTN per fused unit: attention INT8, MLP INT4 (group 64), the tied lm_head INT8 (the default recipe's mix)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.export.checkpoint import write_export
    from accel.quant.allocate import Plan
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from accel.quant.schemes import expand_units, quant_units, quantizable_linears

    root = tmp_path_factory.mktemp("real-export")
    model = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32).eval()
    units = quant_units(quantizable_linears(model))
    plan = Plan(schemes=expand_units({u: "int8" if "self_attn" in u else "int4" for u in units}, units),
                group_size=64, avg_bits=0, estimated_kl=0, lm_head="int8", units=units)
    tok = AutoTokenizer.from_pretrained(real_model_path)
    cal = [torch.tensor([tok("The quick brown fox jumps over the lazy dog. " * 8).input_ids[:64]])]
    ck = save_checkpoint(oneshot_quantize(model, plan, cal, "rtn", processor=tok).model, plan, root / "ck", tok)
    return write_export(root / "export", ck)


def test_transformers_and_accel_runtime_give_the_same_greedy_tokens(export):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.export.load import load_engine

    tok = AutoTokenizer.from_pretrained(export)
    hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    assert not hf.config.tie_word_embeddings  # the INT8 lm_head is its own tensor in the checkpoint
    engine = load_engine(export, num_kv_blocks=64, block_size=16)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for p in PROMPTS:
        ids = tok(p).input_ids
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
        assert engine.generate(ids, greedy)[0].token_ids == out[0, len(ids):].tolist(), p


def test_vllm_loads_the_real_export_with_identical_values(export):
    from accel.export.checkpoint import verify_export
    from accel.export.compatibility import vllm_python

    if not vllm_python().is_file():
        pytest.skip(f"no vLLM side venv at {vllm_python()} (bash scripts/peers/setup_vllm_check.sh)")
    res = verify_export(export, load=False, target="vllm")
    assert res.ok, res.problems
    load = res.details["vllm_check"]["load"]
    assert load["quantized_modules"] == 30 * 4 + 1 and load["ints_equal"] and load["max_abs_diff"] == 0.0
