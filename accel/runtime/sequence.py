"""One request as the scheduler sees it: token ids, progress, blocks, status and timestamps.

Plain Python on purpose (no torch): the scheduler and the KV cache manager are bookkeeping.

Glossary:
  num_tokens           prompt tokens + output tokens so far (the verified sequence).
  num_computed_tokens  how many leading tokens have their K/V in the cache. Each step schedules
                       `num_tokens - num_computed_tokens` (+ draft tokens) for a request, so prefill,
                       chunked prefill, decode and recompute after preemption are the same thing.
  spec_token_ids       draft tokens proposed for the next step (speculative decoding); not verified,
                       so they never enter `token_ids` nor the prefix cache until accepted.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from accel.runtime.sampling_params import SamplingParams
from accel.speculative.stats import SpecDecodeStats


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again after its blocks were taken back (recompute on resume)
    FINISHED = "finished"


class FinishReason(enum.Enum):
    """Why a request ended; the `.value` strings follow the OpenAI API ("stop" / "length") plus "abort" and
    "error" (vLLM's names)."""

    STOP = "stop"  # eos, a stop token id or a stop string
    LENGTH = "length"  # max_tokens reached (or the model's context is full)
    ABORT = "abort"  # aborted by the caller
    ERROR = "error"  # this request's own processing raised (sampling, verification, detokenization, ...)


@dataclass
class RequestMetrics:
    """Timestamps (time.monotonic seconds) of one request and the latency metrics derived from them.

    TPOT = (e2e latency - TTFT) / (output tokens - 1), as in vLLM; ITL = the gaps between consecutive tokens.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)


@dataclass
class Sequence:
    """A request: prompt + generated tokens, how far the KV cache has caught up, and its state."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0  # lower value = more important (vLLM convention)
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.monotonic)

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # KV block ids in order, one table per KV group (`KVLayout`; one group unless the model mixes windows)
    block_tables: list[list[int]] = field(default_factory=lambda: [[]])
    spec_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    swapped: bool = False  # preempted with its K/V moved to host memory (num_computed_tokens kept)
    num_cached_prompt_tokens: int = 0  # prompt tokens served by the prefix cache at (last) admission
    waited_steps: int = 0  # scheduler steps spent waiting since arrival / last preemption
    metrics: RequestMetrics = field(init=False)
    spec: SpecDecodeStats = field(default_factory=SpecDecodeStats)  # this request's acceptance counters

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r} has an empty prompt; at least one token is required")
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.metrics = RequestMetrics(arrival_time=self.arrival_time)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def is_prefilling(self) -> bool:
        """True while the request has more than one token left to compute (prefill or recompute)."""
        return self.num_tokens - self.num_computed_tokens > 1

    def token_slice(self, start: int, end: int) -> list[int]:
        """Token ids [start, end) of prompt + output + draft tokens without building the whole list."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        full = self.prompt_token_ids + self.output_token_ids + self.spec_token_ids
        return full[start:end]
