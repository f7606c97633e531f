"""`accel draft train`: distil a draft model from the target (the training lives in accel.draft_training)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

draft_app = typer.Typer(help="Draft models for speculative decoding: distil one from the target.",
                        no_args_is_help=True)


@draft_app.command("train")
def draft_train(
    target: Annotated[str, typer.Argument(help="Target model: registry name, HF folder or .gguf file.")],
    out: Annotated[Path, typer.Option(help="Folder to write the draft to.")],
    kind: Annotated[str, typer.Option(help="eagle: one layer over the target's hidden states (accel runtime only); "
                                           "layers: a standalone LlamaForCausalLM of target layers.")] = "eagle",
    num_layers: Annotated[int, typer.Option(min=1, max=8, help="Decoder layers of the draft (kind layers).")] = 2,
    minutes: Annotated[float, typer.Option(min=0.1, max=24 * 60, help="Time budget, loading to saving.")] = 30.0,
    num_prompts: Annotated[Optional[int], typer.Option(
        min=1, help="Calibration prompts queued for the target's replies (default: 256 layers; eagle 1200, or 40 "
                    "per budget minute when more).")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=2048, help="Reply length per prompt.")] = 128,
    vocab: Annotated[int, typer.Option(min=1, help="Draft vocabulary (reduced head) size.")] = 8192,
    learning_rate: Annotated[Optional[float], typer.Option(min=0.0, max=1.0,
                                                           help="Default 1e-3 eagle, 5e-4 layers.")] = None,
    layer_choice: Annotated[str, typer.Option(help="first | spread: which target layers initialise it.")] = "first",
    calibration_dir: Annotated[Path, typer.Option(help="JSONL prompt sets with domain labels.")] = Path(
        "calibration_data"),
    train_head: Annotated[bool, typer.Option("--train-head/--frozen-head",
                                             help="Train the draft vocabulary's head rows (own lm_head).")] = True,
    model_written_fraction: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="kind eagle: share of prompts the target writes itself (Magpie-style user turns).")
    ] = 0.5,
    gen_fraction: Annotated[float, typer.Option(
        min=0.05, max=0.95, help="kind eagle: share of the budget spent generating the target's replies (the rest "
                                 "trains).")] = 0.4,
    init_from: Annotated[Optional[Path], typer.Option(
        help="kind eagle: an EAGLE draft folder of this target to go on training on fresh replies (its vocabulary "
             "is kept; use another --seed and a high --model-written-fraction for fresh prompts).")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch CPU threads.")] = None,
) -> None:
    """Distil a small draft from the target's own replies and next-token distributions (CPU, time-boxed)."""
    import torch

    from accel.models import ModelNotFoundError, resolve_model
    from accel.recipe import DISTILL_DEFAULTS, default_num_prompts

    if kind not in DISTILL_DEFAULTS:
        raise typer.BadParameter(f"{kind!r} is invalid; allowed: {', '.join(DISTILL_DEFAULTS)}", param_hint="--kind")
    if init_from is not None and kind != "eagle":
        raise typer.BadParameter(f"given with --kind {kind}; allowed: --kind eagle only", param_hint="--init-from")
    if init_from is not None:
        from accel.draft_training.eagle_train import init_history

        try:
            init_history(init_from)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--init-from") from None
    if threads:
        torch.set_num_threads(threads)
    defaults = DISTILL_DEFAULTS[kind]
    num_prompts = default_num_prompts(kind, minutes) if num_prompts is None else num_prompts
    learning_rate = defaults["learning_rate"] if learning_rate is None else learning_rate
    if layer_choice not in ("first", "spread"):
        raise typer.BadParameter(f"{layer_choice!r} is invalid; allowed: first, spread", param_hint="--layer-choice")
    try:
        target_path = resolve_model(target, pull_if_missing=True)
    except (ModelNotFoundError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if kind == "eagle":
        from accel.draft_training.eagle_train import train_eagle

        r = train_eagle(target_path, out, time_budget_minutes=minutes, calibration_dir=calibration_dir,
                        num_prompts=num_prompts, max_new_tokens=max_new_tokens, learning_rate=learning_rate,
                        draft_vocab_size=vocab, model_written_fraction=model_written_fraction,
                        gen_fraction=gen_fraction, seed=seed, init_from=init_from)
        typer.echo(f"eagle draft: {r.out_dir} (vocab {r.draft_vocab_size}, coverage {r.vocab_coverage:.3f}); "
                   f"{r.num_prompts} replies ({r.num_model_written_prompts} to model-written turns), {r.num_train_positions} positions, {r.num_steps} steps; held-out "
                   f"agreement: first token {r.heldout_top1:.3f}, second given the first {r.heldout_second:.3f}")
        return
    from accel.draft_training.distill import train_draft

    res = train_draft(target_path, out, num_layers=num_layers, time_budget_minutes=minutes,
                      calibration_dir=calibration_dir, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                      learning_rate=learning_rate, seed=seed, draft_vocab_size=vocab, layer_choice=layer_choice,
                      train_head=train_head)
    tail = res.losses[-10:]
    typer.echo(f"draft: {res.out_dir} ({res.num_layers} layers {res.layer_ids}, vocab {res.draft_vocab_size}, "
               f"coverage {res.vocab_coverage:.3f}); {res.num_prompts} replies, {res.num_train_positions} "
               f"positions, {res.num_steps} steps, loss {res.losses[0]:.3f} -> {sum(tail) / len(tail):.3f}")
