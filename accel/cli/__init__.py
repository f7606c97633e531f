"""The `accel` command line. Thin: every command parses its arguments and calls the library.

    common     consoles, `fail` (one red line, exit 2), recipe loading, `--quant`
    pipeline   optimize, quantize, export run | verify
    runtime    serve, generate, bench
    eval       eval
    models     models list | pull
    recipe     recipe schema | check
    draft      draft train
"""

from __future__ import annotations

from typing import Annotated

import typer

from accel.cli import eval as eval_cmd
from accel.cli import pipeline, runtime
from accel.cli.common import err_console, terminate_as_interrupt
from accel.cli.draft import draft_app
from accel.cli.models import models_app
from accel.cli.recipe import recipe_app

__all__ = ["app", "main", "terminate_as_interrupt"]

app = typer.Typer(
    help="accel: make causal language models cheaper and faster to serve, and prove it with numbers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(models_app, name="models")
app.add_typer(recipe_app, name="recipe")
app.add_typer(pipeline.export_app, name="export")
app.add_typer(draft_app, name="draft")
app.command()(pipeline.optimize)
app.command()(runtime.serve)
app.command()(runtime.bench)
app.command("eval")(eval_cmd.eval_)
app.command()(pipeline.quantize)
app.command()(runtime.generate)


@app.callback()
def _global_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show the Python traceback of an unexpected error.")] = False,
) -> None:
    """accel: make causal language models cheaper and faster to serve, and prove it with numbers."""


def main(argv: list[str] | None = None) -> None:
    """The `accel` entry point: an unexpected error prints one line (and where the traceback is), not a traceback,
    unless --debug is given."""
    import sys

    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args
    if debug:  # accepted anywhere on the line, not only before the command
        args = ["--debug"] + [a for a in args if a != "--debug"]
    try:
        app(args=args, prog_name="accel")
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - the last line of defence for the terminal; --debug shows all
        if debug:
            raise
        err_console.print(f"[bold red]error:[/] {type(e).__name__}: {e}", highlight=False)
        err_console.print("[dim](run the command again with --debug for the Python traceback)[/]")
        raise SystemExit(1) from None
