"""`accel draft train`: distil a draft model from the target (the training lives in accel.draft_training). Its
options are `DistillConfig`'s fields, the recipe's `speculation.distill` section, with the same defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from accel.cli.common import fail
from accel.cli.options import build_config, config_options
from accel.recipe import DistillConfig

draft_app = typer.Typer(help="Draft models for speculative decoding: distil one from the target.",
                        no_args_is_help=True)


@draft_app.command("train")
@config_options(DistillConfig, dest="distill")
def draft_train(
    target: Annotated[str, typer.Argument(help="Target model: registry name, HF folder or .gguf file.")],
    out: Annotated[Path, typer.Option(help="Folder to write the draft to.")],
    calibration_dir: Annotated[Path, typer.Option(help="JSONL prompt sets with domain labels.")] = Path(
        "calibration_data"),
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads.")] = None,
    distill: Optional[dict] = None,
) -> None:
    """Distil a small draft from the target's own replies and next-token distributions (CPU, time-boxed)."""
    from accel.hub import ModelNotFoundError, resolve_model

    try:
        config = build_config(DistillConfig, distill or {})
    except ValueError as e:
        fail(str(e))
    if config.init_from is not None:
        from accel.draft_training.eagle_train import init_history

        try:
            init_history(config.init_from)
        except ValueError as e:
            fail(f"--init-from: {e}")
    try:
        target_path = resolve_model(target, pull_if_missing=True)
    except (ModelNotFoundError, ValueError) as e:
        fail(str(e))
    import torch

    from accel.draft_training import distill_draft

    if threads:
        torch.set_num_threads(threads)
    r = distill_draft(target_path, out, config, calibration_dir)
    if config.kind == "eagle":
        typer.echo(f"eagle draft: {r.out_dir} (vocab {r.draft_vocab_size}, coverage {r.vocab_coverage:.3f}); "
                   f"{r.num_prompts} replies ({r.num_model_written_prompts} to model-written turns), "
                   f"{r.num_train_positions} positions, {r.num_steps} steps; held-out agreement: first token "
                   f"{r.heldout_top1:.3f}, second given the first {r.heldout_second:.3f}")
        return
    tail = r.losses[-10:]
    typer.echo(f"draft: {r.out_dir} ({r.num_layers} layers {r.layer_ids}, vocab {r.draft_vocab_size}, "
               f"coverage {r.vocab_coverage:.3f}); {r.num_prompts} replies, {r.num_train_positions} "
               f"positions, {r.num_steps} steps, loss {r.losses[0]:.3f} -> {sum(tail) / len(tail):.3f}")
