"""Stratified calibration sampling: strata = domain x length bucket.

    samples ──tokenize──► units (short samples packed, or kept for padding)
            ──strata───► {(domain, bucket): [units]}
            ──allocate─► quota per stratum (proportional | equal | weights, largest remainder)
            ──draw─────► train (exactly num_samples when available) + holdout (disjoint, per stratum)

A *unit* is what becomes one calibration sequence: one sample, or, with short_policy "pack", several
short samples of the same stratum joined (separated by the tokenizer's EOS when it has one) until they
reach `min_tokens`. Buckets use a sample's full token count; a unit longer than `max_seq_len` is
truncated to its first `max_seq_len` tokens. Every pack, pad and truncation is reported in `notes`.

`random_draw` makes a draw of the same size that ignores strata, for the stratified-vs-random comparison.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from accel.calibration.allocation import allocate, bucket_index, bucket_labels
from accel.calibration.sources import TextSample, filter_domains

Stratum = tuple[str, str]  # (domain, bucket label)


@dataclass(frozen=True)
class DrawnSample:
    """One calibration sequence. `packed_ids` lists the source samples it is made of (one unless packed);
    `token_ids` may be a truncated prefix of the tokenized `text`."""

    id: str
    domain: str
    bucket: str
    text: str
    token_ids: tuple[int, ...]
    num_tokens: int
    packed_ids: tuple[str, ...]
    full_tokens: int = 0  # tokens before truncation to max_seq_len (0 = unknown, e.g. read back from disk)

    @property
    def truncated(self) -> bool:
        return self.full_tokens > self.num_tokens


@dataclass(frozen=True)
class StratumReport:
    available: int  # units in the stratum
    drawn: int      # units drawn for training
    held_out: int   # units drawn for the holdout set


@dataclass
class CalibrationDraw:
    """What the sampler drew: training and holdout sequences, the strata table and notes."""

    train: list[DrawnSample]
    holdout: list[DrawnSample]
    strata: dict[Stratum, StratumReport]
    notes: list[str] = field(default_factory=list)
    method: str = "stratified"  # "stratified" or "random"
    seed: int = 0
    source_tokens: dict[str, int] = field(default_factory=dict)
    """Tokens per domain in the whole source (every unit, after truncation): the share a random draw gives each
    domain on average; the base of quantization.calibration_mix 'damage'."""
    unused: list[DrawnSample] = field(default_factory=list)
    """The units neither drawn nor held out: more text for steps that need more than the draw (scale tuning)."""


def stratified_draw(samples: Sequence[TextSample], tokenizer, cfg) -> CalibrationDraw:
    """Draw cfg.num_samples training units (and a holdout) stratified by domain x length bucket."""
    units, notes = _prepare(samples, tokenizer, cfg)
    rng = random.Random(cfg.seed)
    weights = _stratum_weights(units, cfg, notes)
    capacity = {k: len(v) for k, v in units.items()}
    quota, capped = allocate(cfg.num_samples, weights, capacity)
    for k in capped:
        notes.append(f"stratum {k} has only {capacity[k]} unit(s), fewer than its share; "
                     f"the remainder was redistributed over the other strata")
    train_total = sum(quota.values())
    if train_total < cfg.num_samples:
        notes.append(f"only {train_total} unit(s) available in the selected strata; drew all of them "
                     f"instead of num_samples={cfg.num_samples}")
    # the holdout total is shared over the strata like the draw (rounding each stratum's share alone left 32 samples
    # over 20+ strata with no holdout at all, and a quality budget with nothing to be checked on)
    want_hold = _round_half_up(train_total * cfg.holdout_fraction)
    hold_quota, _ = allocate(want_hold, {k: quota.get(k, 0) for k in units},
                             {k: len(units[k]) - quota.get(k, 0) for k in units})
    if sum(hold_quota.values()) < want_hold:
        notes.append(f"the holdout has {sum(hold_quota.values())} unit(s) instead of {want_hold} (strata exhausted)")
    train, holdout, unused, strata = [], [], [], {}
    for k, pool in units.items():
        order = rng.sample(range(len(pool)), len(pool))
        n_train, n_hold = quota.get(k, 0), hold_quota.get(k, 0)
        train += [pool[i] for i in order[:n_train]]
        holdout += [pool[i] for i in order[n_train:n_train + n_hold]]
        unused += [pool[i] for i in order[n_train + n_hold:]]
        strata[k] = StratumReport(available=len(pool), drawn=n_train, held_out=n_hold)
    _note_truncation(train + holdout, cfg.max_seq_len, notes)
    return CalibrationDraw(train=train, holdout=holdout, strata=strata, notes=notes, method="stratified", seed=cfg.seed,
                           source_tokens=_tokens_per_domain(units), unused=unused)


def random_draw(samples: Sequence[TextSample], tokenizer, cfg) -> CalibrationDraw:
    """Uniformly random draw of the same size as `stratified_draw` (same units, strata ignored)."""
    units, notes = _prepare(samples, tokenizer, cfg)
    rng = random.Random(cfg.seed)
    flat = [u for pool in units.values() for u in pool]
    n_train = min(cfg.num_samples, len(flat))
    n_hold = min(_round_half_up(n_train * cfg.holdout_fraction), len(flat) - n_train)
    if n_train < cfg.num_samples:
        notes.append(f"only {n_train} unit(s) available; drew all of them instead of num_samples={cfg.num_samples}")
    order = rng.sample(range(len(flat)), len(flat))
    train = [flat[i] for i in order[:n_train]]
    holdout = [flat[i] for i in order[n_train:n_train + n_hold]]
    unused = [flat[i] for i in order[n_train + n_hold:]]
    strata = {}
    for k, pool in units.items():
        strata[k] = StratumReport(available=len(pool), drawn=sum(1 for u in train if (u.domain, u.bucket) == k),
                                  held_out=sum(1 for u in holdout if (u.domain, u.bucket) == k))
    _note_truncation(train + holdout, cfg.max_seq_len, notes)
    return CalibrationDraw(train=train, holdout=holdout, strata=strata, notes=notes, method="random", seed=cfg.seed,
                           source_tokens=_tokens_per_domain(units), unused=unused)


def _tokens_per_domain(units: dict[Stratum, list[DrawnSample]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (domain, _), pool in units.items():
        out[domain] = out.get(domain, 0) + sum(u.num_tokens for u in pool)
    return out


# --- preparation: tokenize, bucket, pack --------------------------------------------------------------------

def _prepare(samples: Sequence[TextSample], tokenizer, cfg) -> tuple[dict[Stratum, list[DrawnSample]], list[str]]:
    """Units per stratum (strata in domain order, then bucket order) and the notes made on the way."""
    if cfg.num_samples < 1:
        raise ValueError(f"calibration.num_samples must be >= 1, got {cfg.num_samples}")
    if not 0 <= cfg.holdout_fraction <= 0.5:
        raise ValueError(f"calibration.holdout_fraction must be in [0, 0.5], got {cfg.holdout_fraction}")
    if cfg.short_policy not in ("pack", "pad"):
        raise ValueError(f"calibration.short_policy must be 'pack' or 'pad', got {cfg.short_policy!r}")
    samples = filter_domains(list(samples), cfg)
    if not samples:
        raise ValueError("no calibration samples to draw from")
    labels = bucket_labels(cfg.length_buckets)
    ids = tokenize(tokenizer, [s.text for s in samples])
    by_stratum: dict[Stratum, list[tuple[TextSample, list[int]]]] = {}
    for s, tok in sorted(zip(samples, ids), key=lambda p: (p[0].domain, bucket_index(len(p[1]), cfg.length_buckets))):
        by_stratum.setdefault((s.domain, labels[bucket_index(len(tok), cfg.length_buckets)]), []).append((s, tok))
    notes: list[str] = []
    rng = random.Random(f"pack-{cfg.seed}")
    sep = _eos_id(tokenizer)
    units = {}
    for k, members in by_stratum.items():
        units[k] = _units_for_stratum(k, members, cfg, rng, sep, notes)
    return units, notes


def tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids per text without special tokens (a `transformers` tokenizer, called on the whole batch)."""
    out = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [list(x) for x in out]


def _eos_id(tokenizer) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if isinstance(eos, int) else None


def _units_for_stratum(k: Stratum, members, cfg, rng: random.Random, sep: int | None, notes: list[str]):
    long = [m for m in members if len(m[1]) >= cfg.min_tokens]
    short = [m for m in members if len(m[1]) < cfg.min_tokens]
    units = [_unit(k, [m], cfg.max_seq_len, sep) for m in long]
    if not short:
        return units
    if cfg.short_policy == "pad":
        units += [_unit(k, [m], cfg.max_seq_len, sep) for m in short]
        notes.append(f"stratum {k}: {len(short)} sample(s) shorter than min_tokens={cfg.min_tokens} kept as is; "
                     f"to_padded_batches pads them (ids: {_preview([m[0].id for m in short])})")
        return units
    # Pack: shuffled (seeded) so packs do not depend on file order; a leftover that stays short joins the
    # previous pack rather than being dropped.
    order = rng.sample(short, len(short))
    packs: list[list] = []
    cur: list = []
    for m in order:
        cur.append(m)
        if _packed_len(cur, sep) >= cfg.min_tokens:
            packs.append(cur)
            cur = []
    if cur:
        if packs:
            packs[-1] += cur
        else:
            packs.append(cur)
            notes.append(f"stratum {k}: all {len(cur)} short sample(s) together have fewer than "
                         f"min_tokens={cfg.min_tokens} tokens; kept as one short unit")
    units += [_unit(k, p, cfg.max_seq_len, sep) for p in packs]
    notes.append(f"stratum {k}: packed {len(short)} sample(s) shorter than min_tokens={cfg.min_tokens} "
                 f"into {len(packs)} unit(s)")
    return units


def _packed_len(members, sep: int | None) -> int:
    return sum(len(t) for _, t in members) + (len(members) - 1 if sep is not None else 0)


def _unit(k: Stratum, members, max_seq_len: int, sep: int | None) -> DrawnSample:
    tokens: list[int] = []
    for i, (_, t) in enumerate(members):
        if i and sep is not None:
            tokens.append(sep)
        tokens += t
    full = len(tokens)
    tokens = tokens[:max_seq_len]
    return DrawnSample(id=members[0][0].id, domain=k[0], bucket=k[1], text="\n\n".join(s.text for s, _ in members),
                       token_ids=tuple(tokens), num_tokens=len(tokens), packed_ids=tuple(s.id for s, _ in members),
                       full_tokens=full)


def _stratum_weights(units: dict[Stratum, list], cfg, notes: list[str]) -> dict[Stratum, Fraction]:
    if cfg.allocation == "proportional":
        return {k: Fraction(len(v)) for k, v in units.items()}
    if cfg.allocation == "equal":
        return {k: Fraction(1) for k in units}
    domain_size: dict[str, int] = {}
    for (d, _), v in units.items():
        domain_size[d] = domain_size.get(d, 0) + len(v)
    if cfg.allocation == "balanced":
        # Domains by sqrt(size) (the temperature sampling of multilingual pretraining mixes, exponent 0.5),
        # buckets by size within a domain. Why: on a skewed source "proportional" starves the rare domains
        # (5 of 128 units for a 5% domain: GPTQ then hardly sees it) and "equal" takes many rows from the common
        # ones; measured by scripts/bench_calibration.py.
        return {k: Fraction(math.sqrt(domain_size[k[0]])) * Fraction(len(v), domain_size[k[0]])
                for k, v in units.items()}
    if cfg.allocation != "weights":
        raise ValueError(f"calibration.allocation must be 'proportional', 'equal', 'balanced' or 'weights', "
                         f"got {cfg.allocation!r}")
    if not cfg.weights:
        raise ValueError("calibration.allocation 'weights' needs calibration.weights (domain -> weight)")
    missing = sorted(d for d in domain_size if d not in cfg.weights)
    if missing:
        notes.append(f"domains without a weight get none: {missing}")
    # A domain's weight is shared over its buckets in proportion to what each bucket holds (exact fractions,
    # so equal shares tie exactly in the largest-remainder rounding).
    return {k: Fraction(cfg.weights.get(k[0], 0.0)) * Fraction(len(v), domain_size[k[0]]) for k, v in units.items()}


def _note_truncation(drawn: list[DrawnSample], max_seq_len: int, notes: list[str]) -> None:
    truncated = [u for u in drawn if u.truncated]
    if truncated:
        notes.append(f"truncated {len(truncated)} drawn unit(s) to max_seq_len={max_seq_len} tokens "
                     f"(ids: {_preview([u.id for u in truncated])})")


def _round_half_up(x: float) -> int:
    # Python's round() rounds halves to even (round(0.5) == 0); a holdout share of half a unit should be 1.
    return int(math.floor(x + 0.5))


def held_out_count(cfg) -> int:
    """The holdout units a draw of cfg.num_samples aims for (fewer only where the source runs out): what
    accel.preflight checks a quality budget against before any work."""
    return _round_half_up(cfg.num_samples * cfg.holdout_fraction)


def _preview(ids: list[str], n: int = 8) -> str:
    return ", ".join(ids[:n]) + (f", ... ({len(ids)} in all)" if len(ids) > n else "")
