"""Maps requests to KV blocks: prefix-cache lookup, all-or-nothing slot allocation, freeing.

Plain Python, no torch. The KV tensors themselves live in the model runner; this class only decides which
block ids a request's tokens go to.
"""

from __future__ import annotations

from accel.runtime.block_pool import BlockHash, BlockPool, KVBlock, hash_full_blocks
from accel.runtime.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size={block_size} is invalid; allowed: an integer >= 1")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self._blocks: dict[str, list[KVBlock]] = {}  # request id -> its blocks, in order
        self._hashes: dict[str, list[BlockHash]] = {}  # request id -> chained hashes of its full blocks
        self._num_cached: dict[str, int] = {}  # request id -> how many of its blocks are registered in the cache
        # prefix-cache hit rate counters (in tokens, over lookups)
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    # ---- queries ---------------------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def num_held_blocks(self) -> int:
        """Blocks referenced by any request (0 once every request has finished or been aborted): the pool's used
        blocks, since a block is in its free queue exactly when no request references it."""
        return self.pool.num_used_blocks

    def _block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[BlockHash]:
        """Chained hashes of the first `num_full_blocks` blocks of seq's verified tokens (memoised)."""
        hashes = self._hashes.setdefault(seq.request_id, [])
        if len(hashes) < num_full_blocks:
            parent = hashes[-1] if hashes else None
            tokens = seq.token_ids
            hashes.extend(hash_full_blocks(tokens, self.block_size, num_full_blocks - len(hashes),
                                           start=len(hashes), parent=parent))
        return hashes[:num_full_blocks]

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[KVBlock], int]:
        """Longest run of cached full blocks that prefix seq's tokens, and how many tokens they hold.

        At least one token is always left to compute, because the step that computes it samples the next one.
        Takes no references: pass the blocks to `allocate_slots`.
        """
        if not self.enable_prefix_caching or seq.num_computed_tokens > 0:
            return [], 0
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for h in self._block_hashes(seq, max_blocks):
            block = self.pool.get_cached_block(h)
            if block is None:
                break
            hits.append(block)
        self.num_queried_tokens += seq.num_tokens
        self.num_hit_tokens += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    # ---- mutations -------------------------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int, new_computed_blocks: list[KVBlock] | None = None,
                       num_lookahead_tokens: int = 0) -> list[KVBlock] | None:
        """Make room for `num_new_tokens` (+ lookahead slots for draft tokens) after seq's computed tokens.

        `new_computed_blocks` are prefix-cache hits from `get_computed_blocks` (their tokens count as computed).
        Returns the newly allocated blocks, or None -- and then nothing changed -- when the pool is too small.
        Full blocks already computed are registered in the prefix cache as a side effect.
        """
        if num_new_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError(f"num_new_tokens={num_new_tokens}, num_lookahead_tokens={num_lookahead_tokens}; "
                             "allowed: integers >= 0")
        new_computed_blocks = new_computed_blocks or []
        held = self._blocks.get(seq.request_id, [])
        num_computed = seq.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_needed = cdiv(num_computed + num_new_tokens + num_lookahead_tokens, self.block_size)
        num_required = max(num_needed - len(held) - len(new_computed_blocks), 0)
        # a cached hit with ref count 0 sits in the free queue: taking it costs a free block too
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_required + num_revived > self.pool.num_free_blocks:
            return None

        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_required)
        blocks = self._blocks.setdefault(seq.request_id, [])
        blocks.extend(new_computed_blocks)
        blocks.extend(new_blocks)
        seq.block_table = [b.block_id for b in blocks]

        self._cache_full_blocks(seq, num_computed)
        return new_blocks

    def _cache_full_blocks(self, seq: Sequence, num_computed: int) -> None:
        """Register seq's full blocks whose K/V are already computed and verified.

        Blocks are cached only once their K/V exist (not when tokens are merely scheduled): a request preempted
        after scheduling, or a draft token rejected, must never leave a hash pointing at K/V never written.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed, seq.num_tokens) // self.block_size
        start = self._num_cached.get(seq.request_id, 0)
        if num_full <= start:
            return
        blocks = self._blocks[seq.request_id]
        hashes = self._block_hashes(seq, num_full)
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], hashes[i])
        self._num_cached[seq.request_id] = num_full

    def free(self, seq: Sequence) -> None:
        """Release every block of seq (tail first, so shared prefixes are evicted last).

        Its computed full blocks are cached first, so a finished or preempted request leaves its prefix behind.
        """
        if seq.request_id in self._blocks:
            self._cache_full_blocks(seq, seq.num_computed_tokens)
        blocks = self._blocks.pop(seq.request_id, [])
        self.pool.free_blocks(list(reversed(blocks)))
        self._num_cached.pop(seq.request_id, None)
        seq.block_table = []

    def forget(self, seq: Sequence) -> None:
        """Drop the memoised hashes of a finished request."""
        self._hashes.pop(seq.request_id, None)
