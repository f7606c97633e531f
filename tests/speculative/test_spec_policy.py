"""The batch-1 draft-length rule exists twice: `AdaptiveSpeculation` (Python, every step the engine takes one at a
time) and the C++ `SpecPolicy` (inside a burst of verify steps, `accel.kernels.cpu.spec_steps`). This holds the two
to the same lengths and the same state, step for step, over long random runs of acceptance."""

from __future__ import annotations

import random

import pytest

from accel.kernels import cpu
from accel.runtime.outputs import SpecPolicyState
from accel.speculative import adaptive
from accel.speculative.adaptive import AdaptiveConfig, AdaptiveSpeculation

pytestmark = pytest.mark.skipif(not cpu.available(), reason="accel's CPU kernels did not build on this machine")


@pytest.mark.parametrize("seed, k_max, cost_ratio", [(0, 4, 0.05), (1, 15, 0.01), (2, 8, 0.3), (3, 15, 0.12)])
def test_the_native_policy_makes_the_python_policys_choices_step_for_step(seed, k_max, cost_ratio):
    rng = random.Random(seed)
    py = AdaptiveSpeculation(AdaptiveConfig(k_max=k_max, cost_ratio=cost_ratio, disable_above_batch_size=None))
    for _ in range(3):
        py.observe("warm", 2, 1)  # evidence on the proposer: the request is no rate-limited explorer
    py.lengths(["r"], 1)
    est = py.estimates["r"]
    native = cpu.spec_policy(SpecPolicyState(est.successes, est.failures, adaptive.DECAY, cost_ratio, k_max,
                                             est.last_full, -1))
    acceptance = rng.choice([0.2, 0.5, 0.8, 0.95])
    for step in range(400):
        if step % 50 == 0:
            acceptance = rng.choice([0.05, 0.3, 0.6, 0.9, 1.0])  # the text changes: quoting starts or stops
        k_py = py.lengths(["r"], 1)[0]
        k_native = native.length()
        # the native loop has a free row: where Python says 0 it drafts (or guesses) one token all the same
        assert k_native == max(k_py, 1), f"step {step}"
        accepted = 0
        while accepted < k_native and rng.random() < acceptance:
            accepted += 1
        py.observe("r", k_native, accepted)
        native.observe(k_native, accepted)
        est = py.estimates["r"]
        assert (native.successes, native.failures, native.last_full) == pytest.approx(
            (est.successes, est.failures, est.last_full), rel=1e-12), f"step {step}"


def test_the_native_policy_fixes_the_length_where_it_is_not_adaptive():
    for fixed, expected in ((0, 1), (3, 3)):
        policy = cpu.spec_policy(SpecPolicyState(5.0, 1.0, adaptive.DECAY, 0.1, 8, 0, fixed))
        assert policy.length() == expected
