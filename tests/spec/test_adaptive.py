"""Adaptive speculation length and batch cutoff, pinned on hand-computed Leviathan numbers."""

from __future__ import annotations

import pytest

from accel.spec.adaptive import (
    AcceptanceEstimate,
    AdaptiveConfig,
    AdaptiveSpeculation,
    best_speculation_length,
    speculation_enabled,
)


@pytest.mark.parametrize("alpha, c, k_max, expected", [
    (0.8, 0.05, 8, 8),  # speedups rise up to k = 8 (3.092 > 3.082 at k = 7)
    (0.8, 0.05, 4, 4),  # bounded by k_max
    (0.8, 0.2, 8, 4),  # 1.868 at k = 4 beats 1.845 at k = 3 and 1.845 at k = 5
    (0.3, 0.2, 8, 1),  # 1.083 at k = 1, 0.993 at k = 2
    (0.1, 0.2, 8, 0),  # 0.917 at k = 1: speculation would slow down
    (0.9, 0.0, 3, 3),  # free drafts: as many as allowed
    (0.9, 0.1, 0, 0),  # k_max = 0
])
def test_best_speculation_length(alpha, c, k_max, expected):
    assert best_speculation_length(alpha, c, k_max) == expected


def test_min_speedup_threshold():
    assert best_speculation_length(0.3, 0.2, 8, min_speedup=1.1) == 0
    assert best_speculation_length(0.3, 0.2, 8, min_speedup=1.0) == 1


@pytest.mark.parametrize("batch, cutoff, expected", [(1, 16, True), (15, 16, True), (16, 16, False),
                                                     (40, 16, False), (1000, None, True)])
def test_batch_cutoff(batch, cutoff, expected):
    assert speculation_enabled(batch, cutoff) is expected


def test_estimate_is_truncated_geometric_mle():
    est = AcceptanceEstimate(successes=0.0, failures=0.0)
    est.update(4, 4, decay=1.0)  # 4 successes, no failure
    est.update(4, 1, decay=1.0)  # 1 success, 1 failure
    est.update(2, 0, decay=1.0)  # 1 failure
    assert est.alpha == pytest.approx(5 / 7)
    est.update(0, 0, decay=1.0)
    assert est.steps_without_draft == 1 and est.alpha == pytest.approx(5 / 7)


def test_decay_follows_recent_steps():
    est = AcceptanceEstimate(successes=10.0, failures=0.0)
    est.update(4, 0, decay=0.5)
    assert (est.successes, est.failures) == (5.0, 1.0)


def test_controller_lowers_k_then_probes():
    ctl = AdaptiveSpeculation(AdaptiveConfig(k_max=4, cost_ratio=0.2, prior_alpha=0.8, prior_weight=2.0,
                                             decay=0.5, probe_interval=3))
    assert ctl.num_speculative_tokens("r", batch_size=1) == 4  # prior alpha 0.8, c 0.2 -> 4
    for _ in range(4):
        ctl.observe("r", 4, 0)  # everything rejected
    assert ctl.estimates["r"].alpha < 0.15
    assert ctl.num_speculative_tokens("r", 1) == 0
    ctl.observe("r", 0, 0)
    assert ctl.num_speculative_tokens("r", 1) == 0
    ctl.observe("r", 0, 0)
    assert ctl.num_speculative_tokens("r", 1) == 1  # third step without drafts: probe with one token
    for _ in range(3):
        ctl.observe("r", 1, 1)  # the text turned predictable
    assert ctl.num_speculative_tokens("r", 1) >= 2


def test_controller_batch_cutoff_and_non_adaptive():
    ctl = AdaptiveSpeculation(AdaptiveConfig(k_max=3, disable_at_batch_size=8, adaptive=False))
    assert ctl.num_speculative_tokens("a", 7) == 3
    assert ctl.num_speculative_tokens("a", 8) == 0
    ctl.observe("a", 3, 1)
    ctl.forget("a")
    assert "a" not in ctl.estimates


@pytest.mark.parametrize("kwargs, msg", [(dict(k_max=-1), "k_max=-1"), (dict(decay=0.0), "decay=0.0"),
                                         (dict(disable_at_batch_size=0), "disable_at_batch_size=0"),
                                         (dict(prior_alpha=2.0), "prior_alpha=2.0")])
def test_config_validation(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        AdaptiveConfig(**kwargs)


def test_observe_rejects_bad_counts():
    with pytest.raises(ValueError, match="num_accepted_tokens=3"):
        AdaptiveSpeculation().observe("r", 2, 3)
