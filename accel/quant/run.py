"""The quantize stage: sensitivity -> plan (+ held-out fallback) -> llm-compressor oneshot -> checkpoint.

`run_quantize` is what `accel quantize` and the quantize stages of `accel optimize` call. It writes into run_dir:
sensitivity.json, sensitivity.png, plan.json, checkpoint_quantized/ (compressed-tensors + tokenizer +
accel_plan.json) and quantize.json (stage timings).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from accel.quant.allocate import Budget, Plan, Rules, allocate, apply_overrides, average_bits, check_and_fallback
from accel.quant.heatmap import plot_heatmap
from accel.quant.quantize import oneshot_quantize, save_checkpoint
from accel.quant.schemes import SCHEMES, in_features_of, param_counts, quantizable_linears
from accel.quant.sensitivity import SensitivityResult, measure_sensitivity


@dataclass
class QuantizeResult:
    plan: Plan
    sensitivity: SensitivityResult
    checkpoint: Path
    seconds: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


def rows(batches: Iterable[torch.Tensor], seq_len: int, max_rows: int | None,
         batch_size: int | None = None) -> list[torch.Tensor]:
    """Keep only full-length rows ([B, seq_len] batches), at most `max_rows` rows in total.

    When there are more rows than `max_rows`, the kept rows are spread evenly over the whole stream, not its
    first rows: a stratified draw lists its samples stratum by stratum, so a prefix would be a few domains only
    (measured: the first 32 of 89 rows of a 128-sample draw held chat, code and math and no multilingual, prose
    or structured text).
    """
    full = [b for b in batches if b.shape[1] == seq_len and b.shape[0]]
    if not full or max_rows == 0:
        return []
    all_rows = torch.cat(full)  # [R, seq_len]
    if max_rows is not None and all_rows.shape[0] > max_rows:
        keep = torch.linspace(0, all_rows.shape[0] - 1, max_rows).round().long()  # evenly spaced, sorted, unique
        all_rows = all_rows[keep]
    return list(all_rows.split(batch_size or full[0].shape[0]))


def token_batches(samples: Sequence, seq_len: int, max_rows: int | None, batch_size: int = 4) -> list[torch.Tensor]:
    """Packed [B, seq_len] batches from drawn calibration samples (accel.calibration.to_batches)."""
    from accel.calibration import to_batches

    out = rows(to_batches(samples, seq_len, batch_size), seq_len, max_rows, batch_size)
    if not out:
        total = sum(len(s.token_ids) for s in samples)
        raise ValueError(f"calibration draw has {total} tokens, fewer than one row of {seq_len}; "
                         f"lower max_seq_len or draw more samples")
    return out


def calibration_batches(model: nn.Module, plan: Plan, train: Sequence, recipe, source_tokens: dict | None = None):
    """The oneshot's calibration rows: the draw's rows, or (quantization.calibration_mix 'damage', methods that
    use data) the same number of rows mixed by the plan's per-domain damage. Returns (batches, weighting|None)."""
    q, cal = recipe.quantization, recipe.calibration
    batches = token_batches(train, cal.max_seq_len, cal.num_samples)
    if q.calibration_mix != "damage" or q.method == "rtn":
        return batches, None
    from accel.quant.domain_weighting import damage_weighted_batches

    tokens: dict[str, int] = {}
    for u in train:
        tokens[u.domain] = tokens.get(u.domain, 0) + len(u.token_ids)
    if len(tokens) < 2 or min(tokens.values()) < cal.max_seq_len:
        # one domain: nothing to mix; a domain without one full row would drop out of the mix entirely
        return batches, None
    total = sum(b.shape[0] for b in batches)
    return damage_weighted_batches(model, {**plan.schemes, "lm_head": plan.lm_head}, plan.group_size, train,
                                   cal.max_seq_len, total, base=source_tokens, keep=q.calibration_mix_keep)


def _say(console, msg: str) -> None:
    if console is not None:
        console.log(msg)


def run_quantize(recipe, run_dir: str | Path, model_path: str | Path, draw, model: nn.Module | None = None,
                 tokenizer=None, progress: bool = True) -> QuantizeResult:
    """Sensitivity, allocation, fallback check and library quantization for `recipe.quantization`.

    draw: a CalibrationDraw (train rows feed sensitivity and oneshot; holdout rows feed the fallback check).
    model: the fp32 HF model loaded from `model_path` (loaded here when None); it is left unquantized.
    """
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer

    q = recipe.quantization
    cal = recipe.calibration
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True) if progress else None
    seconds: dict[str, float] = {}
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path)
    names = quantizable_linears(model)
    pc, inf = param_counts(model, names), in_features_of(model, names)
    for n, f in inf.items():
        if {"int4", "int4f"} & set(q.candidates) and f % q.int4_group_size:
            raise ValueError(f"int4_group_size {q.int4_group_size} does not divide in_features {f} of {n}; "
                             f"use 32 or 64")

    t = time.perf_counter()
    sens_batches = token_batches(draw.train, q.sensitivity.max_seq_len, q.sensitivity.num_samples)
    sens = measure_sensitivity(model, sens_batches, q.candidates, q.int4_group_size, q.sensitivity.metric, progress)
    sens.to_json(run_dir / "sensitivity.json")
    plot_heatmap(sens, run_dir / "sensitivity.png")
    seconds["sensitivity"] = time.perf_counter() - t
    _say(console, f"sensitivity ({sens.metric}) over {len(names)} Linears: {seconds['sensitivity']:.0f}s")

    t = time.perf_counter()
    budget, rules = Budget.from_config(q.budget), Rules.from_config(q)
    if sens.metric == "proxy" and budget.kl_limit() is not None:
        # Proxy damage is not in KL units, so a KL / perplexity budget cannot be checked against it: start from
        # the cheapest plan and let the held-out fallback promote Linears in proxy order until the budget holds.
        cheapest = min(q.candidates, key=SCHEMES.index)
        schemes = apply_overrides({n: cheapest for n in names}, q.overrides)
        plan = Plan(schemes=schemes, group_size=q.int4_group_size,
                    avg_bits=average_bits(schemes, pc, inf, q.int4_group_size), estimated_kl=float("nan"),
                    lm_head=rules.lm_head, embeddings=rules.embeddings)
    else:
        plan = allocate(sens, budget, pc, rules, inf)
    if budget.kl_limit() is not None and draw.holdout:
        hold = token_batches(draw.holdout, q.sensitivity.max_seq_len, q.sensitivity.num_samples)
        fixed = [n for n in plan.schemes if any(re.search(p, n) for p in q.overrides)]
        plan = check_and_fallback(model, plan, hold, budget, sens, pc, inf, step=max(1, len(names) // 30),
                                  fixed=fixed, progress=progress)
    plan.to_json(run_dir / "plan.json")
    seconds["allocate"] = time.perf_counter() - t
    _say(console, f"plan {plan.counts()} avg bits {plan.avg_bits:.2f} est KL {plan.estimated_kl:.4f} "
                  f"measured KL {plan.measured_kl}")

    t = time.perf_counter()
    cal_batches, weighting = calibration_batches(model, plan, draw.train, recipe,
                                                   getattr(draw, "source_tokens", None))
    if weighting is not None:
        _say(console, f"calibration rows by domain damage: {weighting.rows}")
    # llm-compressor modifies the model it gets in place: give it a fresh copy, keep the caller's model intact
    fresh = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    res = oneshot_quantize(fresh, plan, cal_batches, q.method, q.gptq_dampening, tokenizer)
    ck = save_checkpoint(res.model, plan, run_dir / "checkpoint_quantized", tokenizer)
    seconds["quantize"] = time.perf_counter() - t
    _say(console, f"{q.method} oneshot + save: {seconds['quantize']:.0f}s -> {ck}")
    (run_dir / "quantize.json").write_text(json.dumps({"seconds": seconds, "method": q.method,
                                                       "counts": plan.counts(), "avg_bits": plan.avg_bits,
                                                       "calibration_mix": weighting.to_dict() if weighting else None},
                                                      indent=1))
    files = {k: str(run_dir / v) for k, v in (("sensitivity", "sensitivity.json"), ("heatmap", "sensitivity.png"),
                                              ("plan", "plan.json"), ("checkpoint", "checkpoint_quantized"))}
    return QuantizeResult(plan=plan, sensitivity=sens, checkpoint=ck, seconds=seconds, files=files)

