"""The benchmark ledger: every published figure is one JSON entry written by the script that measured it.

An entry (`benchmarks/ledger/<key>.json`) holds the command, the git commit, the machine (CPU model and flags,
cores, memory, read bandwidth), what else ran during the measurement (other processes' cores, the hypervisor's
steal) and each figure as its median with the spread of its repeats. Re-measuring overwrites the entry (its history
is git's). README's tables are rendered from entries (`accel.bench.readme`) and a test holds them equal, so no
figure is typed by hand.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from accel.bench.probes import CpuLoad

ROOT = Path(__file__).resolve().parents[2]
LEDGER_DIR = ROOT / "benchmarks" / "ledger"
# the CPU features a kernel dispatches on: what makes two machines' figures comparable
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")


def figure(values: list[float], unit: str, digits: int = 4) -> dict:
    """One figure from its repeats: median, min, max and how many (llama-bench's mean ± sd reads the same way)."""
    if not values:
        raise ValueError(f"a figure needs at least one value; got {values!r}")
    r = lambda x: round(float(x), digits)  # noqa: E731
    return {"median": r(statistics.median(values)), "min": r(min(values)), "max": r(max(values)),
            "n": len(values), "unit": unit}


def ratio(num: list[float], den: list[float]) -> dict:
    """Paired ratios num[i] / den[i] (measured taking turns in one run) as a figure."""
    if len(num) != len(den) or not num:
        raise ValueError(f"a ratio pairs equal, non-empty repeats; got {len(num)} and {len(den)}")
    return figure([a / b for a, b in zip(num, den)], "x", 3)


def flat_figures(results: dict, prefix: str = "") -> dict[str, dict]:
    """Every number in a benchmark's nested results as a one-repeat figure, keyed by its path ('offline.ours')."""
    out = {}
    for k, v in results.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_figures(v, key + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = figure([v], "")
    return out


def machine(bandwidth_threads: int | None = None) -> dict:
    """What the figures ran on: CPU model, the dispatch flags it has, cores, memory, and (threads given) a read
    bandwidth probe."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    out = {"cpu": model, "flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count(),
           "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)}
    if bandwidth_threads:
        from accel.bench.probes import read_bandwidth_gbs

        out["read_gbs"] = round(read_bandwidth_gbs(bandwidth_threads), 1)
    return out


def git_commit(root: Path = ROOT) -> str:
    """HEAD's sha, '+dirty' when tracked files differ from it; 'unknown' outside a checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


@dataclass
class Entry:
    """`with Entry("key") as e: ...; e.figures[...] = figure(...)`: the entry times and watches its run and
    writes itself on a clean exit."""

    key: str
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    bandwidth_threads: int | None = None
    directory: Path = LEDGER_DIR
    figures: dict[str, dict] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # what a reader needs beside the figures (model, settings)

    def __post_init__(self) -> None:
        if not self.key or any(c in self.key for c in "/\\ ") or self.key.startswith("."):
            raise ValueError(f"ledger key {self.key!r}: use letters, digits, '-', '_' and '.'")

    def __enter__(self) -> Entry:
        self._load = CpuLoad().__enter__()
        self._t0 = time.time()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self._load.__exit__(exc_type, *exc)
        if exc_type is None:
            self.write()

    def write(self) -> Path:
        if not self.figures:
            raise ValueError(f"ledger entry {self.key!r} has no figures")
        load = getattr(self, "_load", None)
        entry = {
            "key": self.key,
            "command": " ".join(shlex.quote(a) for a in self.argv),
            "commit": git_commit(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(getattr(self, "_t0", time.time()))),
            "seconds": round(time.time() - self._t0, 1) if hasattr(self, "_t0") else None,
            "machine": machine(self.bandwidth_threads),
            "load": load.to_dict() if load is not None else None,
            "info": self.info,
            "figures": self.figures,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.key}.json"
        path.write_text(json.dumps(entry, indent=1, sort_keys=False) + "\n")
        print(f"ledger: {path}", file=sys.stderr)
        return path


def read(key: str, directory: Path = LEDGER_DIR) -> dict:
    path = directory / f"{key}.json"
    if not path.exists():
        have = sorted(p.stem for p in directory.glob("*.json")) if directory.exists() else []
        raise FileNotFoundError(f"no ledger entry {key!r} in {directory}; have: {have}")
    return json.loads(path.read_text())
