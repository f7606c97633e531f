"""`accel draft ...`: train a distilled draft model (registered as a sub-app by accel/cli.py). Thin."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

draft_app = typer.Typer(help="Draft models for speculative decoding: distil one from the target.",
                        no_args_is_help=True)


@draft_app.command("train")
def draft_train(
    target: Annotated[str, typer.Argument(help="Target model: registry name, HF folder or .gguf file.")],
    out: Annotated[Path, typer.Option(help="Folder to write the draft to (an HF LlamaForCausalLM folder).")],
    num_layers: Annotated[int, typer.Option(min=1, max=8, help="Decoder layers of the draft.")] = 2,
    minutes: Annotated[float, typer.Option(min=0.1, max=24 * 60, help="Time budget, loading to saving.")] = 30.0,
    num_prompts: Annotated[int, typer.Option(min=1, help="Calibration prompts the target replies to.")] = 256,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=2048, help="Reply length per prompt.")] = 128,
    vocab: Annotated[int, typer.Option(min=1, help="Draft vocabulary (reduced head) size.")] = 8192,
    learning_rate: Annotated[float, typer.Option(min=0.0, max=1.0)] = 5e-4,
    layer_choice: Annotated[str, typer.Option(help="first | spread: which target layers initialise it.")] = "first",
    calibration_dir: Annotated[Path, typer.Option(help="JSONL prompt sets with domain labels.")] = Path(
        "calibration_data"),
    train_head: Annotated[bool, typer.Option("--train-head/--frozen-head",
                                             help="Train the draft vocabulary's head rows (own lm_head).")] = True,
    seed: Annotated[int, typer.Option()] = 0,
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads.")] = None,
) -> None:
    """Distil a small draft from the target's own replies and next-token distributions (CPU, time-boxed)."""
    import torch

    from accel.models import ModelNotFoundError, resolve_model
    from accel.spec.distill import train_draft

    if threads:
        torch.set_num_threads(threads)
    if layer_choice not in ("first", "spread"):
        raise typer.BadParameter(f"{layer_choice!r} is invalid; allowed: first, spread", param_hint="--layer-choice")
    try:
        target_path = resolve_model(target, pull_if_missing=True)
    except (ModelNotFoundError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    res = train_draft(target_path, out, num_layers=num_layers, time_budget_minutes=minutes,
                      calibration_dir=calibration_dir, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                      learning_rate=learning_rate, seed=seed, draft_vocab_size=vocab, layer_choice=layer_choice,
                      train_head=train_head)
    tail = res.losses[-10:]
    typer.echo(f"draft: {res.out_dir} ({res.num_layers} layers {res.layer_ids}, vocab {res.draft_vocab_size}, "
               f"coverage {res.vocab_coverage:.3f}); {res.num_prompts} replies, {res.num_train_positions} "
               f"positions, {res.num_steps} steps, loss {res.losses[0]:.3f} -> {sum(tail) / len(tail):.3f}")
