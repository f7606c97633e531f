"""accel.bench.probes: the bandwidth and compute probes benchmarks record beside each repeat."""

import pytest
import torch

from accel.bench.probes import PLACEMENTS, core_to_core_ns, fp32_gflops, placement, read_bandwidth_gbs


def test_probes_are_positive_rates_and_leave_the_thread_count_alone():
    was = torch.get_num_threads()
    assert read_bandwidth_gbs(1, megabytes=4, reads=2) > 0
    assert fp32_gflops(1, size=32, calls=2, passes=1) > 0
    assert torch.get_num_threads() == was


@pytest.mark.parametrize("kw", [{"threads": 0}, {"threads": 1, "megabytes": 0}, {"threads": 1, "reads": 0}])
def test_read_bandwidth_rejects_bad_arguments(kw):
    with pytest.raises(ValueError, match="must be >= 1"):
        read_bandwidth_gbs(**kw)


@pytest.mark.parametrize("kw", [{"threads": 0}, {"threads": 1, "size": 0}, {"threads": 1, "calls": 0},
                                {"threads": 1, "passes": 0}])
def test_fp32_gflops_rejects_bad_arguments(kw):
    with pytest.raises(ValueError, match="must be >= 1"):
        fp32_gflops(**kw)


def test_core_to_core_latency_is_positive_or_unknown():
    ns = core_to_core_ns(rounds=200)
    assert ns is None or ns > 0


def test_core_to_core_rejects_bad_rounds():
    with pytest.raises(ValueError, match="must be >= 1"):
        core_to_core_ns(rounds=0)


@pytest.mark.parametrize("before, after, where", [(30.0, 41.0, "one CCD"), (165.0, 170.0, "two CCDs"),
                                                  (30.0, 165.0, "changed"), (170.0, 28.0, "changed"),
                                                  (None, 30.0, "unknown")])
def test_placement_of_a_repeat_from_the_core_latency_around_it(before, after, where):
    assert placement(before, after) == where
    assert where in PLACEMENTS
