"""Preempted requests' K/V (and their feature-cache rows) in host memory (preemption_mode "swap"): copied out
when the scheduler preempts a request, back into its new blocks when it resumes."""

from __future__ import annotations

import torch
from torch import Tensor


class HostSwap:
    """Request id -> its blocks' saved tensors, per layer."""

    def __init__(self) -> None:
        self.kv: dict[str, list[list[Tensor]]] = {}
        self.features: dict[str, Tensor] = {}

    def swap(self, swap_out: dict[str, list[int]], swap_in: dict[str, list[int]], kv_caches: list,
             feature_cache: Tensor | None, num_blocks: int, block_size: int, device: torch.device) -> None:
        """Copy preempted requests' blocks to host memory, and resumed ones back (out first: blocks get reused)."""
        host = torch.device("cpu")
        feats = None if feature_cache is None else feature_cache.view(num_blocks, block_size, -1)
        for rid, blocks in swap_out.items():
            ids = torch.tensor(blocks, dtype=torch.long, device=device)
            self.kv[rid] = [cache.read_blocks(ids, host) for cache in kv_caches]
            if feats is not None:
                self.features[rid] = feats[ids].to(host)
        for rid, blocks in swap_in.items():
            ids = torch.tensor(blocks, dtype=torch.long, device=device)
            for cache, saved in zip(kv_caches, self.kv.pop(rid)):
                cache.write_blocks(ids, saved)
            saved_feats = self.features.pop(rid, None)
            if feats is not None and saved_feats is not None:
                feats[ids] = saved_feats.to(device)

    def release(self, request_id: str) -> None:
        self.kv.pop(request_id, None)
        self.features.pop(request_id, None)
