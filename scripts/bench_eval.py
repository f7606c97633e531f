"""Time the full quality eval of SmolLM2-135M: baseline (fp32) vs a fake-quantized INT8 variant.

The variant rounds every decoder Linear weight to int8 per output channel (symmetric, absmax scale) and
dequantizes it back to fp32: the numerics of weight-only INT8, without the kernels (another module's job).

    .venv/bin/python scripts/bench_eval.py                       # defaults of run_eval, prints time + table
    .venv/bin/python scripts/bench_eval.py --max-windows 2 --max-examples 10 --out /tmp/eval.json

It also prints the split of one window's cost (baseline forward, variant forward, metric reduction), the
numbers behind not caching baseline logits on disk.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer

from accel.eval import from_hf, render_table, run_eval
from accel.eval.metrics import position_stats

MODEL = "smollm2-135m"  # resolved through the model zoo ($ACCEL_HOME)


def fake_quant_int8_(model: torch.nn.Module) -> int:
    """Round each decoder Linear's weight to int8 per output channel in place; returns how many were rounded."""
    n = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}":
            w = mod.weight.data  # [out, in]
            scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0  # [out, 1]
            mod.weight.data = torch.clamp(torch.round(w / scale), -127, 127) * scale
            n += 1
    return n


def window_cost_split(base, variant, tokenizer, window: int) -> dict[str, float]:
    """CPU seconds (all threads) for one window: baseline forward, variant forward, metric reduction.

    CPU time rather than wall time: on a shared machine wall time mostly measures the neighbours.
    """
    text = Path("eval/text/prose.jsonl").read_text().splitlines()[0]
    ids = torch.tensor([tokenizer.encode(text * 4, add_special_tokens=False)[:window]])  # [1, T]
    with torch.inference_mode():
        t0 = time.process_time()
        lb = base(input_ids=ids, use_cache=False).logits[0]
        t1 = time.process_time()
        lv = variant(input_ids=ids, use_cache=False).logits[0]
        t2 = time.process_time()
        position_stats(lv[:-1], ids[0, 1:], lb[:-1])
        t3 = time.process_time()
    return {"base_forward_cpu_s": t1 - t0, "variant_forward_cpu_s": t2 - t1, "metrics_cpu_s": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=None, help="per domain; default: run_eval's default")
    ap.add_argument("--max-examples", type=int, default=None, help="per task; default: run_eval's default")
    ap.add_argument("--no-tasks", action="store_true")
    ap.add_argument("--split", action="store_true", help="only print the per-window cost split")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    from accel.hub import resolve_model

    model = resolve_model(args.model, pull_if_missing=True)
    tok = AutoTokenizer.from_pretrained(model)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    variant = copy.deepcopy(base)
    n = fake_quant_int8_(variant)
    print(f"fake-quantized {n} Linear layers to int8 per channel; torch threads {torch.get_num_threads()}")

    from accel.bench.ledger import Entry, figure, flat_figures

    with Entry(f"eval-{Path(args.model).name}" + ("-split" if args.split else "")) as entry:
        entry.info = {"model": args.model, "window": args.window, "max_windows": args.max_windows,
                      "max_examples": args.max_examples, "tasks": not args.no_tasks,
                      "threads": torch.get_num_threads(), "int8_linears": n}
        split = window_cost_split(base, variant, tok, args.window)
        print("one window: " + ", ".join(f"{k} {v:.2f}" for k, v in split.items()))
        entry.figures = {f"window.{k}": figure([v], "s", 3) for k, v in split.items()}
        if args.split:
            return

        kwargs = {}
        if args.max_windows is not None:
            kwargs["max_windows_per_domain"] = args.max_windows
        if args.max_examples is not None:
            kwargs["max_examples_per_task"] = args.max_examples
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_eval(
            from_hf(variant, tok, name="smollm2-135m-int8-fakequant"),
            from_hf(base, tok, name="smollm2-135m-fp32"),
            window=args.window,
            tasks=not args.no_tasks,
            **kwargs,
        )
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        entry.figures |= {"eval.wall_s": figure([elapsed], "s", 1), "eval.cpu_s": figure([cpu], "s", 1),
                          **flat_figures(result.summary(), "quality.")}
    Console().print(render_table(result))
    print(
        f"full eval (baseline + 1 variant): {elapsed:.1f}s wall, {cpu:.1f}s CPU (all threads), "
        f"{result.overall.num_tokens_scored} tokens scored, "
        f"{result.overall.num_windows} windows, "
        f"{sum(t.model.n for t in result.tasks.values())} task examples per model"
    )
    if args.out:
        args.out.write_text(result.to_json())
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
