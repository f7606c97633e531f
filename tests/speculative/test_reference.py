"""The reference speculative loop: greedy output identical to plain greedy, sampling distribution exact."""

from __future__ import annotations

import pytest
import torch

from accel.speculative.proposer import DraftModelProposer, NgramProposer
from accel.speculative.reference import speculative_generate
from tests.conftest import make_tiny_llama


@pytest.fixture(scope="module")
def models():
    return make_tiny_llama(seed=0), make_tiny_llama(seed=1)


def plain_greedy(model, prompt, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_identical_with_draft_model_and_ngram(models, k):
    target, draft = models
    prompt = [1, 9, 33, 9, 33, 71, 9, 33]
    ref = plain_greedy(target, prompt, 24)
    for proposer in (DraftModelProposer(draft), NgramProposer(1, 3), DraftModelProposer(target)):
        res = speculative_generate(target, proposer, prompt, 24, k)
        assert res.token_ids == ref
    # the target drafting for itself accepts everything: ceil(24 / (k + 1)) forwards
    assert res.stats.acceptance_rate == 1.0
    assert res.num_target_forwards == -(-24 // (k + 1))


def test_plain_decoding_without_proposer(models):
    target, _ = models
    res = speculative_generate(target, None, [1, 2, 3], 10, 4)
    assert res.token_ids == plain_greedy(target, [1, 2, 3], 10) and res.num_target_forwards == 10


def test_eos_stops(models):
    target, _ = models
    ref = plain_greedy(target, [1, 2, 3], 6)
    res = speculative_generate(target, NgramProposer(1, 2), [1, 2, 3], 50, 3, eos_token_id=ref[3])
    assert res.token_ids == ref[: ref.index(ref[3]) + 1]


def test_sampling_self_draft_accepts_everything_and_is_seeded(models):
    """The target drafting for itself with the same processing (temperature, top-k, penalties) has q == p,
    so every draft is accepted: this pins that draft and target distributions are processed identically.
    (The output distribution of rejection sampling itself is tested in test_rejection.py.)"""
    from accel.runtime.sampling_params import SamplingParams

    target, _ = models
    params = SamplingParams(temperature=0.8, top_k=50, repetition_penalty=1.3, max_tokens=12)
    prop = DraftModelProposer(target)
    runs = [speculative_generate(target, prop, [1, 4, 4, 9], 12, 3, params=params,
                                 generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert runs[0].token_ids == runs[1].token_ids != runs[2].token_ids
    assert all(r.stats.acceptance_rate == 1.0 for r in runs)
    assert runs[0].num_target_forwards == 3  # 12 tokens, 4 per step
