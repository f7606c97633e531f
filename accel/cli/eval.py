"""`accel eval`: quality of a model against a baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from accel.cli.common import console, fail


def eval_(
    model: Annotated[str, typer.Argument(help="Model to evaluate: name, HF folder or .gguf file.")],
    baseline: Annotated[Optional[str], typer.Option(help="Baseline for KL / top-1 / perplexity increase.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the result JSON here.")] = None,
    domains: Annotated[Optional[str], typer.Option(help="Comma-separated text domains (default: all).")] = None,
    window: Annotated[int, typer.Option(min=16, help="Tokens per scored window.")] = 512,
    max_windows: Annotated[int, typer.Option(min=1, help="Windows per domain (spread evenly).")] = 4,
    tasks: Annotated[bool, typer.Option(help="Also score the tasks (greedy generation).")] = True,
    max_examples_per_task: Annotated[int, typer.Option(min=1)] = 20,
) -> None:
    """Evaluate quality: perplexity, KL and top-1 vs a baseline, task accuracy; prints a table, writes JSON."""
    from accel.eval import render_table, run_eval
    from accel.fsutil import atomic_write_text
    from accel.hub import ModelNotFoundError, resolve_model

    root = Path(__file__).resolve().parents[2] / "eval"  # the project's eval/ (texts and tasks)
    try:
        path = resolve_model(model)
        base = resolve_model(baseline) if baseline else None
        res = run_eval(path, base, text_dir=root / "text", tasks_dir=root / "tasks",
                       domains=domains.split(",") if domains else None, window=window,
                       max_windows_per_domain=max_windows, tasks=tasks, max_examples_per_task=max_examples_per_task)
    except (ModelNotFoundError, ValueError) as e:
        fail(str(e))
    console.print(render_table(res))
    if out is not None:
        atomic_write_text(out, res.to_json())
        console.print(f"wrote {out}")
