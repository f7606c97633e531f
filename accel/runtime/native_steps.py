"""Bursts of steps in one native call (`NativeDecode`), and the list inputs a native step takes: what the model
runner hands the native side when a step, or several, run without Python between them."""

from __future__ import annotations

from torch import Tensor

from accel.runtime.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput, SpecBurst


def decode_steps(native, sched: SchedulerOutput, kv_caches: list, block_size: int, feature_cache: Tensor | None
                 ) -> ModelRunnerOutput:
    """`sched.num_steps` greedy decode steps in one native call (each request one row); they end early after a
    step in which a request drew one of its stop tokens (eos unless ignored, stop_token_ids)."""
    bs = block_size
    ids, positions, stops = [], [], []
    for r in sched.scheduled:
        seq = r.seq
        ids.append(seq.token_slice(seq.num_computed_tokens, seq.num_computed_tokens + 1)[0])
        positions.append(seq.num_computed_tokens)
        stop = list(seq.params.stop_token_ids)
        if seq.eos_token_id is not None and not seq.params.ignore_eos:
            stop.append(seq.eos_token_id)
        stops.append(stop)
    # never past a request's own blocks (a padded table entry would point into another request's block)
    num_steps = min([sched.num_steps] + [len(r.seq.block_tables[0]) * bs - p
                                         for r, p in zip(sched.scheduled, positions)])
    nb = -(-(max(positions) + num_steps) // bs)
    flat: list[int] = []  # [groups, T, nb]
    for g in range(len(sched.scheduled[0].seq.block_tables)):
        for r in sched.scheduled:
            bt = r.seq.block_tables[g][:nb]
            flat.extend(bt + [0] * (nb - len(bt)))
    tokens = native.steps(kv_caches, ids, positions, flat, nb, num_steps, stops, feature_cache)
    n = len(sched.scheduled)
    return ModelRunnerOutput([r.seq.request_id for r in sched.scheduled], tokens, [None] * n, [None] * n)


def spec_steps(native, sched: SchedulerOutput, burst: SpecBurst, kv_caches: list, feature_cache: Tensor | None
               ) -> ModelRunnerOutput:
    """`burst`'s verify steps of its one request in one native call, within the blocks the request holds (the
    scheduler took lookahead slots for `sched.num_steps` positions) and its max_tokens and the model length."""
    (r,) = sched.scheduled
    seq = r.seq
    assert seq.request_id == burst.request_id and seq.num_computed_tokens == seq.num_tokens - 1
    assert feature_cache is None, "n-gram lookup reads no features"
    stop = list(seq.params.stop_token_ids)
    if seq.eos_token_id is not None and not seq.params.ignore_eos:
        stop.append(seq.eos_token_id)
    tokens, steps = native.spec_steps(kv_caches, seq.token_ids, [b for bt in seq.block_tables for b in bt],
                                      burst.max_steps,
                                      burst.max_new, burst.budget_s, stop, burst.min_n, burst.max_n, burst.guess,
                                      burst.policy)
    return ModelRunnerOutput([seq.request_id], [tokens], [None], [None], spec_steps=steps)


def native_inputs(scheduled: list[ScheduledRequest], block_size: int) -> tuple[tuple, list[tuple[int, int]]]:
    """What `prepare_inputs` builds for a step on the paged decode kernel alone, as lists for
    `NativeDecode.step`: (ids, positions, slots [groups, T] flat, block tables [groups, T, nb] flat, nb, context
    lengths, rows, spans), and the sampling rows. Every row is a decode row over its own causal context; a
    request's rows are one span."""
    bs = block_size
    groups = range(len(scheduled[0].seq.block_tables))
    ids: list[int] = []
    positions: list[int] = []
    slots: list[list[int]] = [[] for _ in groups]
    ctx_lens: list[int] = []
    spans = [0]
    sample_rows: list[tuple[int, int]] = []
    for i, r in enumerate(scheduled):
        seq, n = r.seq, r.num_tokens
        start = seq.num_computed_tokens
        end = start + n
        ids.extend(seq.token_slice(start, end))
        positions.extend(range(start, end))
        for g in groups:
            bt = seq.block_tables[g]
            slots[g].extend(bt[p // bs] * bs + p % bs for p in range(start, end))
        ctx_lens.extend(range(start + 1, end + 1))
        spans.append(len(ids))
        if r.samples:
            sample_rows.append((i, len(ids) - 1))
    nb = -(-max(ctx_lens) // bs)
    flat: list[int] = []
    for g in groups:
        for r in scheduled:
            bt = r.seq.block_tables[g]
            row = bt[:nb] + [0] * (nb - min(len(bt), nb))
            flat.extend(row * r.num_tokens)
    slots = slots[0] if len(slots) == 1 else [s for grp in slots for s in grp]
    return (ids, positions, slots, flat, nb, ctx_lens, list(range(len(ids))), spans), sample_rows
