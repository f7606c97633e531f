"""What a number was measured on: CPU model, cores, memory, GPU, OS and package versions.

Every report and bench result records `machine_info()` so a number can be reproduced (or explained).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("accel", "torch", "transformers", "tokenizers", "safetensors", "numpy", "llmcompressor",
            "compressed-tensors", "accelerate", "fastapi", "uvicorn", "httpx", "httptools", "matplotlib", "vllm")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo (x86 'model name', ARM 'Model'/'Hardware'), else platform's."""
    if cpuinfo is None:
        p = Path("/proc/cpuinfo")
        cpuinfo = p.read_text(errors="replace") if p.exists() else ""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        for line in cpuinfo.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == key and v.strip():
                return v.strip()
    return platform.processor() or platform.machine() or "unknown"


def memory_gb(meminfo: str | None = None) -> float | None:
    """Total RAM in GiB from /proc/meminfo (MemTotal, in kB); None where unavailable."""
    if meminfo is None:
        p = Path("/proc/meminfo")
        if not p.exists():
            return None
        meminfo = p.read_text()
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / (1024 ** 2), 2)
    return None


def gpus() -> list[dict[str, Any]]:
    """Visible CUDA devices (name, memory, capability); empty without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 1024 ** 3, 2),
                    "capability": f"{p.major}.{p.minor}"})
    return out


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each package, None when it is not installed."""
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


def machine_info() -> dict[str, Any]:
    """CPU model, logical / usable cores, RAM, GPUs, OS, Python, torch threads and package versions."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    threads = None
    try:
        import torch

        threads = torch.get_num_threads()
        cuda = torch.version.cuda
    except ImportError:
        cuda = None
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpu_usable": usable, "ram_gb": memory_gb(),
            "gpus": gpus(), "cuda": cuda, "torch_threads": threads, "os": platform.platform(),
            "python": sys.version.split()[0], "versions": package_versions()}
