"""Bit allocation: choose int4 / int8 / fp16 per unit under the recipe's budget, then check it for real.

A unit is a fused module (q/k/v, gate/up: one scheme for all members, as vLLM and accel's runtime load them) or a
Linear fused with nothing (`accel.quant.schemes.quant_units`); plans store the scheme of every member Linear.

`allocate` is greedy by damage per bit saved. It starts from every unit at its most precise option and repeatedly
takes the cheapest demotion (a unit moves to an option of fewer bits) ranked by
    added damage / bits saved       (bits saved = delta bits per weight x parameter count)
while the budget still holds. An option is a candidate scheme, and for INT4 each group size measured, so each unit
gets its own group size (int4-mixed, 32 or 64 per unit: the same held-out KL after GPTQ as 64 for all).
Damage is assumed ADDITIVE across units (the joint KL of a plan is estimated as the sum of the single-unit KLs);
this is first-order accurate for small perturbations, and
`check_and_fallback` corrects what it misses by measuring the joint KL of the plan on held-out tokens.

Budgets (exactly one):
- max_mean_kl: estimated mean KL <= budget.
- max_ppl_increase_pct p: converted to a KL budget ln(1 + p/100), because for a calibrated model the expected
  increase of cross-entropy from a perturbation is about its KL; the fallback then measures perplexity itself.
- target_avg_bits: demote until the parameter-weighted average bits <= target (size budget, no quality check).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from accel.quant.schemes import (HEAD, INT8_GROUP, TABLE, GroupSizes, bits_per_weight, check_scheme, expand_units,
                                 fake_quantized, group_size_of, group_sized)
from accel.quant.schemes import schemes as scheme_order
from accel.quant.sensitivity import SensitivityResult, f64_rows, kl_sum


@dataclass(frozen=True)
class Budget:
    """Mirror of recipe.BudgetConfig (exactly one field set)."""

    max_mean_kl: float | None = None
    max_ppl_increase_pct: float | None = None
    target_avg_bits: float | None = None

    def __post_init__(self):
        given = [k for k, v in asdict(self).items() if v is not None]
        if len(given) != 1:
            raise ValueError(f"set exactly one budget (max_mean_kl, max_ppl_increase_pct, target_avg_bits), got {given}")

    @classmethod
    def from_config(cls, cfg) -> Budget:
        return cls(cfg.max_mean_kl, cfg.max_ppl_increase_pct, cfg.target_avg_bits)

    def kl_limit(self) -> float | None:
        if self.max_mean_kl is not None:
            return self.max_mean_kl
        if self.max_ppl_increase_pct is not None:
            return math.log1p(self.max_ppl_increase_pct / 100.0)
        return None


@dataclass(frozen=True)
class Rules:
    """Explicit rules outside the allocation: the lm_head scheme and regex overrides (applied last)."""

    lm_head: str = "int8"
    overrides: dict[str, str] = field(default_factory=dict)
    lm_head_group_size: int = INT8_GROUP

    @classmethod
    def from_config(cls, cfg) -> Rules:
        return cls(lm_head=cfg.lm_head, overrides=dict(cfg.overrides), lm_head_group_size=cfg.lm_head_group_size)


@dataclass
class Plan:
    """The bit plan. `schemes` covers the quantizable Linears (members of a unit share one); `units` maps each
    unit to its members; the lm_head follows the recipe's rule, the embedding table `table`."""

    schemes: dict[str, str]
    group_size: int
    avg_bits: float
    estimated_kl: float
    lm_head: str = "fp16"
    measured_kl: float | None = None
    measured_ppl_increase_pct: float | None = None
    promoted: list[str] = field(default_factory=list)
    """Units promoted by the accuracy-driven fallback, in order."""
    units: dict[str, list[str]] = field(default_factory=dict)
    group_sizes: dict[str, int] = field(default_factory=dict)
    """INT4 Linears at a group size other than `group_size` (the allocator chooses one per unit)."""
    table: str = "fp16"
    """The embedding table's scheme (`accel.quant.plan.table_scheme`): a tied model's INT8 table is stored once, at
    the head's integers; the held-out check measures it as stored."""
    tied: bool = False
    """The model ties its lm_head to the table (llm-compressor unties them while it quantizes)."""
    lm_head_group_size: int = INT8_GROUP
    """An int8g lm_head's (and tied table's) group of inputs per fp16 scale."""
    w8a8_weight_bits: int = 8
    """The range w8a8 Linears' INT8 weights are quantized within: 8, or 7 (in [-64, 63]) for vLLM-CPU
    (`accel.quant.plan.w8a8_weight_bits`); stored as 8-bit weights either way."""

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for v in self.schemes.values() if v == s) for s in scheme_order()}

    def sizes(self) -> GroupSizes:
        """{Linear: INT4 group size} (what fake quantization, the bit count and the checkpoint take)."""
        head = {n: self.lm_head_group_size for n, s in ((HEAD, self.lm_head), (TABLE, self.table)) if s == "int8g"}
        return GroupSizes(self.group_size, {**self.group_sizes, **head})

    def size_counts(self) -> dict[str, int]:
        """{group size: INT4 Linears at it}."""
        sizes = self.sizes()
        out: dict[str, int] = {}
        for n, s in self.schemes.items():
            if group_sized(s):
                out[str(sizes[n])] = out.get(str(sizes[n]), 0) + 1
        return dict(sorted(out.items()))

    def unit_map(self) -> dict[str, list[str]]:
        """{unit: members}; a plan without units treats every Linear as its own unit."""
        return self.units or {n: [n] for n in self.schemes}

    def unit_schemes(self) -> dict[str, str]:
        """{unit: scheme} (what the report shows and vLLM loads per fused module)."""
        return {u: self.schemes[ms[0]] for u, ms in self.unit_map().items()}

    def all_schemes(self) -> dict[str, str]:
        """{module: scheme} including lm_head (what the runtime's apply_plan takes)."""
        return {**self.schemes, "lm_head": self.lm_head}

    def measured_schemes(self, schemes: dict[str, str] | None = None) -> dict[str, str]:
        """What the held-out check fake-quantizes: the Linears (`schemes`, default the plan's), the lm_head, and the
        embedding table when it is stored at 8 bits."""
        out = {**(self.schemes if schemes is None else schemes), "lm_head": self.lm_head}
        return {**out, TABLE: self.table} if self.table != "fp16" else out

    def to_json(self, path: str | Path | None = None) -> str:
        data = asdict(self)
        data["counts"] = self.counts()
        text = json.dumps(data, indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Plan:
        p = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        data = json.loads(p.read_text() if p is not None else str(text_or_path))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})  # "counts" is derived


def average_bits(schemes: dict[str, str], param_counts: dict[str, int], in_features: dict[str, int],
                 group_size: int | dict[str, int]) -> float:
    """Parameter-count-weighted mean bits per weight (metadata included, see schemes.py)."""
    total = sum(param_counts[n] for n in schemes)
    bits = sum(bits_per_weight(s, in_features[n], group_size_of(group_size, n)) * param_counts[n]
               for n, s in schemes.items())
    return bits / total


def _damage(sens: SensitivityResult, unit: str, scheme: str, group_size: int) -> float:
    """A unit's measured damage at a scheme (INT4 at its group size; INT8's does not depend on it)."""
    if scheme == "fp16":
        return 0.0
    by_g = sens.by_group_size()
    return by_g.get(group_size, sens).damage[unit].get(scheme, 0.0)


def estimated_kl(sens: SensitivityResult, schemes: dict[str, str], group_size: int | dict[str, int] | None = None
                 ) -> float:
    """Sum of the single-unit damages of a plan ({Linear: scheme}) under the additive assumption."""
    gs = sens.group_size if group_size is None else group_size
    return sum(_damage(sens, unit, schemes.get(members[0], "fp16"), group_size_of(gs, members[0]))
               for unit, members in sens.unit_map().items())


def _ordered(candidates: Sequence[str]) -> list[str]:
    return [s for s in scheme_order() if s in candidates]


def apply_overrides(schemes: dict[str, str], overrides: dict[str, str],
                    units: dict[str, list[str]] | None = None) -> dict[str, str]:
    """The recipe's regex overrides on {unit: scheme}: a pattern that matches a unit's name or any of its members'
    sets the whole unit (an override never splits a fused module)."""
    out = dict(schemes)
    units = units or {}
    for pattern, scheme in overrides.items():
        check_scheme(scheme)
        rx = re.compile(pattern)
        for u in out:
            if any(rx.search(n) for n in (u, *units.get(u, []))):
                out[u] = scheme
    return out


def overridden_units(units: dict[str, list[str]], overrides: dict[str, str]) -> list[str]:
    """Units an override names (the fallback never promotes them)."""
    return [u for u, ms in units.items() if any(re.search(p, n) for p in overrides for n in (u, *ms))]


def allocate(
    sensitivity: SensitivityResult,
    budget: Budget,
    param_counts: dict[str, int],
    rules: Rules = Rules(),
    in_features: dict[str, int] | None = None,
) -> Plan:
    """Greedy allocation over units by damage per bit saved (module doc); overrides fix their units first.
    param_counts / in_features are per Linear. INT4 options come at every group size the sensitivity measured."""
    units = sensitivity.unit_map()
    names = [m for ms in units.values() for m in ms]
    missing = [n for n in names if n not in param_counts]
    if missing:
        raise ValueError(f"param_counts lacks {missing[:3]}{'...' if len(missing) > 3 else ''}")
    by_g = sensitivity.by_group_size()
    cands = _ordered({s for r in by_g.values() for s in r.candidates})
    default_gs = sensitivity.group_size
    sizes = sorted(by_g)
    in_features = in_features or {n: default_gs for n in names}  # only int8 metadata depends on it (tiny)

    def bits(u, s, g):
        return sum(bits_per_weight(s, in_features[m], g) * param_counts[m] for m in units[u])

    def at(s, only):  # the group sizes whose measurement has scheme s (int4f joins only where exact: plan.py)
        if not group_sized(s):
            return [default_gs]
        return [g for g in sizes if s in by_g[g].candidates] or (sizes if only else [])

    def options(u, only=None):  # (scheme, group size, damage, bits), most bits first
        out = [(s, g, _damage(sensitivity, u, s, g), bits(u, s, g))
               for s in (cands if only is None else [only]) for g in at(s, only)]
        return sorted(out, key=lambda o: -o[3])

    fixed = apply_overrides({u: "" for u in units}, rules.overrides, units)
    opts = {u: options(u, fixed[u] or None) for u in units}
    choice = {u: o[0] for u, o in opts.items()}
    total_params = sum(param_counts[n] for n in names)
    kl_limit = budget.kl_limit()
    cur_kl = sum(c[2] for c in choice.values())
    cur_bits = sum(c[3] for c in choice.values())

    def done() -> bool:
        return budget.target_avg_bits is not None and cur_bits / total_params <= budget.target_avg_bits + 1e-9

    while not done():
        best = None  # (ratio, unit, option)
        for u, c in choice.items():
            for o in opts[u]:
                if o[3] >= c[3]:
                    continue
                d_kl = o[2] - c[2]
                if kl_limit is not None and cur_kl + d_kl > kl_limit:
                    continue
                key = (d_kl / (c[3] - o[3]), u, o)
                if best is None or key[0] < best[0]:
                    best = key
        if best is None:
            break
        _, u, o = best
        cur_kl += o[2] - choice[u][2]
        cur_bits -= choice[u][3] - o[3]
        choice[u] = o
    if budget.target_avg_bits is not None and not done():
        raise ValueError(f"target_avg_bits {budget.target_avg_bits} is unreachable with candidates {cands} "
                         f"and overrides {rules.overrides}; the lowest is {cur_bits / total_params:.3f}")
    if budget.target_avg_bits is not None:
        # the last demotion can overshoot by a whole unit (Gemma 3's gate_up: 0.2 bits on average): the bits left
        # under the target go back to the units that save the most damage per bit
        room = budget.target_avg_bits * total_params - cur_bits
        while True:
            best = None  # (damage saved per bit, unit, option)
            for u, c in choice.items():
                for o in opts[u]:
                    if o[3] <= c[3] or o[3] - c[3] > room + 1e-9 or o[2] >= c[2]:
                        continue
                    key = ((c[2] - o[2]) / (o[3] - c[3]), u, o)
                    if best is None or key[0] > best[0]:
                        best = key
            if best is None:
                break
            _, u, o = best
            room -= o[3] - choice[u][3]
            cur_kl += o[2] - choice[u][2]
            cur_bits += o[3] - choice[u][3]
            choice[u] = o
    group_sizes = {m: c[1] for u, c in choice.items() if group_sized(c[0]) and c[1] != default_gs
                   for m in units[u]}
    return Plan(schemes=expand_units({u: c[0] for u, c in choice.items()}, units), group_size=default_gs,
                avg_bits=cur_bits / total_params, estimated_kl=cur_kl, lm_head=rules.lm_head, units=units,
                group_sizes=group_sizes, lm_head_group_size=rules.lm_head_group_size)


# --- accuracy-driven fallback ---------------------------------------------------------------------------------

@dataclass
class JointQuality:
    mean_kl: float
    ppl_ref: float
    ppl_quant: float

    @property
    def ppl_increase_pct(self) -> float:
        return 100.0 * (self.ppl_quant / self.ppl_ref - 1.0)


@dataclass
class _Reference:
    logits: list[torch.Tensor]  # per batch [B*S, V]
    nll: float
    ntok: int


def _nll(logits: torch.Tensor, ids: torch.Tensor) -> float:
    """Summed next-token NLL; logits [B*S, V] of ids [B, S] (predict token t+1 from position t)."""
    B, S = ids.shape
    rows = logits.reshape(B, S, -1)[:, :-1].reshape(B * (S - 1), -1)  # [B*(S-1), V]
    targets = ids[:, 1:].reshape(-1)
    total, n = 0.0, f64_rows(rows.shape[-1])
    for i in range(0, rows.shape[0], n):
        chunk = rows[i:i + n].double()
        total += float((chunk.logsumexp(-1) - chunk.gather(-1, targets[i:i + n, None])[:, 0]).sum())
    return total


@torch.inference_mode()
def _reference(model: nn.Module, batches: Sequence[torch.Tensor]) -> _Reference:
    all_logits, nll, ntok = [], 0.0, 0
    for ids in batches:
        logits = model(ids, use_cache=False).logits.float()
        flat = logits.reshape(-1, logits.shape[-1])  # [B*S, V]
        all_logits.append(flat)
        nll += _nll(flat, ids)
        ntok += ids.shape[0] * (ids.shape[1] - 1)
    return _Reference(all_logits, nll, ntok)


@torch.inference_mode()
def joint_quality(model: nn.Module, schemes: dict[str, str], group_size: int | dict[str, int],
                  batches: Sequence[torch.Tensor],
                  ref: _Reference | None = None) -> JointQuality:
    """Mean KL and perplexities of the whole plan (all Linears fake-quantized at once) on `batches`."""
    ref = ref or _reference(model, batches)
    kl, nll, n = 0.0, 0.0, 0
    with fake_quantized(model, schemes, group_size):
        for ids, ref_logits in zip(batches, ref.logits):
            logits = model(ids, use_cache=False).logits.float()
            flat = logits.reshape(-1, logits.shape[-1])  # [B*S, V]
            kl += kl_sum(ref_logits, flat)
            n += flat.shape[0]
            nll += _nll(flat, ids)
    return JointQuality(mean_kl=kl / n, ppl_ref=math.exp(ref.nll / ref.ntok), ppl_quant=math.exp(nll / ref.ntok))


def _holds(q: JointQuality, budget: Budget) -> bool:
    if budget.max_mean_kl is not None:
        return q.mean_kl <= budget.max_mean_kl
    if budget.max_ppl_increase_pct is not None:
        return q.ppl_increase_pct <= budget.max_ppl_increase_pct
    return True  # a size budget has no quality condition


def promotion_order(plan: Plan, sensitivity: SensitivityResult, candidates: Sequence[str]) -> list[str]:
    """Units that can still be promoted, worst (largest estimated damage at its current scheme) first."""
    cands = _ordered(candidates)
    current, units, sizes = plan.unit_schemes(), plan.unit_map(), plan.sizes()
    movable = [u for u, s in current.items() if s in cands and cands.index(s) < len(cands) - 1]
    return sorted(movable, key=lambda u: -_damage(sensitivity, u, current[u], sizes[units[u][0]]))


def check_and_fallback(
    model: nn.Module,
    plan: Plan,
    holdout_batches: Sequence[torch.Tensor],
    budget: Budget,
    sensitivity: SensitivityResult,
    param_counts: dict[str, int],
    in_features: dict[str, int] | None = None,
    step: int = 1,
    max_rounds: int = 50,
    fixed: Sequence[str] = (),
    progress: bool = True,
) -> Plan:
    """Measure the plan's real joint KL / perplexity on held-out tokens; promote the worst units until it holds.

    Each round promotes the `step` units with the largest estimated damage by one precision level (int4 -> int8
    -> fp16 among the candidates) and measures again. `fixed` units (overrides) are never promoted.
    Returns a new Plan with measured_kl / measured_ppl_increase_pct and the promoted units in order.
    """
    if not holdout_batches:
        raise ValueError("check_and_fallback needs held-out batches, got none")
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    from accel.progress import bar as progress_bar

    cands = _ordered(sensitivity.candidates)
    in_features = in_features or {n: plan.group_size for n in plan.schemes}
    schemes = dict(plan.schemes)
    promoted: list[str] = []
    ref = _reference(model, holdout_batches)
    bar = progress_bar(max_rounds, "fallback check (rounds at most)", progress)
    sizes = plan.sizes()
    q = joint_quality(model, plan.measured_schemes(schemes), sizes, holdout_batches, ref)
    rounds = 0
    units = plan.unit_map()
    while not _holds(q, budget) and rounds < max_rounds:
        cur = Plan(schemes=schemes, group_size=plan.group_size, avg_bits=0, estimated_kl=0, units=units,
                   group_sizes=plan.group_sizes)
        order = [u for u in promotion_order(cur, sensitivity, cands) if u not in fixed]
        if not order:
            break
        for u in order[:step]:
            up = cands[cands.index(schemes[units[u][0]]) + 1]
            schemes.update({m: up for m in units[u]})
            promoted.append(u)
        q = joint_quality(model, plan.measured_schemes(schemes), sizes, holdout_batches, ref)
        rounds += 1
        bar.update(1)
        bar.set_postfix(kl=f"{q.mean_kl:.4f}", ppl=f"{q.ppl_increase_pct:+.2f}%")
    bar.close()
    return Plan(schemes=schemes, group_size=plan.group_size,
                avg_bits=average_bits(schemes, param_counts, in_features, sizes),
                estimated_kl=estimated_kl(sensitivity, schemes, sizes), lm_head=plan.lm_head,
                measured_kl=q.mean_kl, measured_ppl_increase_pct=q.ppl_increase_pct,
                promoted=plan.promoted + promoted, units=plan.units, table=plan.table, tied=plan.tied,
                lm_head_group_size=plan.lm_head_group_size,
                group_sizes={n: g for n, g in plan.group_sizes.items() if group_sized(schemes[n])})
