"""`accel recipe schema | check`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from accel.cli.common import console, load_recipe_or_exit

recipe_app = typer.Typer(help="Validate recipes and print their JSON schema.", no_args_is_help=True)


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

    recipe = load_recipe_or_exit(file)
    if show:
        print(dump_recipe(recipe), end="")
    console.print(f"[green]ok:[/] {file} (run folder {recipe.run_dir()})")
