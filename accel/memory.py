"""Memory: how much this process may hold, what loading a model will hold, and the peak it reached.

A model that cannot fit is refused before its first weight is read, in one line with the numbers, instead of
being killed by the OOM killer half way through. The budget is the least of: `ACCEL_MEMORY_LIMIT` (bytes, or with
a K / M / G suffix), the process's cgroup limit (v2 `memory.max`, v1 `memory.limit_in_bytes`) less what others in
it use, and the machine's MemAvailable; each counts what this process already holds.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ENV = "ACCEL_MEMORY_LIMIT"
GB = 1e9
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


class MemoryLimitError(ValueError):
    """What was asked for does not fit the memory this process may use; the message has the numbers."""


def parse_bytes(value: str) -> int:
    """"12G", "12GiB", "800M", "1.5G" (binary units) or a plain number of bytes -> bytes; ValueError naming the
    value otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:i?B)?\s*", str(value), re.IGNORECASE)
    if not m:
        raise ValueError(f"{ENV}={value!r} is invalid; allowed: bytes, or a number with K, M, G or T (e.g. 12G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def peak_rss() -> int:
    """The most resident memory this process has held so far, in bytes: the kernel's high-water mark of its
    address space (VmHWM). Not getrusage's ru_maxrss: Linux carries that across exec, so a command started by a
    large process (a benchmark holding a model) would report its parent's size."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_peak() -> bool:
    """Start a new high-water mark (Linux: writing 5 to /proc/self/clear_refs), so a stage's peak is its own, not
    an earlier stage's; False where the kernel does not allow it (the peak then spans the whole process)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def current_rss() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss()


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_LOAD_MMAP_THRESHOLD = 256 << 10
STEADY_MMAP_THRESHOLD = 32 << 20
"""Where glibc's own dynamic mmap threshold ends up once large blocks were freed: an allocation above it is mapped
fresh, and its pages faulted in, on every call."""


def _libc():
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_free_memory() -> None:
    """Hand the C allocator's free pages back to the system (glibc `malloc_trim`)."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)


def collect() -> None:
    """Free what was dropped, now: models sit in reference cycles, which otherwise wait for the collector, then
    hand the allocator's free pages back."""
    import gc

    gc.collect()
    release_free_memory()


_mapped_depth = [0]


@contextlib.contextmanager
def large_blocks_mapped() -> Iterator[None]:
    """While a model loads, the sensitivity measures or the evaluation scores, every block of 256 KB or more is its
    own mapping, unmapped when freed; afterwards the free pages go back (`release_free_memory`). Why: such work
    frees many tensors of a few MB (reads once rounded, activations, per-Linear temporaries), which glibc keeps in
    its heaps (on Qwen2.5-1.5B, gigabytes of a load's freed reads and of the proxy sensitivity's temporaries;
    docs/DESIGN.md, Memory). Not around GPTQ: its per-row temporaries, faulted in anew each time, made the 1.5B's
    quantize stage slower.
    Blocks below 32 MB come from the heaps again after (nested: after the outermost block), as glibc's own
    threshold would have it, so decode steps do not map and fault their logits anew."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _LOAD_MMAP_THRESHOLD)
    _mapped_depth[0] += 1
    try:
        yield
    finally:
        _mapped_depth[0] -= 1
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, _LOAD_MMAP_THRESHOLD if _mapped_depth[0] else STEADY_MMAP_THRESHOLD)
            libc.malloc_trim(0)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" or not text.isdigit() else int(text)


def _cgroup_room(proc_root: Path = Path("/proc"), cg_root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the cgroup lets this process still add: its limit less its usage, None where there is no limit."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            d = cg_root / path.lstrip("/")
            limit, usage = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        elif "memory" in controllers.split(","):  # v1
            d = cg_root / "memory" / path.lstrip("/")
            limit, usage = _read_int(d / "memory.limit_in_bytes"), _read_int(d / "memory.usage_in_bytes")
        else:
            continue
        if limit is not None and limit < _NO_LIMIT:
            return max(0, limit - (usage or 0))
    return None


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


@dataclass(frozen=True)
class Budget:
    """The resident bytes this process may reach, and which limit sets it."""

    bytes: int
    source: str


def budget() -> Budget:
    """The least of ACCEL_MEMORY_LIMIT, the cgroup's room and MemAvailable, each on top of what this process holds
    now (ACCEL_MEMORY_LIMIT caps the whole process)."""
    rss = current_rss()
    options = []
    if os.environ.get(ENV):
        options.append(Budget(parse_bytes(os.environ[ENV]), f"{ENV}={os.environ[ENV]}"))
    if (room := _cgroup_room()) is not None:
        options.append(Budget(rss + room, "the cgroup's memory limit"))
    if (avail := _mem_available()) is not None:
        options.append(Budget(rss + avail, "available memory"))
    return min(options, key=lambda b: b.bytes) if options else Budget(_NO_LIMIT, "no known limit")


@dataclass
class Need:
    """Resident bytes a piece of work will hold, by part (weights, KV cache, ...), on top of `base` (the process
    as it is now: interpreter, torch, libraries)."""

    what: str
    parts: dict[str, int] = field(default_factory=dict)
    base: int = field(default_factory=current_rss)

    @property
    def total(self) -> int:
        return self.base + sum(self.parts.values())

    def describe(self) -> str:
        parts = " + ".join(f"{k} {v / GB:.2f}" for k, v in self.parts.items() if v)
        return f"{self.total / GB:.2f} GB ({parts} + this process {self.base / GB:.2f})"


def check_fits(need: Need, hint: str = "") -> None:
    """Raise MemoryLimitError, one line with the numbers, when `need` exceeds this process's `budget()`."""
    b = budget()
    if need.total > b.bytes:
        raise MemoryLimitError(f"{need.what} needs {need.describe()} but {b.source} allows {b.bytes / GB:.2f} GB"
                               + (f"; {hint}" if hint else ""))


def peak_line(what: str = "", parts: dict[str, int] | None = None) -> str:
    """'peak RSS X.XX GB (weights X.XX GB, KV cache X.XX GB)': what each command prints when it ends."""
    extra = ", ".join(f"{k} {v / GB:.2f} GB" for k, v in (parts or {}).items() if v)
    return f"peak RSS {peak_rss() / GB:.2f} GB" + (f" {what}" if what else "") + (f" ({extra})" if extra else "")
