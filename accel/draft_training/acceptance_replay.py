"""Offline measurement of a proposer against a target, without the runtime.

simulate_greedy_acceptance replays what greedy speculative decoding would do on a known target greedy
continuation: at each step the proposer drafts k tokens from the verified prefix, the longest prefix that
matches the target's continuation is accepted and the target's next token is the recovered/bonus token.
That is exactly greedy verification (the target's argmax *is* its greedy continuation), so the counters
equal the runtime's, at the cost of draft forwards only.

measure_cost_ratio times one decode step of the target and one draft step at batch 1 with a warm cache:
the c in Leviathan's speedup formula.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from accel.speculative.proposer import DraftModelProposer, ProposalRequest, Proposer
from accel.speculative.stats import SpecDecodeStats


@dataclass
class Continuation:
    """A prompt and the target's greedy continuation of it (token ids)."""

    prompt: list[int]
    reply: list[int]


def simulate_greedy_acceptance(proposer: Proposer, continuations: list[Continuation], k: int) -> SpecDecodeStats:
    """Greedy speculative decoding replayed on known target continuations; see the module docstring."""
    if k < 1:
        raise ValueError(f"k={k} is invalid; allowed: >= 1")
    stats = SpecDecodeStats()
    for n, c in enumerate(continuations):
        rid = f"offline-{n}"
        pos = 0
        while pos < len(c.reply):
            want = min(k, len(c.reply) - pos)  # beyond the known continuation there is nothing to compare
            drafts = proposer.propose([ProposalRequest(c.prompt + c.reply[:pos], want, rid)]).token_ids[0]
            accepted = 0
            while accepted < len(drafts) and drafts[accepted] == c.reply[pos + accepted]:
                accepted += 1
            stats.observe(len(drafts), accepted)
            pos += accepted + 1
        proposer.finish(rid)
    return stats


@dataclass
class CostMeasurement:
    target_step_s: float  # median seconds of one target decode step (batch 1, warm cache)
    draft_step_s: float  # median seconds of one draft step (batch 1, warm cache, reduced head if any)

    @property
    def cost_ratio(self) -> float:
        return self.draft_step_s / self.target_step_s


@torch.inference_mode()
def measure_cost_ratio(target, draft: DraftModelProposer, context: list[int], steps: int = 24) -> CostMeasurement:
    """Median per-token decode time of target and draft after prefilling `context` (both at batch 1)."""
    from transformers import DynamicCache

    def time_steps(step_fn) -> float:
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            step_fn(i)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[2:])  # the first steps warm up allocator and kernels

    cache = DynamicCache()
    target(input_ids=torch.tensor([context]), past_key_values=cache, use_cache=True)
    t = time_steps(lambda i: target(input_ids=torch.tensor([[context[i % len(context)]]]), past_key_values=cache,
                                    use_cache=True))
    rid = "cost-probe"
    draft.propose([ProposalRequest(list(context), 1, rid)])
    state = draft.states[rid]
    d = time_steps(lambda i: draft._forward(state, [context[i % len(context)]]))
    draft.finish(rid)
    return CostMeasurement(target_step_s=t, draft_step_s=d)


@dataclass
class DraftEvaluation:
    """Offline greedy acceptance of a proposer on held-out prompts, its cost and the predicted speedup."""

    k: int
    num_prompts: int
    stats: SpecDecodeStats
    cost: CostMeasurement | None
    predicted_speedup: float | None  # Leviathan, from the measured acceptance rate and cost ratio

    def to_dict(self) -> dict:
        return {"k": self.k, "num_prompts": self.num_prompts, **self.stats.to_dict(),
                "target_step_s": None if self.cost is None else self.cost.target_step_s,
                "draft_step_s": None if self.cost is None else self.cost.draft_step_s,
                "cost_ratio": None if self.cost is None else self.cost.cost_ratio,
                "predicted_speedup": self.predicted_speedup}


def target_continuations(target, tokenizer, prompts: list[list[dict]], max_new_tokens: int,
                         batch_size: int = 8) -> list[Continuation]:
    """The target's greedy replies to chat prompts (batched HF generate)."""
    from accel.draft_training.distill import generate_teacher_samples

    samples = generate_teacher_samples(target, tokenizer, prompts, max_new_tokens, deadline=float("inf"),
                                       batch_size=batch_size, top_m=1)
    return [Continuation(s.token_ids[: s.loss_start + 1], s.token_ids[s.loss_start + 1:]) for s in samples]


def evaluate_proposer(proposer: Proposer, continuations: list[Continuation], k: int, target=None,
                      cost_context: list[int] | None = None) -> DraftEvaluation:
    """Acceptance of `proposer` on the continuations; with a target and a DraftModelProposer also the cost
    ratio (batch-1 decode step timing) and Leviathan's predicted speedup. N-gram lookup costs ~0."""
    from accel.speculative.stats import leviathan_speedup

    stats = simulate_greedy_acceptance(proposer, continuations, k)
    cost = None
    if target is not None and isinstance(proposer, DraftModelProposer):
        context = cost_context or (continuations[0].prompt + continuations[0].reply)
        cost = measure_cost_ratio(target, proposer, context)
    alpha = stats.acceptance_rate
    ratio = cost.cost_ratio if cost is not None else 0.0
    predicted = None if alpha is None else leviathan_speedup(alpha, k, ratio)
    return DraftEvaluation(k=k, num_prompts=len(continuations), stats=stats, cost=cost, predicted_speedup=predicted)
