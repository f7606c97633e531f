"""Raw spec-decode counters, derived rates and Leviathan's formula on hand numbers."""

from __future__ import annotations

import pytest

from accel.speculative.stats import (
    SpecDecodeStats,
    expected_tokens_per_step,
    leviathan_speedup,
)


def test_observe_and_derived_rates():
    s = SpecDecodeStats()
    s.observe(4, 2)
    s.observe(4, 4)
    s.observe(2, 0)
    s.observe(0, 0)  # a step without drafts is not a draft
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (3, 10, 6)
    assert s.num_accepted_tokens_per_pos == [2, 2, 1, 1]
    assert s.acceptance_rate == pytest.approx(0.6)
    assert s.mean_acceptance_length == pytest.approx(1 + 6 / 3)
    assert s.acceptance_rate_per_pos == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])


def test_empty_stats_have_no_rates():
    s = SpecDecodeStats()
    assert s.acceptance_rate is None and s.mean_acceptance_length is None and s.acceptance_rate_per_pos == []


def test_add_merges_counters_with_ragged_positions():
    a, b = SpecDecodeStats(), SpecDecodeStats()
    a.observe(2, 2)
    b.observe(4, 3)
    c = a + b
    assert c == SpecDecodeStats(num_drafts=2, num_draft_tokens=6, num_accepted_tokens=5,
                                num_accepted_tokens_per_pos=[2, 2, 1, 0])
    assert a.num_accepted_tokens_per_pos == [1, 1]  # operands untouched


def test_to_dict_round_trip():
    s = SpecDecodeStats()
    s.observe(3, 1)
    d = s.to_dict()
    assert d == {"num_drafts": 1, "num_draft_tokens": 3, "num_accepted_tokens": 1,
                 "num_accepted_tokens_per_pos": [1, 0, 0], "acceptance_rate": pytest.approx(1 / 3),
                 "mean_acceptance_length": 2.0}
    assert SpecDecodeStats.from_dict(d) == s


@pytest.mark.parametrize("drafted, accepted", [(-1, 0), (2, 3), (2, -1)])
def test_observe_rejects_bad_counts(drafted, accepted):
    with pytest.raises(ValueError, match="num_accepted_tokens"):
        SpecDecodeStats().observe(drafted, accepted)


def test_expected_tokens_per_step_hand_numbers():
    assert expected_tokens_per_step(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.8, 0) == 1.0


def test_leviathan_speedup_hand_numbers():
    # alpha 0.8, gamma 4, c 0.05: (1 - 0.8^5) / (0.2 * 1.2) = 0.67232 / 0.24
    assert leviathan_speedup(0.8, 4, 0.05) == pytest.approx(0.67232 / 0.24)
    # a 26%-cost draft at acceptance 0.5 barely helps (the motivation for a cheap draft)
    assert leviathan_speedup(0.5, 4, 0.26) == pytest.approx(1.9375 / 2.04)
    assert leviathan_speedup(0.0, 3, 0.1) == pytest.approx(1 / 1.3)


@pytest.mark.parametrize("alpha, gamma, c, msg", [(1.5, 2, 0.1, "alpha=1.5"), (0.5, -1, 0.1, "gamma=-1"),
                                                  (0.5, 2, -0.1, "cost_ratio=-0.1")])
def test_leviathan_bad_inputs(alpha, gamma, c, msg):
    with pytest.raises(ValueError, match=msg):
        leviathan_speedup(alpha, gamma, c)
