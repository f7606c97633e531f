"""vLLM's own parser and weight loaders accept accel's exports (tiny models, every scheme accel writes), and refuse
what they must: int4f's float zero points and a fused module split across schemes. Runs in the side venv that
scripts/peers/setup_vllm_check.sh builds; skipped without it."""

from __future__ import annotations

import json

import pytest
import torch

from accel.export.compatibility import loader_support, run_vllm_check, vllm_python

pytestmark = pytest.mark.skipif(not vllm_python().is_file(),
                                reason=f"no vLLM side venv at {vllm_python()} (bash scripts/peers/setup_vllm_check.sh)")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from accel.export.checkpoint import write_export
    from accel.quant.allocate import Plan
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from accel.quant.schemes import expand_units, quant_units, quantizable_linears
    from tests.conftest import save_tiny_model

    root = tmp_path_factory.mktemp("vllm-check")
    src = save_tiny_model(root / "base", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                          num_key_value_heads=2, tie_word_embeddings=True)  # shapes vLLM's kernels take
    cal = [torch.randint(3, 300, (2, 32), generator=torch.Generator().manual_seed(0))]
    plans = {
        "int4": lambda i, u: "int4", "int8": lambda i, u: "int8",
        "mixed": lambda i, u: ("int4", "int8", "fp16")[i % 3],  # per fused unit, as the allocator plans
        "int4f": lambda i, u: "int4f",
    }
    out = {}
    for name, pick in plans.items():
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        units = quant_units(quantizable_linears(model))
        schemes = expand_units({u: pick(i, u) for i, u in enumerate(units)}, units)
        plan = Plan(schemes=schemes, group_size=64, avg_bits=0, estimated_kl=0,
                    lm_head="fp16" if name == "int4f" else "int8", units=units)
        ck = save_checkpoint(oneshot_quantize(model, plan, cal, "rtn").model, plan, root / f"{name}-ck")
        pairing = {"method": "ngram", "num_speculative_tokens": 3, "ngram": {"min_n": 2, "max_n": 4}}
        out[name] = write_export(root / name, ck, draft_pairing=pairing if name == "mixed" else None)
    # a plan that ignores fusion: layer 0's q_proj INT4 while k/v are INT8
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    schemes = {n: ("int4" if n.endswith("q_proj") else "int8") for n in quantizable_linears(model)}
    plan = Plan(schemes=schemes, group_size=64, avg_bits=0, estimated_kl=0, lm_head="int8")
    ck = save_checkpoint(oneshot_quantize(model, plan, cal, "rtn").model, plan, root / "split-ck")
    out["split"] = write_export(root / "split", ck)
    return out


@pytest.mark.parametrize("name", ["int4", "int8", "mixed"])
def test_vllm_loads_every_scheme_accel_writes_with_identical_values(exports, name):
    rep = run_vllm_check(exports[name])
    assert rep["ok"], rep
    load = rep["load"]
    assert load["ints_equal"] and load["max_abs_diff"] == 0.0 and not load["params_not_loaded"]
    assert load["quantized_modules"] >= 7  # the decoder Linears (fused) and the lm_head
    assert loader_support(json.loads((exports[name] / "config.json").read_text()))["vllm"].loads


def test_vllm_refuses_float_zero_points(exports):
    """int4f's block [1, g] form passes vLLM's config parser; its scheme selection then finds no kernel."""
    rep = run_vllm_check(exports["int4f"])
    assert not rep["ok"] and rep["config"]["ok"]
    err = rep["load"]["error"]
    assert err["type"] == "NotImplementedError" and "zp_dtype=torch.float16" in err["message"]
    assert not loader_support(json.loads((exports["int4f"] / "config.json").read_text()))["vllm"].loads


def test_vllm_check_names_a_fused_module_split_across_schemes(exports):
    from accel.export.checkpoint import verify_export

    rep = run_vllm_check(exports["split"])
    assert not rep["ok"] and "model.layers.0.self_attn.qkv_proj" in rep["fused_mismatches"]
    res = verify_export(exports["split"], load=False, target="vllm")
    assert not res.ok and any("qkv_proj" in p for p in res.problems)
    res = verify_export(exports["mixed"], load=False, target="vllm")
    assert res.ok  # with the export's n-gram pairing as vLLM's own SpeculativeConfig
    assert res.details["vllm_check"]["config"]["speculative_config"] == {"method": "ngram",
                                                                         "num_speculative_tokens": 3}
