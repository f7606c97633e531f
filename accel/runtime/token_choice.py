"""How a step's logits become tokens: sampling (the argmax the native step computed, where a plain greedy batch
needs nothing else) and verification of draft tokens (greedy prefix match, Leviathan/Chen rejection sampling).
Pure functions over the logits and the requests; the model runner calls them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from accel.runtime.outputs import ScheduledRequest
from accel.runtime.sampler import Sampler, plain_greedy, row_argmax, token_logprobs
from accel.runtime.sequence import Sequence


def sample(sampler: Sampler, logits: Tensor, seqs: list[Sequence], generator_of: Callable, argmax: Tensor | None = None
           ) -> list[tuple[list[int], list | None, list | None]]:
    """One token per row of logits [N, V]: (token ids, logprobs, top logprobs) per request. argmax: the rows'
    argmax where the forward computed it (the native step): a plain greedy batch then skips the sampler."""
    masked = mask_early_stop(logits, seqs)
    if argmax is not None and not masked and all(plain_greedy(s.params) and s.params.logprobs is None
                                                  for s in seqs):
        return [([t], None, None) for t in argmax.tolist()]
    out = sampler(logits, [s.params for s in seqs], [generator_of(s) for s in seqs],
                       [s.prompt_token_ids for s in seqs], [s.output_token_ids for s in seqs])
    tokens = out.token_ids.tolist()
    lps = out.logprobs.tolist() if out.logprobs is not None else None
    rows = []
    for j, seq in enumerate(seqs):
        if lps is not None and seq.params.logprobs is not None:
            rows.append(([tokens[j]], [lps[j]], [out.top_logprobs[j]] if out.top_logprobs is not None else None))
        else:
            rows.append(([tokens[j]], None, None))
    return rows


def verify(sampler: Sampler, logits: Tensor, spec: list[tuple[ScheduledRequest, int]],
           draft_probs: dict[str, Tensor | None], generator_of: Callable, argmax: Tensor | None = None
           ) -> list[tuple[list[int], list | None, list | None]]:
    """Verify the draft tokens of requests scheduled with them: (accepted drafts + 1 token, their logprobs, their
    top logprobs) each, the logprobs raw from the target's rows (what decoding without drafts reports) or None
    where the request asks for none.

    A request with n drafts computed n + 1 query rows ending at its sampling row; `logits` holds those rows of
    every request in `spec`, in order ([sum(n + 1), V]):

        row:     last-n      last-n+1  ...  last
        input:   x_{t-1}     d_0       ...  d_{n-1}
        target:  p_0         p_1       ...  p_n      (p_j: next-token distribution after d_<j)

    Greedy requests keep the drafts while they equal the target's argmax (prefix match: the output is
    token-identical to decoding without drafts); sampled ones go through Leviathan/Chen rejection
    sampling with the request's own processing (penalties, temperature, top-k/p, min-p) applied to p.
    """
    from accel.runtime.rejection import greedy_accept, rejection_sample

    # one entry per row: the sequence, and the output tokens that position has seen (drafts included)
    seqs = [r.seq for r, _ in spec for _ in range(len(r.spec_token_ids) + 1)]
    outputs = [r.seq.output_token_ids + r.spec_token_ids[:j] for r, _ in spec
               for j in range(len(r.spec_token_ids) + 1)]
    masked = mask_early_stop(logits, seqs, [len(o) for o in outputs])
    all_plain_greedy = all(plain_greedy(r.seq.params) for r, _ in spec)
    if all_plain_greedy:
        argmax, probs = (row_argmax(logits) if argmax is None or masked else argmax), None  # [R]
    else:
        probs = sampler.probs(logits, [s.params for s in seqs], [s.prompt_token_ids for s in seqs],
                                   outputs)  # [R, V]; greedy rows one-hot
        argmax = row_argmax(probs)
    # every greedy request's target tokens in one host copy (one device sync per step, not per request)
    targets = argmax.tolist() if any(r.seq.params.greedy for r, _ in spec) else None
    out, start = [], 0
    for r, _ in spec:
        n = len(r.spec_token_ids)
        if r.seq.params.greedy:
            out.append(greedy_accept(r.spec_token_ids, targets[start:start + n + 1]))
        else:
            d = torch.tensor([r.spec_token_ids], dtype=torch.long, device=logits.device)  # [1, n]
            q = draft_probs.get(r.seq.request_id)
            q = None if q is None else q[:n].to(logits.device)[None]  # [1, n, V]
            res = rejection_sample(d, [n], q, probs[start:start + n + 1][None], [generator_of(r.seq)])
            out.append(res.output_token_ids[0])
        start += n + 1
    return [(tokens, *_row_logprobs(logits, start, tokens, r.seq.params.logprobs))
            for tokens, start, (r, _) in zip(out, _starts(spec), spec)]


def _starts(spec: list[tuple[ScheduledRequest, int]]) -> list[int]:
    starts, at = [], 0
    for r, _ in spec:
        starts.append(at)
        at += len(r.spec_token_ids) + 1
    return starts


def _row_logprobs(logits: Tensor, start: int, tokens: list[int], k: int | None) -> tuple[list | None, list | None]:
    """Raw logprobs of `tokens` at rows start.. of a verify span (each accepted position's own row), and the top-k."""
    if k is None or not tokens:
        return None, None
    return token_logprobs(logits[start:start + len(tokens)], tokens, k)


def mask_early_stop(logits: Tensor, seqs: list[Sequence], num_outputs: list[int] | None = None) -> bool:
    """min_tokens: eos and stop token ids cannot be sampled before min_tokens outputs (as vLLM). True if a row
    was masked."""
    masked = False
    for row, seq in enumerate(seqs):
        p = seq.params
        if (seq.num_output_tokens if num_outputs is None else num_outputs[row]) < p.min_tokens:
            banned = list(p.stop_token_ids)
            if seq.eos_token_id is not None and not p.ignore_eos:
                banned.append(seq.eos_token_id)
            if banned:
                logits[row, banned] = float("-inf")
                masked = True
    return masked
