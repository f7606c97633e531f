import torch

from accel.runtime.attention import PagedKVCache, quantize_int8


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
        k, v = torch.randn(8, 2, 8), torch.randn(8, 2, 8)
        slots = torch.tensor([4, 5, 6, 7, 12, 13, 14, 15])  # blocks 1 and 3
        cache.write(slots, k, v)
        gk, gv = cache.gather(torch.tensor([1, 3]))  # [8, 2, 8]
        tol = 0 if dtype == torch.float32 else 0.05
        torch.testing.assert_close(gk, k, atol=tol, rtol=0)
        saved = cache.read_blocks(torch.tensor([1, 3]), torch.device("cpu"))
        cache.write_blocks(torch.tensor([0, 5]), saved)
        k2, v2 = cache.gather(torch.tensor([0, 5]))
        assert torch.equal(k2, gk) and torch.equal(v2, gv)  # bit-exact move, scales included
