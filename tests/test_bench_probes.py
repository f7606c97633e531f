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


def _pid_stat(pid: int, busy: int, ppid: int = 1, children: int = 0) -> str:
    """A /proc/PID/stat text with these busy ticks (split over utime and stime) and its waited-for children's."""
    return f"{pid} (python3 -m x) R {ppid} 1 1 0 -1 0 0 0 0 0 {busy - 5} 5 {children} 0 20 0 3 0 100 0 0"


def _stat(busy: int, idle: int, steal: int, own: int, **engine: int) -> tuple[str, dict[int, str]]:
    """/proc/stat with these tick counts (busy split over user and system), and the engine's /proc/PID/stat
    texts: this process with `own` ticks, a server's processes `p<pid>=ticks`."""
    return (f"cpu  {busy - 10} 0 10 {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3\n",
            {1234: _pid_stat(1234, own), **{int(k[1:]): _pid_stat(int(k[1:]), v) for k, v in engine.items()}})


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


def test_the_peer_runs_a_benchmark_starts_and_waits_for_are_its_own_work():
    from accel.bench.probes import CpuLoad

    # this process used 20 ticks itself and waited for a llama-bench child that used 120 of the 150 busy ticks
    snaps = iter([("cpu  990 0 10 5000 0 0 0 0 0 0\n", {1234: _pid_stat(1234, 300, children=40)}),
                  ("cpu  1140 0 10 5050 0 0 0 0 0 0\n", {1234: _pid_stat(1234, 320, children=160)})])
    clock = iter([0.0, 1.0])
    with CpuLoad(read=lambda: next(snaps), clock=lambda: next(clock), ticks_per_s=100) as load:
        pass
    assert load.others_cores == 0.1 and not load.contended


def test_a_measured_servers_processes_are_the_engine_not_others():
    from accel.bench.probes import CpuLoad

    # a served peer: the client (this process) 20 ticks, the server's API process 30 and engine core 90 of 150 busy;
    # p77 ends during the measurement (its ticks unknown: counted as others')
    snaps = iter([_stat(1000, 5000, 0, 300, p40=100, p41=500, p77=10),
                  _stat(1150, 5050, 0, 320, p40=130, p41=590)])
    clock = iter([0.0, 1.0])
    with CpuLoad(read=lambda: next(snaps), clock=lambda: next(clock), ticks_per_s=100) as load:
        pass
    assert load.others_cores == 0.1 and not load.contended


def test_serving_pids_finds_the_listener_and_its_children(tmp_path):
    from accel.bench.probes import serving_pids

    proc = tmp_path
    (proc / "net").mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (proc / "net" / "tcp").write_text(
        head + "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 555 1\n"
        "   1: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 666 1\n"
        "   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  0 0 777 1\n")
    for pid, ppid, sock in [(40, 1, 555), (41, 40, None), (42, 41, None), (50, 1, 666), (60, 1, 777)]:
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "stat").write_text(_pid_stat(pid, 10, ppid))
        if sock:
            (d / "fd" / "3").symlink_to(f"socket:[{sock}]")
    assert serving_pids("http://127.0.0.1:8080/v1", proc=str(proc)) == [40, 41, 42]  # 0x1F90 = 8080, listening
    assert serving_pids("http://localhost:8082", proc=str(proc)) == []
    assert serving_pids("http://10.0.0.5:8080", proc=str(proc)) == []  # remote: not this machine's CPU


def test_serving_pids_of_a_real_listener():
    import socket
    import subprocess
    import sys

    from accel.bench.probes import serving_pids

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", "import socket, time; s = socket.socket(); "
                              f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        assert serving_pids(f"http://127.0.0.1:{port}") == [child.pid]
    finally:
        child.kill()
        child.wait()


def test_without_proc_nothing_is_recorded():
    from accel.bench.probes import CpuLoad

    def missing():
        raise OSError("no /proc")

    with CpuLoad(read=missing) as load:
        pass
    assert load.to_dict() == {"others_cores": None, "steal_pct": None, "contended": False}
