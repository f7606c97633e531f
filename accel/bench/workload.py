"""Benchmark workloads: a `Workload` spec -> a deterministic list of `BenchRequest`s with long-tailed lengths.

Lengths: most requests are short to medium, a few are long (the shape of real traffic). Exactly
round(n * long_fraction) requests are "long", uniform in the top quarter of the range [lo + 0.75 (hi - lo), hi];
the rest are log-uniform in [lo, lo + 0.75 (hi - lo)). Which requests are long is a seeded shuffle.

Prompts: with a tokenizer, token windows of exactly the asked length cut from the project's text data
(eval/text/*.jsonl, calibration_data/*.jsonl); with only a vocabulary size, seeded random token ids; with
neither, synthetic words (one word ~ one token; the server's usage block then gives the real count).
Every request asks for exactly `max_tokens` output tokens with ignore_eos, so outputs are the asked length.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
LONG_START = 0.75  # long requests are drawn from the top quarter of the length range

_WORDS = ("the of and to in is was for on that with as by at from are this be it an or which have not had one "
          "time model data system value table number result first new state water light city river energy").split()


@dataclass(frozen=True)
class Workload:
    """What to send: how many requests, their prompt/output length ranges (tokens, inclusive), the seed."""

    name: str = "bench"
    num_requests: int = 32
    prompt_tokens: tuple[int, int] = (16, 1024)
    output_tokens: tuple[int, int] = (16, 256)
    long_fraction: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests={self.num_requests} is invalid; allowed: an integer >= 1")
        for f in ("prompt_tokens", "output_tokens"):
            lo, hi = getattr(self, f)
            if not (1 <= lo <= hi):
                raise ValueError(f"{f}=({lo}, {hi}) is invalid; allowed: (min, max) with 1 <= min <= max")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"long_fraction={self.long_fraction} is invalid; allowed: a number in [0, 1]")

    @classmethod
    def from_config(cls, cfg) -> Workload:
        """From the recipe's `WorkloadConfig` (accel.recipe)."""
        return cls(name=cfg.name, num_requests=cfg.num_requests, prompt_tokens=tuple(cfg.prompt_tokens),
                   output_tokens=tuple(cfg.output_tokens), seed=cfg.seed)


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload. `prompt_token_ids` is None when the prompt is synthetic text only."""

    request_id: str
    prompt: str
    prompt_token_ids: tuple[int, ...] | None
    prompt_tokens: int  # exact when prompt_token_ids is set, else the planned (approximate) count
    max_tokens: int
    domain: str | None = None


def long_tail_lengths(n: int, lo: int, hi: int, long_fraction: float, rng: np.random.Generator) -> list[int]:
    """n lengths in [lo, hi]: round(n * long_fraction) uniform in the top quarter, the rest log-uniform below it."""
    if lo == hi:
        return [lo] * n
    split = lo + LONG_START * (hi - lo)
    num_long = round(n * long_fraction)
    is_long = np.zeros(n, dtype=bool)
    is_long[:num_long] = True
    rng.shuffle(is_long)
    body = np.exp(rng.uniform(math.log(lo), math.log(split), size=n))  # log-uniform in [lo, split)
    tail = rng.uniform(math.ceil(split), hi + 1, size=n)  # uniform in [ceil(split), hi]
    out = np.where(is_long, np.floor(tail), np.floor(body))
    return [int(min(max(v, lo), hi)) for v in out]


def default_texts(root: Path = REPO_ROOT) -> list[tuple[str, str]]:
    """(domain, text) pairs from eval/text/*.jsonl then calibration_data/*.jsonl, sorted for determinism."""
    out: list[tuple[str, str]] = []
    for folder in (root / "eval" / "text", root / "calibration_data"):
        for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
            for line in path.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                if isinstance(row.get("text"), str) and row["text"].strip():
                    out.append((row.get("domain") or path.stem, row["text"]))
    return out


def build_requests(workload: Workload, tokenizer=None, vocab_size: int | None = None,
                   texts: list[tuple[str, str]] | None = None, id_prefix: str = "") -> list[BenchRequest]:
    """The workload's requests, deterministic in (workload, tokenizer/vocab, texts)."""
    rng = np.random.default_rng(workload.seed)
    n = workload.num_requests
    p_lens = long_tail_lengths(n, *workload.prompt_tokens, workload.long_fraction, rng)
    o_lens = long_tail_lengths(n, *workload.output_tokens, workload.long_fraction, rng)
    make = _prompt_maker(tokenizer, vocab_size, texts, rng)
    reqs = []
    for i, (pl, ol) in enumerate(zip(p_lens, o_lens)):
        domain, text, ids = make(pl)
        reqs.append(BenchRequest(request_id=f"{id_prefix}{workload.name}-{i}", prompt=text,
                                 prompt_token_ids=tuple(ids) if ids is not None else None, prompt_tokens=pl,
                                 max_tokens=ol, domain=domain))
    return reqs


def _prompt_maker(tokenizer, vocab_size, texts, rng: np.random.Generator):
    """A function length -> (domain, text, token ids | None) for the chosen prompt source."""
    if tokenizer is not None:
        texts = texts if texts is not None else default_texts()
        if not texts:
            texts = [("synthetic", " ".join(_WORDS))]
        docs = [(d, tokenizer.encode(t, add_special_tokens=False)) for d, t in texts]
        docs = [(d, ids) for d, ids in docs if ids]
        # one long token stream per domain so any length can be cut from it
        stream: list[int] = [t for _, ids in docs for t in ids]
        owner: list[str] = [d for d, ids in docs for _ in ids]
        while len(stream) < 2:
            stream = stream * 2
            owner = owner * 2

        def make(n: int):
            start = int(rng.integers(0, len(stream)))
            ids = [stream[(start + k) % len(stream)] for k in range(n)]
            return owner[start], tokenizer.decode(ids), ids
        return make
    if vocab_size is not None:
        if vocab_size < 4:
            raise ValueError(f"vocab_size={vocab_size} is invalid; allowed: an integer >= 4")

        def make(n: int):
            # ids >= 3 avoid the usual pad/bos/eos ids of small vocabularies
            ids = [int(x) for x in rng.integers(3, vocab_size, size=n)]
            return "random", " ".join(map(str, ids)), ids
        return make

    def make(n: int):
        words = [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), size=n)]
        return "synthetic", " ".join(words), None
    return make
