import pytest
import torch

from accel.kernels import cpu
from accel.runtime.attention import (AttentionMetadata, DecodeGroup, PagedKVCache, paged_attention,
                                     quantize_int8)


def test_int8_quantization_error_bound_and_scale():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 8)
    q, s = quantize_int8(x)
    assert q.dtype == torch.int8 and s.shape == (5, 3)
    assert torch.equal(q.abs().amax(-1), torch.full((5, 3), 127, dtype=torch.int8))  # max maps to 127
    assert ((q.float() * s.unsqueeze(-1)) - x).abs().max() <= s.max() / 2 + 1e-6


def test_write_gather_and_block_round_trip():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.int8):
        cache = PagedKVCache(6, 4, 2, 8, dtype, torch.device("cpu"), torch.float32)
        qkv = torch.randn(8, 7, 8)  # k and v as views into a fused qkv row, as the model writes them
        k, v = qkv[:, 3:5], qkv[:, 5:7]
        slots = torch.tensor([4, 5, 6, 7, 12, 13, 14, 15])  # blocks 1 and 3
        cache.write(slots, k, v)
        gk, gv = cache.gather(torch.tensor([1, 3]))  # [8, 2, 8]
        tol = 0 if dtype == torch.float32 else 0.05
        torch.testing.assert_close(gk, k, atol=tol, rtol=0)
        torch.testing.assert_close(gv, v, atol=tol, rtol=0)
        if cache.fast_write:  # a slot past the cache is an error, not a write into other memory
            with pytest.raises(RuntimeError, match="outside the cache"):
                cache.write(torch.tensor([24]), k[:1], v[:1])  # 6 blocks x 4 = 24 slots
        saved = cache.read_blocks(torch.tensor([1, 3]), torch.device("cpu"))
        cache.write_blocks(torch.tensor([0, 5]), saved)
        k2, v2 = cache.gather(torch.tensor([0, 5]))
        assert torch.equal(k2, gk) and torch.equal(v2, gv)  # bit-exact move, scales included


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("head_dim", [64, 12, 20])  # vectorised, scalar and mixed inner loops
@pytest.mark.parametrize("threads", [1, 2, 8])  # 4 rows: split by row (1, 2 threads) or by kv head (8)
@pytest.mark.parametrize("q_scale", [1.0, 8.0])  # large scores: the online softmax rescales across blocks
@pytest.mark.parametrize("heads", [6, 2, 10, 16])  # 2 kv heads: GQA groups 3, 1, 5 (tiles 4 + 1), 8 (4 + 4)
@pytest.mark.parametrize("spans", [False, True])
@pytest.mark.parametrize("bs", [4, 8])  # 8: scores in vectors of 8 tokens, the tail of a block masked
def test_paged_decode_kernel_matches_gather_and_sdpa(head_dim, threads, q_scale, heads, spans, bs):
    # requests with different context lengths and scattered, shared blocks; the kernel reads the block table
    # directly, the reference gathers the blocks and runs SDPA with a padding mask. With spans, rows 1-3 are one
    # request's verify rows (contexts 11, 12, 13 over one table, each row its own causal prefix) read together.
    g = torch.Generator().manual_seed(head_dim)
    kvh, nblocks = 2, 40
    cache = PagedKVCache(nblocks, bs, kvh, head_dim, torch.float32, torch.device("cpu"), torch.float32)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    ctx = torch.tensor([1, 11, 12, 13]) if spans else torch.tensor([1, 7, 16, 13])
    nb = 4
    table = torch.randperm(nblocks, generator=g)[:len(ctx) * nb].view(len(ctx), nb)
    table[1, 0] = table[2, 0]  # a shared (prefix-cached) block
    if spans:
        table[2:] = table[1]
    rows = torch.tensor([3, 0, 2, 5])
    # q as a view into a wider row (the fused qkv output): the kernel reads it through its row stride
    q = (torch.randn(6, heads + 3, head_dim, generator=g) * q_scale)[:, :heads]
    mask = (torch.arange(nb * bs)[None] < ctx[:, None])[:, None, None, :]
    meta_ref = AttentionMetadata(torch.empty(0, dtype=torch.long), [], [DecodeGroup(rows, table, mask)])
    offsets = torch.tensor([0, 1, 4]) if spans else None
    meta_ker = AttentionMetadata(torch.empty(0, dtype=torch.long), [],
                                 [DecodeGroup(rows, table, mask, ctx, spans=offsets)])
    none = torch.empty(0, kvh, head_dim)
    ref = paged_attention(q, none, none, cache, meta_ref, 0.3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = paged_attention(q, none, none, cache, meta_ker, 0.3)
    finally:
        torch.set_num_threads(before)
    assert torch.allclose(got[rows], ref[rows], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_verify_rows_split_across_threads_give_each_row_what_it_gets_alone(threads):
    # one request's verify span over a long context (its rows split into groups, its query heads in halves where 3
    # kv heads do not divide over the threads): every row bit-identical to the same row decoded alone, and to SDPA
    g = torch.Generator().manual_seed(7)
    bs, kvh, heads, d, nb = 16, 3, 9, 64, 40
    cache = PagedKVCache(nb + 8, bs, kvh, d, torch.float32, torch.device("cpu"), torch.float32)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    ctx = torch.arange(600, 605)
    table = torch.randperm(nb + 8, generator=g)[:nb].repeat(len(ctx), 1)
    rows = torch.arange(len(ctx))
    q = torch.randn(len(ctx), heads, d, generator=g)
    mask = (torch.arange(nb * bs)[None] < ctx[:, None])[:, None, None, :]
    none = torch.empty(0, kvh, d)
    span = AttentionMetadata(torch.empty(0, dtype=torch.long), [],
                             [DecodeGroup(rows, table, mask, ctx, spans=torch.tensor([0, len(ctx)]))])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = paged_attention(q, none, none, cache, span, 0.125)
        for r in range(len(ctx)):
            one = AttentionMetadata(torch.empty(0, dtype=torch.long), [],
                                    [DecodeGroup(torch.tensor([0]), table[r:r + 1], mask[r:r + 1], ctx[r:r + 1])])
            assert torch.equal(paged_attention(q[r:r + 1], none, none, cache, one, 0.125)[0], got[r]), r
    finally:
        torch.set_num_threads(before)
    ref = paged_attention(q, none, none, cache, AttentionMetadata(torch.empty(0, dtype=torch.long), [],
                                                                  [DecodeGroup(rows, table, mask)]), 0.125)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
def test_a_large_kv_cache_is_zeros_and_faulted_in_when_allocated():
    # pages left to fault on first use arrive inside decode steps (a 2 MB page allocation may compact memory while
    # the step's other thread waits): the cache must be resident before the first step, as torch.zeros would be
    import ctypes
    import mmap

    cache = PagedKVCache(num_blocks=512, block_size=16, num_kv_heads=4, head_dim=64, dtype=torch.float32,
                         device=torch.device("cpu"), compute_dtype=torch.float32)
    nbytes = cache.k.numel() * cache.k.element_size()
    assert nbytes >= 8 << 20
    libc = ctypes.CDLL(None, use_errno=True)
    pages = (nbytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    for t in (cache.k, cache.v):
        resident = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(nbytes), resident) == 0
        assert sum(b & 1 for b in resident) == pages
        assert not t.any()
