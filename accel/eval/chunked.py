"""Quality scored the way llama.cpp's `llama-perplexity -c N --kl-divergence` scores, so accel's exports and GGUF
files are compared on one scale.

The held-out text is cut into non-overlapping chunks of `n_ctx` tokens; each chunk is a fresh context (its first
token replaced by BOS when the tokenizer adds one), and only the second half of each chunk is scored (the model
always has at least n_ctx / 2 tokens of context). Per scored position: KL(P_base || P_model), whether the top-1
tokens agree, and both NLLs; the PPL ratio is exp(mean NLL - mean base NLL), as llama.cpp's
`Mean PPL(Q)/PPL(base)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from accel.eval.data import load_texts
from accel.eval.metrics import PositionStats, concat_stats, position_stats

CHUNKS_PER_FORWARD = 8  # chunks per batched forward (8 x 128 tokens: one forward's logits are 200 MB)


@dataclass
class ChunkScores:
    """One model against the base over the same chunks."""

    kld_mean: float
    kld_p99: float
    same_top1: float  # fraction of scored positions whose argmax matches the base's
    ppl: float
    ppl_base: float
    num_tokens: int  # scored positions

    @property
    def ppl_ratio(self) -> float:
        return self.ppl / self.ppl_base

    @classmethod
    def from_stats(cls, s: PositionStats) -> ChunkScores:
        return cls(kld_mean=float(s.kl.mean()), kld_p99=float(np.percentile(s.kl, 99)),
                   same_top1=float(s.top1_agree.mean()), ppl=float(np.exp(s.nll.mean())),
                   ppl_base=float(np.exp(s.nll_base.mean())), num_tokens=int(s.nll.size))


def held_out_text(text_dir: str | Path, domains: Sequence[str] | None = None) -> str:
    """Every held-out document, taken round-robin across the domains (so a prefix of the chunks covers all of
    them), separated by blank lines."""
    by_domain = [docs for _, docs in sorted(load_texts(text_dir, domains).items())]
    ordered = [docs[i].text for i in range(max(map(len, by_domain))) for docs in by_domain if i < len(docs)]
    return "\n\n".join(ordered)


def make_chunks(token_ids: Sequence[int], n_ctx: int, max_chunks: int | None = None,
                bos_token_id: int | None = None) -> torch.Tensor:
    """[C, n_ctx] non-overlapping chunks of the token stream (the tail that does not fill a chunk is dropped), each
    starting with `bos_token_id` in place of its first token when given (llama-perplexity's rule)."""
    if n_ctx < 4 or n_ctx % 2:
        raise ValueError(f"n_ctx={n_ctx} is invalid; allowed: an even number >= 4")
    n = len(token_ids) // n_ctx
    if max_chunks is not None:
        n = min(n, max_chunks)
    if n < 1:
        raise ValueError(f"the text has {len(token_ids)} tokens; at least n_ctx={n_ctx} are needed for one chunk")
    chunks = torch.tensor(list(token_ids[: n * n_ctx]), dtype=torch.long).view(n, n_ctx)
    if bos_token_id is not None:
        chunks[:, 0] = bos_token_id
    return chunks


def text_chunks(tokenizer, text: str, n_ctx: int, max_chunks: int | None = None) -> torch.Tensor:
    """`make_chunks` of a text, each chunk opening with BOS when the tokenizer adds one (as llama-perplexity does)."""
    bos = tokenizer.bos_token_id
    adds_bos = bos is not None and tokenizer("a").input_ids[:1] == [bos]
    return make_chunks(tokenizer(text, add_special_tokens=False).input_ids, n_ctx, max_chunks,
                       bos if adds_bos else None)


@torch.no_grad()
def _scored_logits(model, chunks: torch.Tensor) -> torch.Tensor:
    """Logits of the second half of each chunk that predict a token inside it: [C * (n_ctx/2 - 1), V]."""
    first = chunks.shape[1] // 2
    logits = model(input_ids=chunks).logits[:, first:-1]
    return logits.reshape(-1, logits.shape[-1]).float()


def score_chunks(base, models: dict[str, object], chunks: torch.Tensor,
                 on_batch: Callable[[int], None] | None = None) -> dict[str, ChunkScores]:
    """Each of `models` (HF causal LMs sharing the base's vocabulary) scored against `base` on `chunks`; the base
    runs once per batch of chunks. `on_batch`: called with the number of chunks done (progress)."""
    first = chunks.shape[1] // 2
    parts: dict[str, list[PositionStats]] = {name: [] for name in models}
    for lo in range(0, chunks.shape[0], CHUNKS_PER_FORWARD):
        batch = chunks[lo: lo + CHUNKS_PER_FORWARD]
        targets = batch[:, first + 1:].reshape(-1)
        base_logits = _scored_logits(base, batch)
        for name, model in models.items():
            parts[name].append(position_stats(_scored_logits(model, batch), targets, base_logits))
        if on_batch is not None:
            on_batch(min(lo + CHUNKS_PER_FORWARD, chunks.shape[0]))
    return {name: ChunkScores.from_stats(concat_stats(p)) for name, p in parts.items()}
