"""Speed of each quantization plan in accel's runtime vs fp32 at batch 1 and 16 (same prompts, greedy, 64 tokens).

    .venv/bin/python scripts/bench_plans.py [--threads 2] [CHECKPOINT ...]

Variants: fp32, all-INT8 (RTN, lm_head included) and every compressed-tensors checkpoint given (e.g. an
`accel quantize` run's checkpoint_quantized/), each loaded into accel's runtime. Prints tok/s and the ratio to fp32
measured in the same run.
"""
import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
ap = argparse.ArgumentParser()
ap.add_argument("checkpoints", nargs="*")
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
torch.set_num_threads(args.threads)
from bench_runtime import greedy, resolve  # noqa: E402

from accel.bench.ledger import Entry, figure, ratio  # noqa: E402
from accel.export.load import load_engine  # noqa: E402
from accel.quant.schemes import uniform_plan  # noqa: E402
from accel.runtime import Engine  # noqa: E402

path = resolve("smollm2-135m")
rng = random.Random(0)
prompts = [[rng.randrange(100, 40000) for _ in range(rng.randint(32, 128))] for _ in range(16)]
def speed(engine, batch):
    engine.generate([prompts[0]], greedy(8))
    ps = prompts[:batch] if batch > 1 else prompts[:2]
    t0 = time.perf_counter(); n = 0
    if batch == 1:
        for p in ps: n += len(engine.generate([p], greedy(64))[0].token_ids)
    else:
        n = sum(len(o.token_ids) for o in engine.generate(ps, greedy(64)))
    return n / (time.perf_counter() - t0)
variants = {
    "fp32": lambda: Engine.from_pretrained(path),
    "all-int8 (RTN, lm_head int8)": lambda: Engine.from_pretrained(path, quant_plan=uniform_plan(30, "int8")),
    **{str(c): (lambda c=c: load_engine(c)) for c in args.checkpoints},
}
base = {}
with Entry("plans-smollm2-135m", bandwidth_threads=args.threads) as entry:
    entry.info = {"model": "smollm2-135m", "threads": args.threads, "checkpoints": args.checkpoints, "max_tokens": 64}
    for name, mk in variants.items():
        e = mk()
        for b in (1, 16):
            s = speed(e, b)
            base.setdefault(b, s)
            print(f"{name:45s} batch {b:2d}: {s:6.1f} tok/s  {s / base[b]:.2f}x fp32", flush=True)
            entry.figures[f"b{b}|{name}.tok_s"] = figure([s], "tok/s")
            if name != "fp32":
                entry.figures[f"b{b}|{name}.vs_fp32"] = ratio([s], [base[b]])
