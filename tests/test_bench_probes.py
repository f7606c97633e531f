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


def _stat(busy: int, idle: int, steal: int, own: int) -> tuple[str, str]:
    """/proc/stat and /proc/self/stat texts with these tick counts (busy split over user and system)."""
    return (f"cpu  {busy - 10} 0 10 {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3\n",
            f"1234 (python3 -m x) R 1 1 1 0 -1 0 0 0 0 0 {own - 5} 5 0 0 20 0 3 0 100 0 0")


def test_a_measurement_records_what_else_used_the_machine():
    from accel.bench.probes import CpuLoad, contended_runs

    snaps = iter([_stat(1000, 5000, 10, 300), _stat(1150, 5040, 12, 400)])  # 1 s at 100 ticks/s
    clock = iter([10.0, 11.0])
    with CpuLoad(read=lambda: next(snaps), clock=lambda: next(clock), ticks_per_s=100) as load:
        pass
    # others: 150 busy ticks - our 100 = 0.5 cores over 1 s; steal 2 of 192 ticks
    assert load.others_cores == 0.5 and load.steal_pct == 1.04 and load.contended
    quiet = iter([_stat(1000, 5000, 10, 300), _stat(1110, 5090, 10, 400)])
    clock = iter([10.0, 11.0])
    with CpuLoad(read=lambda: next(quiet), clock=lambda: next(clock), ticks_per_s=100) as q:
        pass
    assert q.others_cores == 0.1 and q.steal_pct == 0.0 and not q.contended
    got = contended_runs([("quantized/batch1", [q.to_dict(), load.to_dict()]), ("baseline/batch1", [q.to_dict()]),
                          ("peer/batch1", None)])
    assert got == ["quantized/batch1 (other processes 0.50 cores, steal 1%)"]


def test_without_proc_nothing_is_recorded():
    from accel.bench.probes import CpuLoad

    def missing():
        raise OSError("no /proc")

    with CpuLoad(read=missing) as load:
        pass
    assert load.to_dict() == {"others_cores": None, "steal_pct": None, "contended": False}
