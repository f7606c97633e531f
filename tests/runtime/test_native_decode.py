"""Decode steps in one native call produce exactly what the module-by-module path produces."""

from __future__ import annotations

import pytest

from accel.quant import cpu_kernels
from accel.quant.schemes import uniform_plan
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from accel.speculative.config import SpeculativeConfig
from tests.runtime.helpers import mixed_prompts

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="accel's CPU kernels are not built here")


def _run(engine: Engine, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in engine.generate(prompts, params)]


@pytest.mark.parametrize("scheme", [None, "int8", "int4", "int4f"])
def test_native_decode_is_identical_to_the_modules(tiny_llama_dir, scheme):
    path, _ = tiny_llama_dir
    kw = {"quant_plan": uniform_plan(2, scheme), "quant_group_size": 32} if scheme else {}
    # no prefix cache: the second run must compute what the first did (INT4 prefill and decode kernels differ in
    # their activation rounding, so a cached prompt would change the numbers)
    engine = Engine.from_pretrained(path, num_kv_blocks=128, block_size=8, enable_prefix_caching=False, **kw)
    native = engine.model.native_decode
    assert native is not None
    prompts = mixed_prompts(5, seed=11, lo=3, hi=30)
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    seeded = [SamplingParams(max_tokens=20, temperature=0.9, seed=i, ignore_eos=True) for i in range(5)]
    outs = {}
    for mode in ("native", "modules"):
        engine.model.native_decode = native if mode == "native" else None
        outs[mode] = _run(engine, prompts, greedy) + _run(engine, prompts, seeded)
    assert outs["native"] == outs["modules"]


def test_native_decode_takes_speculative_verify_spans(tiny_llama_dir):
    path, _ = tiny_llama_dir
    prompts = [p * 3 for p in mixed_prompts(4, seed=5, lo=2, hi=10)]  # repeats: n-gram lookup finds drafts
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    spec = SpeculativeConfig(method="ngram", adaptive=False, disable_above_batch_size=None, max_step_rows=None)
    plain = Engine.from_pretrained(path, num_kv_blocks=128, block_size=8)
    plain.model.native_decode = None
    engine = Engine.from_pretrained(path, num_kv_blocks=128, block_size=8, speculative=spec)
    calls = []
    native = engine.model.native_decode
    engine.model.native_decode = type("Spy", (), {"takes": lambda self, m, r: native.takes(m, r),
                                                  "__call__": lambda self, *a: calls.append(1) or native(*a)})()
    assert _run(engine, prompts, greedy) == _run(plain, prompts, greedy)
    assert calls and engine.stats().spec_decode.num_draft_tokens > 0


def test_a_model_with_an_unfused_or_unsupported_layer_keeps_the_modules(tiny_llama_dir):
    path, _ = tiny_llama_dir
    engine = Engine.from_pretrained(path, num_kv_blocks=64, block_size=8, fuse_projections=False)
    assert engine.model.native_decode is None
    engine = Engine.from_pretrained(path, num_kv_blocks=64, block_size=8, kv_cache_dtype="int8")
    assert getattr(engine.model, "native_decode", None) is None
    mixed = {**uniform_plan(2, "int8"), "model.layers.0.self_attn.k_proj": "int4"}  # splits layer 0's qkv
    engine = Engine.from_pretrained(path, num_kv_blocks=64, block_size=8, quant_plan=mixed)
    assert engine.model.native_decode is None
    assert engine.generate([5, 6, 7], SamplingParams(max_tokens=4))[0].finished
