"""What the machine gives a measurement right now: read bandwidth, fp32 compute and core-to-core latency, probed
beside each repeat.

A batch-1 decode step streams its weights and writes next to nothing, so a read stream (not a copy) bounds it;
a verify step of many rows, or a prefill, is bound by fp32 arithmetic instead. On shared VMs both move between
runs. A 2-core Zen 4 VM flips within a minute between its two vCPUs on one CCD (~30 ns core to core, ~37 GB/s:
the CCD's one link to memory) and on two (~165 ns, ~55-67 GB/s: a link each), the latter with less arithmetic
(fp32 matmuls: median ~176 against ~193 GFLOPS) and dearer exchanges between threads. A ratio that mixes kinds of
step (speculation: 1-row against 16-row steps) moves with the placement, so benchmarks record all three."""

from __future__ import annotations

import time

PLACEMENTS = ("one CCD", "two CCDs", "changed", "unknown")


def _check(**values: int) -> None:
    bad = {k: v for k, v in values.items() if v < 1}
    if bad:
        raise ValueError(", ".join(f"{k}={v}" for k, v in values.items()) + ": each must be >= 1")


def read_bandwidth_gbs(threads: int, megabytes: int = 256, reads: int = 5) -> float:
    """Best of `reads` passes over `megabytes` in 2 MB pages, on `threads` threads, in GB/s."""
    import torch

    from accel.kernels import cpu

    _check(threads=threads, megabytes=megabytes, reads=reads)
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = (megabytes << 20) // 4
        src = cpu.huge_page_copy(torch.ones(n))  # itself where 2 MB pages do not apply
        best = 0.0
        for _ in range(reads):
            t0 = time.perf_counter()
            src.max()
            best = max(best, n * 4 / (time.perf_counter() - t0) / 1e9)
        return best
    finally:
        torch.set_num_threads(was)


def fp32_gflops(threads: int, size: int = 384, calls: int = 200, passes: int = 3) -> float:
    """Best of `passes` runs of `calls` fp32 matmuls of size x size (cache-resident: arithmetic, not memory), on
    `threads` threads, in GFLOPS."""
    import torch

    _check(threads=threads, size=size, calls=calls, passes=passes)
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        out = torch.empty(size, size)
        torch.mm(a, b, out=out)  # first call: oneDNN's kernel selection
        best = 0.0
        for _ in range(passes):
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.mm(a, b, out=out)
            best = max(best, 2 * size ** 3 * calls / (time.perf_counter() - t0) / 1e9)
        return best
    finally:
        torch.set_num_threads(was)



def core_to_core_ns(rounds: int = 20000) -> float | None:
    """ns per one-way pass of a cache line between two threads (median of 3 runs of `rounds`); None without accel's
    kernels or a second thread."""
    import statistics

    from accel.kernels import cpu

    _check(rounds=rounds)
    if not cpu.available():
        return None
    runs = [cpu.core_to_core_ns(rounds) for _ in range(3)]
    return statistics.median(runs) if all(runs) else None


def placement(before_ns: float | None, after_ns: float | None) -> str:
    """Where a measurement's two threads ran, from the core-to-core latency probed before and after it: one CCD
    (~30 ns), two CCDs (~165 ns: a memory link per core, ~twice the bandwidth), or changed during it."""
    if before_ns is None or after_ns is None:
        return "unknown"
    far = [ns > 100 for ns in (before_ns, after_ns)]
    return "changed" if far[0] != far[1] else "two CCDs" if far[0] else "one CCD"


# A measurement is contended when the machine's other processes used this many cores beside it, or the hypervisor
# took this share of its CPU time (steal): on 2 cores one busy process cut batch-1 decode to a fifth.
CONTENDED_CORES = 0.25
CONTENDED_STEAL_PCT = 5.0


def _cpu_ticks(stat: str, self_stat: str) -> tuple[int, int, int, int]:
    """(busy, steal, total) ticks of all CPUs from /proc/stat and this process's busy ticks from /proc/self/stat."""
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in stat.split("\n", 1)[0].split()[1:9])
    fields = self_stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    own = int(fields[11]) + int(fields[12])  # utime, stime (all threads)
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal, own


class CpuLoad:
    """What else ran on the machine during a measurement: `with CpuLoad() as load: ...`, then `load.others_cores`
    (the CPU time other processes used, in cores), `load.steal_pct` (the hypervisor's share) and `load.contended`.
    `read` is injectable (tests): it returns the texts of /proc/stat and /proc/self/stat."""

    def __init__(self, read=None, clock=time.monotonic, ticks_per_s: int | None = None) -> None:
        import os

        self._read = read or (lambda: (open("/proc/stat").read(), open("/proc/self/stat").read()))
        self._clock = clock
        self._hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
        self.others_cores: float | None = None
        self.steal_pct: float | None = None

    def __enter__(self) -> CpuLoad:
        try:
            self._t0, self._start = self._clock(), _cpu_ticks(*self._read())
        except (OSError, ValueError, IndexError):  # no /proc (not Linux): nothing recorded
            self._start = None
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        busy, steal, total, own = (b - a for a, b in zip(self._start, _cpu_ticks(*self._read())))
        seconds = self._clock() - self._t0
        if seconds > 0:
            self.others_cores = round(max(0, busy - own) / self._hz / seconds, 3)
        self.steal_pct = round(100 * steal / total, 2) if total > 0 else 0.0

    @property
    def contended(self) -> bool:
        return (self.others_cores or 0) > CONTENDED_CORES or (self.steal_pct or 0) > CONTENDED_STEAL_PCT

    def to_dict(self) -> dict:
        return {"others_cores": self.others_cores, "steal_pct": self.steal_pct, "contended": self.contended}


def contended_runs(measurements) -> list[str]:
    """'label (other processes N cores, steal S%)' for each (label, per-run loads) measured on a shared machine."""
    out = []
    for label, loads in measurements:
        bad = [x for x in loads or [] if x.get("contended")]
        if bad:
            out.append(f"{label} (other processes {max(x['others_cores'] or 0 for x in bad):.2f} cores, steal "
                       f"{max(x['steal_pct'] or 0 for x in bad):.0f}%)")
    return out
