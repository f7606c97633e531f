"""Grid recovery (`accel.kernels.linear.grid_fit`): weights dequantized from a GGUF release come back bit for bit
at int8g / int5 / int4f, and weights on no grid are rounded exactly as before (compressed-tensors' min-max)."""

from __future__ import annotations

import torch

from accel.kernels.linear import (dequantize_int4_groupwise, dequantize_int8_per_channel, fp16_scale, grid_fit,
                                  quantize_int4_groupwise, quantize_int5_groupwise, quantize_int8_groupwise)

G = 32


def _blocks(out_f=48, in_f=128, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return gen, out_f, in_f


def q8_0(out_f=48, in_f=128, seed=0):
    """GGUF Q8_0: d = absmax / 127 (fp16), codes round(w / d)."""
    gen, *_ = _blocks(out_f, in_f, seed)
    w = torch.randn(out_f, in_f // G, G, generator=gen) * torch.rand(out_f, in_f // G, 1, generator=gen)
    d = (w.abs().amax(-1, keepdim=True) / 127).half().float()
    return (torch.round(w / d).clamp(-127, 127) * d).reshape(out_f, in_f), d.squeeze(-1)


def q5_0(out_f=48, in_f=128, seed=1):
    """GGUF Q5_0: d = the signed value of largest magnitude / -16 (fp16), codes in [-16, 15]: where that value is
    positive d is negative and the block's codes only fit mirrored."""
    gen, *_ = _blocks(out_f, in_f, seed)
    w = torch.randn(out_f, in_f // G, G, generator=gen)
    signed_max = torch.gather(w, -1, w.abs().argmax(-1, keepdim=True))
    d = (signed_max / -16).half().float()
    return (torch.round(w / d).clamp(-16, 15) * d).reshape(out_f, in_f), d.squeeze(-1)


def q4_k_like(out_f=48, in_f=128, seed=2, exact_zero=False):
    """A Q4_K sub-block: w = d * k - m with k in [0, 15] where the search left the extreme codes unused (codes 1..13
    here), so the block's min and max are not on codes 0 and 15 and min-max re-rounds it."""
    gen, *_ = _blocks(out_f, in_f, seed)
    k = torch.randint(1, 14, (out_f, in_f // G, G), generator=gen).float()
    d = (torch.rand(out_f, in_f // G, 1, generator=gen) * 0.02 + 0.005).half().float()
    if not exact_zero:  # Q4_K's 6-bit min scale: m / d is no short fraction, so the fp16 zero point rounds it
        m = (torch.rand(out_f, in_f // G, 1, generator=gen) * 0.1).half().float()
    else:  # m / d a multiple of 1/4: the fp16 zero point holds it exactly
        m = d * torch.randint(0, 40, (out_f, in_f // G, 1), generator=gen).float() / 4
    return (d * k - m).reshape(out_f, in_f)


def test_a_q8_0_table_is_stored_bit_for_bit_at_int8g():
    w, d = q8_0()
    q, s = quantize_int8_groupwise(w)
    assert torch.equal(dequantize_int8_per_channel(q, s), w)
    assert torch.equal(s.abs(), d)
    old = fp16_scale(w.reshape(48, -1, G).abs().amax(-1) / 127.5)  # min-max alone scales every value by 127/127.5
    assert not torch.equal(dequantize_int8_per_channel(q, old), w)


def test_a_q5_0_release_is_exact_at_int5_with_its_mirrored_blocks_negative():
    w, d = q5_0()
    q, s = quantize_int5_groupwise(w)
    assert int(q.min()) >= -16 and int(q.max()) <= 15
    assert torch.equal(dequantize_int8_per_channel(q, s), w)
    assert (s < 0).any() and (s > 0).any()  # both signs of block occur, each kept
    _, _, found = grid_fit(w, G, 5, symmetric=True)
    assert bool(found.all())


def test_q4_k_sub_blocks_with_unused_extreme_codes_are_kept_at_int4f_where_min_max_rounds_them_off():
    w = q4_k_like()
    q, s, z = quantize_int4_groupwise(w, G, float_zero=True)  # as exported: fp16 scale and zero point
    err = (dequantize_int4_groupwise(q, s, z, G) - w).abs().max() / w.abs().max()
    assert err < 1e-3, err  # fp16 zero points only
    _, _, found = grid_fit(w, G, 4, symmetric=False)
    assert bool(found.all())
    wg = w.reshape(48, -1, G)  # what min-max alone gives (both ends on codes 0 and 15)
    lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
    mm = (hi - lo) / 15
    minmax = (torch.round(wg / mm[..., None] - lo[..., None] / mm[..., None]) * mm[..., None] + lo[..., None])
    assert (minmax.reshape(w.shape) - w).abs().max() / w.abs().max() > 20 * err


def test_weights_on_no_grid_round_as_compressed_tensors_min_max():
    torch.manual_seed(0)
    w = torch.randn(64, 128)
    _, _, found = grid_fit(w, G, 8, symmetric=True)
    assert not bool(found.any())
    q, s = quantize_int8_groupwise(w)
    expect = fp16_scale(w.reshape(64, -1, G).abs().amax(-1) / 127.5)
    assert torch.equal(s, expect)
    q5, s5 = quantize_int5_groupwise(w)
    assert torch.equal(s5, fp16_scale(w.reshape(64, -1, G).abs().amax(-1) / 15.5))
    assert int(q5.min()) >= -16 and int(q5.max()) <= 15
    _, s4, z4 = quantize_int4_groupwise(w, G, float_zero=True)
    wg = w.reshape(64, -1, G)
    lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
    assert torch.equal(s4, fp16_scale((hi - lo) / 15))


def test_a_constant_or_zero_group_is_exact():
    w = torch.zeros(4, 64)
    w[1] = 0.25
    w[2, :32] = -0.5
    for bits, sym in ((8, True), (5, True), (4, False)):
        _, _, found = grid_fit(w, G, bits, sym)
        assert bool(found.all())
    q, s = quantize_int5_groupwise(w)
    assert torch.equal(dequantize_int8_per_channel(q, s), w)
    q, s, z = quantize_int4_groupwise(w, G, float_zero=True)
    assert torch.equal(dequantize_int4_groupwise(q, s, z, G), w)


def test_int5_codes_with_negative_block_scales_run_on_the_int8g_kernels():
    import pytest

    from accel.kernels import cpu
    from accel.kernels.linear import Int8WeightOnlyLinear

    if not cpu.available():
        pytest.skip("accel's AVX2 kernels did not build on this machine")
    w, _ = q5_0(96, 576)
    q, s = quantize_int5_groupwise(w)
    assert (s < 0).any()
    mod = Int8WeightOnlyLinear.from_quantized(q, s)
    assert torch.equal(mod.dequantized(), w)
    x = torch.randn(97, 576)
    ref = x.double() @ w.double().T
    for m in (1, 7, 32, 97):  # row kernels (decode, verify), prefill GEMM
        y = mod(x[:m]).double()
        assert torch.allclose(y, ref[:m], rtol=1e-4, atol=1e-3 * ref.abs().max().item()), m

