"""What the quantize stages of `accel optimize` run between sensitivity and llm-compressor: calibration rows,
the plan (allocation + held-out fallback) and the damage-weighted calibration mix."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from accel import schemes
from accel.export.compatibility import VLLM_TARGETS
from accel.quant.allocate import Budget, Plan, Rules, allocate, check_and_fallback, overridden_units
from accel.quant.schemes import fake_quant, in_features_of, param_counts, quantizable_linears
from accel.quant.sensitivity import SensitivityResult


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


ROWS_PER_FORWARD = 1
"""Calibration rows per forward of the fp32 model (sensitivity, the plan's check, the calibration mix): what a
forward holds grows with its tokens times the model's width and vocabulary (a 152k vocabulary's logits and their
gradients: 3 GB per 1k tokens), and one row of 256-512 tokens already fills the GEMMs. Qwen2.5-Coder-1.5B's
sensitivity at 4 rows of 256 peaked far above one row's (docs/DESIGN.md, Memory)."""


def token_batches(samples: Sequence, seq_len: int, max_rows: int | None,
                  batch_size: int = ROWS_PER_FORWARD) -> list[torch.Tensor]:
    """Packed [B, seq_len] batches from drawn calibration samples (accel.calibration.to_batches)."""
    from accel.calibration import to_batches

    out = rows(to_batches(samples, seq_len, batch_size), seq_len, max_rows, batch_size)
    if not out:
        total = sum(len(s.token_ids) for s in samples)
        raise ValueError(f"calibration draw has {total} tokens, fewer than one row of {seq_len}; "
                         f"lower max_seq_len or draw more samples")
    return out


def calibration_batches(load_model: Callable[[], nn.Module], plan: Plan, train: Sequence, recipe,
                        source_tokens: dict | None = None, progress: bool = False):
    """The oneshot's calibration rows: the draw's rows, or (quantization.calibration_mix 'damage', methods that
    use data) the same number of rows mixed by the plan's per-domain damage, measured on the fp32 model
    `load_model()` returns (loaded only then). Returns (batches, weighting|None)."""
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
    return damage_weighted_batches(load_model(), {**plan.schemes, "lm_head": plan.lm_head}, plan.sizes(), train,
                                   cal.max_seq_len, total, base=source_tokens, keep=q.calibration_mix_keep,
                                   progress=progress)


JOIN_BELOW = 0.5  # a scheme joins the candidates where its weight error is under half of the one it joins


@torch.no_grad()
def joining_candidates(model: nn.Module, candidates: Sequence[str], group_size: int, export_target: str | None
                       ) -> tuple[list[str], dict[str, float]]:
    """The candidates with every scheme added that `joins_beside` one of them and reproduces the weights far better
    (int4f beside int4: weights already on a float-min grid, GGUF Q4_1 / Q4_K releases, are exact at int4f and ~8%
    off at int4; it costs more bits, and the allocator weighs both per unit). Not where the export's loader cannot
    take it (vLLM: no float-zero-point kernel). Returns (candidates, {compared scheme: its weight error / the
    joined one's over the quantizable Linears})."""
    cands, ratios = list(candidates), {}
    for name in schemes.names("candidate"):
        s = schemes.get(name)
        if (s.joins_beside not in cands or name in cands
                or (export_target is not None and export_target not in s.loaders)):
            continue
        err_base = err = 0.0
        for linear in quantizable_linears(model):
            w = model.get_submodule(linear).weight.float()
            err_base += float((fake_quant(w, s.joins_beside, group_size) - w).pow(2).sum())
            err += float((fake_quant(w, name, group_size) - w).pow(2).sum())
        ratios[name] = err / max(err_base, 1e-30)
        if ratios[name] < JOIN_BELOW:
            cands.append(name)
    return cands, ratios


def table_scheme(tied: bool, q, export_target: str | None) -> str:
    """The embedding table's scheme for a recipe's quantization section `q` (`tied`: the model ties its lm_head to
    the table): `q.table`, or by default the INT8 lm_head's (int8 / int8g), else fp16. A tied model's table is its
    lm_head's (stored once, at the head's integers: `accel.quant.quantize.tie_int8_table`) or 16 bits; an untied
    model's is rounded on its own (`quantize_table`). A vLLM export keeps 16 bits: vLLM ties only an unquantized
    table and quantizes no embedding; transformers loads no 4-bit one. An untied table is the largest matrix of a
    small model with a large vocabulary."""
    head_ties = schemes.get(q.lm_head).ties_table
    scheme = q.table or (q.lm_head if head_ties else "fp16")
    if export_target in VLLM_TARGETS and q.table not in (None, "fp16"):
        raise ValueError(f"quantization.table {q.table!r} with export.target {export_target!r}: vLLM quantizes no "
                         "embedding; allowed: fp16, or leave it unset")
    if export_target in VLLM_TARGETS:
        return "fp16"
    if scheme == "int4" and export_target not in (None, "accel"):
        raise ValueError(f"quantization.table 'int4' with export.target {export_target!r}: transformers loads no "
                         "4-bit embedding (accel's runtime does); allowed: export.target accel, or table int8 / int8g")
    tied_ok = ("fp16", q.lm_head) if head_ties else ("fp16",)
    if tied and scheme not in tied_ok:
        raise ValueError(f"quantization.table {scheme!r}: this model ties its table to its lm_head ({q.lm_head!r}), "
                         f"stored once at an INT8 head's integers; allowed: {', '.join(tied_ok)}")
    return scheme


def allocates(q) -> bool:
    """Whether a recipe's quantization section leaves the plan anything to choose (more than one candidate or
    INT4 group size); with one, every unit gets it, sensitivity is not measured and no budget applies."""
    return len(q.candidates) > 1 or len(q.int4_group_sizes) > 1


def holdout_problem(holdout: Sequence, q) -> str | None:
    """Why the held-out draw cannot check the recipe's quality budget (None when it can, or no quality budget is
    set): the check needs at least one row of sensitivity.max_seq_len tokens."""
    if Budget.from_config(q.budget).kl_limit() is None or not allocates(q):
        return None
    try:
        if token_batches(holdout, q.sensitivity.max_seq_len, q.sensitivity.num_samples):
            return None
    except ValueError:
        pass
    return (f"the quality budget ({q.budget}) needs held-out calibration text to be checked on: the holdout has "
            f"{len(holdout)} unit(s), less than one row of sensitivity.max_seq_len={q.sensitivity.max_seq_len} "
            "tokens; raise calibration.holdout_fraction or num_samples, or lower sensitivity.max_seq_len")


# vLLM-CPU's oneDNN INT8 GEMM on a CPU without VNNI (AVX2, or AVX-512 before Cascade Lake) adds each pair of u8 x s8
# products in saturating 16-bit lanes (vpmaddubsw, activations shifted to u8): on full-range INT8 weights its W8A8
# Linears were measurably off here (SmolLM2's export: greedy output parted from accel's on some eval prompts;
# docs/DESIGN.md, Quantization: `w8a8`). Weights within 7 bits never saturate (2 x 255 x 64 < 2^15).
VLLM_CPU_W8A8_BITS = 7


def w8a8_weight_bits(export_target: str | None) -> int:
    """The range of w8a8 weights for an export target: 7 bits for vllm-cpu (exact on every vLLM-CPU build), else 8."""
    return VLLM_CPU_W8A8_BITS if export_target == "vllm-cpu" else 8


def build_plan(model: nn.Module, sens: SensitivityResult, q, holdout: Sequence = (), progress: bool = False,
               export_target: str | None = None) -> Plan:
    """The plan for `q` (a recipe's quantization section): budgeted allocation over the sensitivity's units (INT4 at
    any group size measured, chosen per unit), then the held-out check that promotes units until a quality budget
    holds (`model`: the fp32 model, unchanged). Both sensitivity metrics are in KL units (the proxy estimates the
    KL), so a quality budget is allocated directly. `export_target` decides the table's scheme (`table_scheme`) and
    the range of w8a8 weights (`w8a8_weight_bits`)."""
    units = sens.unit_map()
    names = [m for ms in units.values() for m in ms]
    pc, inf = param_counts(model, names), in_features_of(model, names)
    budget, rules = Budget.from_config(q.budget), Rules.from_config(q)
    plan = allocate(sens, budget, pc, rules, inf)
    plan.tied = bool(getattr(model.config, "tie_word_embeddings", False))
    plan.table = table_scheme(plan.tied, q, export_target)
    plan.w8a8_weight_bits = w8a8_weight_bits(export_target)
    if budget.kl_limit() is None or len(sens.candidates) == 1:  # one candidate: nothing to promote to
        return plan
    problem = holdout_problem(holdout, q)
    if problem:  # a quality budget is checked on held-out text, never assumed
        raise ValueError(problem)
    hold = token_batches(holdout, q.sensitivity.max_seq_len, q.sensitivity.num_samples)
    return check_and_fallback(model, plan, hold, budget, sens, pc, inf, step=max(1, len(units) // 30),
                              fixed=overridden_units(units, q.overrides), progress=progress)
