import math

import numpy as np
import pytest
import torch

from accel.eval.metrics import POSITION_CHUNK, PositionStats, position_stats, summarize


def test_uniform_distribution_has_perplexity_equal_to_vocab_size():
    V = 17
    logits = torch.zeros(5, V)
    stats = position_stats(logits, torch.tensor([0, 3, 16, 2, 9]))
    assert np.allclose(stats.nll, math.log(V))
    assert summarize(stats, num_windows=1).ppl == pytest.approx(V, rel=1e-6)


def test_nll_picks_the_target_log_probability():
    # p = softmax([0, log 3]) = [1/4, 3/4]
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], dtype=torch.float64)
    stats = position_stats(logits, torch.tensor([0, 1]))
    assert stats.nll == pytest.approx([math.log(4.0), math.log(4.0 / 3.0)], rel=1e-6)
    assert summarize(stats, 1).ppl == pytest.approx(math.exp((math.log(4) + math.log(4 / 3)) / 2), rel=1e-6)


def test_identical_models_have_zero_kl_full_agreement_and_same_ppl():
    torch.manual_seed(0)
    logits = torch.randn(300, 50)  # > POSITION_CHUNK, so chunking is exercised
    assert logits.shape[0] > POSITION_CHUNK
    stats = position_stats(logits, torch.randint(0, 50, (300,)), logits.clone())
    assert np.all(stats.kl == 0.0)
    assert stats.top1_agree.all()
    m = summarize(stats, 1)
    assert (m.kl_mean, m.kl_p99, m.kl_max, m.top1_agreement) == (0.0, 0.0, 0.0, 1.0)
    assert m.ppl == m.ppl_baseline and m.ppl_increase_pct == 0.0


def test_kl_matches_hand_computation():
    # base P = [1/2, 1/4, 1/4], model Q = [1/4, 1/2, 1/4]:
    # KL(P||Q) = 1/2 log 2 + 1/4 log(1/2) + 0 = 1/4 log 2
    base = torch.log(torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64))
    model = torch.log(torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64))
    stats = position_stats(model, torch.tensor([1]), base)
    assert stats.kl == pytest.approx([0.25 * math.log(2.0)], rel=1e-6)
    assert stats.top1_agree.tolist() == [False]
    assert stats.nll.tolist() == pytest.approx([math.log(2.0)])
    assert stats.nll_base.tolist() == pytest.approx([math.log(4.0)])


def test_kl_is_base_to_model_direction_and_ignores_tokens_the_base_rules_out():
    # base puts zero mass on token 2 (-inf logit): 0 * log 0 terms must not turn into NaN.
    base = torch.tensor([[0.0, 0.0, -float("inf")]], dtype=torch.float64)  # P = [1/2, 1/2, 0]
    model = torch.log(torch.tensor([[0.25, 0.25, 0.5]], dtype=torch.float64))
    stats = position_stats(model, torch.tensor([0]), base)
    assert stats.kl == pytest.approx([math.log(2.0)], rel=1e-6)  # sum 1/2 log(2) * 2


def test_summary_reports_mean_p99_max_and_agreement():
    stats = PositionStats(
        nll=np.full(100, math.log(2.0)),
        nll_base=np.full(100, 0.0),
        kl=np.arange(100, dtype=np.float64),  # 0..99
        top1_agree=np.array([True] * 97 + [False] * 3),
    )
    m = summarize(stats, num_windows=4)
    assert m.num_tokens_scored == 100 and m.num_windows == 4
    assert m.kl_mean == pytest.approx(49.5)
    assert m.kl_p99 == pytest.approx(98.01)  # linear interpolation: 0.99 * 99
    assert m.kl_max == 99.0
    assert m.top1_agreement == pytest.approx(0.97)
    assert m.ppl == pytest.approx(2.0) and m.ppl_baseline == 1.0 and m.ppl_increase_pct == pytest.approx(100.0)


def test_vocab_mismatch_is_rejected():
    with pytest.raises(ValueError, match="must share the vocabulary"):
        position_stats(torch.zeros(2, 5), torch.tensor([0, 1]), torch.zeros(2, 6))


def test_empty_stats_cannot_be_summarized():
    with pytest.raises(ValueError, match="no scored tokens"):
        summarize(PositionStats(np.zeros(0)), 0)
