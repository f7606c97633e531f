"""Damage-weighted calibration rows for GPTQ: keep every domain near its share, give the rest to the most damaged.

Why (no library does this): GPTQ minimises the layer-output error weighted by the calibration
activations, so the domain mix of the rows decides whose outputs it protects. On SmolLM2-135M the multilingual text
loses several times more (KL) than any other domain at the same plan. A stratified draw knows each row's domain,
so before the oneshot we measure, on a few calibration rows per domain, the KL of the plan's RTN
fake-quantization (the damage GPTQ starts from) and steer the rows. A random draw has no strata and cannot do
this; that is the point of stratifying.

How much to steer comes from a measurement (scripts/bench_calibration.py, 18 GPTQ runs, two sources): a domain's
held-out KL after GPTQ falls with its share s of the calibration tokens as about s^-0.15 (log-log slope -0.13 to
-0.18 for all six domains). With so flat a curve, taking 20% of every domain's share costs it only ~3.5% KL, while
the same 20% of the budget moves the worst domain a lot, and spreading the spare by damage (what minimises the mean)
would starve the least damaged domains. So:

    s_d = keep * base_d + (1 - keep) * w_d,   w_d = damage_d^(1/gamma) / sum(damage^(1/gamma))
    rows_d = largest_remainder(R, s)

base_d is the source's token share of domain d (what a random draw gives it on average; the draw's own share when
the source is unknown), keep (default 0.8) bounds every domain's loss, and w is the minimax water-filling of the
power law KL_d ~ damage_d * s_d^-gamma (gamma = 0.15 measured): the spare goes to the domain(s) with the highest
damage, shared only between domains whose damage is close. Rows of a domain are its own packed rows, evenly spaced,
repeated cyclically if it has fewer than rows_d.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from accel.calibration.allocation import largest_remainder


@dataclass
class DomainWeighting:
    damage: dict[str, float]  # mean KL of the RTN plan per domain, on the probe rows
    shares: dict[str, float]  # fraction of the calibration rows per domain
    rows: dict[str, int]  # rows per domain actually used
    base: dict[str, float] | None = None  # the base share per domain (source tokens, normalised)
    keep: float = 0.8

    def to_dict(self) -> dict:
        return {"damage": self.damage, "shares": self.shares, "rows": self.rows, "base": self.base, "keep": self.keep}


def domain_rows(samples: Sequence, seq_len: int) -> dict[str, torch.Tensor]:
    """Full packed rows [R_d, seq_len] per domain (each domain packed on its own, in draw order)."""
    from accel.calibration import to_batches

    by: dict[str, list] = {}
    for s in samples:
        by.setdefault(s.domain, []).append(s)
    out = {}
    for d, group in by.items():
        full = [b for b in to_batches(group, seq_len, 64) if b.shape[1] == seq_len]
        if full:
            out[d] = torch.cat(full)
    return out


KL_SHARE_ELASTICITY = 0.15  # -d log KL / d log share, measured (module doc)


def shares_from_damage(damage: dict[str, float], base: dict[str, float] | None = None, keep: float = 0.8,
                       gamma: float = KL_SHARE_ELASTICITY) -> dict[str, float]:
    """Row shares: `keep` of each domain's base share, the rest by damage^(1/gamma) (module doc); they sum to 1.

    base: domain -> weight (token counts or shares; normalised here; a domain missing from it has base 0);
    None = equal."""
    if not damage:
        raise ValueError("no domain damage to weight by")
    if not 0.0 <= keep <= 1.0:
        raise ValueError(f"keep={keep} is invalid; allowed: in [0, 1]")
    if gamma <= 0:
        raise ValueError(f"gamma={gamma} is invalid; allowed: > 0")
    d = len(damage)
    base = {k: 1.0 for k in damage} if base is None else {k: max(float(base.get(k, 0.0)), 0.0) for k in damage}
    bsum = sum(base.values())
    base = {k: (v / bsum if bsum > 0 else 1.0 / d) for k, v in base.items()}
    top = max(max(v, 0.0) for v in damage.values())
    # damage relative to the largest before the power, so 1/gamma ~ 7 cannot underflow or overflow
    w = {k: (max(v, 0.0) / top) ** (1.0 / gamma) if top > 0 else 1.0 for k, v in damage.items()}
    wsum = sum(w.values())
    return {k: keep * base[k] + (1.0 - keep) * w[k] / wsum for k in damage}


def pick_rows(per_domain: dict[str, torch.Tensor], counts: dict[str, int]) -> torch.Tensor:
    """counts[d] rows of each domain: evenly spaced over its rows, cycling when it has fewer; domains interleaved."""
    picked = []
    for d, n in counts.items():
        rows = per_domain[d]
        if n <= 0:
            continue
        if n <= rows.shape[0]:
            idx = torch.linspace(0, rows.shape[0] - 1, n).round().long()
        else:
            idx = torch.arange(n) % rows.shape[0]
        picked.append(rows[idx])
    return torch.cat(picked)


@torch.inference_mode()
def damage_weighted_batches(model: nn.Module, schemes: dict[str, str], group_size: int | dict[str, int],
                            samples: Sequence, seq_len: int, total_rows: int, probe_rows: int = 4,
                            base: dict[str, float] | None = None, keep: float = 0.8, batch_size: int | None = None,
                            progress: bool = False) -> tuple[list[torch.Tensor], DomainWeighting]:
    """Calibration batches whose domain mix follows the plan's per-domain RTN damage (see module doc).

    model: the unquantized model (left unchanged); schemes: the plan {module: scheme} (lm_head included or not).
    base: domain -> token count of the calibration source (CalibrationDraw.source_tokens); None or empty = the
    draw's own tokens per domain. Domains with no full row of seq_len tokens are left out (their tokens still shaped
    the draw)."""
    from accel.quant.allocate import joint_quality
    from accel.quant.plan import ROWS_PER_FORWARD

    batch_size = batch_size or ROWS_PER_FORWARD

    if total_rows < 1:
        raise ValueError(f"total_rows={total_rows} is invalid; allowed: >= 1")
    per_domain = domain_rows(samples, seq_len)
    if not per_domain:
        raise ValueError(f"no domain of the draw has a full row of {seq_len} tokens; lower max_seq_len")
    from accel.progress import bar

    damage = {}
    with bar(len(per_domain), "calibration mix (domains probed)", progress) as b:
        for d, rows in per_domain.items():
            probe = rows[torch.linspace(0, rows.shape[0] - 1, min(probe_rows, rows.shape[0])).round().long()]
            damage[d] = joint_quality(model, schemes, group_size, list(probe.split(batch_size))).mean_kl
            b.update(1)
    if not base:
        base = {}
        for u in samples:
            base[u.domain] = base.get(u.domain, 0) + u.num_tokens
    bsum = sum(max(float(base.get(k, 0)), 0.0) for k in damage) or 1.0
    base = {k: max(float(base.get(k, 0)), 0.0) / bsum for k in damage}
    shares = shares_from_damage(damage, base, keep)
    counts = largest_remainder(total_rows, shares)
    rows = pick_rows(per_domain, counts)
    return list(rows.split(batch_size)), DomainWeighting(damage=damage, shares=shares, rows=dict(counts),
                                                      base=base, keep=keep)
