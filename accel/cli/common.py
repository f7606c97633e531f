"""What every command shares: the consoles, the one-line error exit, recipe loading, `--quant`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer
from rich.console import Console

from accel import schemes

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

EXIT_USAGE = 2  # bad input


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print one red line and exit: bad input never shows a traceback."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def load_recipe_or_exit(path: Path):
    """The recipe, checked by its schema and against the disk (accel.preflight); exit 2 listing every problem."""
    from accel.preflight import preflight
    from accel.recipe import RecipeError, load_recipe

    try:
        recipe = load_recipe(path)
    except RecipeError as e:
        fail(str(e))
    problems = preflight(recipe)
    if problems:
        fail(str(RecipeError(str(path), problems)))
    return recipe


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def int_pair(value: str, name: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in value.split(","))
    except ValueError:
        fail(f"--{name} {value!r} is invalid; expected MIN,MAX (two integers, e.g. 16,1024)")
    if not 1 <= lo <= hi:
        fail(f"--{name} {value!r} is invalid; expected 1 <= MIN <= MAX")
    return lo, hi


QUANT_CHOICES = (None, *schemes.names("on_load"))
QUANT_HELP = "Quantize every Linear and the lm_head on load (RTN): " + "; ".join(
    f"{s}: {schemes.get(s).summary}" for s in schemes.names("on_load")) + "."


def quant_kwargs(path, quant: str | None, group_size: int) -> dict:
    """EngineConfig fields for `--quant` (a plain model folder quantized on load; an export carries its own)."""
    if quant is None:
        return {}
    from accel.quant.schemes import uniform_plan
    from accel.runtime.models.hf_config import load_config

    n = load_config(path).num_hidden_layers
    return {"quant_plan": uniform_plan(n, quant), "quant_group_size": group_size}


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM behaves as Ctrl-C while the block runs, so `finally` blocks (a stage's temp folder) clean up."""
    import signal

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
