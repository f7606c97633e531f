#!/usr/bin/env python
"""Benchmark the embedded runtime against transformers, in ONE run, same model, same prompts; prints ratios.

Workloads:
  offline   64 requests, long-tailed prompt lengths 16-1024 (about 5% long), outputs 16-256, all at once:
            (a) transformers `generate` in padded static batches, (b) transformers continuous batching,
            (c) our runtime. Output tokens/s over the whole run (prefill included). Also the KV pool usage
            under saturation (a pool too small for the whole workload).
  batch1    one request, decode tok/s: transformers `generate` vs ours fp32 vs ours all-INT8 (quant kernels).
  prefix    32 requests sharing a 512-token system prompt, all at once: mean TTFT with prefix caching on vs off.
  kvint8    quality cost of the INT8 KV cache: mean KL(fp32-KV || int8-KV) of next-token distributions over a
            text scored in chunks (so attention reads the cache), plus top-1 agreement.

Token ids are drawn at random (seeded) and eos is ignored, so every engine produces exactly the requested
number of tokens. Timings on a shared machine are noisy: compare the ratios, measured back to back.

    .venv/bin/python scripts/bench_runtime.py                  # everything, real model
    .venv/bin/python scripts/bench_runtime.py --only batch1 --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import time

import torch

from accel.quant.schemes import uniform_plan
from accel.runtime.config import RUNTIME_DEFAULTS
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams


def resolve(model: str) -> str:
    from accel.hub import resolve_model

    return str(resolve_model(model, pull_if_missing=True))


def long_tailed_workload(n: int, seed: int, max_prompt: int = 1024, max_out: int = 256,
                         vocab: int = 49152) -> list[tuple[list[int], int]]:
    """(prompt ids, output length): prompts log-uniform in 16-256 (95%) or max_prompt/2-max_prompt (5%, at least
    one), outputs log-uniform in 16-max_out."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if rng.random() < 0.05 or i == n // 2:  # at least one long prompt
            plen = rng.randint(max_prompt // 2, max_prompt)
        else:
            plen = int(math.exp(rng.uniform(math.log(16), math.log(256))))
        olen = int(math.exp(rng.uniform(math.log(16), math.log(max_out))))
        out.append(([rng.randrange(100, vocab - 100) for _ in range(plen)], olen))
    return out


class Results(dict):
    """A dict that prints every result the moment it is set (a long run shows its numbers as it goes)."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        print(f"  {key:32s} {value:.4g}" if isinstance(value, float) else f"  {key:32s} {value}", flush=True)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


# ---- peers ---------------------------------------------------------------------------------------------
def hf_padded(model, work, batch_size: int) -> tuple[float, int]:
    """transformers generate on static batches in submission order, left-padded; returns (seconds, tokens)."""
    t0, useful = time.perf_counter(), 0
    for i in range(0, len(work), batch_size):
        batch = work[i:i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, (p, _) in enumerate(batch):
            ids[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        n = max(o for _, o in batch)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0, eos_token_id=None)
        useful += sum(o for _, o in batch)  # tokens past a request's own length are waste, not throughput
    return time.perf_counter() - t0, useful


def hf_continuous(model, work) -> tuple[float, int]:
    """transformers continuous batching (the generate_batch manager) with per-request max_new_tokens."""
    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=False, max_new_tokens=max(o for _, o in work), eos_token_id=-1,
                          pad_token_id=0)
    t0, produced = time.perf_counter(), 0
    with model.continuous_batching_context_manager(generation_config=gc, block=True, timeout=5) as manager:
        for p, o in work:
            manager.add_request(p, max_new_tokens=o, eos_token_id=-1)
        done = 0
        while done < len(work):
            r = manager.get_result(timeout=1)
            if r is not None and r.is_finished():
                done += 1
                produced += len(r.generated_tokens)
            elif r is None and not manager.is_running():
                raise RuntimeError(f"transformers' continuous batching thread stopped after {done} requests")
    return time.perf_counter() - t0, produced


def ours_offline(engine: Engine, work) -> tuple[float, int, list[float]]:
    """Our runtime; returns (seconds, tokens, KV usage while requests were waiting).

    Usage is sampled right after each schedule (the blocks the step's forward runs with, as vLLM's
    kv_cache_usage gauge), not after the step's finished requests have released theirs.
    """
    usage: list[float] = []
    schedule = engine.scheduler.schedule

    def sampled_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        if engine.scheduler.waiting:
            usage.append(engine.kv.usage)
        return out

    engine.scheduler.schedule = sampled_schedule
    t0 = time.perf_counter()
    for p, o in work:
        engine.add_request(p, greedy(o))
    produced = 0
    try:
        while engine.has_unfinished():
            for out in engine.step():
                produced += len(out.new_token_ids)
    finally:
        del engine.scheduler.schedule  # back to the class method
    return time.perf_counter() - t0, produced, usage


# ---- workloads -----------------------------------------------------------------------------------------
def bench_offline(path: str, args, hf) -> dict:
    n = args.num_requests or (16 if args.quick else 64)
    work = long_tailed_workload(n, seed=0, max_prompt=256 if args.quick else 1024,
                                max_out=32 if args.quick else 256)
    res = Results()
    res["requests"], res["prompt_tokens"] = n, sum(len(p) for p, _ in work)
    res["output_tokens"] = sum(o for _, o in work)
    engine = Engine.from_pretrained(path, max_num_batched_tokens=args.max_num_batched_tokens,
                                    max_num_seqs=args.max_num_seqs)
    ours_offline(engine, work[:2])  # warm-up
    dt, toks, _ = ours_offline(engine, work)
    res["ours_tok_s"] = toks / dt
    if not args.skip_hf:
        if not args.skip_padded:
            dt, toks = hf_padded(hf, work, args.hf_batch_size)
            res["hf_padded_tok_s"] = toks / dt
        try:
            dt, toks = hf_continuous(hf, work)
            res["hf_continuous_tok_s"] = toks / dt
        except Exception as e:  # noqa: BLE001 - report and go on
            res["hf_continuous_error"] = repr(e)
        for peer in ("hf_padded", "hf_continuous"):
            if f"{peer}_tok_s" in res:
                res[f"ratio_vs_{peer}"] = res["ours_tok_s"] / res[f"{peer}_tok_s"]
    # saturation: a pool holding about a third of the workload's tokens
    need = sum(len(p) + o for p, o in work)
    small = Engine(engine.model, type(engine.config)(**{**engine.config.__dict__, "num_kv_blocks":
                                                        max(need // 3 // 16, 80)}), engine.tokenizer)
    dt, toks, usage = ours_offline(small, work)
    res["saturated_tok_s"] = toks / dt
    res["saturated_mean_kv_usage"] = statistics.mean(usage) if usage else None
    res["saturated_preemptions"] = small.stats().num_preemptions
    return res


def decode_tok_s(fn, n: int) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def bench_batch1(path: str, args, hf) -> dict:
    n = 32 if args.quick else 128
    prompt = [random.Random(1).randrange(100, 49000) for _ in range(32)]
    res = Results()
    res["new_tokens"] = n
    engine = Engine.from_pretrained(path)
    engine.generate([prompt], greedy(4))  # warm-up
    res["ours_fp32_tok_s"] = decode_tok_s(lambda: engine.generate([prompt], greedy(n)), n)
    if not args.skip_hf:
        ids = torch.tensor([prompt])

        def run_hf():
            with torch.no_grad():
                hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0, eos_token_id=None)

        res["hf_tok_s"] = decode_tok_s(run_hf, n)
        res["ratio_ours_vs_hf"] = res["ours_fp32_tok_s"] / res["hf_tok_s"]
    try:
        q = Engine.from_pretrained(path, quant_plan=uniform_plan(engine.model.num_layers, "int8"))
        q.generate([prompt], greedy(4))
        res["ours_int8_tok_s"] = decode_tok_s(lambda: q.generate([prompt], greedy(n)), n)
        res["ratio_int8_vs_fp32"] = res["ours_int8_tok_s"] / res["ours_fp32_tok_s"]
    except Exception as e:  # noqa: BLE001 - quant kernels may not be there yet
        res["int8_error"] = repr(e)
    return res


def bench_prefix(path: str, args) -> dict:
    n, sys_len = (8, 128) if args.quick else (32, 512)
    rng = random.Random(2)
    system = [rng.randrange(100, 49000) for _ in range(sys_len)]
    prompts = [system + [rng.randrange(100, 49000) for _ in range(rng.randint(16, 48))] for _ in range(n)]
    res = Results()
    res["requests"], res["shared_prefix_tokens"] = n, sys_len
    for caching in (False, True):
        engine = Engine.from_pretrained(path, enable_prefix_caching=caching,
                                        max_num_batched_tokens=args.max_num_batched_tokens)
        engine.generate([prompts[0][:8]], greedy(2))  # warm-up (cannot hit: different tokens)
        t0 = time.perf_counter()
        outs = engine.generate(prompts, greedy(16))
        key = "on" if caching else "off"
        res[f"caching_{key}_mean_ttft_s"] = statistics.mean(o.metrics.ttft for o in outs)
        res[f"caching_{key}_wall_s"] = time.perf_counter() - t0
        res[f"caching_{key}_hit_rate"] = engine.stats().prefix_cache_hit_rate
    res["ttft_ratio_off_vs_on"] = res["caching_off_mean_ttft_s"] / res["caching_on_mean_ttft_s"]
    return res


def all_row_logits(engine: Engine, tokens: list[int]) -> torch.Tensor:
    """Logits of every position of `tokens`, in chunks of the engine's token budget (later chunks read the cache)."""
    rows = []
    engine.add_request(tokens, greedy(1), request_id="score")
    runner = engine.runner
    while engine.has_unfinished():
        sched = engine.scheduler.schedule()
        with torch.inference_mode():
            ids, pos, meta, _ = runner.prepare_inputs(sched.scheduled)
            rows.append(runner.model.compute_logits(runner.model(ids, pos, meta, runner.kv_caches)))
        engine.scheduler.update_from_output(sched, runner.execute(sched))
    return torch.cat(rows)[:len(tokens)]


def bench_kvint8(path: str, args) -> dict:
    engine = Engine.from_pretrained(path, enable_prefix_caching=False, max_num_batched_tokens=16)
    text = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
            "combined movable metal type, oil-based ink and a wooden screw press. ") * 8
    tokens = engine.tokenizer.encode(text)[: (128 if args.quick else 512)]
    ref = all_row_logits(engine, tokens).log_softmax(-1)
    q = Engine(engine.model, dataclasses.replace(engine.config, kv_cache_dtype="int8"),
               engine.tokenizer)
    got = all_row_logits(q, tokens).log_softmax(-1)
    kl = (ref.exp() * (ref - got)).sum(-1)  # [T] KL(fp32 KV || int8 KV)
    res = Results()
    res["tokens"], res["chunk"] = len(tokens), 16
    res["mean_kl"], res["max_kl"] = kl[16:].mean().item(), kl.max().item()
    res["top1_agreement"] = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--only", nargs="*", default=["offline", "batch1", "prefix", "kvint8"])
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--skip-hf", action="store_true", help="ours only")
    ap.add_argument("--skip-padded", action="store_true", help="offline: skip the (slow) padded generate peer")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=RUNTIME_DEFAULTS["max_num_batched_tokens"])
    ap.add_argument("--max-num-seqs", type=int, default=RUNTIME_DEFAULTS["max_num_seqs"])
    ap.add_argument("--num-requests", type=int, default=None, help="offline workload size (default 64, quick 16)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve(args.model)
    hf = None
    if not args.skip_hf and {"offline", "batch1"} & set(args.only):
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    from accel.bench.ledger import Entry, flat_figures

    with Entry(f"runtime-{args.model}" + ("-quick" if args.quick else ""), bandwidth_threads=args.threads) as entry:
        results = _run(args, path, hf)
        entry.info = {"model": args.model, "workloads": args.only, "threads": torch.get_num_threads()}
        entry.figures = flat_figures(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def _run(args, path: str, hf) -> dict:
    results = {}
    for name in args.only:
        fn = {"offline": lambda: bench_offline(path, args, hf), "batch1": lambda: bench_batch1(path, args, hf),
              "prefix": lambda: bench_prefix(path, args), "kvint8": lambda: bench_kvint8(path, args)}[name]
        print(f"== {name}", flush=True)
        results[name] = fn()
    return results


if __name__ == "__main__":
    main()
