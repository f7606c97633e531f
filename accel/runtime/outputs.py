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
    # preemption_mode="swap": request id -> per KV group, (table index, block id) of the blocks whose K/V move to
    # host memory (before this step's forward, so the blocks can be reused in this very step) / come back from it
    # (into freshly allocated blocks)
    swap_out: dict[str, list[list[tuple[int, int]]]] = field(default_factory=dict)
    swap_in: dict[str, list[list[tuple[int, int]]]] = field(default_factory=dict)
    # decode steps the runner may run in a row (every request one decode row with lookahead KV slots for them); it
    # may stop earlier, and returns every step's token. With a `SpecBurst`: the positions its request may advance
    num_steps: int = 1

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class SpecBurst:
    """Greedy n-gram speculation of the one running request for several verify steps in one native call (what
    `SpecDecoder.burst` hands the runner): the proposer's n-gram sizes, whether a one-token guess fills a step where
    nothing matches, and the draft-length state the native loop advances (`SpecPolicy` in the C++)."""

    request_id: str
    max_steps: int
    max_new: int  # tokens the request may still take (max_tokens, the model length)
    num_positions: int  # lookahead the scheduler reserves: what max_steps steps of up to k max + 1 rows can reach
    budget_s: float
    min_n: int
    max_n: int
    guess: bool
    policy: SpecPolicyState


@dataclass
class SpecPolicyState:
    """The batch-1 draft-length rule's state for a burst: the C++ `SpecPolicy`'s fields, by name."""

    successes: float  # the request's decayed acceptance evidence (AcceptanceEstimate)
    failures: float
    decay: float  # adaptive.DECAY
    cost_ratio: float  # the draft's cost in target steps, as measured before the burst
    k_max: int
    last_full: int  # draft tokens of the last step when all were accepted, else 0
    fixed_k: int  # -1: adaptive; 0: speculation is off at this batch size (a guess every step); > 0: always this


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
    # per scheduled request asking for prompt logprobs: (position of the first prompt token scored, its raw logprobs,
    # their top-k alternatives or None); a step scores the prompt tokens its chunk predicts
    prompt_logprobs: list[tuple[int, list[float], list | None] | None] = field(default_factory=list)
    # a `SpecBurst`'s verify steps: [length asked, drafted, accepted, guess (0/1), propose seconds, step seconds] each
    spec_steps: list[list[float]] | None = None
