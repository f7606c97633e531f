"""A batch-1 speculative decoding loop over an HF target: the oracle for runtime tests and a bench baseline.

One step: the proposer drafts k tokens from the verified sequence, the target scores the last verified token
plus the drafts in one forward (k + 1 positions), `greedy_verify` / `rejection_sample` decide, and the
target's KV cache is cropped back to the verified tokens (rejected drafts' K/V are discarded, exactly what the
runtime's rollback of num_computed_tokens does).

    verified: x_0 .. x_{t-1}          cache holds K/V of x_0 .. x_{t-2}
    forward:  [x_{t-1}, d_0 .. d_{k-1}] -> p_0 .. p_k
    accept a drafts, emit d_0 .. d_{a-1} + one recovered/bonus token; crop the cache to t - 1 + a + 1 tokens
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from accel.runtime.rejection import greedy_verify, rejection_sample
from accel.speculative.proposer import ProposalRequest, Proposer
from accel.speculative.stats import SpecDecodeStats


@dataclass
class SpecGenerateResult:
    token_ids: list[int]  # generated tokens (prompt excluded), eos included when hit
    stats: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    num_target_forwards: int = 0


@torch.inference_mode()
def speculative_generate(target, proposer: Proposer | None, prompt_ids: list[int], max_new_tokens: int, k: int,
                         params=None, generator: torch.Generator | None = None,
                         eos_token_id: int | set[int] | None = None, request_id: str = "ref") -> SpecGenerateResult:
    """Generate up to max_new_tokens with speculation (proposer None or k = 0: plain decoding).

    params: runtime SamplingParams (None: greedy). Sampling uses accel.runtime.sampler.Sampler.probs for the
    target, so with a draft model proposing from the same processing the output is distributed exactly as
    plain sampling; greedy output is token-identical to plain greedy decoding."""
    from transformers import DynamicCache

    if not prompt_ids:
        raise ValueError("prompt_ids is empty; at least one token is required")
    greedy = params is None or params.greedy
    stop = set() if eos_token_id is None else ({eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id))
    cache = DynamicCache()
    if len(prompt_ids) > 1:
        target(input_ids=torch.tensor([prompt_ids[:-1]]), past_key_values=cache, use_cache=True)
    tokens = list(prompt_ids)
    out = SpecGenerateResult(token_ids=[])
    while len(out.token_ids) < max_new_tokens:
        want = min(k, max_new_tokens - len(out.token_ids) - 1) if proposer is not None else 0
        drafts, q = [], None
        if want > 0:
            prop = proposer.propose([ProposalRequest(tokens, want, request_id, len(prompt_ids), params, generator)])
            drafts = prop.token_ids[0]
            q = None if prop.probs is None else prop.probs[0]
        logits = target(input_ids=torch.tensor([[tokens[-1]] + drafts]), past_key_values=cache,
                        use_cache=True).logits[0].float()  # [n + 1, V]
        out.num_target_forwards += 1
        n = len(drafts)
        d = torch.tensor([drafts], dtype=torch.long).reshape(1, n)
        if greedy:
            res = greedy_verify(d, [n], logits.argmax(-1)[None])
        else:
            p = _target_probs(logits, params, tokens, prompt_ids, drafts)  # [n + 1, V]
            res = rejection_sample(d, [n], None if q is None else q[None], p[None], [generator])
        new = res.output_token_ids[0]
        if n:
            out.stats.observe(n, res.num_accepted[0])
        # the cache now holds tokens[:-1] + [tokens[-1]] + drafts; keep only the verified ones
        if n > res.num_accepted[0]:
            cache.crop(res.num_accepted[0] - n)  # negative: drop the rejected drafts' positions
        for tok in new:
            tokens.append(tok)
            out.token_ids.append(tok)
            if tok in stop or len(out.token_ids) >= max_new_tokens:
                break
        if out.token_ids and out.token_ids[-1] in stop:
            break
    if proposer is not None:
        proposer.finish(request_id)
    return out


def _target_probs(logits, params, tokens: list[int], prompt_ids: list[int], drafts: list[int]):
    """Sampler.probs for each of the n + 1 positions, with the output tokens each position has seen."""
    from accel.runtime.sampler import Sampler

    n_prompt = len(prompt_ids)
    outputs = [tokens[n_prompt:] + drafts[:j] for j in range(len(drafts) + 1)]
    prompts = [tokens[:n_prompt]] * (len(drafts) + 1)
    return Sampler().probs(logits, [params] * (len(drafts) + 1), prompts, outputs)
