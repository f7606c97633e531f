"""Rich tables of an EvalResult (what `accel eval` prints)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from accel.eval.metrics import TextMetrics
from accel.eval.result import EvalResult, TaskScores


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_text_table(result: EvalResult) -> Table:
    """One row per domain plus the pooled overall row: tokens, perplexities, KL mean/P99/max, top-1."""
    title = f"text: {result.model}" + (f" vs {result.baseline}" if result.baseline else "")
    # box.SIMPLE and 4-decimal KL keep the nine columns inside an 80-column terminal without truncation.
    table = Table(title=title, title_justify="left", box=box.SIMPLE, pad_edge=False, collapse_padding=True)
    for col in ("domain", "tokens", "PPL base", "PPL", "ΔPPL%", "KL mean", "KL P99", "KL max", "top-1%"):
        table.add_column(col, justify="left" if col == "domain" else "right", no_wrap=True)

    def row(name: str, m: TextMetrics, **style) -> None:
        table.add_row(
            name,
            str(m.num_tokens_scored),
            _f(m.ppl_baseline, ".3f"),
            _f(m.ppl, ".3f"),
            _f(m.ppl_increase_pct, "+.2f"),
            _f(m.kl_mean, ".4f"),
            _f(m.kl_p99, ".4f"),
            _f(m.kl_max, ".3f"),
            _f(None if m.top1_agreement is None else 100 * m.top1_agreement, ".2f"),
            **style,
        )

    for name, m in result.domains.items():
        row(name, m)
    if result.overall is not None:
        table.add_section()
        row("overall", result.overall, style="bold")
    p = result.protocol
    table.caption = f"window {p.window}, stride {p.stride}, KL(P_base || P_model) in nats"
    return table


def render_task_table(result: EvalResult) -> Table:
    """One row per task plus overall: n, accuracy ± standard error for the model and the baseline."""
    table = Table(title="tasks (greedy, exact match)", title_justify="left", box=box.SIMPLE, pad_edge=False)
    for col in ("task", "n", "base acc %", "acc %", "Δ pts"):
        table.add_column(col, justify="left" if col == "task" else "right")

    def acc(s: TaskScores | None) -> str:
        return "-" if s is None else f"{100 * s.accuracy:.1f} ± {100 * s.stderr:.1f}"

    rows = list(result.tasks.values()) + ([result.tasks_overall] if result.tasks_overall else [])
    for i, t in enumerate(rows):
        if t is result.tasks_overall and i > 0:
            table.add_section()
        delta = None if t.baseline is None else 100 * (t.model.accuracy - t.baseline.accuracy)
        table.add_row(t.task, str(t.model.n), acc(t.baseline), acc(t.model), _f(delta, "+.1f"),
                      style="bold" if t is result.tasks_overall else None)
    return table


def render_table(result: EvalResult) -> Table:
    """The text table and, when tasks ran, the task table below it, as one printable Table."""
    grid = Table.grid(padding=(1, 0))
    grid.add_column()
    grid.add_row(render_text_table(result))
    if result.tasks:
        grid.add_row(render_task_table(result))
    return grid
