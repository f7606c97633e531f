"""Benchmark accel's quantized Linear kernels against fp32 / bf16 peers on the real SmolLM2-135M weights.

Prints, for each distinct Linear shape of the model and each number of activation rows M, the best-of-N time of
every kernel path in microseconds and its speed-up over fp32 nn.Linear measured in the same run (the peers are
timed round-robin so machine noise hits them alike). Then a whole-model decode-step estimate: all 30 layers'
7 Linears + the tied lm_head run back to back with their own weights (so caches are as cold as in a real decode
step), per scheme. Then the relative Frobenius error ||W - deq(q(W))|| / ||W|| per scheme.

    .venv/bin/python scripts/bench_kernels.py                   # everything, torch's default threads
    .venv/bin/python scripts/bench_kernels.py --threads 1 --rows 1 8 32 256 --reps 30
    .venv/bin/python scripts/bench_kernels.py --skip-shapes      # only the whole-model estimate and errors

Paths: fp32 = nn.Linear fp32; bf16 = F.linear in bf16; int8_pack = aten._weight_int8pack_mm (bf16 in/out);
int8_deq = dequantize to fp32 + sgemm; int4_pack = aten._weight_int4pack_mm_for_cpu (bf16); int4_deq likewise;
int8 / int4 = the module's own choice (what the runtime gets).

What it prints decided the kernel per row count in accel/kernels/linear.py (`kernel_for`, `dequant_min_rows`:
at large M the dequantize+sgemm path is the better quantized one); docs/DESIGN.md (CPU kernels) records the
decisions. On a shared machine only the ratios mean anything.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from accel.bench.ledger import Entry, figure, ratio
from accel.kernels.linear import (
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    dequantize_int4_groupwise,
    dequantize_int8_per_channel,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
)

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def time_round_robin(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """`reps` seconds per function, timing them interleaved so noise hits all peers alike."""
    for fn in fns.values():  # warm-up (also builds lazy kernel caches)
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def record(figures: dict, prefix: str, times: dict[str, list[float]], unit: str, scale: float) -> dict[str, float]:
    """Each path's repeats as a figure and its per-round speed-up over fp32 as a ratio; returns the best-of times."""
    for k, v in times.items():
        figures[f"{prefix}|{k}.{unit}"] = figure([x * scale for x in v], unit)
        if k != "fp32":
            figures[f"{prefix}|{k}.speedup"] = ratio(times["fp32"], v)
    return {k: min(v) for k, v in times.items()}


def shape_paths(w: torch.Tensor, x: torch.Tensor, group_size: int) -> dict[str, Callable[[], object]]:
    """All kernel paths for one weight [out, in] and activation x [M, in]."""
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data = w
    wb, xb = w.bfloat16(), x.bfloat16()
    i8 = Int8WeightOnlyLinear.from_linear(lin)
    i8_pack = Int8WeightOnlyLinear.from_linear(lin, dequant_min_rows=1 << 30)
    i8_deq = Int8WeightOnlyLinear.from_linear(lin, dequant_min_rows=0)
    paths = {
        "fp32": lambda: lin(x),
        "bf16": lambda: F.linear(xb, wb).float(),
        "int8_pack": lambda: i8_pack(x),
        "int8_deq": lambda: i8_deq(x),
        "int8": lambda: i8(x),
    }
    if w.shape[1] % group_size == 0:
        i4 = Int4WeightOnlyLinear.from_linear(lin, group_size=group_size)
        i4_pack = Int4WeightOnlyLinear.from_linear(lin, group_size=group_size, dequant_min_rows=1 << 30)
        i4_deq = Int4WeightOnlyLinear.from_linear(lin, group_size=group_size, dequant_min_rows=0)
        paths |= {"int4_pack": lambda: i4_pack(x), "int4_deq": lambda: i4_deq(x), "int4": lambda: i4(x)}
    return paths


def bench_shapes(sd: dict[str, torch.Tensor], rows: list[int], reps: int, group_size: int, figures: dict) -> None:
    shapes = {"q/o_proj": sd["model.layers.0.self_attn.q_proj.weight"],
              "k/v_proj": sd["model.layers.0.self_attn.k_proj.weight"],
              "gate/up_proj": sd["model.layers.0.mlp.gate_proj.weight"],
              "down_proj": sd["model.layers.0.mlp.down_proj.weight"],
              "lm_head": sd["model.embed_tokens.weight"]}
    print(f"\n== per shape: best-of-{reps} us (speed-up vs fp32), int4 group {group_size} ==")
    for name, w in shapes.items():
        for m in rows:
            x = torch.randn(m, w.shape[1])
            paths = shape_paths(w, x, group_size)
            with torch.inference_mode():
                t = record(figures, f"shape|{name}|M{m}", time_round_robin(paths, reps), "us", 1e6)
            cells = "  ".join(f"{k}={v * 1e6:.0f}({t['fp32'] / v:.2f}x)" for k, v in t.items())
            print(f"{name:13s} {tuple(w.shape)!s:14s} M={m:<4d} {cells}", flush=True)


def build_model_linears(sd: dict[str, torch.Tensor], scheme: str, group_size: int) -> list[torch.nn.Module]:
    """The 211 Linears of one decode step (30 layers x 7 + lm_head) under one scheme."""
    weights = [sd[f"model.layers.{i}.{n}.weight"] for i in range(30) for n in LINEARS]
    weights.append(sd["model.embed_tokens.weight"])  # the tied lm_head
    mods = []
    for w in weights:
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data = w
        if scheme == "int8":
            mods.append(Int8WeightOnlyLinear.from_linear(lin))
        elif scheme == "int4":
            mods.append(Int4WeightOnlyLinear.from_linear(lin, group_size=group_size))
        elif scheme == "int8+int4_lm_head":
            mods.append(Int8WeightOnlyLinear.from_linear(lin) if w.shape[0] != 49152
                        else Int4WeightOnlyLinear.from_linear(lin, group_size=group_size))
        elif scheme == "bf16":
            mods.append(lin.bfloat16())
        else:
            mods.append(lin)
    return mods


def bench_decode_step(sd: dict[str, torch.Tensor], rows: list[int], reps: int, group_size: int,
                      figures: dict) -> None:
    schemes = ["fp32", "bf16", "int8", "int4", "int8+int4_lm_head"]
    models = {s: build_model_linears(sd, s, group_size) for s in schemes}
    print(f"\n== whole-model Linears of one step (30 x 7 + lm_head, own weights, cold caches): best-of-{reps} ms ==")
    for m in rows:
        xs = {576: torch.randn(m, 576), 1536: torch.randn(m, 1536)}

        def step(mods, dtype=torch.float32):
            for mod in mods:
                mod(xs[mod.in_features].to(dtype))

        fns = {s: (lambda mods=mods, s=s: step(mods, torch.bfloat16 if s == "bf16" else torch.float32))
               for s, mods in models.items()}
        with torch.inference_mode():
            t = record(figures, f"step|M{m}", time_round_robin(fns, max(3, reps // 5)), "ms", 1e3)
        print(f"M={m:<4d} " + "  ".join(f"{k}={v * 1e3:.2f}ms({t['fp32'] / v:.2f}x)" for k, v in t.items()),
              flush=True)


def quant_errors(sd: dict[str, torch.Tensor], figures: dict) -> None:
    print("\n== relative Frobenius error ||W - deq(q(W))|| / ||W|| over the 210 layer Linears + lm_head ==")
    weights = {f"model.layers.{i}.{n}": sd[f"model.layers.{i}.{n}.weight"] for i in range(30) for n in LINEARS}
    weights["lm_head"] = sd["model.embed_tokens.weight"]
    schemes: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "int8": lambda w: dequantize_int8_per_channel(*quantize_int8_per_channel(w)),
        "bf16": lambda w: w.bfloat16().float(),
    }
    for g in (32, 64, 128):
        schemes[f"int4_g{g}"] = lambda w, g=g: dequantize_int4_groupwise(*quantize_int4_groupwise(w, g), g)
    for s, fn in schemes.items():
        errs = {}
        for name, w in weights.items():
            if s.startswith("int4") and w.shape[1] % int(s.split("_g")[1]):
                continue
            errs[name] = ((w - fn(w)).norm() / w.norm()).item()
        if not errs:
            print(f"{s:10s} not applicable (576 is not divisible by the group size)")
            continue
        layer = [v for k, v in errs.items() if k != "lm_head"]
        worst = max((k for k in errs if k != "lm_head"), key=errs.get)
        print(f"{s:10s} layers mean={statistics.mean(layer):.5f} max={max(layer):.5f} ({worst})  "
              f"lm_head={errs.get('lm_head', float('nan')):.5f}  ({len(errs)} tensors)")
        figures[f"error|{s}.layers_mean"] = figure([statistics.mean(layer)], "", 6)
        figures[f"error|{s}.layers_max"] = figure([max(layer)], "", 6)
        if "lm_head" in errs:
            figures[f"error|{s}.lm_head"] = figure([errs["lm_head"]], "", 6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", type=Path, help="a model.safetensors (default: smollm2-135m from the model zoo)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--skip-shapes", action="store_true")
    ap.add_argument("--skip-step", action="store_true")
    ap.add_argument("--skip-errors", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    if args.weights is None:
        from accel.hub import resolve_model

        args.weights = resolve_model("smollm2-135m", pull_if_missing=True) / "model.safetensors"
    sd = load_file(str(args.weights))
    with Entry(f"kernels-{args.weights.parent.name}", bandwidth_threads=args.threads or None) as entry:
        entry.info = {"weights": str(args.weights), "threads": torch.get_num_threads(), "rows": args.rows,
                      "reps": args.reps, "group_size": args.group_size, "torch": torch.__version__,
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()}
        if not args.skip_shapes:
            bench_shapes(sd, args.rows, args.reps, args.group_size, entry.figures)
        if not args.skip_step:
            bench_decode_step(sd, args.rows, args.reps, args.group_size, entry.figures)
        if not args.skip_errors:
            quant_errors(sd, entry.figures)


if __name__ == "__main__":
    main()
