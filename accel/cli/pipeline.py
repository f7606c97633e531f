"""`accel optimize`, `accel quantize` and `accel export run | verify`: the pipeline's commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from accel.cli.common import console, err_console, fail, load_recipe_or_exit, terminate_as_interrupt

export_app = typer.Typer(help="Export optimized checkpoints and verify them.", no_args_is_help=True)


def run_pipeline(recipe, force: list[str], until: str | None = None, override_gates: bool = False) -> None:
    """Run the stages with a progress line each, then the summary table; exit 1 on a failed gate."""
    import sys

    from accel.pipeline.optimize import GateFailed, optimize as run_optimize
    from accel.pipeline.ui import EXIT_GATES, StageProgress, headline_table
    from accel.recipe import RecipeError
    from accel.runlog import LOG_NAME

    if override_gates:
        recipe.gates.override = True
    ui = StageProgress(console)
    console.print(f"run folder: {recipe.run_dir()}")
    code = 0
    try:
        with terminate_as_interrupt():
            run_optimize(recipe, on_event=ui, force=tuple(force), until=until, progress=sys.stderr.isatty(),
                         run_log=True)
    except RecipeError as e:  # the recipe does not fit the disk: nothing ran
        fail(str(e))
    except ValueError as e:
        if not ui.rows:  # bad --force etc.: nothing ran
            fail(str(e))
        raise
    except GateFailed as e:
        err_console.print(f"[bold red]gates failed:[/] {e}", highlight=False)
        ui.mark_blocked("export", f"blocked by gates: {', '.join(e.report.failed)}")
        code = EXIT_GATES
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted:[/] finished stages are kept; rerun to resume.")
        code = 130
    console.print(ui.table(recipe.run_dir()))
    table = headline_table(recipe.run_dir())
    if table is not None:
        console.print(table)
    for name in ("report.html", "checkpoint", LOG_NAME):
        if (recipe.run_dir() / name).exists():
            console.print(f"{name}: {recipe.run_dir() / name}")
    if code:
        raise typer.Exit(code)


def optimize(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file (see recipes/).")],
    force: Annotated[Optional[list[str]], typer.Option(help="Rerun this stage even if its inputs did not "
                                                            "change (repeatable).")] = None,
    clean: Annotated[bool, typer.Option(help="Delete the run folder first (rerun every stage).")] = False,
    override_gates: Annotated[bool, typer.Option(help="Export even when a quality/speed gate fails.")] = False,
) -> None:
    """Run the whole pipeline: calibrate, plan bits, quantize, pair a draft, evaluate, report, export."""
    from accel.pipeline.optimize import clean as clean_run

    r = load_recipe_or_exit(recipe)
    if clean:
        clean_run(r)
    run_pipeline(r, force or [], override_gates=override_gates)


def quantize(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file.")],
    force: Annotated[Optional[list[str]], typer.Option(help="Rerun this stage (repeatable).")] = None,
) -> None:
    """Run only the quantization stages of a recipe (load, calibrate, sensitivity, plan, quantize)."""
    r = load_recipe_or_exit(recipe)
    if not r.quantization.enabled:
        fail(f"{recipe}: quantization.enabled is false; nothing to quantize")
    run_pipeline(r, force or [], until="quantize")


@export_app.command("verify")
def export_verify(
    directory: Annotated[Path, typer.Argument(help="An exported checkpoint folder (with accel.json).")],
    load: Annotated[bool, typer.Option(help="Also load it with transformers and run a forward.")] = True,
    target: Annotated[Optional[str], typer.Option(
        help="A loader that must accept the export: accel, transformers, vllm or vllm-cpu (vllm also runs vLLM's own "
             "parser and weight loaders on it, in the side venv of scripts/peers/setup_vllm_check.sh; both serve it "
             "with a real vLLM-CPU, scripts/peers/setup_vllm_cpu.sh, and compare its greedy output with accel's).")
    ] = None,
) -> None:
    """Check every file against accel.json, say which loaders accept which layers, load it; exit 1 on a problem."""
    from accel.export import verify_export
    from accel.export.checkpoint import TARGETS
    from accel.export.compatibility import VllmCheckUnavailable

    if target is not None and target not in TARGETS:
        fail(f"--target {target!r} is invalid; allowed: {', '.join(TARGETS)}")
    from accel.hub import accel_home
    from accel.runlog import terminal, third_party_to

    log = accel_home() / "logs" / "export-verify.txt"  # transformers' and compressed-tensors' bars and warnings
    try:
        with third_party_to(log):
            res = verify_export(directory, load=load, target=target,
                                progress=lambda msg: print(msg, file=terminal(), flush=True))
    except VllmCheckUnavailable as e:
        fail(str(e))
    for name, s in res.details.get("loaders", {}).items():
        refused = s["refused"]
        line = "loads every layer" if s["loads"] else f"refuses {len(refused)} layers, e.g. {next(iter(refused))}: " \
                                                     f"{next(iter(refused.values()))}"
        console.print(f"{name}: {line}", highlight=False)
    rep = res.details.get("vllm_check")
    if rep and rep.get("ok"):
        load_rep = rep.get("load") or {}
        spec = (rep.get("config") or {}).get("speculative_config")
        console.print(f"vllm check (vLLM {rep.get('vllm')}'s own code, {rep.get('platform')}): config parsed"
                      + (f" with speculative config {spec}" if spec else "")
                      + f", {load_rep.get('quantized_modules', 0)} quantized modules loaded {load_rep.get('schemes')},"
                      " values equal to the checkpoint", highlight=False)
    serve = res.details.get("vllm_serve") or {}
    if serve.get("skipped"):
        console.print(f"vllm serve: skipped: {serve['skipped']}", highlight=False)
    elif serve.get("prompts"):
        parted = [p for p in serve["prompts"] if p["first_divergence"] is not None]
        console.print(f"vllm serve (vLLM-CPU {serve['vllm_version']}, {serve['loader']}, {serve['dtype']}): greedy "
                      f"equal to accel on {serve['equal']} of {len(serve['prompts'])} eval prompts"
                      + "".join(f"; {p['task']} parts at token {p['first_divergence']} (KLD {p['kld_mean']:.4f}, "
                                f"same top-1 {100 * p['same_top1']:.0f}%)" for p in parted)
                      + f"; stream {serve['stream']}; /metrics {serve['metrics']}", highlight=False, soft_wrap=True)
    for p in res.problems:
        err_console.print(f"[red]problem:[/] {p}", highlight=False)
    if not res.ok:
        raise typer.Exit(1)
    console.print(f"[green]ok:[/] {res.checked_files} files match accel.json"
                  + ("; loads in transformers" if res.loaded else ""))


@export_app.command("run")
def export_run(
    run_dir: Annotated[Path, typer.Argument(help="Run folder of `accel optimize`.")],
    override_gates: Annotated[bool, typer.Option(help="Export even when a quality/speed gate fails.")] = False,
    target: Annotated[Optional[str], typer.Option(
        help="The loader that must accept every layer: accel, transformers, vllm or vllm-cpu (default: the "
             "recipe's export.target).")] = None,
) -> None:
    """Export the checkpoint of a run folder (finished stages are reused; missing ones run first)."""
    from accel.export.checkpoint import TARGETS
    from accel.pipeline.optimize import recipe_of_run
    from accel.recipe import RecipeError

    if not (run_dir / "recipe.yaml").is_file():
        fail(f"{run_dir} is not a run folder of `accel optimize` (no recipe.yaml)")
    try:
        r = recipe_of_run(run_dir)
    except RecipeError as e:
        fail(str(e))
    if not r.export.enabled:
        r.export.enabled = True
    if target is not None:
        try:
            r.export.target = target
        except ValueError:
            fail(f"--target {target!r} is invalid; allowed: {', '.join(TARGETS)}")
    run_pipeline(r, [], override_gates=override_gates)
