import pytest

from accel.runtime.config import RuntimeConfig
from accel.runtime.kv_cache_manager import KVCacheManager
from accel.runtime.outputs import ModelRunnerOutput
from accel.runtime.sampling_params import SamplingParams
from accel.runtime.scheduler import QueueFullError, Scheduler, SchedulerConfig
from accel.runtime.sequence import FinishReason, Sequence, SequenceStatus


def make(num_blocks=64, block_size=4, caching=False, **cfg) -> Scheduler:
    """A scheduler over RuntimeConfig's fields in `cfg`, the engine-derived ones (max_model_len, ...) beside them."""
    own = {k: cfg.pop(k) for k in ("max_model_len", "num_lookahead_tokens", "max_step_rows") if k in cfg}
    return Scheduler(SchedulerConfig(RuntimeConfig(**cfg), **own), KVCacheManager(num_blocks, block_size, caching))


def req(rid, n, max_tokens=4, priority=0, t=0.0) -> Sequence:
    return Sequence(rid, list(range(3, 3 + n)), SamplingParams(max_tokens=max_tokens, temperature=0),
                    priority=priority, arrival_time=t)


def step(s: Scheduler, token: int = 7) -> dict[str, int]:
    """Schedule, fake a model step (every sampling row emits `token`), return {request id: tokens scheduled}."""
    out = s.schedule()
    sampled = [[token] if r.samples else [] for r in out.scheduled]
    s.update_from_output(out, ModelRunnerOutput([r.seq.request_id for r in out.scheduled], sampled))
    return {r.seq.request_id: r.num_tokens for r in out.scheduled}


def test_token_budget_and_chunked_prefill():
    s = make(max_num_batched_tokens=10)
    s.add(req("a", 25))
    assert step(s) == {"a": 10}
    assert step(s) == {"a": 10}
    assert step(s) == {"a": 5}  # last chunk samples the first token
    assert s.requests["a"].output_token_ids == [7]
    assert step(s) == {"a": 1}


def test_max_num_seqs():
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add(req(f"r{i}", 3, t=i))
    assert step(s) == {"r0": 3, "r1": 3}
    assert [q.request_id for q in s.waiting] == ["r2"]


def test_chunked_prefill_never_stalls_running_decodes():
    s = make(max_num_batched_tokens=8)
    s.add(req("short", 2, max_tokens=10, t=0))
    step(s)  # short prefilled, now decoding
    s.add(req("long", 40, t=1))
    for _ in range(4):
        got = step(s)
        assert got["short"] == 1 and got["long"] == 7  # decode first, the long prompt takes the rest


def test_running_decodes_are_scheduled_before_a_prefilling_request():
    s = make(max_num_batched_tokens=8)
    s.add(req("long", 40, t=0))
    step(s)  # long is running (prefilling, 8 of 40)
    s.add(req("short", 2, max_tokens=10, t=1))
    assert step(s) == {"long": 8}  # budget spent
    # with a per-request chunk cap, the long prefill leaves room: short is admitted, then decodes first
    s2 = make(max_num_batched_tokens=8, long_prefill_token_threshold=4)
    s2.add(req("long", 40, t=0))
    s2.add(req("short", 2, max_tokens=10, t=1))
    assert step(s2) == {"long": 4, "short": 2}
    got = step(s2)
    assert got == {"short": 1, "long": 4} and list(got) == ["short", "long"]


def test_short_request_passes_long_one_that_does_not_fit():
    s = make(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    s.add(req("a", 8, max_tokens=8, t=0))  # 2 blocks
    step(s)
    s.add(req("long", 20, max_tokens=4, t=1))  # needs 5 blocks, only 4 free
    s.add(req("short", 4, max_tokens=4, t=2))  # 1 block
    got = step(s)
    assert "short" in got and "long" not in got
    assert [q.request_id for q in s.waiting] == ["long"]


def test_priority_and_starvation_bound():
    s = make(max_num_seqs=1, max_wait_steps=3)
    s.add(req("low", 2, max_tokens=1, priority=1, t=0))
    for i in range(10):
        s.add(req(f"hi{i}", 2, max_tokens=1, priority=0, t=1 + i))
    order = [next(iter(step(s))) for _ in range(5)]
    # high priority first, but after waiting max_wait_steps the low-priority request cannot be passed
    assert order == ["hi0", "hi1", "hi2", "low", "hi3"]


def test_starved_request_is_not_passed_when_it_does_not_fit():
    s = make(num_blocks=6, block_size=4, max_wait_steps=1, max_num_batched_tokens=64)
    s.add(req("a", 8, max_tokens=3, t=0))  # holds 2-3 blocks
    step(s)
    s.add(req("long", 20, max_tokens=1, t=1))  # needs 6 blocks: waits until a finishes
    s.add(req("short", 4, max_tokens=1, t=2))
    got = step(s)  # long not starved yet -> short passes it
    assert "short" in got
    s.add(req("short2", 4, max_tokens=1, t=3))
    got = step(s)  # long waited 2 steps >= 1: short2 may not pass
    assert "short2" not in got and "long" not in got
    while "long" not in got:
        got = step(s)
    assert list(got)[0] == "long"  # long admitted first (short2 may follow it into the leftover blocks)


def test_preemption_by_recompute_and_resume():
    s = make(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    s.add(req("a", 7, max_tokens=6, t=0))  # 2 blocks, grows to 13 tokens = 4 blocks
    s.add(req("b", 7, max_tokens=6, t=1))
    assert step(s) == {"a": 7, "b": 7}
    assert step(s) == {"a": 1, "b": 1}  # position 7 still in block 1
    got = step(s)  # position 8: a and b both need a third block: only b (the latest) is preempted
    assert got == {"a": 1} and s.num_preemptions == 1
    b = s.waiting[0]
    assert b.request_id == "b" and b.status == SequenceStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.output_token_ids == [7, 7] and b.block_tables[0] == []
    resumed = []
    while s.has_unfinished():
        got = step(s)
        if "b" in got:
            resumed.append(got["b"])
    assert resumed[0] == 9  # recompute of prompt + the two earlier output tokens in one step
    assert b.output_token_ids == [7] * 6 and b.finish_reason == FinishReason.LENGTH
    assert s.kv.num_held_blocks() == 0


def test_queue_cap_rejects_with_clear_reason():
    s = make(max_waiting=2)
    s.add(req("a", 2))
    s.add(req("b", 2))
    with pytest.raises(QueueFullError, match=r"waiting queue is full \(2 requests waiting, max_waiting=2\)"):
        s.add(req("c", 2))


def test_request_that_can_never_fit_is_rejected():
    s = make(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="needs up to 3 KV blocks"):
        s.add(req("a", 8, max_tokens=4))


def test_abort_frees_blocks_at_any_point():
    s = make(max_num_batched_tokens=8)
    s.add(req("a", 20))
    s.add(req("b", 3))
    s.add(req("c", 3))
    step(s)  # a mid-prefill (8 of 20 tokens), b and c waiting
    assert s.kv.num_held_blocks() == 2
    assert s.abort("a")  # running, mid-prefill
    assert s.kv.num_held_blocks() == 0 and s.requests.keys() == {"b", "c"}
    assert s.abort("c")  # still waiting
    step(s)  # b prefilled (running)
    assert s.kv.num_held_blocks() == 1
    assert s.abort("b")
    assert not s.abort("b") and not s.abort("nope")
    assert s.kv.num_held_blocks() == 0 and not s.has_unfinished()


def test_no_block_held_after_all_finish_or_abort():
    s = make(num_blocks=10, block_size=4, caching=True, max_num_batched_tokens=16)
    for i in range(8):
        s.add(req(f"r{i}", 5 + i, max_tokens=5, t=i))
    for k in range(6):
        step(s)
    s.abort("r3")
    s.abort("r7")
    while s.has_unfinished():
        step(s)
    assert s.kv.num_held_blocks() == 0 and s.kv.num_free_blocks == 10


def test_stop_conditions():
    s = make()
    a = Sequence("a", [5, 6], SamplingParams(max_tokens=10, stop_token_ids=[7], min_tokens=2), eos_token_id=2)
    s.add(a)
    step(s, token=7)  # stop id but below min_tokens
    assert not a.is_finished
    step(s, token=7)
    assert a.finish_reason == FinishReason.STOP and a.output_token_ids == [7, 7]
    b = Sequence("b", [5], SamplingParams(max_tokens=3, ignore_eos=True), eos_token_id=2)
    s.add(b)
    for _ in range(3):
        step(s, token=2)
    assert b.finish_reason == FinishReason.LENGTH and b.output_token_ids == [2, 2, 2]


def test_rejected_draft_tokens_are_rolled_back():
    s = make(num_lookahead_tokens=3)
    a = req("a", 5, max_tokens=10)
    s.add(a)
    step(s)  # prefill -> 1 output token, 5 computed
    a.spec_token_ids = [11, 12, 13]
    out = s.schedule()
    (r,) = out.scheduled
    assert r.num_tokens == 4 and r.spec_token_ids == [11, 12, 13]
    # verification accepted 11 and rejected 12: tokens = [11, recovered 50]
    s.update_from_output(out, ModelRunnerOutput(["a"], [[11, 50]]))
    assert a.output_token_ids == [7, 11, 50]
    assert a.num_computed_tokens == 5 + 4 - 2 == a.num_tokens - 1
    assert (a.spec.num_drafts, a.spec.num_draft_tokens, a.spec.num_accepted_tokens) == (1, 3, 1)
    assert a.spec.num_accepted_tokens_per_pos == [1, 0, 0]
    assert a.spec_token_ids == []


def test_draft_token_ids_ride_the_next_step_of_their_own_request():
    s = make()
    for r in (req("a", 3, max_tokens=8), req("b", 2, max_tokens=8)):
        s.add(r)
    step(s)  # both prefilled
    s.update_draft_token_ids({"a": [9, 9], "gone": [1]})
    rows = {r.seq.request_id: (r.num_tokens, r.spec_token_ids) for r in s.schedule().scheduled}
    assert rows == {"a": (3, [9, 9]), "b": (1, [])}


def test_the_scheduler_holds_a_step_to_max_step_rows_granting_drafts_in_the_order_given():
    s = make(max_step_rows=6)
    for i, r in enumerate((req("a", 3, max_tokens=16), req("b", 2, max_tokens=16), req("c", 2, max_tokens=16))):
        s.add(r)
    assert s.draft_budget() == 6  # nothing decodes yet
    step(s)  # all three prefilled: three decode rows
    assert s.draft_budget() == 3
    s.update_draft_token_ids({"c": [5, 5], "a": [9, 9, 9]})  # c first: the drafter ranks it likelier accepted
    rows = {r.seq.request_id: (r.num_tokens, r.spec_token_ids) for r in s.schedule().scheduled}
    assert rows == {"a": (2, [9]), "b": (1, []), "c": (3, [5, 5])}
    assert sum(n for n, _ in rows.values()) == 6
    assert make().draft_budget() is None
    with pytest.raises(ValueError, match="max_step_rows=1 is invalid"):
        SchedulerConfig(max_step_rows=1)


def test_multi_step_takes_lookahead_slots_only_from_free_blocks_and_only_when_nothing_waits():
    s = make(num_blocks=6, block_size=4)
    s.add(req("a", 3, max_tokens=20, t=0))
    s.add(req("b", 3, max_tokens=20, t=1))
    out = s.schedule(num_steps=4)
    assert out.num_steps == 1  # prefill rows
    s.update_from_output(out, ModelRunnerOutput(["a", "b"], [[7], [7]]))
    out = s.schedule(num_steps=4)
    assert out.num_steps == 4 and [r.num_tokens for r in out.scheduled] == [1, 1]
    for r in out.scheduled:  # 4 tokens computed in a row from position 3: slots 3..6 -> 2 blocks each
        assert len(r.seq.block_tables[0]) == 2
    s.update_from_output(out, ModelRunnerOutput(["a", "b"], [[7, 8, 9, 10], [7, 8]]))  # b stopped early
    assert [q.num_computed_tokens for q in s.running] == [7, 5]
    assert [q.num_tokens for q in s.running] == [8, 6]
    # a burst of 8 needs 2 more blocks for a (positions 7..14) and 1 for b: 2 are free -> one step, no block taken
    out = s.schedule(num_steps=8)
    assert out.num_steps == 1 and not out.preempted_request_ids and len(out.scheduled) == 2
    assert [len(q.block_tables[0]) for q in s.running] == [2, 2] and s.kv.pool.num_free_blocks == 2
    s.update_from_output(out, ModelRunnerOutput(["a", "b"], [[7], [7]]))
    s.add(req("c", 3, t=2))
    out = s.schedule(num_steps=2)  # c is admitted (prefill): not a multi-step batch
    assert out.num_steps == 1 and len(out.scheduled) == 3


def test_no_multi_step_while_a_request_waits():
    s = make(max_num_seqs=1)
    s.add(req("a", 3, max_tokens=20, t=0))
    s.add(req("b", 3, max_tokens=20, t=1))
    out = s.schedule(num_steps=4)
    s.update_from_output(out, ModelRunnerOutput(["a"], [[7]]))
    assert s.schedule(num_steps=4).num_steps == 1  # b waits for a's seat
