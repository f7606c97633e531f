"""Adaptive speculation length and batch cutoff, pinned on hand-computed Leviathan numbers."""

from __future__ import annotations

import pytest

from accel.speculative import adaptive
from accel.speculative.adaptive import (
    AcceptanceEstimate,
    AdaptiveConfig,
    AdaptiveSpeculation,
    best_speculation_length,
    speculation_enabled,
)


@pytest.fixture
def internals(monkeypatch):
    """Set the policy's fixed internals (adaptive.DECAY, PRIOR_ALPHA, PRIOR_WEIGHT, PROBE_INTERVAL) for one test."""
    def set_(**values):
        for name, value in values.items():
            monkeypatch.setattr(adaptive, name.upper(), value)
    return set_


def make(k_max=4, cost_ratio=0.1, disable_above_batch_size=16, adaptive=True) -> AdaptiveSpeculation:
    return AdaptiveSpeculation(AdaptiveConfig(k_max=k_max, cost_ratio=cost_ratio,
                                              disable_above_batch_size=disable_above_batch_size, adaptive=adaptive))


def k_of(ctl: AdaptiveSpeculation, request_id: str, batch_size: int) -> int:
    """The request's draft length as the only one asking in its step."""
    return ctl.lengths([request_id], batch_size)[0]


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


def test_controller_lowers_k_then_probes(internals):
    internals(prior_alpha=0.8, decay=0.5, probe_interval=3)
    ctl = make(k_max=4, cost_ratio=0.2)
    assert k_of(ctl, "r", 1) == 4  # prior alpha 0.8, c 0.2 -> 4
    for _ in range(4):
        ctl.observe("r", 4, 0)  # everything rejected
    assert ctl.estimates["r"].alpha < 0.15
    assert k_of(ctl, "r", 1) == 0
    backoff = ctl.estimates["r"].probe_backoff
    assert backoff == 16  # four drafts that accepted nothing: the probe waits 3 x 16 steps
    for _ in range(3 * backoff - 1):
        assert k_of(ctl, "r", 1) == 0
        ctl.observe("r", 0, 0)
    # four misses are not conclusive: the engine-wide estimate is shrunk to the prior ((0 + 1.6) / (4 + 2)), and
    # twice it pays at c 0.2, so the request may probe; after 20 misses anywhere (1.6 / 22) it may not
    assert ctl.global_alpha() == pytest.approx(1.6 / 6)
    ctl.global_failures += 16.0
    assert k_of(ctl, "r", 1) == 0
    ctl.global_successes += 2.0  # another request shows some acceptance: (2 + 1.6) / 24, twice pays at c 0.2
    assert k_of(ctl, "r", 1) == 1  # 48th step without drafts: probe with one token
    for _ in range(3):
        ctl.observe("r", 1, 1)  # the text turned predictable
    assert k_of(ctl, "r", 1) >= 2


def test_new_requests_start_from_the_acceptance_the_proposer_has_shown(internals):
    internals(prior_alpha=0.5)
    ctl = make(k_max=4, cost_ratio=0.3)
    assert k_of(ctl, "a", 1) == 1  # default prior 0.5 at c 0.3: one token pays
    ctl.observe("a", 1, 1)  # one step of evidence: still below prior_weight, the default prior stays
    assert ctl._prior().alpha == 0.5
    for _ in range(9):
        ctl.observe("a", 1, 0)  # the proposer keeps failing
    assert ctl.global_successes == 1 and ctl.global_failures == 9
    assert ctl._prior().alpha == pytest.approx((1 + 1) / (10 + 2))  # shrunk to the prior by 2 pseudo-steps
    assert k_of(ctl, "b", 1) == 0  # a new request does not relearn it from 0.5
    ctl.observe("b", 0, 0)  # steps without drafts are no evidence
    assert ctl.global_successes + ctl.global_failures == 10


def test_one_request_explores_an_unproven_proposer_and_new_requests_wait_longer_to_probe_a_weak_one(internals):
    from accel.speculative.adaptive import NEW_REQUEST_PROBE_BACKOFF

    internals(prior_alpha=0.5)

    ctl = make(k_max=4, cost_ratio=0.3, disable_above_batch_size=None)
    # no verified drafts yet: of 8 requests that the default prior would all let draft, only the first does
    ids = [f"r{i}" for i in range(8)]
    assert ctl.lengths(ids, 8) == [1] + [0] * 7
    assert ctl.lengths(ids[1:], 8) == [1] + [0] * 6  # the budget is per step, not per request
    for _ in range(3):
        ctl.observe("r0", 1, 1)  # evidence: the proposer is good; everyone drafts
    assert all(k >= 1 for k in ctl.lengths(ids, 8))
    # a weak proposer: requests arriving after the evidence start with a longer wait before their first probe
    internals(prior_alpha=0.5, probe_interval=2)
    weak = make(k_max=4, cost_ratio=0.3, disable_above_batch_size=None)
    for _ in range(4):
        weak.observe("old", 2, 1)
    for _ in range(8):
        weak.observe("old", 1, 0)  # acceptance 4 / 16 = 0.25: k = 0 at c 0.3, but twice that would pay: probes
    assert k_of(weak, "new", 1) == 0
    assert weak.estimates["new"].probe_backoff == NEW_REQUEST_PROBE_BACKOFF
    waited = 0
    while k_of(weak, "new", 1) == 0:
        weak.observe("new", 0, 0)
        waited += 1
    assert waited == 2 * NEW_REQUEST_PROBE_BACKOFF - 1
    # requests that are due to probe in the same step probe one at a time
    for r in ("p", "q", "s"):
        weak.estimates[r] = AcceptanceEstimate(0.0, 2.0, steps_without_draft=50)
    assert weak.lengths(["p", "q", "s"], 3) == [1, 0, 0]


def test_a_fully_accepted_draft_doubles_the_next_length(internals):
    internals(prior_alpha=0.7)
    ctl = make(k_max=15, cost_ratio=0.2, disable_above_batch_size=None)
    for _ in range(3):
        ctl.observe("warm", 2, 1)  # global evidence, so "r" is not rate-limited as an explorer
    k0 = k_of(ctl, "r", 1)
    assert 1 <= k0 < 15
    ctl.observe("r", k0, k0)  # all accepted: a copied span goes on
    k1 = k_of(ctl, "r", 1)
    assert k1 >= 2 * k0
    ctl.observe("r", k1, k1)
    k2 = k_of(ctl, "r", 1)
    assert k2 == min(15, 2 * k1) and k2 > best_speculation_length(ctl.alpha("r"), 0.2, 15)
    ctl.observe("r", k2, 1)  # a rejection ends the run: back to the formula's length
    assert k_of(ctl, "r", 1) == best_speculation_length(ctl.alpha("r"), 0.2, 15)


def test_failed_probes_back_off_and_accepted_ones_come_back(internals):
    internals(prior_alpha=0.0, probe_interval=2)
    ctl = make(k_max=2, cost_ratio=0.3)
    # other requests accepted 1 in 3 (r itself accepts nothing): twice that pays at c 0.3, so r is probed
    ctl.global_successes, ctl.global_failures = 10.0, 20.0
    ctl.estimates["r"] = AcceptanceEstimate(successes=0.0, failures=2.0)

    def steps_to_probe():
        n = 0
        while k_of(ctl, "r", 1) == 0:
            ctl.observe("r", 0, 0)
            n += 1
        return n

    assert steps_to_probe() == 1  # probe_interval 2: one step without drafts, then a probe
    ctl.observe("r", 1, 0)  # the probe accepts nothing
    assert steps_to_probe() == 3  # waits 2 x 2 steps
    ctl.observe("r", 1, 0)
    assert steps_to_probe() == 7  # 2 x 4
    for _ in range(10):
        ctl.observe("r", 1, 0)
    assert ctl.estimates["r"].probe_backoff == 16  # capped
    ctl.observe("r", 1, 1)
    assert ctl.estimates["r"].probe_backoff == 8  # an accepted probe halves the wait


def test_controller_batch_cutoff_and_non_adaptive():
    ctl = make(k_max=3, disable_above_batch_size=8, adaptive=False)
    assert k_of(ctl, "a", 7) == 3
    assert k_of(ctl, "a", 8) == 0
    ctl.observe("a", 3, 1)
    ctl.forget("a")
    assert "a" not in ctl.estimates


@pytest.mark.parametrize("kwargs, msg", [(dict(k_max=-1), "k_max=-1"), (dict(cost_ratio=-0.1), "cost_ratio=-0.1"),
                                         (dict(disable_above_batch_size=0), "disable_above_batch_size=0")])
def test_config_validation(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        AdaptiveConfig(**{**dict(k_max=4, cost_ratio=0.1, disable_above_batch_size=None), **kwargs})


def test_observe_rejects_bad_counts():
    with pytest.raises(ValueError, match="num_accepted_tokens=3"):
        make().observe("r", 2, 3)


def test_cost_meter_fits_the_per_row_verification_cost_and_averages_the_draft_cost():
    from accel.speculative.adaptive import CostMeter

    assert (adaptive.FALLBACK_VERIFY, adaptive.COST_DECAY) == (0.05, 0.95)
    m = CostMeter()
    assert m.verify_ratio(1) == pytest.approx(0.05) and m.cost_ratio(1, fallback_propose=0.2) == pytest.approx(0.25)
    # decode-only steps at a constant row count cannot give a slope: the fallback stays
    for _ in range(5):
        m.observe(0.0, 0, 0.050, rows=1, decode_rows=1, decode_only=True)
    assert m.slope() is None and m.verify_ratio(1) == pytest.approx(0.05)
    # steps cost 50 ms + 2.5 ms per row (1 decode row + 0..7 drafts); prefill steps do not enter the fit
    for i in range(40):
        rows = 1 + i % 8
        m.observe(0.001 * rows, rows - 1, 0.050 + 0.0025 * (rows - 1), rows=rows, decode_rows=1, decode_only=True)
        m.observe(0.0, 0, 3.0, rows=300, decode_rows=1, decode_only=False)
    assert m.slope() == pytest.approx(0.0025, rel=1e-6)
    assert m.verify_ratio(1) == pytest.approx(0.0025 / 0.050, rel=1e-6)
    # in a batch of B a verified row delays all B requests: its cost is B * b over the B-row step
    assert m.verify_ratio(15) == pytest.approx(15 * 0.0025 / (0.0475 + 15 * 0.0025), rel=1e-6)
    assert m.verify_ratio(15) > 8 * m.verify_ratio(1)
    # draft cost: propose seconds per draft forward over the step's seconds, exponentially averaged
    assert 0.0 < m.propose_ratio < 0.05
    assert m.cost_ratio(1, fallback_propose=0.9) == pytest.approx(m.propose_ratio + 0.05, rel=1e-6)


# ---- RateGate: drafting at all, on measured throughput ------------------------------------------------------------
def _run_gate(gate, spec_rate: float, plain_rate: float, steps: int, batch: int = 1) -> list[bool]:
    """Feed `steps` decode steps, one at a time, at the given tokens per second of each side; the phases it ran."""
    phases = []
    for _ in range(steps):
        phases.append(gate.drafting)
        rate = spec_rate if gate.drafting else plain_rate
        gate.observe(batch, 2, 2 / rate, 1)
    return phases


def test_rate_gate_switches_off_a_draft_measured_slower_within_a_few_phases():
    from accel.speculative.adaptive import GATE_MAX_BACKOFF, GATE_PHASE_STEPS, RateGate

    gate = RateGate()
    phases = _run_gate(gate, spec_rate=0.89, plain_rate=1.0, steps=3000)
    assert all(phases[:GATE_PHASE_STEPS]) and not any(phases[GATE_PHASE_STEPS:3 * GATE_PHASE_STEPS])
    assert gate.winner is False and gate.backoff == GATE_MAX_BACKOFF
    share = sum(phases[1000:]) / 2000  # drafting re-measured one phase in 1 + max backoff
    assert share == pytest.approx(1 / (1 + GATE_MAX_BACKOFF), abs=0.02)
    # the loss over the whole run, start-up included, against plain decoding throughout
    time = sum(2 / (0.89 if p else 1.0) for p in phases)
    assert 2 * len(phases) / time > 0.985


def test_rate_gate_keeps_a_winning_draft_and_re_measures_plain_rarely():
    from accel.speculative.adaptive import GATE_MAX_BACKOFF, RateGate

    gate = RateGate()
    phases = _run_gate(gate, spec_rate=1.5, plain_rate=1.0, steps=3000)
    assert gate.winner is True and gate.backoff == GATE_MAX_BACKOFF
    assert sum(phases[1000:]) / 2000 == pytest.approx(GATE_MAX_BACKOFF / (1 + GATE_MAX_BACKOFF), abs=0.02)


def test_rate_gate_follows_a_change_and_compares_only_batch_sizes_both_sides_saw():
    from accel.speculative.adaptive import RateGate

    gate = RateGate()
    _run_gate(gate, 1.5, 1.0, 600)
    assert gate.winner is True
    _run_gate(gate, 0.5, 1.0, 600)  # the text changed: drafts stop paying
    assert gate.winner is False
    fresh = RateGate()
    _run_gate(fresh, 0.5, 1.0, 16, batch=1)  # drafting measured at one request, plain only at eight
    _run_gate(fresh, 0.5, 1.0, 200, batch=8)
    assert fresh.winner is False and set(fresh.last[True]) == {8}  # drafting measured again at eight
    lone = RateGate()
    lone.observe(1, 5, 1.0, 16)
    lone.observe(3, 5, 1.0, 16)  # plain at another bucket: nothing to compare, drafting's turn again
    assert lone.winner is None and lone.drafting
    lone.observe(1, 5, 1.0, 0)  # an empty call changes nothing
    assert lone.steps_left == 16


def test_rate_gate_gives_a_tie_to_plain_decoding():
    from accel.speculative.adaptive import GATE_MARGIN, RateGate

    gate = RateGate()
    _run_gate(gate, (1 + GATE_MARGIN) / 2, 1.0, 1000)  # faster, but within the margin drafting's unseen costs take
    assert gate.winner is False


def test_rate_gate_measures_a_far_slower_draft_again_only_within_its_loss_budget():
    from accel.speculative.adaptive import GATE_LOSS_BUDGET, GATE_MAX_STEPS, RateGate

    gate = RateGate()
    phases = _run_gate(gate, 0.25, 1.0, 20000)  # e.g. every re-measure prefills new prompts into a draft model
    assert gate.winner is False
    time = sum(2 / (0.25 if p else 1.0) for p in phases[2000:])
    assert 2 * len(phases[2000:]) / time > 1 - GATE_LOSS_BUDGET - 0.01
    runs, n = [], 0  # lengths of the plain phases
    for p in phases:
        n = 0 if p else n + 1
        runs.append(n)
    assert 1000 < max(runs) <= GATE_MAX_STEPS
