"""Repeatability of a load test: run the same bench N times on one backend and report the throughput spread.

The target: two identical runs at a fixed concurrency agree within 5% on output throughput.

    python -m accel.bench.repeat --model smollm2-135m --concurrency 4 --num-requests 24 --runs 2

In-process runs switch the engine's prefix cache off, so a later run does not reuse the KV blocks of an earlier
one (that would make the runs not identical).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from accel.bench.latency import BenchResult, throughput_spread
from accel.bench.loadgen import BenchConfig, open_backend, run_bench
from accel.bench.workload import Workload


@dataclass
class RepeatResult:
    output_throughputs: list[float]
    spread: float  # (max - min) / mean
    runs: list[BenchResult]


def repeat_bench(backend, cfg: BenchConfig, runs: int = 2, progress: bool = False) -> RepeatResult:
    """Run the same configuration `runs` times (each with its own warm-up) and measure the spread."""
    if runs < 2:
        raise ValueError(f"runs={runs} is invalid; a spread needs at least 2 runs")
    results = [run_bench(backend, cfg, progress=progress) for _ in range(runs)]
    tps = [r.output_throughput for r in results]
    return RepeatResult(output_throughputs=tps, spread=throughput_spread(tps), runs=results)


def main(argv: list[str] | None = None) -> RepeatResult:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--url", default=None, help="an OpenAI-compatible server instead of the in-process engine")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-requests", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, nargs=2, default=(32, 256))
    ap.add_argument("--output-tokens", type=int, nargs=2, default=(32, 64))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads for the in-process engine")
    ap.add_argument("--out", default=None, help="write every run's BenchResult as JSON here")
    a = ap.parse_args(argv)
    kw = {} if a.url else {"enable_prefix_caching": False, "num_threads": a.threads}
    backend = open_backend(url=a.url, model=a.model, **kw)
    cfg = BenchConfig(workload=Workload(num_requests=a.num_requests, prompt_tokens=tuple(a.prompt_tokens),
                                        output_tokens=tuple(a.output_tokens)),
                      concurrency=a.concurrency, warmup=a.warmup)
    res = repeat_bench(backend, cfg, a.runs, progress=True)
    for i, r in enumerate(res.runs):
        print(f"run {i + 1}: {r.output_throughput:.2f} output tok/s, {r.request_throughput:.3f} req/s, "
              f"TTFT P50 {r.ttft_ms.p50:.1f} ms, TPOT P50 {r.tpot_ms.p50:.1f} ms, errors {r.num_errors}")
    ratio = res.output_throughputs[-1] / res.output_throughputs[0]
    print(f"last/first throughput ratio {ratio:.4f}; spread (max-min)/mean = {res.spread:.2%} (target < 5%)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"spread": res.spread, "runs": [r.to_dict() for r in res.runs]}, f, indent=1)
    return res


if __name__ == "__main__":
    main()
