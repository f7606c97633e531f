"""The machine's read bandwidth, probed next to a measurement: a batch-1 decode step streams its weights and
writes next to nothing, so a read stream (not a copy) is its bound. On shared VMs the rate moves between runs
(a 2-core Zen 4 flips between ~37 and ~66 GB/s within a minute), so benchmarks record it beside each repeat."""

from __future__ import annotations

import time


def read_bandwidth_gbs(threads: int, megabytes: int = 256, reads: int = 5) -> float:
    """Best of `reads` passes over `megabytes` in 2 MB pages, on `threads` threads, in GB/s."""
    import torch

    from accel.quant import cpu_kernels

    if threads < 1 or megabytes < 1 or reads < 1:
        raise ValueError(f"threads={threads}, megabytes={megabytes}, reads={reads}: each must be >= 1")
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = (megabytes << 20) // 4
        src = cpu_kernels.huge_page_copy(torch.ones(n))  # itself where 2 MB pages do not apply
        best = 0.0
        for _ in range(reads):
            t0 = time.perf_counter()
            src.max()
            best = max(best, n * 4 / (time.perf_counter() - t0) / 1e9)
        return best
    finally:
        torch.set_num_threads(was)
