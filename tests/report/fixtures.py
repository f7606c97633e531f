"""A hand-made run result (three variants, two workloads, a sweep, spec counters, sensitivity, plan)."""

from __future__ import annotations

from accel.bench.latency import SLO, RequestRecord, SweepResult, summarize


def bench(concurrency: int, ttft: float, gap: float, n_req: int = 8, n_out: int = 5, seed: int = 0) -> dict:
    """A BenchResult dict: n_req requests, each `n_out` tokens, first after `ttft` s then every `gap` s."""
    recs = []
    for i in range(n_req):
        start = i * 0.01
        t1 = start + ttft * (1 + 0.1 * ((i + seed) % 3))
        times = [t1 + k * gap for k in range(n_out)]
        recs.append(RequestRecord(request_id=f"r{i}", start=start, end=times[-1], prompt_tokens=20,
                                  output_tokens=n_out, chunk_times=times, queue_time=0.001 * i))
    recs.append(RequestRecord(request_id="bad", start=0.0, end=0.1, prompt_tokens=20, output_tokens=0,
                              error="http_503"))
    cfg = {"concurrency": concurrency, "request_rate": None, "backend": "in-process", "num_warmup": 2,
           "workload": {"prompt_tokens": [16, 64], "output_tokens": [5, 5]}}
    return summarize(recs, config=cfg, slo=SLO(ttft_ms=500, tpot_ms=100)).to_dict()


def sweep() -> dict:
    points = [summarize(
        [RequestRecord(f"r{i}", 0.0, 1.0 / tp * c, 5, 5, [0.1 * c, 0.2 * c, 1.0 / tp * c]) for i in range(c)],
        config={"concurrency": c, "request_rate": None}) for c, tp in ((1, 1.0), (2, 1.6), (4, 1.65))]
    return SweepResult(points=points, knee_index=1, knee_rule="test rule").to_dict()


def run_result() -> dict:
    modules = [f"model.layers.{i}.{m}" for i in range(3) for m in ("self_attn.q_proj", "mlp.down_proj")]
    return {
        "name": "demo",
        "created": "2026-11-29T10:00:00Z",
        "command": "accel optimize recipes/default.yaml",
        "recipe": "name: demo\nmodel:\n  path: smollm2-135m\n",
        "machine": {"cpu_model": "Test CPU 9000", "cpu_count": 2, "cpu_usable": 2, "ram_gb": 16.0, "gpus": [],
                    "cuda": None, "torch_threads": 2, "os": "Linux", "python": "3.11.7",
                    "versions": {"torch": "2.13.0+cpu", "transformers": "5.17.0", "llmcompressor": None}},
        "variants": [
            {"name": "fp32", "size_mb": 513.0, "avg_bits": 32.0,
             "quality": {"ppl": 10.0, "ppl_increase_pct": 0.0, "kl_mean": 0.0, "kl_p99": 0.0, "top1": 1.0,
                         "task_accuracy": 0.4,
                         "per_domain": {"code": {"ppl": 5.0, "kl_mean": 0.0}, "prose": {"ppl": 15.0, "kl_mean": 0.0}}},
             "speed": {"batch1": bench(1, 0.05, 0.040), "batch16": bench(16, 0.20, 0.050)}, "sweep": sweep()},
            {"name": "int8", "size_mb": 140.0, "avg_bits": 8.0,
             "quality": {"ppl": 10.1, "ppl_increase_pct": 1.0, "kl_mean": 0.004, "kl_p99": 0.03, "top1": 0.97,
                         "task_accuracy": 0.39},
             "speed": {"batch1": bench(1, 0.04, 0.025, seed=1), "batch16": bench(16, 0.15, 0.03, seed=1)}},
            {"name": "mixed+spec", "size_mb": 100.0, "avg_bits": 6.2,
             "quality": {"ppl": 10.4, "ppl_increase_pct": 4.0, "kl_mean": 0.02, "kl_p99": 0.1, "top1": 0.93,
                         "task_accuracy": 0.37},
             "speed": {"batch1": bench(1, 0.045, 0.015, seed=2)},
             "spec": {"num_drafts": 100, "num_draft_tokens": 400, "num_accepted_tokens": 230,
                      "num_accepted_tokens_per_pos": [90, 70, 45, 25]},
             "spec_per_domain": {"code": {"num_drafts": 50, "num_draft_tokens": 200, "num_accepted_tokens": 150},
                                 "prose": {"num_drafts": 50, "num_draft_tokens": 200, "num_accepted_tokens": 80}}},
            # dominated: slower than int8 and worse quality
            {"name": "int4-bad", "quality": {"kl_mean": 0.05}, "speed": {"batch1": bench(1, 0.05, 0.035)}},
        ],
        "sensitivity": {m: {"int4": 0.01 * (i + 1), "int8": 0.0005 * (i + 1)} for i, m in enumerate(modules)},
        "plan": {m: ("int4" if i % 3 == 0 else "int8" if i % 3 == 1 else "fp16") for i, m in enumerate(modules)},
    }
