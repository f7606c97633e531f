"""Preempted requests' K/V (and their feature-cache rows) in host memory (preemption_mode "swap"): copied out
when the scheduler preempts a request, back into its new blocks when it resumes."""

from __future__ import annotations

import torch
from torch import Tensor


class HostSwap:
    """Request id -> per KV group, its blocks' saved tensors per layer of the group, by table index."""

    def __init__(self) -> None:
        self.kv: dict[str, list[tuple[list[int], list[list[Tensor]]]]] = {}
        self.features: dict[str, tuple[list[int], Tensor]] = {}

    def swap(self, swap_out: dict[str, list[list[tuple[int, int]]]], swap_in: dict[str, list[list[tuple[int, int]]]],
             kv_caches: list, feature_cache: Tensor | None, num_blocks: int, block_size: int,
             device: torch.device) -> None:
        """Copy preempted requests' blocks to host memory, and resumed ones back (out first: blocks get reused).
        Each request's blocks come per KV group as (table index, block id); a layer's cache names its group. A
        resumed request holds blocks at a subset of the indices it held (a sliding group's window only moved on).
        The feature cache follows group 0's blocks."""
        host = torch.device("cpu")
        feats = None if feature_cache is None else feature_cache.view(num_blocks, block_size, -1)
        for rid, groups in swap_out.items():
            saved = []
            for g, pairs in enumerate(groups):
                ids = torch.tensor([b for _, b in pairs], dtype=torch.long, device=device)
                saved.append(([i for i, _ in pairs], [c.read_blocks(ids, host) if c.group == g else None
                                                     for c in kv_caches]))
            self.kv[rid] = saved
            if feats is not None:
                ids = torch.tensor([b for _, b in groups[0]], dtype=torch.long, device=device)
                self.features[rid] = ([i for i, _ in groups[0]], feats[ids].to(host))
        for rid, groups in swap_in.items():
            saved = self.kv.pop(rid)
            for g, pairs in enumerate(groups):
                where, per_layer = saved[g]
                rows = _rows(where, pairs)
                ids = torch.tensor([b for _, b in pairs], dtype=torch.long, device=device)
                for cache, parts in zip(kv_caches, per_layer):
                    if parts is not None:
                        cache.write_blocks(ids, [t[rows] for t in parts])
            saved_feats = self.features.pop(rid, None)
            if feats is not None and saved_feats is not None:
                where, rows_saved = saved_feats
                pairs = groups[0]
                rows = _rows(where, pairs)
                ids = torch.tensor([b for _, b in pairs], dtype=torch.long, device=device)
                feats[ids] = rows_saved[rows].to(device)

    def release(self, request_id: str) -> None:
        self.kv.pop(request_id, None)
        self.features.pop(request_id, None)


def _rows(where: list[int], pairs: list[tuple[int, int]]) -> Tensor:
    """Rows of the saved blocks (saved at table indices `where`) for the new (table index, block) pairs."""
    row = {i: r for r, i in enumerate(where)}
    return torch.tensor([row[i] for i, _ in pairs], dtype=torch.long)
