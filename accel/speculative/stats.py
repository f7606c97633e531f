"""Acceptance tracking from raw counters, and the speedup Leviathan et al.'s analysis predicts.

Only raw counters are stored (names follow vLLM's spec-decode metrics); every rate is derived from them, so
stats of requests, domains and runs add up exactly:

  num_drafts                  verification steps in which at least one draft token was proposed
  num_draft_tokens            draft tokens proposed
  num_accepted_tokens         draft tokens accepted
  num_accepted_tokens_per_pos [j]: drafts whose token at position j was accepted

  acceptance rate         = num_accepted_tokens / num_draft_tokens
  mean acceptance length  = 1 + num_accepted_tokens / num_drafts   (tokens per verify step, bonus included)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    """Raw speculative-decoding counters of one request, domain, proposer or run; see the module docstring.

    The one counters class: requests carry it (`RequestOutput.spec_decode`), the engine sums it per run, domain
    and proposer, the server turns it into vLLM's metrics and usage block, and the report reads it back."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verification step that proposed `num_draft_tokens` and accepted the first `num_accepted`."""
        if num_draft_tokens < 0 or not 0 <= num_accepted_tokens <= num_draft_tokens:
            raise ValueError(f"num_draft_tokens={num_draft_tokens}, num_accepted_tokens={num_accepted_tokens} are "
                             "invalid; allowed: 0 <= num_accepted_tokens <= num_draft_tokens")
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        if len(self.num_accepted_tokens_per_pos) < num_draft_tokens:
            self.num_accepted_tokens_per_pos += [0] * (num_draft_tokens - len(self.num_accepted_tokens_per_pos))
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    def __add__(self, other: SpecDecodeStats) -> SpecDecodeStats:
        width = max(len(self.num_accepted_tokens_per_pos), len(other.num_accepted_tokens_per_pos))
        a = self.num_accepted_tokens_per_pos + [0] * (width - len(self.num_accepted_tokens_per_pos))
        b = other.num_accepted_tokens_per_pos + [0] * (width - len(other.num_accepted_tokens_per_pos))
        return SpecDecodeStats(
            num_drafts=self.num_drafts + other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            num_accepted_tokens_per_pos=[x + y for x, y in zip(a, b)],
        )

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / draft tokens; None before any draft token."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens emitted per verification step; None before any draft."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        """[j]: fraction of drafts whose position j was accepted (vLLM's per-position rate)."""
        return [c / self.num_drafts for c in self.num_accepted_tokens_per_pos] if self.num_drafts else []

    def counters(self) -> dict:
        """The raw counters (vLLM metric names without the `vllm:spec_decode_` prefix)."""
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos)}

    def to_dict(self) -> dict:
        """The counters plus the derived rates."""
        return {**self.counters(), "acceptance_rate": self.acceptance_rate,
                "mean_acceptance_length": self.mean_acceptance_length}

    @classmethod
    def from_dict(cls, data: dict) -> SpecDecodeStats:
        """Inverse of `to_dict` (derived fields are ignored: they are recomputed from the counters). Raises
        ValueError naming the counter that is missing or inconsistent."""
        try:
            stats = cls(num_drafts=int(data["num_drafts"]), num_draft_tokens=int(data["num_draft_tokens"]),
                        num_accepted_tokens=int(data["num_accepted_tokens"]),
                        num_accepted_tokens_per_pos=[int(x) for x in data.get("num_accepted_tokens_per_pos") or []])
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            raise ValueError(f"speculative-decoding counters need integers num_drafts, num_draft_tokens, "
                             f"num_accepted_tokens (and optional num_accepted_tokens_per_pos): {e!r}") from None
        if not 0 <= stats.num_accepted_tokens <= stats.num_draft_tokens:
            raise ValueError(f"num_accepted_tokens={stats.num_accepted_tokens} is invalid; allowed: 0 to "
                             f"num_draft_tokens={stats.num_draft_tokens}")
        return stats


def _check_alpha_gamma(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} is invalid; allowed: an acceptance rate in [0, 1]")
    if gamma < 0:
        raise ValueError(f"gamma={gamma} is invalid; allowed: a number of draft tokens >= 0")


def expected_tokens_per_step(alpha: float, gamma: int) -> float:
    """Expected tokens emitted per verification step with gamma drafts of i.i.d. acceptance alpha.

    (1 - alpha^(gamma+1)) / (1 - alpha): accepted drafts plus the recovered/bonus token; gamma + 1 at alpha = 1.
    """
    _check_alpha_gamma(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def leviathan_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Predicted walltime speedup over plain decoding (Leviathan et al. 2023, Theorem 3.8).

    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), with c = cost of one draft step / one target step
    (`cost_ratio`), assuming verifying gamma + 1 tokens costs one target step.
    """
    if cost_ratio < 0:
        raise ValueError(f"cost_ratio={cost_ratio} is invalid; allowed: >= 0")
    return expected_tokens_per_step(alpha, gamma) / (gamma * cost_ratio + 1.0)


@dataclass
class SpecTally:
    """An engine's four acceptance tables: all verifications, one-token guesses alone, per domain label, per
    proposer (where one step mixes two). `record` is the one place a verified draft is counted."""

    total: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    guesses: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    per_domain: dict[str, SpecDecodeStats] = field(default_factory=dict)
    per_source: dict[str, SpecDecodeStats] = field(default_factory=dict)

    def record(self, num_draft: int, num_accepted: int, guessed: bool, domain: str | None,
               source: str | None = None) -> None:
        self.total.observe(num_draft, num_accepted)
        if guessed:
            self.guesses.observe(num_draft, num_accepted)
        if domain is not None:
            self.per_domain.setdefault(domain, SpecDecodeStats()).observe(num_draft, num_accepted)
        if source is not None:
            self.per_source.setdefault(source, SpecDecodeStats()).observe(num_draft, num_accepted)
