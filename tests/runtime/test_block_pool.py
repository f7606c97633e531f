from accel.runtime.block_pool import BlockPool, hash_block_tokens, hash_full_blocks
from accel.runtime.kv_cache_manager import KVCacheManager
from accel.runtime.sampling_params import SamplingParams
from accel.runtime.sequence import Sequence


def seq(rid: str, tokens: list[int]) -> Sequence:
    return Sequence(rid, tokens, SamplingParams())


def test_new_blocks_come_from_the_head_with_ref_count_one():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]
    assert pool.free_block_ids() == [3]


def test_free_appends_to_tail_and_touch_revives():
    pool = BlockPool(4)
    a, b, c = pool.get_new_blocks(3)
    pool.free_blocks([c, a])
    assert pool.free_block_ids() == [3, 2, 0]
    pool.touch([a])
    assert a.ref_cnt == 1 and pool.free_block_ids() == [3, 2]
    pool.touch([b])
    assert b.ref_cnt == 2
    pool.free_blocks([b])
    assert b.ref_cnt == 1 and 1 not in pool.free_block_ids()


def test_chained_hash_depends_on_whole_prefix():
    h0 = hash_block_tokens(None, [1, 2])
    assert hash_block_tokens(h0, [3, 4]) != hash_block_tokens(hash_block_tokens(None, [9, 9]), [3, 4])
    assert hash_full_blocks([1, 2, 3, 4, 5], 2, 2) == [h0, hash_block_tokens(h0, [3, 4])]
    assert hash_block_tokens(None, [1, 2]) == h0  # deterministic


def test_lru_eviction_of_cached_free_blocks():
    pool = BlockPool(3)
    a, b, c = pool.get_new_blocks(3)
    for blk, tok in ((a, 1), (b, 2), (c, 3)):
        pool.cache_block(blk, hash_block_tokens(None, [tok]))
    pool.free_blocks([b, a, c])  # freed order b, a, c -> evicted in that order
    (x,) = pool.get_new_blocks(1)
    assert x is b and b.block_hash is None
    assert pool.get_cached_block(hash_block_tokens(None, [2])) is None
    assert pool.get_cached_block(hash_block_tokens(None, [1])) is a
    (y,) = pool.get_new_blocks(1)
    assert y is a and pool.num_evictions == 2
    assert pool.get_cached_block(hash_block_tokens(None, [3])) is c


def test_allocate_slots_exact_blocks_and_all_or_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    s1 = seq("a", list(range(10, 20)))  # 10 tokens -> 3 blocks
    assert [b.block_id for b in kv.allocate_slots(s1, 10)] == [0, 1, 2]
    assert s1.block_tables[0] == [0, 1, 2]
    s2 = seq("b", list(range(30, 38)))  # 8 tokens -> 2 blocks, only 1 free
    assert kv.allocate_slots(s2, 8) is None
    assert kv.num_free_blocks == 1 and s2.block_tables[0] == [] and kv.num_held_blocks() == 3
    s1.num_computed_tokens = 10
    assert kv.allocate_slots(s1, 2) == []  # tokens 10..11 still fit in block 2
    assert [b.block_id for b in kv.allocate_slots(s1, 3)] == [3]  # token 12 needs block 3
    kv.free(s1)
    assert kv.num_held_blocks() == 0 and kv.pool.free_block_ids() == [3, 2, 1, 0]  # tail first


def test_prefix_cache_hit_shares_blocks_and_leaves_one_token():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    s1 = seq("a", list(range(1, 13)))  # 12 tokens: 3 full blocks
    kv.allocate_slots(s1, 12)
    assert kv.pool.num_cached_blocks == 0  # scheduled, not computed yet: nothing may be served from it
    s1.num_computed_tokens = 12  # the step ran
    s1.output_token_ids.append(50)
    kv.allocate_slots(s1, 1)  # next step: the 3 computed blocks enter the cache
    assert kv.pool.num_cached_blocks == 3
    s2 = seq("b", list(range(1, 13)))  # identical prompt: at most 2 blocks hit (one token must be computed)
    hits, n = kv.get_computed_blocks(s2)
    assert [b.block_id for b in hits[0]] == [0, 1] and n == 8
    new = kv.allocate_slots(s2, 4, hits)
    assert s2.block_tables[0] == [0, 1, 4] and [b.block_id for b in new] == [4]
    assert [kv.pool.blocks[i].ref_cnt for i in (0, 1, 2, 3, 4)] == [2, 2, 1, 1, 1]
    s3 = seq("c", list(range(1, 9)) + [99, 98, 97, 96, 95])  # shares the first 2 blocks only
    hits, n = kv.get_computed_blocks(s3)
    assert [b.block_id for b in hits[0]] == [0, 1] and n == 8
    assert kv.prefix_cache_hit_rate == 16 / 25
    for s in (s1, s2):
        kv.free(s)
    assert kv.num_held_blocks() == 0
    # freed cached blocks are still hits
    s4 = seq("d", list(range(1, 13)))
    hits, _ = kv.get_computed_blocks(s4)
    assert [b.block_id for b in hits[0]] == [0, 1]


def test_revived_cached_blocks_count_against_free_blocks():
    kv = KVCacheManager(num_blocks=3, block_size=2)
    s1 = seq("a", [5, 6, 7, 8, 9])
    kv.allocate_slots(s1, 5)
    s1.num_computed_tokens = 5
    kv.free(s1)  # blocks 0,1 full -> cached on free, 2 partial
    assert kv.pool.num_cached_blocks == 2
    s2 = seq("b", [5, 6, 7, 8, 1, 2, 3])  # hits 2 blocks (free, cached) and needs 2 more: 4 > 3
    hits, n = kv.get_computed_blocks(s2)
    assert n == 4
    assert kv.allocate_slots(s2, 3, hits) is None
    assert kv.num_free_blocks == 3 and all(b.ref_cnt == 0 for b in kv.pool.blocks)


def test_bookkeeping_modules_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; import accel.runtime.scheduler, accel.runtime.kv_cache_manager, accel.runtime.outputs; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_sliding_group_gives_back_blocks_behind_its_window_and_hits_need_only_the_window():
    """Groups (full, window 8) over one pool of 4-token blocks: the sliding group keeps the blocks a query at the
    next position reads; a later request with the same prefix hits every full block but only the window's."""
    kv = KVCacheManager(num_blocks=40, block_size=4, windows=(None, 8))
    s1 = seq("a", list(range(1, 33)))  # 32 tokens
    for done in range(0, 32, 8):  # chunks of 8
        s1.num_computed_tokens = done
        assert kv.allocate_slots(s1, 8) is not None
    s1.num_computed_tokens = 32
    s1.output_token_ids.append(77)
    kv.allocate_slots(s1, 1)  # decode position 32 reads keys 25..32: blocks 6..8
    full, window = s1.block_tables
    assert len(full) == len(window) == 9 and len(set(full)) == 9
    assert [kv.first_needed(1, 32)] == [6] and window[6:] != [0, 0, 0]
    assert kv.num_held_blocks() == 9 + 3
    assert [len(g) for g in kv.held_blocks(s1, 32)] == [8, 2]  # (index, block) of the computed ones
    s2 = seq("b", list(range(1, 33)) + [5])  # same 32-token prefix
    hits, n = kv.get_computed_blocks(s2)
    assert n == 32 and [b is None for b in hits[1]] == [True] * 6 + [False] * 2
    assert [b.block_id for b in hits[0]] == full[:8]
    kv.allocate_slots(s2, 1, hits)
    assert s2.block_tables[1][6:8] == window[6:8]  # shared with s1
    kv.free(s1)
    kv.free(s2)
    assert kv.num_held_blocks() == 0
    assert kv.max_blocks(100, 16) == 25 + min(25, -(-(8 - 1 + 16) // 4) + 2)
