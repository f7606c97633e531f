"""Offline greedy acceptance replay with scripted proposers."""

from __future__ import annotations

import pytest

from accel.draft_training.acceptance_replay import Continuation, simulate_greedy_acceptance
from accel.speculative.proposer import NgramProposer, ProposalRequest, Proposals, Proposer


class Scripted(Proposer):
    """Proposes from a fixed 'belief' of the continuation: right up to `wrong_at`, then wrong."""

    def __init__(self, prompt_len: int, truth: list[int], wrong_at: set[int]):
        self.prompt_len, self.truth, self.wrong_at = prompt_len, truth, wrong_at
        self.calls: list[int] = []

    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        out = []
        for r in requests:
            pos = len(r.token_ids) - self.prompt_len
            self.calls.append(pos)
            out.append([(-1 if pos + j in self.wrong_at else self.truth[pos + j]) for j in range(r.k)])
        return Proposals(out)


def test_replay_counts_and_positions():
    reply = list(range(100, 110))  # 10 tokens
    prop = Scripted(prompt_len=2, truth=reply, wrong_at={2, 7})
    stats = simulate_greedy_acceptance(prop, [Continuation([1, 2], reply)], k=4)
    # pos 0: drafts 0..3, wrong at 2 -> accept 2, +recovered -> pos 3
    # pos 3: drafts 3..6 all right -> accept 4, +bonus -> pos 8
    # pos 8: drafts 8..9 (2 left) all right -> accept 2 -> done
    assert prop.calls == [0, 3, 8]
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 10, 8)
    assert stats.num_accepted_tokens_per_pos == [3, 3, 1, 1]


def test_replay_with_ngram_on_copied_text():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    reply = [5, 6, 7, 8, 9, 10, 11, 12]  # the reply copies the prompt
    stats = simulate_greedy_acceptance(NgramProposer(1, 2), [Continuation(prompt, reply)], k=3)
    # pos 0: suffix [12]/[11,12] only at the end -> no proposal -> one plain step
    # pos 1: unigram 5 matches the prompt start -> [6, 7, 8] accepted; pos 5: [8, 9] -> [10, 11, 12] accepted
    assert (stats.num_drafts, stats.num_accepted_tokens, stats.acceptance_rate) == (2, 6, 1.0)


def test_bad_k():
    with pytest.raises(ValueError, match="k=0"):
        simulate_greedy_acceptance(NgramProposer(), [], 0)
