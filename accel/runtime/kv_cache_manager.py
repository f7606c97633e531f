"""Maps requests to KV blocks: prefix-cache lookup, all-or-nothing slot allocation, freeing.

Plain Python, no torch. The KV tensors themselves live in the model runner; this class only decides which
block ids a request's tokens go to.

Hybrid models (vLLM's hybrid allocator): layers with different sliding windows (Gemma 3: one global layer in six)
are split into KV groups of equal size (`KVLayout`); a block is one group's K/V for `block_size` positions, all
groups draw from one pool, and each request holds one block table per group. A sliding-window group gives back
the blocks that fall behind its window (their table entries then point at block 0 and are never read), so its
layers hold about window / block_size blocks per request however long the request grows.
"""

from __future__ import annotations

from dataclasses import dataclass

from accel.runtime.block_pool import BlockHash, BlockPool, KVBlock, hash_full_blocks
from accel.runtime.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVLayout:
    """Which block table and which physical K/V tensor each layer uses.

    Layers of one window size form groups of `num_tensors` layers (the size of the smallest kind; the last group
    of a kind may have fewer); layer l stores its K/V in tensor `layer_tensor[l]` at the blocks of group
    `layer_group[l]`. Full-attention groups come first, so group 0 holds every position of a request where any
    layer attends globally. A model whose layers all share one window is one group of all its layers."""

    windows: tuple[int | None, ...]  # per group: its layers' sliding window (None: full attention)
    layer_group: tuple[int, ...]
    layer_tensor: tuple[int, ...]
    num_tensors: int

    @classmethod
    def of(cls, layer_windows: list[int | None]) -> KVLayout:
        kinds: dict[int | None, list[int]] = {}
        for i, w in enumerate(layer_windows):
            kinds.setdefault(w, []).append(i)
        size = min(len(v) for v in kinds.values()) if len(kinds) > 1 else len(layer_windows)
        windows: list[int | None] = []
        group, tensor = [0] * len(layer_windows), [0] * len(layer_windows)
        for w in sorted(kinds, key=lambda w: (w is not None, w or 0)):
            layers = kinds[w]
            for a in range(0, len(layers), size):
                for j, layer in enumerate(layers[a:a + size]):
                    group[layer], tensor[layer] = len(windows), j
                windows.append(w)
        return cls(tuple(windows), tuple(group), tuple(tensor), size)

    @property
    def num_groups(self) -> int:
        return len(self.windows)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 windows: tuple[int | None, ...] = (None,)) -> None:
        """windows: one entry per KV group (`KVLayout.windows`)."""
        if block_size < 1:
            raise ValueError(f"block_size={block_size} is invalid; allowed: an integer >= 1")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.windows = tuple(windows)
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        # request id -> per group its blocks in order (None: behind the group's window, given back)
        self._blocks: dict[str, list[list[KVBlock | None]]] = {}
        self._hashes: dict[str, list[BlockHash]] = {}  # request id -> chained hashes of its full blocks
        self._num_cached: dict[str, list[int]] = {}  # request id -> per group, blocks registered in the cache
        self._num_released: dict[str, list[int]] = {}  # request id -> per group, leading entries given back
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

    def first_needed(self, group: int, num_computed: int) -> int:
        """The group's first block a query at position `num_computed` (or later) reads."""
        w = self.windows[group]
        return 0 if w is None else max(0, num_computed - w + 1) // self.block_size

    def max_blocks(self, num_tokens: int, chunk: int) -> int:
        """Blocks a request of `num_tokens` positions holds at most, computed `chunk` positions a step."""
        n, bs = cdiv(num_tokens, self.block_size), self.block_size
        return sum(n if w is None else min(n, cdiv(w - 1 + chunk, bs) + 2) for w in self.windows)

    def blocks_to_grow(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs to cover `num_tokens` positions (at most: blocks behind a window may go back)."""
        held = self._blocks.get(seq.request_id)
        n = cdiv(num_tokens, self.block_size)
        return sum(max(0, n - len(grp)) for grp in held) if held else n * len(self.windows)

    def held_blocks(self, seq: Sequence, num_tokens: int) -> list[list[tuple[int, int]]]:
        """Per group, (table index, block id) of the blocks holding seq's first `num_tokens` positions' K/V
        (swapping a preempted request out and back in)."""
        n = cdiv(num_tokens, self.block_size)
        return [[(i, b.block_id) for i, b in enumerate(grp[:n]) if b is not None]
                for grp in self._blocks.get(seq.request_id, [[] for _ in self.windows])]

    def _key(self, group: int, block_hash: BlockHash) -> BlockHash:
        return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")

    def _block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[BlockHash]:
        """Chained hashes of the first `num_full_blocks` blocks of seq's verified tokens (memoised)."""
        hashes = self._hashes.setdefault(seq.request_id, [])
        if len(hashes) < num_full_blocks:
            parent = hashes[-1] if hashes else None
            tokens = seq.token_ids
            hashes.extend(hash_full_blocks(tokens, self.block_size, num_full_blocks - len(hashes),
                                           start=len(hashes), parent=parent))
        return hashes[:num_full_blocks]

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[list[KVBlock | None]], int]:
        """Longest run of cached full blocks that prefix seq's tokens, per group, and how many tokens they hold.

        A full-attention group needs every block of the run; a sliding group only those its window reaches from
        the first position left to compute (the others come back as None). At least one token is always left to
        compute, because the step that computes it samples the next one.
        Takes no references: pass the blocks to `allocate_slots`.
        """
        groups = range(len(self.windows))
        if not self.enable_prefix_caching or seq.num_computed_tokens > 0 or seq.params.prompt_logprobs is not None:
            return [[] for _ in groups], 0  # prompt logprobs need every prompt position's logits computed
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hashes = self._block_hashes(seq, max_blocks)
        found: list[list[KVBlock | None]] = []
        n = max_blocks
        for g in groups:
            if self.windows[g] is None:
                got = []
                for h in hashes[:n]:
                    block = self.pool.get_cached_block(self._key(g, h))
                    if block is None:
                        break
                    got.append(block)
                n = len(got)
            else:
                got = [self.pool.get_cached_block(self._key(g, h)) for h in hashes[:n]]
            found.append(got)
        while n > 0 and not all(all(found[g][i] is not None for i in range(self.first_needed(g, n * self.block_size), n))
                                for g in groups if self.windows[g] is not None):
            n -= 1
        hits = [[b if i >= self.first_needed(g, n * self.block_size) else None for i, b in enumerate(found[g][:n])]
                for g in groups]
        self.num_queried_tokens += seq.num_tokens
        self.num_hit_tokens += n * self.block_size
        return hits, n * self.block_size

    # ---- mutations -------------------------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int,
                       new_computed_blocks: list[list[KVBlock | None]] | None = None,
                       num_lookahead_tokens: int = 0) -> list[KVBlock] | None:
        """Make room for `num_new_tokens` (+ lookahead slots for draft tokens) after seq's computed tokens.

        `new_computed_blocks` are prefix-cache hits from `get_computed_blocks` (their tokens count as computed).
        Returns the newly allocated blocks, or None -- and then nothing changed but blocks behind a window going
        back -- when the pool is too small. Full blocks already computed are registered in the prefix cache as a
        side effect.
        """
        if num_new_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError(f"num_new_tokens={num_new_tokens}, num_lookahead_tokens={num_lookahead_tokens}; "
                             "allowed: integers >= 0")
        groups = range(len(self.windows))
        hits = new_computed_blocks or [[] for _ in groups]
        rid = seq.request_id
        held = self._blocks.get(rid) or [[] for _ in groups]
        num_computed = seq.num_computed_tokens + len(hits[0]) * self.block_size
        num_needed = cdiv(num_computed + num_new_tokens + num_lookahead_tokens, self.block_size)
        if rid in self._blocks:
            self._release_behind_windows(seq, num_computed)
        first = [self.first_needed(g, num_computed) for g in groups]
        num_required = sum(max(0, num_needed - max(len(held[g]) + len(hits[g]), first[g])) for g in groups)
        # a cached hit with ref count 0 sits in the free queue: taking it costs a free block too
        taken = [b for grp in hits for b in grp if b is not None]
        num_revived = sum(1 for b in taken if b.ref_cnt == 0)
        if num_required + num_revived > self.pool.num_free_blocks:
            return None

        self.pool.touch(taken)
        new_blocks = self.pool.get_new_blocks(num_required)
        it = iter(new_blocks)
        for g in groups:
            blocks = held[g]
            blocks.extend(hits[g])
            blocks.extend(None if i < first[g] else next(it) for i in range(len(blocks), num_needed))
        if rid not in self._blocks:
            self._blocks[rid] = held
            self._num_released[rid] = [min(first[g], len(held[g])) if self.windows[g] is not None else 0
                                       for g in groups]
        seq.block_tables = [[0 if b is None else b.block_id for b in grp] for grp in held]
        self._cache_full_blocks(seq, num_computed)
        return new_blocks

    def _release_behind_windows(self, seq: Sequence, num_computed: int) -> None:
        """Give back each sliding group's blocks that no query from position `num_computed` on reads (cached first,
        so a later request with the same prefix may still find them)."""
        rid = seq.request_id
        released = self._num_released[rid]
        for g, w in enumerate(self.windows):
            first = self.first_needed(g, num_computed)
            if w is None or first <= released[g]:
                continue
            self._cache_full_blocks(seq, num_computed)
            blocks = self._blocks[rid][g]
            gone = [b for b in blocks[released[g]:first] if b is not None]
            for i in range(released[g], min(first, len(blocks))):
                blocks[i] = None
            released[g] = first
            self.pool.free_blocks(gone)

    def _cache_full_blocks(self, seq: Sequence, num_computed: int) -> None:
        """Register seq's full blocks whose K/V are already computed and verified.

        Blocks are cached only once their K/V exist (not when tokens are merely scheduled): a request preempted
        after scheduling, or a draft token rejected, must never leave a hash pointing at K/V never written.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed, seq.num_tokens) // self.block_size
        cached = self._num_cached.setdefault(seq.request_id, [0] * len(self.windows))
        if num_full <= min(cached):
            return
        hashes = self._block_hashes(seq, num_full)
        for g, blocks in enumerate(self._blocks[seq.request_id]):
            for i in range(cached[g], num_full):
                if blocks[i] is not None:
                    self.pool.cache_block(blocks[i], self._key(g, hashes[i]))
            cached[g] = max(cached[g], num_full)

    def free(self, seq: Sequence) -> None:
        """Release every block of seq (each group's tail first, so shared prefixes are evicted last).

        Its computed full blocks are cached first, so a finished or preempted request leaves its prefix behind.
        """
        if seq.request_id in self._blocks:
            self._cache_full_blocks(seq, seq.num_computed_tokens)
        groups = self._blocks.pop(seq.request_id, [])
        for blocks in groups:
            self.pool.free_blocks([b for b in reversed(blocks) if b is not None])
        self._num_cached.pop(seq.request_id, None)
        self._num_released.pop(seq.request_id, None)
        seq.block_tables = [[] for _ in self.windows]

    def forget(self, seq: Sequence) -> None:
        """Drop the memoised hashes of a finished request."""
        self._hashes.pop(seq.request_id, None)
