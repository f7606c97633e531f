"""Sampler: processing on hand-made distributions, per-request seeds, empirical frequencies, logprobs."""

import math

import pytest
import torch

from accel.runtime.sampler import Sampler, _top_k_top_p_sorted, apply_min_p, apply_penalties, apply_top_k_top_p
from accel.runtime.sampling_params import SamplingParams

NEG = float("-inf")


def _logits_of(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor(probs).log()


def _call(logits, params, generators=None, prompts=None, outputs=None, **kw):
    n = logits.shape[0]
    return Sampler(**kw)(
        logits, params, generators or [None] * n, prompts or [[] for _ in range(n)], outputs or [[] for _ in range(n)]
    )


def test_greedy_is_argmax_and_fast_path_has_no_logprobs():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    out = _call(logits, [SamplingParams(temperature=0.0)] * 6)
    assert torch.equal(out.token_ids, logits.argmax(-1))
    assert out.logprobs is None and out.top_logprobs is None


def test_greedy_rows_in_a_mixed_batch_are_argmax():
    torch.manual_seed(1)
    logits = torch.randn(4, 30)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1)] * 2
    gens = [None, torch.Generator().manual_seed(1), None, torch.Generator().manual_seed(2)]
    out = _call(logits, params, gens)
    assert out.token_ids[0] == logits[0].argmax() and out.token_ids[2] == logits[2].argmax()


def test_top_k_keeps_exactly_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [1.0, 5.0, 3.0, 4.0, 2.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2, 5]), torch.tensor([1.0, 1.0]))
    assert torch.equal(out[0], torch.tensor([NEG, 5.0, NEG, 4.0, NEG]))
    assert torch.equal(out[1], logits[1])


def test_top_p_keeps_smallest_prefix_reaching_p():
    # sorted probs 0.5, 0.3, 0.15, 0.05: p=0.6 keeps {0.5, 0.3}; p=0.1 keeps only the top token;
    # p=0.96 needs the 0.05 tail too (0.95 < 0.96), so all four stay.
    logits = _logits_of([[0.15, 0.5, 0.05, 0.3]] * 3)
    out = apply_top_k_top_p(logits, torch.tensor([4, 4, 4]), torch.tensor([0.6, 0.1, 0.96]))
    assert torch.isfinite(out[0]).tolist() == [False, True, False, True]
    assert torch.isfinite(out[1]).tolist() == [False, True, False, False]
    assert torch.isfinite(out[2]).tolist() == [True, True, True, True]


def test_top_k_then_top_p_renormalises_in_between():
    # top-k 2 leaves {0.5, 0.3} -> renormalised {0.625, 0.375}; top-p 0.6 then keeps only the first.
    logits = _logits_of([[0.15, 0.5, 0.05, 0.3]])
    out = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.6]))
    assert torch.isfinite(out[0]).tolist() == [False, True, False, False]


@pytest.mark.parametrize("candidates", [2, 8, 64])
def test_candidate_top_k_top_p_equals_full_sort(candidates):
    # candidates=2 forces the full-sort fallback for the top-p rows; 64 covers the whole vocabulary.
    torch.manual_seed(5)
    logits = torch.randn(6, 64) * 3
    top_k = torch.tensor([64, 5, 64, 3, 64, 30])
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.5, 0.3, 0.95])
    fast = apply_top_k_top_p(logits, top_k, top_p, candidates=candidates)
    ref = _top_k_top_p_sorted(logits, top_k, top_p)
    assert torch.equal(fast, ref)
    assert torch.equal(fast[0], logits[0])
    assert torch.isfinite(fast).sum(-1)[1].item() == 5


def test_min_p_masks_relative_to_max():
    logits = _logits_of([[0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])
    out = apply_min_p(logits, torch.tensor([0.45, 0.0]))  # threshold 0.18: keep 0.4, 0.3, 0.2
    assert torch.isfinite(out[0]).tolist() == [True, True, True, False]
    assert torch.isfinite(out[1]).all()


def test_repetition_penalty_on_prompt_and_output():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    out = apply_penalties(logits, torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([0.0]),
                          prompt_token_ids=[[0, 1]], output_token_ids=[[3, 3]])
    assert torch.equal(out, torch.tensor([[1.0, -4.0, 2.0, -4.0, 1.0]]))


def test_presence_and_frequency_penalties_use_output_counts_only():
    logits = torch.zeros(1, 5)
    out = apply_penalties(logits, torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([0.25]),
                          prompt_token_ids=[[4, 4, 4]], output_token_ids=[[1, 2, 2, 2]])
    assert torch.allclose(out, torch.tensor([[0.0, -0.75, -1.25, 0.0, 0.0]]))


def test_penalties_per_row_with_ragged_and_empty_histories():
    logits = torch.tensor([[2.0, 2.0, 2.0, 2.0], [2.0, -1.0, 4.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    out = apply_penalties(logits, torch.tensor([2.0, 2.0, 1.0]), torch.tensor([1.0, 0.0, 0.5]),
                          torch.tensor([0.0, 0.0, 0.5]),
                          prompt_token_ids=[[], [2, 0, 2, 2], [0]], output_token_ids=[[], [1], [3, 3, 1]])
    assert torch.allclose(out, torch.tensor([[2.0, 2.0, 2.0, 2.0], [1.0, -2.0, 2.0, 1.0], [1.0, 0.0, 1.0, -0.5]]))


def test_penalties_change_greedy_choice_in_sampler():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    out = _call(logits, [SamplingParams(temperature=0.0, repetition_penalty=1.5)], outputs=[[0]])
    assert out.token_ids.tolist() == [1]


def test_bad_token_id_in_history_raises():
    with pytest.raises(ValueError, match="outside"):
        _call(torch.zeros(1, 5), [SamplingParams(temperature=0.0, presence_penalty=1.0)], outputs=[[5]])


def test_batch_size_mismatch_raises():
    with pytest.raises(ValueError, match="generators"):
        Sampler()(torch.zeros(2, 5), [SamplingParams()] * 2, [None], [[], []], [[], []])
    with pytest.raises(ValueError, match="params"):
        Sampler()(torch.zeros(2, 5), [SamplingParams()], [None, None], [[], []], [[], []])
    with pytest.raises(ValueError, match="logprobs_mode"):
        Sampler(logprobs_mode="weird")


def _seeded_tokens(row_logits, seed, steps, others: int, position: int):
    """Sample `steps` tokens for a seeded row placed at `position` among `others` unrelated rows."""
    torch.manual_seed(123 + others)
    gen = torch.Generator().manual_seed(seed)
    other_gens = [torch.Generator().manual_seed(1000 + i) for i in range(others)]
    tokens = []
    for _ in range(steps):
        batch = torch.randn(others + 1, row_logits.shape[0])
        batch[position] = row_logits
        params = [SamplingParams(temperature=0.7, top_p=0.9, seed=1000 + i) for i in range(others + 1)]
        params[position] = SamplingParams(temperature=1.3, top_k=20, seed=seed)
        gens = other_gens[:position] + [gen] + other_gens[position:]
        out = _call(batch, params, gens)
        tokens.append(out.token_ids[position].item())
    return tokens


def test_same_seed_same_tokens_whatever_the_batch():
    row = torch.randn(64, generator=torch.Generator().manual_seed(7))
    alone = _seeded_tokens(row, seed=42, steps=20, others=0, position=0)
    in_batch = _seeded_tokens(row, seed=42, steps=20, others=4, position=3)
    first = _seeded_tokens(row, seed=42, steps=20, others=4, position=0)
    other_seed = _seeded_tokens(row, seed=43, steps=20, others=0, position=0)
    assert alone == in_batch == first
    assert alone != other_seed


def test_empirical_frequencies_match_processed_distribution():
    torch.manual_seed(3)
    v, n = 12, 4000
    logits = torch.randn(1, v) * 2
    params = SamplingParams(temperature=0.8, top_k=8, top_p=0.9, min_p=0.05)
    expected = Sampler().probs(logits, [params], [[]], [[]])[0]
    batch = logits.expand(n, v).contiguous()
    out = _call(batch, [params] * n, [torch.Generator().manual_seed(9)] * n)
    freq = torch.bincount(out.token_ids, minlength=v).float() / n
    assert (freq[expected == 0] == 0).all()  # never a filtered token
    tv = 0.5 * (freq - expected).abs().sum().item()
    assert tv < 0.03, (freq, expected)


def test_probs_greedy_rows_are_one_hot_and_rows_sum_to_one():
    torch.manual_seed(4)
    logits = torch.randn(3, 10)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=2.0, top_k=3), SamplingParams()]
    p = Sampler().probs(logits, params, [[], [], []], [[], [], []])
    assert torch.equal(p[0], torch.nn.functional.one_hot(logits[0].argmax(), 10).float())
    assert (p[1] > 0).sum() == 3
    assert torch.allclose(p.sum(-1), torch.ones(3))
    assert torch.allclose(p[2], logits[2].softmax(-1))


def test_raw_logprobs_and_top_logprobs():
    logits = _logits_of([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6]])
    params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(temperature=0.0, logprobs=0)]
    out = _call(logits, params)
    assert out.token_ids.tolist() == [1, 2]
    assert torch.allclose(out.logprobs, torch.tensor([math.log(0.6), math.log(0.6)]))
    assert [t for t, _ in out.top_logprobs[0]] == [1, 2]
    assert out.top_logprobs[0][1][1] == pytest.approx(math.log(0.3), abs=1e-6)
    assert out.top_logprobs[1] == []


def test_processed_logprobs_follow_the_sampled_distribution():
    logits = _logits_of([[0.1, 0.6, 0.3], [0.1, 0.6, 0.3]])
    params = [SamplingParams(temperature=1.0, top_k=2, logprobs=3, seed=0), SamplingParams(temperature=0.0, logprobs=1)]
    out = _call(logits, params, [torch.Generator().manual_seed(0), None], logprobs_mode="processed")
    chosen = out.token_ids[0].item()
    assert chosen in (1, 2)
    assert out.logprobs[0].item() == pytest.approx(math.log({1: 2 / 3, 2: 1 / 3}[chosen]), abs=1e-5)
    assert out.top_logprobs[0][2] == (0, NEG)
    assert out.logprobs[1].item() == 0.0


def test_logit_bias_is_added_to_the_raw_logits_of_its_row_only_greedy_or_sampled():
    torch.manual_seed(3)
    logits = torch.randn(4, 50)
    top = logits.argmax(-1)
    params = [SamplingParams(temperature=0.0, logit_bias={int(top[0]): -100.0}),
              SamplingParams(temperature=0.0, logit_bias={11: 100.0}),
              SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.7, seed=1, logit_bias={11: 3.0, 12: -2.5})]
    out = _call(logits, params, [None, None, None, torch.Generator().manual_seed(1)])
    assert int(out.token_ids[0]) == int(logits[0].clone().index_fill_(0, top[0], -1e9).argmax())
    assert int(out.token_ids[1]) == 11 and int(out.token_ids[2]) == int(top[2])
    probs = Sampler().probs(logits, params, [[]] * 4, [[]] * 4)
    biased = logits[3].clone()
    biased[11] += 3.0
    biased[12] -= 2.5
    torch.testing.assert_close(probs[3], (biased / 0.7).softmax(-1))  # what rejection sampling verifies against
    assert float(probs[1, 11]) == 1.0


@pytest.mark.parametrize("bias, allowed", [({-1: 1.0}, "integer >= 0"), ({3: 100.5}, "[-100, 100]"),
                                           ({3: float("nan")}, "finite"), ({3: float("inf")}, "finite")])
def test_logit_bias_outside_openais_range_is_refused(bias, allowed):
    with pytest.raises(ValueError, match="logit_bias") as e:
        SamplingParams(logit_bias=bias)
    assert allowed in str(e.value)
    with pytest.raises(ValueError, match=r"logit_bias token ids \[60\]"):
        SamplingParams(logit_bias={60: 1.0}).check_vocab(50)
