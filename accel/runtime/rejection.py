"""Verification of draft tokens: greedy prefix match and exact (Leviathan/Chen) rejection sampling.

Pure functions over padded batches. Row i proposed `num_draft_tokens[i]` tokens (ragged, padded to k columns);
the target scored every draft position plus one more, so target tensors have k + 1 positions per row:

    position j:      0        1      ...   n_i - 1     n_i        (n_i = num_draft_tokens[i] <= k)
    draft tokens:    d_0      d_1    ...   d_{n_i-1}   -
    target dist:     p_0      p_1    ...   p_{n_i-1}   p_{n_i}    (p_j = target's next-token dist. after d_<j)

Glossary (vLLM's rejection sampler):
  accepted tokens   draft tokens kept: d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)) (greedy:
                    when d_j == argmax p_j), and only while every earlier draft token was accepted.
  recovered token   at the first rejected position j, a token sampled from norm(max(0, p_j - q_j)) instead
                    (greedy: argmax p_j). This is what makes the output distribution exactly p.
  bonus token       when all n_i drafts are accepted, one extra token sampled from p_{n_i} for free.
  output tokens     accepted tokens + exactly one recovered or bonus token: 1 to n_i + 1 tokens per row.

Proposers without a distribution (n-gram lookup) pass `draft_probs=None`: q_j is then the one-hot of d_j, so
d_j is accepted with probability p_j(d_j) and the recovered token comes from p_j with d_j removed.

Randomness: seeded rows consume only their own generator, in a fixed order (n_i uniforms, then one [V]
exponential vector), so a seeded row's output does not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class VerifyResult:
    """Outcome of verifying one batch of drafts.

    output_token_ids[i]  accepted drafts of row i followed by its recovered or bonus token.
    num_accepted[i]      how many leading draft tokens of row i were accepted (0..num_draft_tokens[i]).
    """

    output_token_ids: list[list[int]]
    num_accepted: list[int]


def _check_drafts(draft_token_ids: Tensor, num_draft_tokens: list[int] | Tensor, target: Tensor) -> Tensor:
    """Validate shapes; return num_draft_tokens as a [N] long tensor."""
    if draft_token_ids.dim() != 2:
        raise ValueError(f"draft_token_ids must be [N, k]; got shape {tuple(draft_token_ids.shape)}")
    n, k = draft_token_ids.shape
    if target.shape[0] != n or target.shape[1] != k + 1:
        raise ValueError(f"target tensor must have shape [N={n}, k+1={k + 1}, ...]; got {tuple(target.shape)}")
    num = torch.as_tensor(num_draft_tokens, dtype=torch.long, device=draft_token_ids.device).reshape(-1)
    if num.shape[0] != n:
        raise ValueError(f"num_draft_tokens has {num.shape[0]} entries for {n} rows; need one per row")
    if n and (int(num.min()) < 0 or int(num.max()) > k):
        raise ValueError(f"num_draft_tokens must lie in [0, k={k}]; got {num.tolist()}")
    return num


def _num_accepted(accept: Tensor, num: Tensor) -> Tensor:
    """accept [N, k] bool per position -> [N] count of the accepted prefix, ignoring padding past num[i]."""
    n, k = accept.shape
    valid = torch.arange(k, device=accept.device)[None, :] < num[:, None]  # [N, k]
    return (accept & valid).long().cumprod(dim=1).sum(dim=1)  # [N]


def greedy_accept(draft_token_ids: list[int], target_argmax: list[int]) -> list[int]:
    """`greedy_verify` for one request on host lists: drafts d [n], the target's argmax at its n + 1 positions ->
    the accepted drafts followed by the target's token at the first mismatch (or the bonus token).

    Why a host form: the runner turns the argmax of every greedy request of a step into one list with a single
    device sync, where the tensor form costs ~4 syncs per request (shape checks, counts, `.tolist()`), 64 a step
    at batch 16 on a GPU."""
    if len(target_argmax) != len(draft_token_ids) + 1:
        raise ValueError(f"target_argmax has {len(target_argmax)} tokens for {len(draft_token_ids)} drafts; "
                         "need one more than the drafts")
    a = 0
    while a < len(draft_token_ids) and draft_token_ids[a] == target_argmax[a]:
        a += 1
    return list(target_argmax[: a + 1])


def greedy_verify(draft_token_ids: Tensor, num_draft_tokens: list[int] | Tensor,
                  target_argmax: Tensor) -> VerifyResult:
    """Prefix-match verification for greedy requests.

    draft_token_ids [N, k] long (row i valid up to num_draft_tokens[i]), target_argmax [N, k + 1] long: the
    target's greedy token at each position. Accepts drafts while they equal the target's argmax; the output
    is then exactly the target's argmax tokens up to and including the first mismatch (or the bonus token),
    so greedy decoding with speculation is token-identical to decoding without it.
    """
    num = _check_drafts(draft_token_ids, num_draft_tokens, target_argmax)
    accepted = _num_accepted(draft_token_ids == target_argmax[:, :-1], num)  # [N]
    rows = target_argmax.tolist()
    counts = accepted.tolist()
    return VerifyResult(output_token_ids=[rows[i][: a + 1] for i, a in enumerate(counts)], num_accepted=counts)


def rejection_sample(
    draft_token_ids: Tensor,
    num_draft_tokens: list[int] | Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generators: list[torch.Generator | None],
) -> VerifyResult:
    """Leviathan/Chen speculative sampling: the output tokens are distributed exactly as the target's sampler.

    draft_token_ids [N, k] long; draft_probs [N, k, V] (q, the distribution each draft token was drawn from;
    None for proposers without one: q = one-hot of the draft token); target_probs [N, k + 1, V] (p). Both must
    come from the same processing (temperature, top-k, top-p, penalties: `Sampler.probs`). Greedy rows (p
    one-hot) reduce to `greedy_verify`. generators: one per row, None = the global RNG.
    """
    num = _check_drafts(draft_token_ids, num_draft_tokens, target_probs)
    n, k = draft_token_ids.shape
    if len(generators) != n:
        raise ValueError(f"got {len(generators)} generators for {n} rows; need one per row")
    if draft_probs is not None and draft_probs.shape != (n, k, target_probs.shape[2]):
        raise ValueError(f"draft_probs must be [N, k, V] = {(n, k, target_probs.shape[2])}; "
                         f"got {tuple(draft_probs.shape)}")
    target_probs = target_probs.float()
    device, vocab = target_probs.device, target_probs.shape[2]
    uniform, expo = _draws(num, k, vocab, generators, device)  # [N, k], [N, V]

    d = draft_token_ids[:, :, None]  # [N, k, 1]
    p_d = target_probs[:, :k].gather(2, d).squeeze(2)  # [N, k]: p_j(d_j)
    if draft_probs is None:
        q_d = torch.ones_like(p_d)
        q = torch.zeros(n, k, vocab, device=device).scatter_(2, d, 1.0)  # [N, k, V] one-hot
    else:
        q = draft_probs.float()
        q_d = q.gather(2, d).squeeze(2)  # [N, k]
    # accept iff u < p/q, written without the division (q_d == 0 accepts iff p_d > 0)
    accepted = _num_accepted(uniform * q_d < p_d, num)  # [N]

    # the final token's distribution: norm(max(0, p_j - q_j)) at the first rejection, p_{n_i} if none
    rows = torch.arange(n, device=device)
    all_accepted = accepted == num  # [N]
    p_last = target_probs[rows, accepted]  # [N, V]: p_{n_i} (bonus) or p_j at the rejection
    q_last = q[rows, accepted.clamp(max=k - 1)] if k > 0 else torch.zeros_like(p_last)  # [N, V]
    residual = (p_last - q_last).clamp_min(0.0)
    # p == q makes the residual vanish, but then rejection had probability 0; fall back to p for rounding
    residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, p_last)
    final_dist = torch.where(all_accepted[:, None], p_last, residual)  # [N, V]
    # exponential race: argmax(w / e), e ~ Exp(1) picks i with probability w_i / sum(w)
    final = (final_dist / expo).argmax(dim=1)  # [N]

    drafts = draft_token_ids.tolist()
    counts, finals = accepted.tolist(), final.tolist()
    return VerifyResult(output_token_ids=[drafts[i][:a] + [finals[i]] for i, a in enumerate(counts)],
                        num_accepted=counts)


def _draws(num: Tensor, k: int, vocab: int, generators: list[torch.Generator | None],
           device: torch.device) -> tuple[Tensor, Tensor]:
    """Uniforms [N, k] for the accept tests and Exp(1) [N, V] for the final token.

    A seeded row draws num[i] uniforms then V exponentials from its own generator (padding columns get 1.0,
    which never accepts); unseeded rows share one draw from the global RNG.
    """
    n = num.shape[0]
    uniform = torch.ones(n, k, device=device)
    expo = torch.empty(n, vocab, device=device)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if unseeded:
        uniform[unseeded] = torch.rand(len(unseeded), k, device=device)
        expo[unseeded] = torch.empty(len(unseeded), vocab, device=device).exponential_()
    for i, g in enumerate(generators):
        if g is not None:
            m = int(num[i])
            uniform[i, :m] = torch.rand(m, generator=g, device=device)
            expo[i].exponential_(generator=g)
    # Exp(1) == 0 has probability ~2^-24 per entry in fp32; clamping keeps the division finite.
    return uniform, expo.clamp_min_(1e-20)
