"""Per-request sampling parameters (the contract between the engine, the sampler and the server).

Semantics follow vLLM / the OpenAI API:
  temperature == 0      greedy (argmax); top_k / top_p / min_p / seed are then irrelevant. A temperature below
                        SAMPLING_EPS is greedy too (as in vLLM): dividing float32 logits by it overflows to NaN
  top_k is None         no top-k filter
  top_p == 1.0          no nucleus filter
  min_p == 0.0          no min-p filter
  repetition_penalty    HF/CTRL style on prompt + output tokens (1.0 = off)
  presence_penalty      OpenAI style, subtracted once per token present in the output
  frequency_penalty     OpenAI style, subtracted per occurrence in the output
  seed                  per-request generator: the same seed gives the same tokens whatever else is in the batch;
                        a signed 64-bit integer (what torch.Generator.manual_seed takes, and vLLM's range)
  logprobs is None      no logprobs; 0 = logprob of the sampled token only; k = plus the top-k alternatives
  prompt_logprobs       None: none; k: the raw logprob of every prompt token after the first (and its top-k
                        alternatives), for scoring (OpenAI's echo + logprobs); such a prompt skips the prefix cache
  structured            None, or the JSON schema (or any JSON object) the output must follow (runtime.structured)
  logit_bias            {token id: bias} added to the raw logits before everything else (OpenAI's; -100 / 100
                        in effect ban / force a token); applies to greedy rows too
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 1024  # the detokenizer holds back len(stop) - 1 characters of every streamed delta
MAX_LOGPROBS = 20
SAMPLING_EPS = 1e-5
# The smallest repetition penalty: logits are float32, and dividing one by a smaller penalty overflows (1e-300 is
# 0.0 in float32, so the division gives inf and the probabilities NaN).
MIN_REPETITION_PENALTY = 0.01
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
LOGIT_BIAS_MAX = 100.0  # OpenAI's range: [-100, 100]


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must be: any JSON value (`json_object`, OpenAI's JSON mode: an object) or a value
    of a JSON schema (`json_schema`, the schema as a JSON string)."""

    json_schema: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if (self.json_schema is None) == (not self.json_object):
            raise ValueError("structured output needs exactly one of json_schema (a JSON string) or json_object")
        if self.json_schema is not None:
            try:
                schema = json.loads(self.json_schema)
            except ValueError as e:
                raise ValueError(f"structured output json_schema is not JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"structured output json_schema must be a JSON object; got {type(schema).__name__}")



@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    prompt_logprobs: int | None = None
    structured: StructuredOutput | None = None  # the output constrained to JSON / a JSON schema (runtime.structured)

    def __post_init__(self) -> None:
        if 0.0 < self.temperature < SAMPLING_EPS:
            self.temperature = 0.0
        checks = [
            ("max_tokens", self.max_tokens >= 1, "an integer >= 1"),
            ("temperature", 0.0 <= self.temperature <= 100.0, "a number in [0, 100] (0 = greedy)"),
            ("top_k", self.top_k is None or self.top_k >= 1, "None (off) or an integer >= 1"),
            ("top_p", 0.0 < self.top_p <= 1.0, "a number in (0, 1]"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "a number in [0, 1]"),
            ("repetition_penalty", MIN_REPETITION_PENALTY <= self.repetition_penalty <= 10.0,
             f"a number in [{MIN_REPETITION_PENALTY}, 10]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "a number in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "a number in [-2, 2]"),
            ("min_tokens", 0 <= self.min_tokens <= self.max_tokens, "an integer in [0, max_tokens]"),
            ("stop", len(self.stop) <= MAX_STOP_STRINGS
             and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_STRING_CHARS for s in self.stop),
             f"at most {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_STRING_CHARS} characters"),
            ("stop_token_ids", all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "a list of token ids (integers >= 0)"),
            ("seed", self.seed is None or (isinstance(self.seed, int) and SEED_MIN <= self.seed <= SEED_MAX),
             f"None or an integer in [{SEED_MIN}, {SEED_MAX}]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
             f"None or an integer in [0, {MAX_LOGPROBS}]"),
            ("prompt_logprobs", self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
             f"None or an integer in [0, {MAX_LOGPROBS}]"),
            ("logit_bias", all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                               and isinstance(b, (int, float)) and math.isfinite(b) and abs(b) <= LOGIT_BIAS_MAX
                               for t, b in self.logit_bias.items()),
             f"{{token id (an integer >= 0): a finite number in [-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}]}}"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"sampling parameter {name}={getattr(self, name)!r} is invalid; allowed: {allowed}")

    def check_vocab(self, vocab_size: int) -> None:
        """The token ids the parameters name (stop_token_ids, logit_bias) against the model's vocabulary."""
        for what, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias token ids", list(self.logit_bias))):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{what} {bad[:5]} are invalid; allowed: integers in [0, {vocab_size})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
