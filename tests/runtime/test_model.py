"""Our model + paged attention vs transformers (the oracle), fp32, tiny random models."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.helpers import hf_greedy, mixed_prompts, tiny_config

from accel.runtime.engine import Engine, EngineConfig
from accel.runtime.models import load_model
from accel.runtime.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def chunk_logits(engine: Engine) -> dict[str, list[torch.Tensor]]:
    """Run an engine to completion, recording the logits of EVERY computed row, per request and step."""
    rows: dict[str, list[torch.Tensor]] = {}
    runner = engine.runner

    while engine.has_unfinished():
        sched = engine.scheduler.schedule()
        with torch.inference_mode():
            ids, pos, meta, _ = runner.prepare_inputs(sched.scheduled)
            hidden = runner.model(ids, pos, meta, runner.kv_caches)
            all_logits = runner.model.compute_logits(hidden)
        # then the real step: it recomputes the same rows and rewrites the same K/V (idempotent)
        start = 0
        for r in sched.scheduled:
            rows.setdefault(r.seq.request_id, []).append(all_logits[start:start + r.num_tokens])
            start += r.num_tokens
        out = runner.execute(sched)
        engine.scheduler.update_from_output(sched, out)
    return {k: torch.cat(v) for k, v in rows.items()}


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("budget", [1024, 16])
def test_logits_allclose_mixed_batch(tiny_llama_dir, budget):
    path, hf = tiny_llama_dir
    prompts = mixed_prompts(6, seed=1, lo=1, hi=40)
    engine = Engine.from_pretrained(path, num_kv_blocks=128, block_size=4, max_num_batched_tokens=budget)
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), request_id=str(i))
    got = chunk_logits(engine)
    for i, p in enumerate(prompts):
        seq_rows = got[str(i)]  # logits of prompt rows + the rows of the first 2 generated tokens
        # rebuild the full token sequence from the engine's greedy choices
        full = p + seq_rows[len(p) - 1:].argmax(-1).tolist()[:2]
        ref = hf_logits(hf, full)
        torch.testing.assert_close(seq_rows, ref[:seq_rows.shape[0]], atol=1e-4, rtol=1e-4)


def _greedy_refs(hf, prompts, n=8):
    return [hf_greedy(hf, p, n) for p in prompts]


@pytest.fixture(scope="module")
def prompts_and_refs(tiny_llama_dir):
    _, hf = tiny_llama_dir
    prompts = mixed_prompts(16, seed=2, lo=1, hi=70)
    return prompts, _greedy_refs(hf, prompts)


def _greedy_identical(tiny_llama_dir, prompts_and_refs, **engine_args) -> Engine:
    """An engine built with `engine_args` whose greedy replies to the shared prompts were checked equal to
    transformers'; returned for the test's own checks."""
    path, _ = tiny_llama_dir
    prompts, refs = prompts_and_refs
    engine = Engine.from_pretrained(path, **engine_args)
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == refs
    return engine


def test_greedy_identical_one_batch(tiny_llama_dir, prompts_and_refs):
    engine = _greedy_identical(tiny_llama_dir, prompts_and_refs, num_kv_blocks=512, block_size=4,
                               max_num_batched_tokens=4096, num_scheduler_steps=1)
    assert engine.stats().num_steps == 8  # everything ran together: one prefill step + 7 decode steps


def test_greedy_identical_chunked_prefill(tiny_llama_dir, prompts_and_refs):
    engine = _greedy_identical(tiny_llama_dir, prompts_and_refs, num_kv_blocks=512, block_size=4,
                               max_num_batched_tokens=24, long_prefill_token_threshold=None)
    assert engine.kv.num_held_blocks() == 0


def test_greedy_identical_with_prefix_cache_hits(tiny_llama_dir):
    path, hf = tiny_llama_dir
    shared = mixed_prompts(1, seed=3, lo=23, hi=23)[0]
    prompts = [shared + tail for tail in mixed_prompts(16, seed=4, lo=1, hi=20)]
    refs = _greedy_refs(hf, prompts)
    engine = Engine.from_pretrained(path, num_kv_blocks=512, block_size=4, max_num_batched_tokens=64)
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == refs
    assert engine.stats().prefix_cache_hit_rate > 0.3
    # blocks are cached once computed: the requests admitted in the first step miss, all later ones hit the
    # 5 shared full blocks (20 tokens)
    assert outs[0].num_cached_tokens == 0 and all(o.num_cached_tokens >= 20 for o in outs[4:])
    # and again: everything is cached now (including generated tokens of the first round)
    outs2 = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs2] == refs


def test_greedy_identical_with_preemption(tiny_llama_dir, prompts_and_refs):
    engine = _greedy_identical(tiny_llama_dir, prompts_and_refs, num_kv_blocks=40, block_size=4,
                               max_num_batched_tokens=64)
    assert engine.stats().num_preemptions > 0
    assert engine.kv.num_held_blocks() == 0


def test_greedy_identical_preemption_without_prefix_cache(tiny_llama_dir, prompts_and_refs):
    engine = _greedy_identical(tiny_llama_dir, prompts_and_refs, num_kv_blocks=40, block_size=8,
                               max_num_batched_tokens=32, enable_prefix_caching=False)
    assert engine.stats().num_preemptions > 0


def test_int8_kv_cache_is_close(tiny_llama_dir, prompts_and_refs):
    path, _ = tiny_llama_dir
    prompts, refs = prompts_and_refs
    engine = Engine.from_pretrained(path, num_kv_blocks=512, block_size=4, kv_cache_dtype="int8")
    outs = engine.generate(prompts, GREEDY)
    agree = sum(a == b for o, r in zip(outs, refs) for a, b in zip(o.token_ids, r))
    assert agree >= 0.8 * 16 * 8


def test_unfused_projections_give_the_same_tokens(tiny_llama_dir, prompts_and_refs):
    engine = _greedy_identical(tiny_llama_dir, prompts_and_refs, num_kv_blocks=512, block_size=4,
                               fuse_projections=False)
    assert hasattr(engine.model.model.layers[0].self_attn, "q_proj")


def test_fusion_skips_swapped_linears(tiny_llama_dir):
    from accel.runtime.models import fuse_projections

    class Custom(torch.nn.Linear):
        pass

    model = load_model(tiny_llama_dir[0], torch.float32, torch.device("cpu"))
    attn = model.model.layers[1].self_attn
    old = attn.k_proj
    attn.k_proj = Custom(old.in_features, old.out_features, bias=False)
    fused = fuse_projections(model)
    assert "model.layers.1.self_attn.qkv_proj" not in fused and hasattr(attn, "q_proj")
    assert fused == ["model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj",
                     "model.layers.1.mlp.gate_up_proj"]


def test_seeded_sampling_independent_of_batch_and_logprobs(tiny_llama_dir):
    path, _ = tiny_llama_dir
    engine = Engine.from_pretrained(path, num_kv_blocks=512, block_size=4)
    prompt = mixed_prompts(1, seed=7, lo=10, hi=10)[0]
    sp = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True, logprobs=2)
    (alone,) = engine.generate([prompt], sp)
    others = [SamplingParams(max_tokens=5, temperature=1.0, seed=i, ignore_eos=True) for i in range(5)]
    outs = engine.generate(mixed_prompts(5, seed=8) + [prompt], others + [sp])
    assert outs[-1].token_ids == alone.token_ids
    assert len(alone.logprobs) == 12 and all(lp <= 0 for lp in alone.logprobs)
    assert len(alone.top_logprobs) == 12 and all(len(t) == 2 for t in alone.top_logprobs)
    (other_seed,) = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=1.0, seed=99,
                                                             ignore_eos=True))
    assert other_seed.token_ids != alone.token_ids


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
def test_swap_preemption_resumes_without_recompute(tiny_llama_dir, prompts_and_refs, kv_dtype):
    path, _ = tiny_llama_dir
    prompts, refs = prompts_and_refs
    engine = Engine.from_pretrained(path, num_kv_blocks=40, block_size=4, max_num_batched_tokens=64,
                                    preemption_mode="swap", enable_prefix_caching=False, kv_cache_dtype=kv_dtype)
    recomputed = []
    orig = engine.runner.execute

    def execute(sched):  # a resumed request continues where it stopped: never schedules from token 0 again
        recomputed.extend(r.seq.request_id for r in sched.scheduled
                          if r.seq.num_computed_tokens == 0 and r.seq.num_preemptions > 0)
        return orig(sched)

    engine.runner.execute = execute
    outs = engine.generate(prompts, GREEDY)
    assert engine.stats().num_preemptions > 0 and recomputed == []
    if kv_dtype == "auto":
        assert [o.token_ids for o in outs] == refs
    else:  # int8 KV: near the fp32 oracle (a lost scale would give ~0%; exact round trip: test_attention)
        agree = sum(a == b for o, r in zip(outs, refs) for a, b in zip(o.token_ids, r))
        assert agree >= 0.7 * 16 * 8
    assert engine.kv.num_held_blocks() == 0 and engine.runner.host.kv == {}
