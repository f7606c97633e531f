"""Batched sampling: one call turns a batch of next-token logits into one token per row.

Every row carries its own `SamplingParams`; the processing is vectorised over rows by turning the parameters
into per-row tensors (temperature [N], top_k [N], ...), so a batch mixing greedy, nucleus and penalised
requests costs one pass of tensor ops. Only the random draw loops over rows, because each seeded row must
consume its own `torch.Generator` (that is what makes "same seed -> same tokens" hold whatever else is in
the batch).

Processing order (the same for `__call__` and `probs`, so the speculative-decoding rejection sampler sees
target and draft distributions processed identically):

    raw logits ─► + logit_bias ─► penalties (repetition on prompt+output, presence/frequency on output)
               ─► / temperature ─► top-k ─► top-p ─► min-p ─► softmax ─► draw

Glossary:
  raw logprobs        log_softmax of the logits exactly as the model produced them (vLLM v1's default and what
                      the OpenAI API reports); independent of the sampling parameters.
  processed logprobs  log of the distribution the token was actually drawn from (after everything above);
                      -inf for filtered tokens, 0.0 for the chosen token of a greedy row.
  exponential race    argmax(p / q) with q_i ~ Exp(1) i.i.d. picks index i with probability p_i; it needs one
                      vector of random numbers per row and no cumsum/searchsorted, and it is what vLLM uses.
  candidates          the TOP_P_CANDIDATES most likely tokens of a row; top-k / top-p work on them (topk is
                      far cheaper than a full sort of the vocabulary) and fall back to a full sort when a
                      nucleus does not fit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from accel.kernels import cpu
from accel.runtime.sampling_params import SamplingParams


def row_argmax(x: Tensor) -> Tensor:
    """argmax over the last dim of [N, V]: accel's kernel for fp32 on the CPU (torch's is much slower on one
    49,152-logit row, which every batch-1 decode step takes), else torch's. Same result either way."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] > 0 \
            and cpu.available():
        return cpu.argmax_rows(x)
    return x.argmax(dim=-1)

LogprobsMode = Literal["raw", "processed"]
_LOGPROBS_MODES = ("raw", "processed")


@dataclass
class SamplerOutput:
    """Result of sampling one token per row.

    token_ids     [N] long: the chosen token of each row.
    logprobs      [N] float: log-prob of the chosen token (raw or processed, see `Sampler(logprobs_mode=...)`),
                  or None when no row asked for logprobs (`params.logprobs is None` for all rows).
    top_logprobs  per row, the `params.logprobs` most likely (token_id, logprob) pairs in descending order
                  (an empty list for rows that asked for none), or None when no row asked for any.
    """

    token_ids: Tensor
    logprobs: Tensor | None
    top_logprobs: list[list[tuple[int, float]]] | None


@dataclass
class _RowParams:
    """Per-row sampling parameters as tensors on the logits' device (built once per call)."""

    greedy: Tensor  # [N] bool
    temperature: Tensor  # [N] float, 1.0 on greedy rows so the division is harmless
    top_k: Tensor  # [N] long, V where off
    top_p: Tensor  # [N] float, 1.0 where off
    min_p: Tensor  # [N] float, 0.0 where off
    repetition: Tensor  # [N] float, 1.0 where off
    presence: Tensor  # [N] float
    frequency: Tensor  # [N] float
    bias_ids: Tensor | None  # [N, L] long: each row's biased token ids (padded with its first, bias 0), or None
    bias: Tensor | None  # [N, L] float
    greedy_rows: tuple[bool, ...]  # the same flags on the host: branching on them never waits for the device
    any_penalty: bool
    any_temperature: bool  # some row's temperature != 1.0
    any_top_k_top_p: bool
    any_min_p: bool


def is_greedy(params: SamplingParams | None) -> bool:
    """Temperature 0 (None: no params, greedy)."""
    return params is None or bool(params.greedy)


def has_penalty(params: SamplingParams | None) -> bool:
    """Repetition, presence or frequency penalty on (they make even a greedy row's argmax depend on history)."""
    return params is not None and (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
                                   or params.frequency_penalty != 0.0)


def plain_greedy(params: SamplingParams | None) -> bool:
    """Greedy without penalties, a logit bias or a grammar: the token is the raw logits' argmax."""
    return is_greedy(params) and not has_penalty(params) and not (
        params is not None and (params.logit_bias or params.structured is not None))


def _row_params(params: list[SamplingParams], vocab_size: int, device: torch.device) -> _RowParams:
    def t(values: list, dtype: torch.dtype) -> Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    greedy = [p.greedy for p in params]
    top_k = [vocab_size if (p.top_k is None or p.greedy) else min(p.top_k, vocab_size) for p in params]
    top_p = [1.0 if p.greedy else p.top_p for p in params]
    min_p = [0.0 if p.greedy else p.min_p for p in params]
    rep = [p.repetition_penalty for p in params]
    pres = [p.presence_penalty for p in params]
    freq = [p.frequency_penalty for p in params]
    temperature = [1.0 if g else p.temperature for g, p in zip(greedy, params)]
    biased = [sorted(p.logit_bias.items()) for p in params]
    bias_ids = bias = None
    if any(biased):
        _check_token_ids([[t for t, _ in b] for b in biased], vocab_size, "logit_bias")
        bias_ids = _padded([[t for t, _ in b] for b in biased], 0, device=device)
        bias = _padded([[float(v) for _, v in b] for b in biased], 0.0, dtype=torch.float32, device=device)
    return _RowParams(
        greedy=t(greedy, torch.bool),
        temperature=t(temperature, torch.float32),
        top_k=t(top_k, torch.long),
        top_p=t(top_p, torch.float32),
        min_p=t(min_p, torch.float32),
        repetition=t(rep, torch.float32),
        presence=t(pres, torch.float32),
        frequency=t(freq, torch.float32),
        bias_ids=bias_ids,
        bias=bias,
        greedy_rows=tuple(greedy),
        any_penalty=any(r != 1.0 for r in rep) or any(x != 0.0 for x in pres + freq),
        any_temperature=any(x != 1.0 for x in temperature),
        any_top_k_top_p=any(k < vocab_size for k in top_k) or any(p < 1.0 for p in top_p),
        any_min_p=any(m > 0.0 for m in min_p),
    )


def _padded(rows: list[list], pad: list | int, dtype: torch.dtype = torch.long,
            device: torch.device | None = None) -> Tensor:
    """Ragged lists -> [N, L] tensor (L >= 1), row i padded with pad[i] (or the scalar pad)."""
    width = max(1, max((len(r) for r in rows), default=0))
    pads = pad if isinstance(pad, list) else [pad] * len(rows)
    data = [list(r) + [pads[i]] * (width - len(r)) for i, r in enumerate(rows)]
    return torch.tensor(data, dtype=dtype, device=device)


def _check_token_ids(rows: list[list[int]], vocab_size: int, what: str = "token id") -> None:
    for i, r in enumerate(rows):
        if r and (min(r) < 0 or max(r) >= vocab_size):
            raise ValueError(f"row {i} has a {what} outside [0, {vocab_size}): {r}")


def apply_penalties(
    logits: Tensor,
    repetition: Tensor,
    presence: Tensor,
    frequency: Tensor,
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
) -> Tensor:
    """Return penalised logits [N, V] (new tensor).

    repetition (CTRL/HF, on prompt + output tokens): positive logits divided by the penalty, negative ones
    multiplied, so penalty > 1 always makes a seen token less likely.
    presence / frequency (OpenAI, on output tokens only): logit -= presence * [count > 0] + frequency * count.
    Only the seen tokens are touched (gather / scatter over [N, L] ids), not the whole [N, V] vocabulary.
    """
    n, v = logits.shape
    _check_token_ids(prompt_token_ids, v)
    _check_token_ids(output_token_ids, v)
    out = logits.clone()
    dev = logits.device
    if bool((repetition != 1.0).any()):
        seen = [sorted(set(p) | set(o)) for p, o in zip(prompt_token_ids, output_token_ids)]
        # Pad with the row's first seen id: a duplicate index that receives the same penalised value.
        ids = _padded(seen, [r[0] if r else 0 for r in seen], device=dev)  # [N, L]
        nonempty = torch.tensor([bool(r) for r in seen], device=dev)[:, None]  # [N, 1]
        g = out.gather(1, ids)  # [N, L]
        rep = repetition[:, None]
        penalised = torch.where(g > 0, g / rep, g * rep)
        out.scatter_(1, ids, torch.where(nonempty, penalised, g))
    if bool((presence != 0.0).any() or (frequency != 0.0).any()):
        counts = [Counter(o) for o in output_token_ids]
        ids = _padded([list(c) for c in counts], 0, device=dev)  # [N, L] unique output ids
        cnt = _padded([list(c.values()) for c in counts], 0, dtype=torch.float32, device=dev)  # [N, L], pad 0
        delta = presence[:, None] * (cnt > 0).to(cnt.dtype) + frequency[:, None] * cnt  # 0 on padding
        out.scatter_add_(1, ids, -delta.to(out.dtype))
    return out


# Rows are first cut to this many most likely candidates with topk, which is far cheaper than sorting a
# 49k vocabulary; the nucleus almost always lies inside them. When it does not, the full sort is used.
TOP_P_CANDIDATES = 1024


def apply_top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor, candidates: int = TOP_P_CANDIDATES) -> Tensor:
    """Mask (-inf) all but the top_k[i] largest logits of row i, then all outside the nucleus top_p[i].

    top_k [N] long (V = off) keeps exactly k tokens (ties at the boundary broken by torch.topk's order).
    top_p [N] float (1.0 = off) keeps the smallest prefix of the descending distribution (after top-k,
    renormalised) whose mass reaches p: the token that crosses p is kept, the most likely token always is.
    Returns a new tensor; rows with both filters off are returned unchanged.
    """
    n, v = logits.shape
    finite_k = top_k[top_k < v]
    c = min(v, max(candidates, int(finite_k.max()) if finite_k.numel() else 0))
    vals, idx = logits.topk(c, dim=-1)  # [N, c] descending
    keep = torch.arange(c, device=logits.device)[None, :] < top_k[:, None]  # [N, c]
    vals_k = vals.masked_fill(~keep, float("-inf"))
    # Normaliser of the top-k-filtered distribution: the kept candidates when k <= c, else the whole row.
    has_k = top_k < v  # [N]
    lse = vals_k.logsumexp(dim=-1)  # [N]
    if not bool(has_k.all()):
        lse = torch.where(has_k, lse, logits.logsumexp(dim=-1))
    probs = (vals_k - lse[:, None]).exp()  # [N, c]
    cum = probs.cumsum(dim=-1)  # [N, c]
    use_p = top_p < 1.0  # p == 1.0 is "off": rounding can push cumsum to 1.0 before the tail
    if bool((use_p & (cum[:, -1] < top_p)).any()):
        return _top_k_top_p_sorted(logits, top_k, top_p)  # some nucleus extends past the candidates
    drop = ((cum - probs) >= top_p[:, None]) & use_p[:, None]  # mass of strictly more likely tokens >= p
    drop[:, 0] = False
    filtered = has_k | use_p  # [N]
    if bool(filtered.all()):
        out = torch.full_like(logits, float("-inf"))
    else:
        out = torch.where(filtered[:, None], torch.full_like(logits, float("-inf")), logits)
    return out.scatter_(1, idx, torch.where(filtered[:, None], vals_k.masked_fill(drop, float("-inf")), vals))


def _top_k_top_p_sorted(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Reference implementation of `apply_top_k_top_p` over a full sort of each row."""
    v = logits.shape[1]
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)  # [N, V]
    ranks = torch.arange(v, device=logits.device)  # [V]
    sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)  # [N, V]
    mass_before = probs.cumsum(dim=-1) - probs  # exclusive cumsum: mass of strictly more likely tokens
    drop = (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_idx, sorted_logits)


def apply_min_p(logits: Tensor, min_p: Tensor) -> Tensor:
    """Mask tokens whose probability is below min_p[i] * (probability of the row's most likely token)."""
    probs = logits.softmax(dim=-1)  # [N, V]
    threshold = min_p[:, None] * probs.amax(dim=-1, keepdim=True)  # [N, 1]
    return logits.masked_fill(probs < threshold, float("-inf"))


class Sampler:
    """Samples one token per row of a logits batch, each row with its own `SamplingParams`.

    logprobs_mode: "raw" (default, like vLLM v1 and the OpenAI API: log_softmax of the model's logits) or
    "processed" (log of the distribution actually sampled from; see the module docstring).
    """

    def __init__(self, logprobs_mode: LogprobsMode = "raw") -> None:
        if logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode={logprobs_mode!r} is invalid; allowed: {_LOGPROBS_MODES}")
        self.logprobs_mode = logprobs_mode

    def __call__(
        self,
        logits: Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
    ) -> SamplerOutput:
        """Sample one token per row of `logits` [N, V]; see `SamplerOutput`."""
        _check_batch(logits, params, prompt_token_ids, output_token_ids)
        if len(generators) != logits.shape[0]:
            raise ValueError(f"got {len(generators)} generators for {logits.shape[0]} logits rows; need one per row")
        logits = logits.float()
        want_logprobs = any(p.logprobs is not None for p in params)
        if not want_logprobs and all(plain_greedy(p) for p in params):
            # Fast path: a plain greedy batch is one argmax. Decided from the host-side params, before any
            # per-row tensor is built: on a GPU each of those is a copy, and a branch on one a sync.
            return SamplerOutput(token_ids=row_argmax(logits), logprobs=None, top_logprobs=None)
        rp = _row_params(params, logits.shape[1], logits.device)

        processed = self._process(logits, rp, prompt_token_ids, output_token_ids)  # [N, V]
        probs = processed.softmax(dim=-1)  # [N, V]
        if all(rp.greedy_rows):
            token_ids = row_argmax(processed)
        else:
            token_ids = torch.where(rp.greedy, row_argmax(processed),
                                    _exponential_race(probs, rp.greedy_rows, generators))

        if not want_logprobs:
            return SamplerOutput(token_ids=token_ids, logprobs=None, top_logprobs=None)
        if self.logprobs_mode == "raw":
            logp = logits.log_softmax(dim=-1)
        else:
            logp = _one_hot_greedy(probs, processed, rp).log()
        return SamplerOutput(
            token_ids=token_ids,
            logprobs=logp.gather(1, token_ids[:, None]).squeeze(1),
            top_logprobs=_top_logprobs(logp, params),
        )

    def probs(
        self,
        logits: Tensor,
        params: list[SamplingParams],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
    ) -> Tensor:
        """The distribution `__call__` would draw from: [N, V] float32 (greedy rows: one-hot of the argmax)."""
        _check_batch(logits, params, prompt_token_ids, output_token_ids)
        logits = logits.float()
        rp = _row_params(params, logits.shape[1], logits.device)
        processed = self._process(logits, rp, prompt_token_ids, output_token_ids)
        return _one_hot_greedy(processed.softmax(dim=-1), processed, rp)

    @staticmethod
    def _process(
        logits: Tensor, rp: _RowParams, prompt_token_ids: list[list[int]], output_token_ids: list[list[int]]
    ) -> Tensor:
        if rp.bias is not None:  # padding adds 0 to the row's first id
            logits = logits.scatter_add(1, rp.bias_ids, rp.bias)
        if rp.any_penalty:
            logits = apply_penalties(logits, rp.repetition, rp.presence, rp.frequency, prompt_token_ids,
                                     output_token_ids)
        if rp.any_temperature:
            logits = logits / rp.temperature[:, None]
        if rp.any_top_k_top_p:
            logits = apply_top_k_top_p(logits, rp.top_k, rp.top_p)
        if rp.any_min_p:
            logits = apply_min_p(logits, rp.min_p)
        return logits


def _check_batch(logits: Tensor, params: list, prompt_token_ids: list, output_token_ids: list) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V]; got shape {tuple(logits.shape)}")
    n = logits.shape[0]
    for name, seq in (("params", params), ("prompt_token_ids", prompt_token_ids),
                      ("output_token_ids", output_token_ids)):
        if len(seq) != n:
            raise ValueError(f"got {len(seq)} {name} for {n} logits rows; need one per row")


def _exponential_race(probs: Tensor, greedy: tuple[bool, ...], generators: list[torch.Generator | None]) -> Tensor:
    """Draw one index per row from probs [N, V] as argmax(probs / q), q ~ Exp(1).

    q = -log(u), u ~ U[0, 1): several times cheaper than Tensor.exponential_ on CPU, and u < 1 keeps q > 0.
    Seeded rows draw u from their own generator (a full [V] vector, so the stream they consume does not
    depend on the batch); unseeded rows share one draw from the global RNG. Greedy rows draw nothing.
    """
    n, v = probs.shape
    u = torch.full_like(probs, 0.5)  # [N, V]; greedy rows keep a constant (their result is discarded)
    unseeded = [i for i, g in enumerate(generators) if g is None and not greedy[i]]
    if unseeded:
        u[unseeded] = torch.rand(len(unseeded), v, device=probs.device)
    for i, g in enumerate(generators):
        if g is not None and not greedy[i]:
            u[i] = torch.rand(v, generator=g, device=probs.device)
    return row_argmax(probs / u.log_().neg_())


def _one_hot_greedy(probs: Tensor, processed: Tensor, rp: _RowParams) -> Tensor:
    """Replace greedy rows of probs [N, V] by the one-hot of their argmax."""
    if not any(rp.greedy_rows):
        return probs
    one_hot = torch.zeros_like(probs).scatter_(1, processed.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(rp.greedy[:, None], one_hot, probs)


def _top_logprobs(logp: Tensor, params: list[SamplingParams]) -> list[list[tuple[int, float]]] | None:
    k_max = max((p.logprobs or 0) for p in params)
    if k_max == 0:
        return None
    values, ids = logp.topk(k_max, dim=-1)  # [N, k_max], descending
    values, ids = values.tolist(), ids.tolist()
    return [list(zip(ids[i][: p.logprobs or 0], values[i][: p.logprobs or 0])) for i, p in enumerate(params)]


def token_logprobs(logits: Tensor, targets: list[int], k: int) -> tuple[list[float], list | None]:
    """Raw logprobs of tokens `targets` [n] under the logits of the positions before them [n, V], and each
    position's top-k (token id, logprob) when k > 0: prompt tokens (`SamplingParams.prompt_logprobs`), a verify
    span's accepted tokens."""
    logp = logits.float().log_softmax(dim=-1)
    chosen = logp.gather(1, torch.tensor(targets, device=logits.device)[:, None])[:, 0].tolist()
    if not k:
        return chosen, None
    values, ids = logp.topk(k, dim=-1)
    return chosen, [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
