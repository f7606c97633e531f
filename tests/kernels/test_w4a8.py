"""w4a8: INT4 weights against 8-bit activation blocks (the VNNI `vpdpbusd` kernels), against their torch reference."""

import pytest
import torch
from torch import nn

from accel import schemes
from accel.kernels import cpu
from accel.kernels.linear import Int4WeightOnlyLinear, quantize_activation_blocks_int8, unpack_int4


def _module(n: int, k: int, group_size: int, seed: int = 0, bias: bool = False) -> Int4WeightOnlyLinear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    nn.init.normal_(lin.weight, std=0.05)
    return schemes.quantize_linear(lin, "w4a8", group_size)


def _reference(mod: Int4WeightOnlyLinear, x: torch.Tensor) -> torch.Tensor:
    """y = x8 @ (q * scale)^T + x @ min^T in float64: the 8-bit blocks meet the codes, the float activations the
    group mins (the kernels' min term)."""
    n, k, g = mod.out_features, mod.in_features, mod.group_size
    scale = mod.scales.double()
    qs = (unpack_int4(mod.qweight).double().reshape(n, -1, g) * scale[..., None]).reshape(n, k)
    mins = (-mod.zeros.double() * scale)[..., None].expand(n, k // g, g).reshape(n, k)
    return quantize_activation_blocks_int8(x).double() @ qs.T + x.double() @ mins.T


def test_activation_blocks_round_each_block_to_127_steps_of_its_own_absmax():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0] * 8 + [100.0] + [1.0] * 31, [0.0] * 64])
    r = quantize_activation_blocks_int8(x)
    assert torch.allclose(r[0, :32], x[0, :32], atol=1.0 / 127 / 2 + 1e-7)  # block 1: its own scale (1 / 127)
    assert r[0, 32] == 100.0 and torch.all(r[0, 33:] == torch.round(torch.tensor(127 / 100.0)) * 100.0 / 127)
    assert torch.equal(r[1], torch.zeros(64))  # a zero block stays zero (scale 1)


def test_the_scheme_is_registered_with_int4s_storage_and_declared_activations():
    s = schemes.get("w4a8")
    assert s.code_bits == 4 and s.a8 and s.loaders == frozenset({"accel"})
    assert s.bits_per_weight(1536, 64) == schemes.get("int4").bits_per_weight(1536, 64)
    assert "w4a8" in schemes.names("on_load") and "w4a8" in schemes.names("candidate")
    assert schemes.identify(s.weights_args(64), "pack-quantized", dict(s.input_activations)) is s
    assert schemes.identify(s.weights_args(64), "pack-quantized", None) is schemes.get("int4")
    other = {**s.input_activations, "group_size": 64}
    assert schemes.identify(s.weights_args(64), "pack-quantized", other) is None
    assert "w4a8" in schemes.describe_unread(s.weights_args(64), other)
    assert s.check_width(1536, 48) is not None and s.check_width(1536, 64) is None  # groups of whole 32-blocks


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_the_module_computes_its_reference_and_a_row_the_same_at_any_row_count(group_size):
    n, k = 48, 256
    mod = _module(n, k, group_size, seed=group_size, bias=True)
    assert schemes.scheme_of(mod) == "w4a8" and mod.a8
    g = torch.Generator().manual_seed(1)
    x = torch.randn(70, k, generator=g)
    x[:, 5] *= 40  # an outlier channel costs its own block only
    full = mod(x)
    ref = _reference(mod, x) + mod.bias.double()
    assert torch.allclose(full.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    if mod.kernel_for(1, x.device) != "avx2":
        pytest.skip("this CPU has no AVX512-VNNI: the torch reference ran (checked above)")
    for m in (1, 2, 3, 6, 7, 16, 32, 33, 70):  # decode, verify and prefill rows: bit-identical per row
        assert torch.equal(mod(x[:m]), full[:m]), m
        assert torch.equal(mod(x[m - 1:m]), full[m - 1:m]), m
    assert mod.avx2_operands()[0] == 7


@pytest.mark.skipif(not cpu.available(), reason="accel's CPU kernels are not built here")
def test_the_a8_tile_layout_round_trips():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (32, 128), generator=g, dtype=torch.uint8)
    sm = torch.randn(32, 2, 2, generator=g)
    qv, smv = cpu.int4a8_vnni_layout(q, sm)
    assert qv.shape == (32, 64) and smv.shape == (2, 2, 2, 16)
    # row 0's first 4 bytes: inputs 0..3 low, 4..7 high
    assert [int(b) for b in qv.reshape(-1)[:4]] == [int(q[0, t]) | int(q[0, 4 + t]) << 4 for t in range(4)]
    back_q, back_sm = cpu.int4a8_vnni_unlayout(qv, smv)
    assert torch.equal(back_q, q) and torch.equal(back_sm, sm)


def test_a_compacted_module_computes_as_before_and_dequantizes_from_its_kernel_operands():
    mod = _module(32, 128, 64)
    x = torch.randn(3, 128)
    before, w = mod(x), mod.dequantized()
    if mod.compact_() == 0:
        pytest.skip("no kernel layout to compact into on this CPU")
    assert torch.equal(mod(x), before)
    assert torch.allclose(mod.dequantized(), w, atol=1e-6)


def test_the_reference_path_matches_the_kernel(monkeypatch):
    mod = _module(32, 128, 32, seed=3)
    x = torch.randn(5, 128)
    kernel = mod(x)
    monkeypatch.setattr(mod, "kernel_for", lambda rows, device, dtype=torch.float32: "a8")
    assert torch.allclose(mod(x), kernel, rtol=1e-5, atol=1e-5 * kernel.abs().max().item())


def test_float_zero_points_are_refused():
    with pytest.raises(ValueError, match="float_zero=True"):
        Int4WeightOnlyLinear(128, 32, group_size=32, float_zero=True, a8=True)
