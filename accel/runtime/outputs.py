"""Dataclasses at the scheduler <-> model runner boundary (plain Python, no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from accel.runtime.sequence import Sequence


@dataclass
class ScheduledRequest:
    """One request's share of a step: compute `num_tokens` tokens starting at `seq.num_computed_tokens`.

    The last `len(spec_token_ids)` of those tokens are draft tokens to verify (speculative decoding).
    """

    seq: Sequence
    num_tokens: int
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence, so the step samples a next token."""
        return self.seq.num_computed_tokens + self.num_tokens >= self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    num_scheduled_tokens: int
    preempted_request_ids: list[str] = field(default_factory=list)
    # preemption_mode="swap": request id -> block ids whose K/V move to host memory (before this step's
    # forward, so the blocks can be reused in this very step) / come back from it (into freshly allocated blocks)
    swap_out: dict[str, list[int]] = field(default_factory=dict)
    swap_in: dict[str, list[int]] = field(default_factory=dict)
    # decode steps the runner may run in a row (every request one decode row with lookahead KV slots for them); it
    # may stop earlier, and returns every step's token
    num_steps: int = 1

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    """Per scheduled request (same order as `SchedulerOutput.scheduled`): the tokens the step produced.

    sampled_token_ids[i] is empty for a prefill chunk that does not reach the end of its prompt; with draft
    tokens it holds the accepted drafts plus one bonus/recovered token.
    failed: request id -> error, for requests whose own sampling or verification raised this step (their
    sampled_token_ids are empty; the engine ends them, and only them, with finish reason "error").
    """

    request_ids: list[str]
    sampled_token_ids: list[list[int]]
    logprobs: list[list[float] | None] = field(default_factory=list)
    top_logprobs: list[list[list[tuple[int, float]]] | None] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
