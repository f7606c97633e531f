"""Decode steps in one native call produce exactly what the module-by-module path produces."""

from __future__ import annotations

import pytest
import torch

from accel.kernels import cpu
from accel.quant.schemes import uniform_plan
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from accel.speculative.config import SpeculativeConfig
from tests.runtime.helpers import mixed_prompts

pytestmark = pytest.mark.skipif(not cpu.available(), reason="accel's CPU kernels are not built here")


def _run(engine: Engine, prompts, params) -> list[list[int]]:
    return [o.token_ids for o in engine.generate(prompts, params)]


def _weights(scheme: str | None) -> dict:
    """Engine kwargs of a test's weights: fp32, fp16 panels (`weight_dtype`), or a scheme quantized on load."""
    if scheme == "fp16-panels":
        if not cpu.has_avx512():
            pytest.skip("fp16 weight panels need AVX-512")
        return {"weight_dtype": "float16"}
    return {"quant_plan": uniform_plan(2, scheme), "quant_group_size": 32} if scheme else {}


@pytest.mark.parametrize("scheme", [None, "fp16-panels", "int8", "int8g", "w8a8", "int4", "w4a8", "int4f"])
def test_native_decode_is_identical_to_the_modules(tiny_llama_dir, scheme):
    path, _ = tiny_llama_dir
    kw = _weights(scheme)
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


@pytest.mark.parametrize("scheme", [None, "fp16-panels", "int8", "int8g", "w8a8", "int4", "w4a8", "int4f"])
@pytest.mark.parametrize("inputs", ["lists", "tensors"])
def test_the_native_step_computes_the_lm_heads_logits_as_the_module_does(tiny_llama_dir, scheme, inputs):
    """The lm_head inside the native step: the same logits, to the bit, as the lm_head module on the step's
    hidden states, for any subset and order of rows (a verify span's rows, then sampling rows). The runner calls it
    with lists (`NativeDecode.step`), or with tensors where a hidden hook reads the step's hidden states."""
    path, _ = tiny_llama_dir
    kw = _weights(scheme)
    engine = Engine.from_pretrained(path, num_kv_blocks=128, block_size=8, enable_prefix_caching=False,
                                    num_scheduler_steps=1, **kw)
    native, runner = engine.model.native_decode, engine.runner
    assert native is not None and native.has_head
    seen = []

    def compare(run, n):
        rows = list(range(n))[::-1] + [0]  # reversed, and a row twice
        # run twice: the second run writes the same K/V into the same slots
        hidden, logits, argmax = run(rows)
        want = engine.model.compute_logits(hidden[torch.tensor(rows)])
        assert logits.shape == want.shape and torch.equal(logits, want)
        assert torch.equal(argmax, want.argmax(-1))
        seen.append(len(rows))

    if inputs == "lists":
        step = native.step

        def check_lists(kv_caches, *args):
            compare(lambda rows: step(kv_caches, *args[:-1], rows), len(args[0]))
            return step(kv_caches, *args)

        native.step = check_lists
    else:
        runner.hidden_hook = lambda scheduled, hidden: None
        forward_logits = engine.model.forward_logits

        def check(input_ids, positions, meta, kv_caches, logit_rows):
            if native.takes(meta, input_ids.shape[0]):
                compare(lambda rows: forward_logits(input_ids, positions, meta, kv_caches, rows), input_ids.shape[0])
            return forward_logits(input_ids, positions, meta, kv_caches, logit_rows)

        engine.model.forward_logits = check
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.generate(mixed_prompts(3, seed=2, lo=3, hi=12), params)
    assert seen and max(seen) > 2


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
    step = native.step
    native.step = lambda *a: calls.append(len(a[1])) or step(*a)
    assert _run(engine, prompts, greedy) == _run(plain, prompts, greedy)
    assert calls and max(calls) > 1 and engine.stats().spec_decode.num_draft_tokens > 0


@pytest.mark.parametrize("scheme", [None, "int8"])
def test_decode_steps_in_a_row_give_what_single_steps_give(tiny_llama_dir, scheme):
    """Greedy bursts of native steps (num_scheduler_steps) against one step at a time: the same tokens, finish
    reasons and stop reasons, with a stop token that lands inside a burst, max_tokens that end mid-burst, min_tokens,
    and a sampled request that keeps the batch to single steps while it runs."""
    path, _ = tiny_llama_dir
    kw = {"quant_plan": uniform_plan(2, scheme), "quant_group_size": 32} if scheme else {}
    prompts = mixed_prompts(4, seed=7, lo=3, hi=25)
    engines = {k: Engine.from_pretrained(path, num_kv_blocks=128, block_size=8, enable_prefix_caching=False,
                                         num_scheduler_steps=k, **kw) for k in (1, 5)}
    first = engines[1].generate(prompts, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    stop_id = first[1].token_ids[6]  # request 1 stops at its 7th token (or earlier where it drew it before)
    params = [SamplingParams(max_tokens=30, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop_token_ids=[stop_id]),
              SamplingParams(max_tokens=13, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=17, temperature=0, min_tokens=9, stop_token_ids=[stop_id])]
    calls = {}
    for k, engine in engines.items():
        steps = engine.model.native_decode.steps
        calls[k] = []
        engine.model.native_decode.steps = lambda *a, calls=calls[k], steps=steps: calls.append(a[5]) or steps(*a)
    outs = {k: [(o.token_ids, o.finish_reason, o.stop_reason) for o in e.generate(prompts, params)]
            for k, e in engines.items()}
    assert outs[5] == outs[1]
    assert outs[1][1][1:] == ("stop", stop_id) and len(outs[1][2][0]) == 13
    assert not calls[1] and calls[5] and max(calls[5]) == 5
    assert engines[5].scheduler.num_steps < engines[1].scheduler.num_steps
    sampled = [SamplingParams(max_tokens=12, temperature=0.8, seed=1, ignore_eos=True),
               SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)]  # the sampled one runs to the end
    calls[5].clear()
    assert ([o.token_ids for o in engines[5].generate(prompts[:2], sampled)]
            == [o.token_ids for o in engines[1].generate(prompts[:2], sampled)])
    assert not calls[5]


@pytest.fixture(scope="module")
def looping_llama_dir(tmp_path_factory):
    """A tiny Llama whose attention adds nothing (o_proj = 0): each next token is a function of the last one alone,
    so greedy output soon cycles and n-gram drafts are accepted to their end, after the prompt's wrong ones."""
    from tests.runtime.helpers import make_hf_model, tiny_config

    model = make_hf_model(tiny_config())
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    path = tmp_path_factory.mktemp("looping_llama")
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("scheme", [None, "int8"])
def test_ngram_verify_steps_in_a_row_make_the_choices_of_single_steps(looping_llama_dir, scheme):
    """n-gram speculation at batch 1 in bursts of verify steps (`spec_steps`) against one step at a time: the same
    tokens and finish reasons, and step for step the same drafts, acceptances and guesses (the native loop's draft
    length mirrors `AdaptiveSpeculation`), with a stop token and max_tokens that end a burst. The cost meter is
    off, so both paths weigh drafts at the same cost, and so is the drafting gate."""
    kw = {"quant_plan": uniform_plan(2, scheme), "quant_group_size": 32} if scheme else {}
    prompts = [p * 3 for p in mixed_prompts(4, seed=5, lo=2, hi=10)]  # repeats: wrong drafts before the cycle
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=6)
    engines = {k: Engine.from_pretrained(looping_llama_dir, num_kv_blocks=128, block_size=8,
                                         enable_prefix_caching=False, speculative=spec, num_scheduler_steps=k, **kw)
               for k in (1, 8)}
    steps: dict[int, list] = {}
    for k, engine in engines.items():
        sd = engine.spec
        sd.cost = sd.gate = None  # measured on the clock: neither may tell the two paths apart
        log = steps[k] = []

        def observe(sched, out, seconds, sd=sd, log=log, observe=sd.observe):
            for r, sampled in zip(sched.scheduled, out.sampled_token_ids):
                if sampled and r.seq.request_id in sd._drafted:
                    log.append((len(r.spec_token_ids), len(sampled) - 1, r.seq.request_id in sd._guessed))
            observe(sched, out, seconds)

        def observe_burst(seq, records, log=log, observe_burst=sd.observe_burst):
            log.extend((int(d), int(a), bool(g)) for _, d, a, g, _, _ in records)
            observe_burst(seq, records)

        sd.observe, sd.observe_burst = observe, observe_burst
    # the same history for both: the adaptive prior of new requests is the engine's measured acceptance
    first = [e.generate(prompts[1], SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
             for e in engines.values()][0]
    params = [SamplingParams(max_tokens=60, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=60, temperature=0, ignore_eos=True, stop_token_ids=[first[0].token_ids[37]]),
              SamplingParams(max_tokens=43, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=51, temperature=0, ignore_eos=True)]
    steps[1].clear()
    steps[8].clear()
    outs = {k: [(o.token_ids, o.finish_reason) for p, sp in zip(prompts, params) for o in e.generate(p, sp)]
            for k, e in engines.items()}
    assert outs[8] == outs[1]
    assert outs[1][1][1] == "stop" and len(outs[1][2][0]) == 43
    assert steps[8] == steps[1]
    assert any(a == d >= 4 and not g for d, a, g in steps[1])  # whole drafts, and doubled after them
    assert any(a < d for d, a, _ in steps[1]) and any(g for _, _, g in steps[1])  # rejections, guesses
    assert engines[8].scheduler.num_steps < engines[1].scheduler.num_steps / 2


def test_a_speculating_engine_bursts_plain_steps_where_no_request_may_draft(tiny_llama_dir):
    """At or above `disable_above_batch_size` running requests nothing drafts, and the engine bursts decode steps
    as one without speculation does: the same tokens, in fewer steps."""
    path, _ = tiny_llama_dir
    prompts = [p * 3 for p in mixed_prompts(3, seed=5, lo=2, hi=10)]
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    spec = SpeculativeConfig(method="ngram", disable_above_batch_size=2)
    plain = Engine.from_pretrained(path, num_kv_blocks=128, block_size=8, num_scheduler_steps=1)
    engine = Engine.from_pretrained(path, num_kv_blocks=128, block_size=8, speculative=spec, num_scheduler_steps=6)
    calls = []
    steps = engine.model.native_decode.steps
    engine.model.native_decode.steps = lambda *a: calls.append(a[5]) or steps(*a)
    assert _run(engine, prompts, greedy) == _run(plain, prompts, greedy)
    assert calls and max(calls) == 6 and engine.scheduler.num_steps < plain.scheduler.num_steps / 2


def test_bursts_fill_the_feature_cache_as_single_steps_do(tiny_llama_dir):
    """An EAGLE draft reads the target's final hidden state of every verified position from the runner's feature
    cache; bursts of decode steps write it by slot, to the bit what steps one at a time write."""
    path, _ = tiny_llama_dir
    greedy = SamplingParams(max_tokens=21, temperature=0, ignore_eos=True)
    engines = {k: Engine.from_pretrained(path, num_kv_blocks=64, block_size=8, enable_prefix_caching=False,
                                         num_scheduler_steps=k) for k in (1, 6)}
    calls = []
    steps = engines[6].model.native_decode.steps
    engines[6].model.native_decode.steps = lambda *a: calls.append(a[5]) or steps(*a)
    outs = {}
    for k, engine in engines.items():
        engine.runner.enable_feature_cache()
        outs[k] = [_run(engine, p, greedy) for p in mixed_prompts(2, seed=3, lo=3, hi=12)]
    assert outs[6] == outs[1] and calls and max(calls) == 6
    f1, f6 = engines[1].runner.feature_cache, engines[6].runner.feature_cache
    assert f1.abs().sum() > 0 and torch.equal(f6, f1)


def test_a_burst_never_runs_past_a_requests_own_blocks(tiny_llama_dir):
    from accel.runtime.outputs import ScheduledRequest, SchedulerOutput

    path, _ = tiny_llama_dir
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    single = Engine.from_pretrained(path, num_kv_blocks=64, block_size=8, num_scheduler_steps=1)
    ref = single.generate([5, 6, 7], greedy)
    engine = Engine.from_pretrained(path, num_kv_blocks=64, block_size=8, enable_prefix_caching=False)
    rid = engine.add_request([5, 6, 7], greedy)
    engine.step()  # the prompt: positions 0-2 of the request's one block, and its first token
    seq = engine.scheduler.requests[rid]
    assert len(seq.block_tables[0]) == 1 and seq.num_computed_tokens == 3
    out = engine.runner.execute(SchedulerOutput([ScheduledRequest(seq, 1)], 1, num_steps=30))
    assert out.sampled_token_ids[0] == ref[0].token_ids[1:6]  # positions 3-7: the block's end


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


TEAM_SCRIPT = """
import json, sys, threading
from accel.quant.schemes import uniform_plan
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from tests.runtime.helpers import mixed_prompts
path, scheme = sys.argv[1], sys.argv[2]
kw = {"quant_plan": uniform_plan(2, scheme), "quant_group_size": 32} if scheme != "fp32" else {}
outs = {}
def serve():
    engine = Engine.from_pretrained(path, num_kv_blocks=64, block_size=8, enable_prefix_caching=False, **kw)
    native = engine.model.native_decode
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    for mode in ("native", "modules"):
        engine.model.native_decode = native if mode == "native" else None
        outs[mode] = [o.token_ids for o in engine.generate(mixed_prompts(3, seed=3, lo=3, hi=20), params)]
    outs["native_on"] = native is not None
t = threading.Thread(target=serve)
t.start()
t.join()
print(json.dumps(outs))
"""


@pytest.mark.parametrize("scheme", ["fp32", "int8", "int4"])
def test_a_thread_team_on_the_engine_thread_matches_the_modules(tmp_path, scheme):
    """An engine built and stepped on a thread other than the main one (a server run in a thread), torch's thread
    count never set, and Linears large enough that each thread of the team takes several chunks of each. (A pool thread then
    reads a different thread count from torch than the engine thread; planning chunks with it crashed the step.)
    A fresh process, since this process has set torch's thread count."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.runtime.helpers import make_hf_model, tiny_config

    make_hf_model(tiny_config(hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                              num_key_value_heads=2, initializer_range=0.05)).save_pretrained(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", TEAM_SCRIPT, str(tmp_path), scheme], capture_output=True, text=True,
                         cwd=root, env={**env, "PYTHONPATH": str(root)}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    outs = json.loads(run.stdout.strip().splitlines()[-1])
    assert outs["native_on"] and outs["native"] == outs["modules"] and len(outs["native"]) == 3


@pytest.mark.parametrize("kind", ["gemma3", "qwen3", "mistral_window"])
@pytest.mark.parametrize("scheme", [None, "int8", "int4"])
def test_the_native_step_runs_each_familys_layer_as_the_modules_do(tmp_path, kind, scheme):
    """q/k norms, Gemma's four norms, GeGLU, the scaled embedding, sliding windows and a second RoPE table inside
    the native step: the same tokens as the module path, past the window."""
    import transformers

    from tests.runtime.test_families import family_config

    config = family_config(kind)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(tmp_path)
    kw = {"quant_plan": uniform_plan(config.num_hidden_layers, scheme), "quant_group_size": 32} if scheme else {}
    engine = Engine.from_pretrained(tmp_path, num_kv_blocks=128, block_size=4, enable_prefix_caching=False, **kw)
    native = engine.model.native_decode
    assert native is not None
    prompts = mixed_prompts(4, seed=12, lo=3, hi=20)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outs = {}
    for mode in ("native", "modules"):
        engine.model.native_decode = native if mode == "native" else None
        outs[mode] = _run(engine, prompts, greedy)
    assert outs["native"] == outs["modules"]
