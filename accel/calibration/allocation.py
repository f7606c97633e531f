"""Allocation of a sample budget over strata, and length-bucket labels. Pure functions, no I/O.

Glossary
- stratum: one (domain, length bucket) cell.
- capacity: how many units a stratum can give (its available samples).
- quota: how many units a stratum is asked for.

Largest-remainder rounding (Hamilton's method) turns real-valued shares into integers that sum exactly to
the budget. A stratum whose share exceeds its capacity gives what it has; the shortfall is shared out
again over the strata that still have room, by the same weights, until the budget is met or every stratum
is empty.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from fractions import Fraction


def bucket_labels(bounds: Sequence[int]) -> list[str]:
    """Labels of the buckets defined by increasing upper bounds, e.g. [64, 256] -> ['<=64', '65-256', '>256']."""
    if not bounds or any(b <= a for a, b in zip(bounds, bounds[1:])) or bounds[0] < 1:
        raise ValueError(f"length buckets must be a non-empty strictly increasing list of positive ints, got {list(bounds)}")
    labels, lo = [], 1
    for hi in bounds:
        labels.append(f"<={hi}" if lo == 1 else f"{lo}-{hi}")
        lo = hi + 1
    return labels + [f">{bounds[-1]}"]


def bucket_index(num_tokens: int, bounds: Sequence[int]) -> int:
    """Index of the bucket holding num_tokens (the last bucket is open-ended)."""
    for i, hi in enumerate(bounds):
        if num_tokens <= hi:
            return i
    return len(bounds)


def largest_remainder(total: int, weights: Mapping[Hashable, float]) -> dict[Hashable, int]:
    """Integers proportional to weights that sum to exactly `total` (ties go to the earlier key)."""
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if any(w < 0 for w in weights.values()):
        raise ValueError(f"weights must be >= 0, got {dict(weights)}")
    # Exact rational arithmetic: float rounding must not decide ties between equal remainders.
    fw = {k: Fraction(w) for k, w in weights.items()}
    wsum = sum(fw.values())
    if wsum <= 0:
        if total:
            raise ValueError(f"cannot share {total} over weights that sum to 0")
        return dict.fromkeys(weights, 0)
    exact = {k: total * w / wsum for k, w in fw.items()}
    alloc = {k: int(x) for k, x in exact.items()}
    order = {k: i for i, k in enumerate(weights)}
    by_remainder = sorted(weights, key=lambda k: (-(exact[k] - alloc[k]), order[k]))
    for k in by_remainder[:total - sum(alloc.values())]:
        alloc[k] += 1
    return alloc


def allocate(total: int, weights: Mapping[Hashable, float], capacity: Mapping[Hashable, int]
             ) -> tuple[dict[Hashable, int], list[Hashable]]:
    """Share `total` over strata by weight, never above capacity; shortfalls are redistributed.

    Returns (quota per stratum, strata that were capped at their capacity). The quotas sum to
    min(total, capacity of all strata with positive weight).
    """
    quota = dict.fromkeys(weights, 0)
    capped: list[Hashable] = []
    active = [k for k in weights if weights[k] > 0 and capacity.get(k, 0) > 0]
    target = min(total, sum(capacity[k] for k in active))
    while sum(quota.values()) < target:
        share = largest_remainder(target - sum(quota.values()), {k: weights[k] for k in active})
        for k in active:
            room = capacity[k] - quota[k]
            if share[k] > room and k not in capped:
                capped.append(k)
            quota[k] += min(share[k], room)
        active = [k for k in active if quota[k] < capacity[k]]
    return quota, capped
