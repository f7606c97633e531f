"""What the machine gives a measurement right now: read bandwidth, fp32 compute and core-to-core latency, probed
beside each repeat.

A batch-1 decode step streams its weights and writes next to nothing, so a read stream (not a copy) bounds it;
a verify step of many rows, or a prefill, is bound by fp32 arithmetic instead. On shared VMs both move between
runs. A 2-core Zen 4 VM flips within a minute between its two vCPUs on one CCD (fast core to core, the read
stream limited by the CCD's one link to memory) and on two (a link each, so more bandwidth), the latter with less
fp32 arithmetic and dearer exchanges between threads. A ratio that mixes kinds of step (speculation: 1-row
against 16-row steps) moves with the placement, so benchmarks record all three."""

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


def _cpu_ticks(stat: str, engine_stats: dict[int, str]) -> tuple[int, int, int, dict[int, int]]:
    """(busy, steal, total) ticks of all CPUs from /proc/stat, and each engine process's busy ticks from its
    /proc/PID/stat, its children's that it waited for included (a benchmark's own peer runs: llama-bench, a server
    it started and stopped)."""
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in stat.split("\n", 1)[0].split()[1:9])
    own = {}
    for pid, text in engine_stats.items():
        fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        own[pid] = sum(int(x) for x in fields[11:15])  # utime, stime (all threads), cutime, cstime
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal, own


def _proc_stats(pids) -> dict[int, str]:
    """/proc/PID/stat of each pid still running."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                out[pid] = f.read()
        except OSError:
            pass
    return out


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def serving_pids(url: str, proc: str = "/proc") -> list[int]:
    """The processes of the server behind `url` when it runs on this machine: every process holding the socket
    listening on its port, and their descendants (vLLM's API server and its engine core; llama-server's one
    process). [] for a remote host or a port nobody here listens on. A measured server is the engine, not "other
    processes", in CpuLoad."""
    import os
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.hostname not in LOCAL_HOSTS:
        return []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()  # sl local_address rem_address st ... inode (10th)
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return []
    children: dict[int, list[int]] = {}
    owners = set()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"{proc}/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(pid)
            if any(os.readlink(f"{proc}/{name}/fd/{fd}") in inodes for fd in os.listdir(f"{proc}/{name}/fd")):
                owners.add(pid)
        except (OSError, ValueError, IndexError):  # gone, or not ours to read
            continue
    found, todo = set(), list(owners)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    found.discard(os.getpid())
    return sorted(found)


class CpuLoad:
    """What else ran on the machine during a measurement: `with CpuLoad() as load: ...`, then `load.others_cores`
    (the CPU time other processes used, in cores), `load.steal_pct` (the hypervisor's share) and `load.contended`.
    The engine is this process, plus a local server's processes when `server` (its URL) is measured.
    `read` is injectable (tests): it returns the text of /proc/stat and {pid: text of /proc/PID/stat} of the
    engine's processes."""

    def __init__(self, read=None, clock=time.monotonic, ticks_per_s: int | None = None,
                 server: str | None = None) -> None:
        import os

        self._server = server
        self._read = read or self._read_proc
        self._clock = clock
        self._hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
        self.others_cores: float | None = None
        self.steal_pct: float | None = None

    def _read_proc(self) -> tuple[str, dict[int, str]]:
        import os

        if not hasattr(self, "_pids"):  # resolved once, at the start: the measurement's engine
            self._pids = [os.getpid(), *(serving_pids(self._server) if self._server else [])]
        with open("/proc/stat") as f:
            return f.read(), _proc_stats(self._pids)

    def __enter__(self) -> CpuLoad:
        try:
            self._t0, self._start = self._clock(), _cpu_ticks(*self._read())
        except (OSError, ValueError, IndexError):  # no /proc (not Linux): nothing recorded
            self._start = None
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        end = _cpu_ticks(*self._read())
        busy, steal, total = (b - a for a, b in zip(self._start[:3], end[:3]))
        # an engine process that ended during the measurement: its last ticks are unknown, counted as others'
        own = sum(end[3][pid] - t for pid, t in self._start[3].items() if pid in end[3])
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
