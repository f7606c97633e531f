"""Decides, every step, which requests compute how many tokens (plain Python, no torch).

Policy, in order:
  1. Running requests first: decodes (1 token left) before requests still prefilling, so a long prompt being
     chunked never stalls running decodes; within each group by (priority, arrival).
  2. When KV blocks run out for a running request, preempt by recompute: the running request with the worst
     (priority, arrival) loses its blocks and goes back to waiting with num_computed_tokens = 0 (its prefix
     blocks usually survive in the prefix cache, so the recompute is often cheap).
  3. Then admit waiting requests while the token budget, `max_num_seqs` and the KV pool allow, in order
     (starved first, then priority, then arrival). A prompt larger than the remaining budget is chunked.
     A request whose blocks do not fit is skipped so shorter ones may pass it (no head-of-line blocking) --
     unless it has waited `max_wait_steps` steps: then it is *starved*, nothing may pass it, and it is
     admitted as soon as blocks free up (the bounded wait that protects low priorities and long prompts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from accel.runtime.config import RuntimeConfig
from accel.runtime.kv_cache_manager import KVCacheManager
from accel.runtime.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from accel.runtime.sequence import FinishReason, Sequence, SequenceStatus


class QueueFullError(RuntimeError):
    """Raised by `add` when the waiting queue is at `max_waiting`."""


@dataclass
class SchedulerConfig:
    """What the scheduler reads: the runtime's settings (`RuntimeConfig`, held, never copied: an engine passes its
    own) and what the engine derives from the model and the proposer."""

    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    max_model_len: int = 8192
    """RuntimeConfig.max_model_len resolved against the model."""
    num_lookahead_tokens: int = 0
    """KV slots reserved per step for draft tokens (speculative decoding)."""
    max_step_rows: int | None = None
    """SpeculativeConfig.max_step_rows of a speculating engine (None: no cap)."""

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len={self.max_model_len} is invalid; allowed: an integer >= 1")
        if self.num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens={self.num_lookahead_tokens} is invalid; allowed: >= 0")
        if self.max_step_rows is not None and self.max_step_rows < 2:
            raise ValueError(f"max_step_rows={self.max_step_rows} is invalid; allowed: None or >= 2")


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager) -> None:
        self.config = config
        self.kv = kv_cache_manager
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}
        self.num_preemptions = 0
        self.num_steps = 0
        self._swap_out: dict[str, list[list[tuple[int, int]]]] = {}  # per KV group (table index, block)
        self._swap_in: dict[str, list[list[tuple[int, int]]]] = {}

    # ---- requests in / out -----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request; raises QueueFullError (waiting cap) or ValueError (too long, duplicate id)."""
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use; pass a unique request_id")
        if seq.num_prompt_tokens >= self.config.max_model_len:
            raise ValueError(f"prompt of request {seq.request_id!r} has {seq.num_prompt_tokens} tokens; allowed: "
                             f"fewer than max_model_len={self.config.max_model_len}")
        max_len = min(seq.num_prompt_tokens + seq.params.max_tokens, self.config.max_model_len)
        need = self.kv.max_blocks(max_len + self.config.num_lookahead_tokens,
                                  self.config.runtime.max_num_batched_tokens + self.config.num_lookahead_tokens)
        if need > self.kv.pool.num_blocks:
            raise ValueError(f"request {seq.request_id!r} needs up to {need} KV blocks (prompt {seq.num_prompt_tokens} "
                             f"+ max_tokens {seq.params.max_tokens}) but the pool has {self.kv.pool.num_blocks}; "
                             "lower max_tokens or give the KV cache more memory")
        if len(self.waiting) >= self.config.runtime.max_waiting:
            raise QueueFullError(f"request {seq.request_id!r} rejected: the waiting queue is full "
                                 f"({len(self.waiting)} requests waiting, "
                                 f"max_waiting={self.config.runtime.max_waiting}); "
                                 "retry later or raise max_waiting")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self.requests[seq.request_id] = seq

    def abort(self, request_id: str) -> bool:
        """Finish a request at any point and free its blocks; False if it is unknown or already finished."""
        seq = self.requests.get(request_id)
        if seq is None or seq.is_finished:
            return False
        self.finish(seq, FinishReason.ABORT)
        return True

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.is_finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        self.kv.forget(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.spec_token_ids = []
        seq.metrics.finished_time = time.monotonic()
        del self.requests[seq.request_id]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- the step ------------------------------------------------------------------------------------
    def draft_budget(self) -> int | None:
        """Draft tokens the next step may carry: `max_step_rows` less the running decode rows (None: no cap)."""
        if self.config.max_step_rows is None:
            return None
        decoding = sum(1 for s in self.running if s.num_tokens - s.num_computed_tokens == 1)
        return max(0, self.config.max_step_rows - decoding)

    def update_draft_token_ids(self, drafts: dict[str, list[int]]) -> None:
        """Draft tokens for this step's verification, by request id (vLLM's `update_draft_token_ids`): each running
        request gets its own or none. Drafts are granted in the order given until `draft_budget` is spent (the
        drafter puts the likeliest accepted first); they take lookahead KV slots only if `schedule` finds them
        free."""
        left = self.draft_budget()
        for seq in self.running:
            seq.spec_token_ids = []
        for request_id, token_ids in drafts.items():
            seq = self.requests.get(request_id)
            if seq is None or seq.status != SequenceStatus.RUNNING:
                continue
            seq.spec_token_ids = list(token_ids if left is None else token_ids[:left])
            if left is not None:
                left -= len(seq.spec_token_ids)

    def schedule(self, num_steps: int = 1) -> SchedulerOutput:
        """num_steps > 1 asks for a multi-step decode: the output's num_steps is that when nothing waits, every
        running request is scheduled as one decode row, and each gets num_steps - 1 lookahead KV slots from free
        blocks (taken after everything else is scheduled, so they never preempt anyone); else 1."""
        self.num_steps += 1
        budget = self.config.runtime.max_num_batched_tokens
        scheduled: dict[str, ScheduledRequest] = {}
        preempted: list[Sequence] = []

        order = sorted(self.running, key=lambda s: (s.is_prefilling, s.priority, s.arrival_time))
        for seq in order:
            if budget == 0:
                break
            if seq.status != SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new = self._num_new_tokens(seq, budget)
            lookahead = self.config.num_lookahead_tokens
            if seq.spec_token_ids and self.kv.allocate_slots(seq, num_new, num_lookahead_tokens=lookahead) is None:
                seq.spec_token_ids = []  # drafts are optional: drop them rather than preempt anyone for them
                num_new = self._num_new_tokens(seq, budget)
            while self.kv.allocate_slots(seq, num_new, num_lookahead_tokens=lookahead) is None:
                victim = max((s for s in self.running), key=lambda s: (s.priority, s.arrival_time))
                if victim.request_id in scheduled:
                    budget += scheduled.pop(victim.request_id).num_tokens
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                continue
            scheduled[seq.request_id] = self._scheduled(seq, num_new)
            budget -= num_new

        if not preempted:
            budget = self._admit_waiting(budget, scheduled)
        for seq in self.waiting:
            seq.waited_steps += 1
        # preempted requests go back to the front: they already waited once
        self.waiting[:0] = [s for s in preempted if s.status != SequenceStatus.FINISHED]
        out = list(scheduled.values())
        now = time.monotonic()
        for s in out:
            if s.seq.metrics.first_scheduled_time is None:
                s.seq.metrics.first_scheduled_time = now
        swap_out, swap_in = self._swap_out, self._swap_in
        self._swap_out, self._swap_in = {}, {}
        if num_steps > 1 and not self._lookahead_for_steps(out, num_steps, preempted):
            num_steps = 1
        return SchedulerOutput(scheduled=out, num_scheduled_tokens=sum(s.num_tokens for s in out),
                               preempted_request_ids=[s.request_id for s in preempted],
                               swap_out=swap_out, swap_in=swap_in, num_steps=num_steps)

    def lookahead_fits(self, num_steps: int) -> bool:
        """Whether the free blocks hold num_steps - 1 lookahead slots for every running request now."""
        return sum(self.kv.blocks_to_grow(s, s.num_computed_tokens + num_steps)
                   for s in self.running) <= self.kv.pool.num_free_blocks

    def _lookahead_for_steps(self, out: list[ScheduledRequest], num_steps: int, preempted: list[Sequence]) -> bool:
        """Take num_steps - 1 lookahead slots for each of `out` if it is a multi-step batch (every running request
        one decode row, nothing waiting or preempted) and the free blocks hold them all; else take nothing."""
        if not out or preempted or self.waiting or len(out) != len(self.running):
            return False
        if any(r.num_tokens != 1 or r.spec_token_ids for r in out):
            return False
        if not self.lookahead_fits(num_steps):
            return False
        for r in out:
            self.kv.allocate_slots(r.seq, 1, num_lookahead_tokens=num_steps - 1)
        return True

    def _num_new_tokens(self, seq: Sequence, budget: int, num_computed: int | None = None) -> int:
        """Tokens to schedule: what is left (incl. drafts), capped by the budget, the model length, the chunk cap."""
        done = seq.num_computed_tokens if num_computed is None else num_computed
        n = min(seq.num_tokens_with_spec - done, budget, self.config.max_model_len - done)
        if self.config.runtime.long_prefill_token_threshold is not None:
            n = min(n, self.config.runtime.long_prefill_token_threshold)
        return n

    @staticmethod
    def _scheduled(seq: Sequence, num_new: int) -> ScheduledRequest:
        # draft tokens are the tail of the scheduled range; a chunk cut short by the budget drops some
        num_spec = max(0, seq.num_computed_tokens + num_new - seq.num_tokens)
        return ScheduledRequest(seq, num_new, list(seq.spec_token_ids[:num_spec]))

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        if self.config.runtime.preemption_mode == "swap" and seq.num_computed_tokens > 0:
            self._swap_out[seq.request_id] = self.kv.held_blocks(seq, seq.num_computed_tokens)
            seq.swapped = True
        self.kv.free(seq)
        if not seq.swapped:
            seq.num_computed_tokens = 0
        seq.spec_token_ids = []
        seq.status = SequenceStatus.PREEMPTED
        seq.num_preemptions += 1
        seq.waited_steps = 0
        self.num_preemptions += 1

    def _waiting_order(self) -> list[Sequence]:
        bound = self.config.runtime.max_wait_steps
        # starved requests first, among themselves by arrival only (priority no longer counts for them)
        return sorted(self.waiting, key=lambda s: (0, 0, s.arrival_time) if s.waited_steps >= bound
                      else (1, s.priority, s.arrival_time))

    def _admit_waiting(self, budget: int, scheduled: dict[str, ScheduledRequest]) -> int:
        admitted: list[Sequence] = []
        for seq in self._waiting_order():
            if budget == 0 or len(self.running) >= self.config.runtime.max_num_seqs:
                break
            starved = seq.waited_steps >= self.config.runtime.max_wait_steps
            hits, num_hit_tokens = self.kv.get_computed_blocks(seq)
            # a swapped-out request keeps its computed tokens (and gets no hits); others start from the hits
            num_new = self._num_new_tokens(seq, budget, num_computed=seq.num_computed_tokens + num_hit_tokens)
            if self.kv.allocate_slots(seq, num_new, hits, self.config.num_lookahead_tokens) is None:
                if starved:
                    break  # nothing may pass a starved request: it gets the next free blocks
                continue  # a shorter request behind it may still fit
            if seq.swapped:  # its K/V come back from host memory into the new blocks before the forward
                self._swap_in[seq.request_id] = self.kv.held_blocks(seq, seq.num_computed_tokens)
                seq.swapped = False
            else:
                seq.num_computed_tokens = num_hit_tokens
                seq.num_cached_prompt_tokens = min(num_hit_tokens, seq.num_prompt_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
            scheduled[seq.request_id] = self._scheduled(seq, num_new)
            budget -= num_new
        for seq in admitted:
            self.waiting.remove(seq)
            seq.waited_steps = 0
        return budget

    def update_from_output(self, sched: SchedulerOutput, out: ModelRunnerOutput) -> list[Sequence]:
        """Advance computed tokens, append sampled tokens, finish requests on stop ids / eos / length.

        Returns the requests that got new tokens or finished this step (stop strings are the engine's job,
        it calls `finish` when the detokenized text contains one).
        """
        now = time.monotonic()
        touched: list[Sequence] = []
        for req, sampled in zip(sched.scheduled, out.sampled_token_ids):
            seq = req.seq
            if seq.is_finished:  # aborted between schedule and update
                continue
            seq.num_computed_tokens += req.num_tokens
            if not sampled:
                continue
            # speculative decoding: drafts after the first rejection are rolled back (their KV slots are
            # overwritten next step); sampled = accepted drafts + one bonus/recovered token
            num_rejected = len(req.spec_token_ids) - (len(sampled) - 1)
            seq.num_computed_tokens -= num_rejected
            if req.spec_token_ids:
                seq.spec.observe(len(req.spec_token_ids), len(sampled) - 1)
            seq.spec_token_ids = []
            for token_id in sampled:
                seq.output_token_ids.append(token_id)
                if seq.metrics.first_token_time is None:
                    seq.metrics.first_token_time = now
                seq.metrics.token_times.append(now)
                reason = self._check_stop(seq, token_id)
                if reason is not None:
                    self.finish(seq, reason)
                    break
            touched.append(seq)
        return touched

    def _check_stop(self, seq: Sequence, token_id: int) -> FinishReason | None:
        p = seq.params
        if seq.num_output_tokens >= p.min_tokens:
            if token_id == seq.eos_token_id and not p.ignore_eos:
                return FinishReason.STOP
            if token_id in p.stop_token_ids:
                return FinishReason.STOP
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None
