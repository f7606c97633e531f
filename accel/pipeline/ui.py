"""Terminal rendering of `accel optimize` / `accel quantize` / `accel export run`: one progress line per stage
(started / reused / done with seconds), then a summary table and the headline numbers."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from accel.pipeline.stages import Stage, StageRecord

EXIT_GATES = 1  # a gate failed and blocked the export
HEADLINE = (("kl_mean", "mean KL vs baseline", "{:.3g}"), ("top1", "top-1 agreement", "{:.3f}"),
            ("ppl_increase_pct", "perplexity change %", "{:+.2f}"), ("speedup_batch1", "batch-1 speedup", "{:.2f}x"),
            ("tok_s_batch1_base", "batch-1 tok/s baseline", "{:.1f}"),
            ("tok_s_batch1_quant", "batch-1 tok/s quantized", "{:.1f}"),
            ("acceptance_rate", "draft acceptance rate", "{:.3f}"),
            ("mean_acceptance_length", "mean acceptance length", "{:.2f}"))

KEY_OUTPUTS = {"load": "model.json", "calibrate": "calibration.jsonl", "sensitivity": "sensitivity.json, .png",
               "plan": "plan.json", "quantize": "checkpoint_quantized/", "draft": "draft.json",
               "evaluate": "eval.json", "gates": "gates.json", "report": "report.html, report.md",
               "export": "checkpoint/"}


class StageProgress:
    """on_event callback for `accel.pipeline.optimize` that prints a line per stage event."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.rows: list[tuple[str, str, float, float | None, str]] = []
        self._t0: dict[str, float] = {}

    def __call__(self, kind: str, stage: Stage, record: StageRecord | None) -> None:
        if kind == "start":
            self._t0[stage.name] = time.perf_counter()
            self.console.print(f"[bold cyan]>[/] {stage.name:<12} started", highlight=False)
        elif kind == "reused":
            self.rows.append((stage.name, "reused", 0.0, None, _note(stage.name, record)))
            self.console.print(f"[dim]=[/] {stage.name:<12} reused (inputs unchanged)", highlight=False)
        elif kind == "done":
            self.rows.append((stage.name, "ran", record.duration_s, record.peak_rss_gb, _note(stage.name, record)))
            peak = f", peak RSS {record.peak_rss_gb:.2f} GB" if record.peak_rss_gb is not None else ""
            self.console.print(f"[green]✓[/] {stage.name:<12} done in {record.duration_s:.1f}s{peak}", highlight=False)
        elif kind == "failed":
            secs = time.perf_counter() - self._t0.get(stage.name, time.perf_counter())
            self.rows.append((stage.name, "FAILED", secs, None, ""))
            self.console.print(f"[red]✗[/] {stage.name:<12} failed after {secs:.1f}s", highlight=False)

    def mark_blocked(self, stage: str, why: str) -> None:
        """Show a stage that stopped on purpose (a failed gate) as blocked rather than failed."""
        self.rows = [(n, "BLOCKED" if n == stage else st, secs, peak, why if n == stage else note)
                     for n, st, secs, peak, note in self.rows]

    def table(self, run_dir: Path) -> Table:
        t = Table(title=f"accel optimize: {run_dir}")
        for col in ("stage", "status", "seconds", "peak RSS GB", "key outputs"):
            t.add_column(col, overflow="fold")
        for name, status, secs, peak, note in self.rows:
            style = {"reused": "dim", "FAILED": "red", "BLOCKED": "red"}.get(status, "")
            t.add_row(name, f"[{style}]{status}[/]" if style else status, f"{secs:.1f}",
                      "-" if peak is None else f"{peak:.2f}", note)
        peaks = [r[3] for r in self.rows if r[3] is not None]
        t.add_row("total", "", f"{sum(r[2] for r in self.rows):.1f}", f"{max(peaks):.2f}" if peaks else "-", "")
        return t


def _note(name: str, record: StageRecord | None) -> str:
    s = (record.summary if record else {}) or {}
    extra = ""
    if name == "plan" and "counts" in s:
        extra = (f" ({', '.join(f'{k}:{v}' for k, v in s['counts'].items() if v)}; "
                 f"avg {s.get('avg_bits')} bits on Linears)")
    elif name == "quantize" and s.get("file_bits") is not None:
        extra = f" ({s['file_bits']} bits per parameter, whole file)"
    elif name == "gates" and s.get("failed"):
        extra = f" (FAILED: {', '.join(s['failed'])})"
    return KEY_OUTPUTS.get(name, "") + extra


def headline_table(run_dir: Path) -> Table | None:
    p = Path(run_dir) / "eval.json"
    if not p.is_file():
        return None
    summary = json.loads(p.read_text()).get("summary", {})
    t = Table(title="headline numbers (quantized vs baseline)")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key, label, fmt in HEADLINE:
        v = summary.get(key)
        t.add_row(label, "-" if v is None else fmt.format(v))
    if summary.get("contended") not in (None, "none"):
        t.caption = f"[yellow]contended: the machine was shared during {summary['contended']}: tok/s understated[/]"
    return t
