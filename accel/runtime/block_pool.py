"""Fixed-size KV blocks: free queue, reference counts, and the prefix cache of full blocks.

A block is *cached* when it is full and carries the chained hash of every token up to its end:

    block 0 hash = H(None,    tokens[0:bs])
    block 1 hash = H(hash 0,  tokens[bs:2bs])      <- depends on the whole prefix, not only its own tokens
    ...

A freed block (ref count 0) keeps its hash and goes to the *tail* of the free queue, so a later request
with the same prefix can take it back (a prefix-cache hit). New allocations pop from the *head*: the block
freed longest ago is reused first and its hash is evicted then (LRU eviction of cached free blocks).

Plain Python, no torch.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

BlockHash = bytes


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: list[int]) -> BlockHash:
    """Chained hash of one full block: sha256(parent hash || token ids as int64).

    sha256 rather than Python's `hash` because a collision would silently serve another prompt's KV.
    """
    h = hashlib.sha256(parent_hash or b"\x00")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


def hash_full_blocks(token_ids: list[int], block_size: int, num_blocks: int,
                     start: int = 0, parent: BlockHash | None = None) -> list[BlockHash]:
    """Chained hashes of blocks [start, start + num_blocks) of `token_ids`, given the hash of block start-1."""
    out: list[BlockHash] = []
    for i in range(start, start + num_blocks):
        parent = hash_block_tokens(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Owns every KV block id; hands out, takes back and caches blocks.

    Invariants: a block is in the free queue iff its ref count is 0; a hash maps to at most one block.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} is invalid; allowed: an integer >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> None, ordered from least to most recently freed (head is evicted first)
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, KVBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached free blocks count as free)."""
        return self.num_used_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (head first); for tests and debugging."""
        return list(self._free)

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Pop `n` blocks from the head of the free queue (evicting their hashes); ref count becomes 1."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self._free)} are free")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
                self.num_evictions += 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on (cached) blocks; a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block, in the given order; blocks reaching 0 join the free queue tail.

        Callers pass a request's blocks tail-first, so the end of a prompt is evicted before its shared start.
        """
        for block in blocks:
            assert block.ref_cnt > 0, f"block {block.block_id} freed more often than taken"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        """Register a full block under its chained hash (no-op if caching is off or the hash is known)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:  # same content computed twice (two requests in one step): keep the first
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every hash (e.g. after new weights are loaded)."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
