"""Quantized Linear kernels vs their float reference, quantize/dequantize bounds, apply_plan on a tiny Llama."""

import pytest
import torch
import transformers
from torch import nn

from accel.kernels import cpu
from accel.kernels.linear import (
    INT4_DEQUANT_MIN_ROWS,
    Int4WeightOnlyLinear,
    Int8WeightOnlyLinear,
    concat_quantized,
    dequantize_int4_groupwise,
    dequantize_int8_per_channel,
    int4_from_compressed_tensors,
    pack_int4,
    quantize_int4_groupwise,
    quantize_int8_per_channel,
    quantize_int8_per_token,
    unpack_int4,
    weight_bytes,
)
from accel.schemes import apply_plan
from accel.schemes import scheme_of as linear_scheme

# bf16 activations on the CPU int-pack paths: ~3e-3 relative error per matmul; the fp32 GEMM path is exact.
REL_TOL = 1e-2


def _linear(out_f: int, in_f: int, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f, bias=bias)
    nn.init.normal_(lin.weight, std=0.05)
    return lin


def _i16_blocks(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as accel's INT8 / INT4 kernels see it: 16-bit integers per block of 32 inputs (the last block may be
    shorter), each with its block's absmax / 32767 as scale, rounded in fp32 as the kernels round (double)."""
    out = x.double().clone()
    for k0 in range(0, x.shape[1], 32):
        b = x[:, k0:k0 + 32].float()
        amax = b.abs().amax(-1, keepdim=True)
        s = torch.where(amax > 0, amax / 32767, torch.ones_like(amax))
        out[:, k0:k0 + 32] = torch.round(b * (1 / s)).double() * s.double()
    return out


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


# ---------------------------------------------------------------------------------------- quantize / dequantize


def test_int8_rounds_as_compressed_tensors_stores_and_error_bound():
    # scale = absmax / 127.5 in fp16; the extreme of a row lands on -128 or 127 (the int8 range, 127.5 steps each way)
    w = torch.tensor([[-2.55, 1.0, 0.0], [0.51, -0.25, 0.02]])
    q, s = quantize_int8_per_channel(w)
    assert torch.equal(s, (torch.tensor([2.55, 0.51]) / 127.5).half().float())
    assert q[0, 0] == round(-2.55 / float(s[0])) and q[1, 0] == 127 and q[0, 2] == 0  # 0.51 / s = 127.5 -> 127
    from accel.quant.schemes import fake_quant_int8

    assert torch.equal(fake_quant_int8(w), dequantize_int8_per_channel(q, s))  # sensitivity rounds the same way
    w = torch.randn(32, 100)
    q, s = quantize_int8_per_channel(w)
    assert q.dtype == torch.int8 and s.shape == (32,)
    # RTN: half a step; the row's extreme up to 0.56 of one (127.5 steps with the scale rounded to fp16, clamped)
    assert ((w - dequantize_int8_per_channel(q, s)).abs() <= s[:, None] * 0.56 + 1e-7).all()


def test_int8_zero_row_stays_zero():
    w = torch.zeros(2, 8)
    w[1, 3] = -2.0
    q, s = quantize_int8_per_channel(w)
    assert torch.equal(q[0], torch.zeros(8, dtype=torch.int8))  # an all-zero row: q = 0 whatever the scale
    torch.testing.assert_close(dequantize_int8_per_channel(q, s), w, rtol=0, atol=float(s[1]) / 2)


@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_quantize_ranges_and_error_bound(group_size):
    torch.manual_seed(1)
    w = torch.randn(16, 192)
    q, s, z = quantize_int4_groupwise(w, group_size)
    assert q.shape == (16, 192) and s.shape == z.shape == (16, 192 // group_size)
    assert int(q.min()) >= 0 and int(q.max()) <= 15 and int(z.max()) <= 15
    err = (w - dequantize_int4_groupwise(q, s, z, group_size)).abs()
    step = s.repeat_interleave(group_size, dim=1)  # [16, 192]
    assert (err <= step / 2 + 1e-6).all()


def test_int4_exact_on_a_hand_made_group():
    # One group of 4 with min -1, max 2 -> scale 0.2, zero 5; all values are on the grid.
    w = torch.tensor([[-1.0, 0.0, 0.4, 2.0] * 8])
    q, s, z = quantize_int4_groupwise(w, 32)
    assert s.item() == pytest.approx(0.2, rel=1e-3) and z.item() == 5  # the scale as fp16 stores it
    assert q[0, :4].tolist() == [0, 5, 7, 15]
    assert torch.allclose(dequantize_int4_groupwise(q, s, z, 32), w, atol=2e-3)


def test_int4_all_positive_group_keeps_zero_in_range():
    w = torch.full((1, 32), 3.0)
    q, s, z = quantize_int4_groupwise(w, 32)
    assert z.item() == 0
    assert torch.allclose(dequantize_int4_groupwise(q, s, z, 32), w, rtol=1e-3)


@pytest.mark.parametrize("group_size, in_f", [(128, 576), (48, 96), (64, 96)])
def test_int4_bad_group_size_raises_with_allowed_values(group_size, in_f):
    with pytest.raises(ValueError, match=f"group_size={group_size}.*allowed"):
        quantize_int4_groupwise(torch.randn(4, in_f), group_size)


def test_pack_unpack_int4_roundtrip_and_layout():
    q = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert pack_int4(q).tolist() == [[0x21, 0x0F]]
    r = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
    assert torch.equal(unpack_int4(pack_int4(r)), r)


def test_int4_from_compressed_tensors_layout():
    # Signed values -8..7 stored +8 as nibbles, lowest first; zero points packed along the output dim.
    signed = torch.tensor([[-8, -1, 0, 7, 1, 2, 3, 4], [0] * 8], dtype=torch.int32)
    unsigned = signed + 8
    packed = (unsigned << torch.arange(0, 32, 4)).sum(dim=1, keepdim=True).to(torch.int64)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)  # [2, 1]
    scale = torch.tensor([[0.5], [1.0]])
    q, s, z = int4_from_compressed_tensors(packed, scale, (2, 8))
    assert q.tolist() == unsigned.tolist() and z.tolist() == [[8], [8]]
    zp = torch.tensor([[(3 + 8) | ((-2 + 8) << 4)]], dtype=torch.int32)  # 2 output rows, 1 group
    _, _, z = int4_from_compressed_tensors(packed, scale, (2, 8), weight_zero_point=zp)
    assert z.tolist() == [[11], [6]]


# ---------------------------------------------------------------------------------------- modules vs reference


@pytest.mark.parametrize("out_f, in_f", [(64, 64), (192, 576), (576, 576), (48, 96)])
@pytest.mark.parametrize("m", [1, 7, 64])
def test_int8_linear_matches_dequantized_reference(out_f, in_f, m):
    lin = _linear(out_f, in_f, bias=True)
    mod = Int8WeightOnlyLinear.from_linear(lin)
    x = torch.randn(m, in_f)
    ref = x @ mod.dequantized().T + lin.bias.detach()
    y = mod(x)
    assert y.dtype == x.dtype and y.shape == (m, out_f)
    assert _rel_err(y, ref) < REL_TOL


@pytest.mark.parametrize("out_f, in_f", [(64, 64), (192, 576), (576, 576), (40, 128)])
@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("m", [1, 7, 64])
def test_int4_linear_matches_dequantized_reference(out_f, in_f, group_size, m):
    lin = _linear(out_f, in_f, bias=True)
    mod = Int4WeightOnlyLinear.from_linear(lin, group_size=group_size)
    x = torch.randn(m, in_f)
    ref = x @ mod.dequantized().T + lin.bias.detach()
    y = mod(x)
    assert y.dtype == x.dtype and y.shape == (m, out_f)
    assert _rel_err(y, ref) < REL_TOL


@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
def test_both_cpu_paths_agree_and_keep_leading_dims(cls):
    lin = _linear(64, 128)
    kernel = cls.from_linear(lin, dequant_min_rows=1 << 30)  # always the int-pack kernel
    gemm = cls.from_linear(lin, dequant_min_rows=0)  # always dequantize + fp32 GEMM
    x = torch.randn(2, 3, 128)
    ref = x @ kernel.dequantized().T
    assert torch.allclose(gemm(x), ref, atol=1e-5)  # fp32 path is exact up to summation order
    assert kernel(x).shape == (2, 3, 64) and _rel_err(kernel(x), ref) < REL_TOL


@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
def test_bf16_activations_stay_bf16(cls):
    mod = cls.from_linear(_linear(64, 64))
    assert mod(torch.randn(3, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_quantized_error_vs_float_linear_is_small():
    lin = _linear(128, 256)
    x = torch.randn(5, 256)
    ref = lin(x).detach()
    assert _rel_err(Int8WeightOnlyLinear.from_linear(lin)(x), ref) < 0.02
    assert _rel_err(Int4WeightOnlyLinear.from_linear(lin, group_size=32)(x), ref) < 0.15


def test_from_quantized_accepts_compressed_tensors_int8_scale_shape_and_state_dict_roundtrip():
    lin = _linear(32, 64)
    q, s = quantize_int8_per_channel(lin.weight.detach())
    a = Int8WeightOnlyLinear.from_quantized(q, s[:, None])
    b = Int8WeightOnlyLinear(64, 32)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 64)
    b(torch.randn(1, 64))  # builds a cache; the reload below must invalidate it
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x), b(x))
    with pytest.raises(ValueError, match="scales must have 32"):
        Int8WeightOnlyLinear.from_quantized(q, s[:5])


def test_int4_state_dict_roundtrip_rebuilds_kernel_cache():
    lin = _linear(64, 64)
    a = Int4WeightOnlyLinear.from_linear(lin, group_size=32)
    b = Int4WeightOnlyLinear(64, 64, group_size=32)
    x = torch.randn(2, 64)
    b(x)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x), b(x))
    assert set(a.state_dict()) == {"qweight", "scales", "zeros"}
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        Int4WeightOnlyLinear.from_quantized(torch.full((4, 64), 16), torch.ones(4, 2), torch.zeros(4, 2), 32)


def test_scheme_and_weight_bytes():
    lin = _linear(64, 128, bias=True)
    assert linear_scheme(lin) == "fp32" and weight_bytes(lin) == (64 * 128 + 64) * 4
    assert linear_scheme(_linear(8, 8).bfloat16()) == "bf16"
    i8 = Int8WeightOnlyLinear.from_linear(lin)
    assert linear_scheme(i8) == "int8" and weight_bytes(i8) == 64 * 128 + 64 * 4 + 64 * 4
    i4 = Int4WeightOnlyLinear.from_linear(lin, group_size=32)
    i4(torch.randn(1, 128))  # the kernel cache does not count
    assert linear_scheme(i4) == "int4" and weight_bytes(i4) == 64 * 64 + 64 * 4 * 4 + 64 * 4 + 64 * 4
    with pytest.raises(ValueError, match="Embedding"):
        linear_scheme(nn.Embedding(4, 4))


# ---------------------------------------------------------------------------------------- apply_plan


def _tiny_llama(tied: bool = True) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
                                   tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(cfg).eval()


def _all_linears(model) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


def test_apply_plan_replaces_named_modules_only():
    model = _tiny_llama()
    plan = {"model.layers.0.self_attn.q_proj": "int8", "model.layers.1.mlp.down_proj": "int4",
            "model.layers.0.mlp.up_proj": "fp32"}
    apply_plan(model, plan, group_size=32)
    mods = dict(model.named_modules())
    assert {n: linear_scheme(mods[n]) for n in plan} == plan
    assert isinstance(mods["model.layers.0.self_attn.k_proj"], nn.Linear)
    assert mods["model.layers.1.mlp.down_proj"].group_size == 32


def test_apply_plan_tied_lm_head_leaves_embedding_untouched():
    model = _tiny_llama(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    emb = model.model.embed_tokens.weight.detach().clone()
    apply_plan(model, {"lm_head": "int4"}, group_size=32)
    assert linear_scheme(model.lm_head) == "int4"
    assert torch.equal(model.model.embed_tokens.weight, emb)
    assert torch.allclose(model.lm_head.dequantized(), emb, atol=0.02)


@pytest.mark.parametrize("plan, match", [
    ({"lm_head": "int3"}, r"'int3' is not a scheme; allowed: int4, w4a8, int4f, int8, w8a8, int8g, fp16"),
    ({"model.layers.9.mlp.up_proj": "int8"}, r"does not have; Linear modules are"),
    ({"model.layers.0.input_layernorm": "int8"}, r"LlamaRMSNorm; only nn.Linear"),
    ({"model.layers.0.mlp.up_proj": "int4"}, r"up_proj.*group_size=128.*allowed: \[32, 64\]"),
])
def test_apply_plan_bad_plans_raise_and_change_nothing(plan, match):
    model = _tiny_llama()
    before = _all_linears(model)
    with pytest.raises(ValueError, match=match):
        # a valid entry first: validation must reject the whole plan before replacing anything
        apply_plan(model, {"model.layers.0.self_attn.q_proj": "int8", **plan}, group_size=128)
    assert _all_linears(model) == before


def test_all_int8_tiny_model_logits_close_to_fp32():
    model = _tiny_llama()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    names = _all_linears(model)
    with torch.no_grad():
        ref = model(ids).logits
        apply_plan(model, {n: "int8" for n in names})
        mods = dict(model.named_modules())
        assert [linear_scheme(mods[n]) for n in names] == ["int8"] * len(names) and _all_linears(model) == []
        out = model(ids).logits
        dec = model(ids[:, :1]).logits  # one row per sequence: the int-pack decode path
    assert _rel_err(out, ref) < 0.02
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    assert _rel_err(dec, ref[:, :1]) < 0.02


@pytest.mark.parametrize("cls, pack", [(Int8WeightOnlyLinear, "int8pack"), (Int4WeightOnlyLinear, "int4pack")])
def test_kernel_choice_by_rows_and_device(cls, pack):
    mod = cls.from_linear(_linear(64, 64), dequant_min_rows=16)
    host, cuda = torch.device("cpu"), torch.device("cuda")
    if cpu.available():
        assert mod.kernel_for(1, host, torch.bfloat16) == pack  # bf16 activations keep torch's kernel
        pack = "avx2"  # accel's own kernel wins for fp32 activations
    assert [mod.kernel_for(m, host) for m in (1, 15, 16, 512)] == [pack, pack, "gemm", "gemm"]
    assert mod.kernel_for(1, cuda) == "generic"


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
def test_int4f_scales_on_an_fp16_grid_stream_as_fp16_and_others_as_fp32():
    from accel.kernels.linear import Int4WeightOnlyLinear

    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (64, 128), generator=g)
    d = (torch.rand(64, 4, generator=g) * 0.01 + 1e-3).half().float()  # a Q4_1 release: fp16 d and m
    m = (-torch.rand(64, 4, generator=g) * 15 * d).half().float()  # zero points inside [0, 15]
    zeros = (-m / d).clamp(0, 15)  # the int4f form, as the quantizer stores it (fp32: -zeros * scale is m up to rounding)
    grid = Int4WeightOnlyLinear.from_quantized(q, d, zeros, 32)
    assert grid.avx2_operands()[2].dtype == torch.float16
    off_grid = Int4WeightOnlyLinear.from_quantized(q, d * 1.0001, zeros, 32)
    assert off_grid.avx2_operands()[2].dtype == torch.float32
    x = torch.randn(3, 128, generator=g)
    assert _rel_err(grid(x), x @ grid.dequantized().T) < 5e-4
    assert _rel_err(off_grid(x), x @ off_grid.dequantized().T) < 5e-4


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("out_f", [100, 96])  # the row layout, the VNNI tiles
def test_int4_integer_zeros_stream_as_fp16_scale_zero_pairs_with_the_fp32_pairs_results(out_f):
    """An integer zero point and an fp16 scale (every export's int4) stream as int16 pairs of fp16 bits (scale, zero),
    half the bytes of fp32 (scale, min) pairs; the kernel forms min = -zero * scale exactly, so every kernel (row,
    tiles, prefill GEMM, dequantize) gives what the fp32 pairs give, to the bit."""
    from accel.kernels.linear import Int4WeightOnlyLinear, unpack_int4

    g = torch.Generator().manual_seed(5)
    q = torch.randint(0, 16, (out_f, 128), generator=g)
    d = (torch.rand(out_f, 2, generator=g) * 0.01 + 1e-3).half().float()
    zeros = torch.randint(0, 16, (out_f, 2), generator=g).to(torch.uint8)
    mod = Int4WeightOnlyLinear.from_quantized(q, d, zeros, 64)
    kind, packed, sm = mod.avx2_operands()
    assert sm.dtype == torch.int16 and sm.numel() == out_f * 2 * 2
    fp32 = torch.stack([d, -zeros.float() * d], dim=-1).contiguous()
    if kind == 4:
        fp32 = cpu.int4_vnni_layout(q, fp32)[1]
    linear = cpu.int4_linear_vnni if kind == 4 else cpu.int4_linear
    x = torch.randn(40, 128, generator=g)
    for m in (1, 3, 40):  # decode rows, and the prefill GEMM
        assert torch.equal(linear(x[:m], packed, sm, 64), linear(x[:m], packed, fp32, 64)), m
    assert _rel_err(mod(x), x @ mod.dequantized().T) < 5e-4
    rows = cpu.int4_repack(unpack_int4(mod.qweight))
    pairs = torch.stack([d.half(), zeros.half()], dim=-1).contiguous().view(torch.int16)
    assert torch.equal(cpu.int4_dequant(rows, pairs, 64, 0, out_f), mod.dequantized())
    off_grid = Int4WeightOnlyLinear.from_quantized(q, d * 1.0001, zeros, 64)  # scales off fp16: fp32 pairs
    assert off_grid.avx2_operands()[2].dtype == torch.float32


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
@pytest.mark.parametrize("fp16_grid", [False, True])
def test_int4_vnni_tiles_give_a_row_the_same_result_at_any_row_count(group_size, fp16_grid):
    # the INT4 tile layout: each row bit-identical alone or batched (speculation exact), equal to the row layout's
    # prefill GEMM from 33 rows, and within the 16-bit activations' rounding of the dequantized weight
    from accel.kernels.linear import Int4WeightOnlyLinear, unpack_int4

    g = torch.Generator().manual_seed(group_size)
    n, k = 48, 256
    q = torch.randint(0, 16, (n, k), generator=g)
    d = torch.rand(n, k // group_size, generator=g) * 0.01 + 1e-3
    mins = -torch.rand(n, k // group_size, generator=g) * 15 * d
    if fp16_grid:  # a Q4_1 release's fp16 d and m
        d, mins = d.half().float(), mins.half().float()
    zeros = (-mins / d).clamp(0, 15)
    mod = Int4WeightOnlyLinear.from_quantized(q, d, zeros, group_size, float_zero=True)
    packed, sm = cpu.int4_vnni_layout(unpack_int4(mod.qweight), torch.randn(n, k // group_size, 2))
    assert packed.shape == (n, k // 2) and sm.shape == (n // 16, k // group_size, 2, 16)
    kind, qv, smv = mod.avx2_operands()
    if kind != 4:
        pytest.skip("this CPU has no AVX512-VNNI")
    assert smv.dtype == (torch.float16 if fp16_grid else torch.float32)
    x = torch.randn(70, k, generator=g)
    full = mod(x)
    for m in (1, 2, 3, 6, 7, 16, 31, 32, 33, 70):
        assert torch.equal(mod(x[:m]), full[:m]), m
        assert torch.equal(mod(x[m - 1:m]), full[m - 1:m]), m
    rows_sm = smv.permute(0, 3, 1, 2).reshape(n, k // group_size, 2).contiguous()
    rows = cpu.int4_linear(x, cpu.int4_repack(unpack_int4(mod.qweight)), rows_sm, group_size)
    assert torch.equal(rows, full)
    ref = (_i16_blocks(x) @ mod.dequantized().double().T)
    assert torch.allclose(full.double(), ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item())


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 40, 97])  # 40, 97: the VNNI prefill GEMM where the CPU has it
@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_avx2_int4_kernel_matches_reference_and_float_mins(m, group_size):
    g = torch.Generator().manual_seed(m + group_size)
    out_f, in_f = 70, 192
    q = torch.randint(0, 16, (out_f, in_f), generator=g)
    scale = torch.rand(out_f, in_f // group_size, generator=g) + 0.01
    mins = torch.randn(out_f, in_f // group_size, generator=g)  # float mins (GGUF Q4_1 form), not only -z * s
    x = torch.randn(m, in_f, generator=g)
    x[:, 7] = 12.0  # an outlier channel, as LLM activations have
    w = (q.double().view(out_f, -1, group_size) * scale.double()[..., None] + mins.double()[..., None])
    # groups of 32 inputs or more: activations rounded to 16 bits per block of 32 for the q * scale part (the min
    # part takes the exact sum of each group's inputs); groups of 16: exact fp32
    xr = _i16_blocks(x) if group_size % 32 == 0 else x.double()
    qs = (q.double().view(out_f, -1, group_size) * scale.double()[..., None]).view(out_f, in_f)
    mn = mins.double().repeat_interleave(group_size, dim=1)  # [out, in]
    ref = xr @ qs.T + x.double() @ mn.T
    packed = cpu.int4_repack(q)
    y = cpu.int4_linear(x, packed, torch.stack([scale, mins], dim=-1), group_size)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    # fp16 scale/min pairs (a GGUF grid's d and m) give exactly what the same values in fp32 give
    sm16 = torch.stack([scale, mins], dim=-1).half()
    assert torch.equal(cpu.int4_linear(x, packed, sm16, group_size),
                       cpu.int4_linear(x, packed, sm16.float(), group_size))
    exact = x.double() @ w.view(out_f, in_f).T
    assert _rel_err(y, exact.float()) < 5e-4  # an outlier costs its own block of 32 only
    if group_size in (32, 64):  # the module's integer zero points take the same kernel
        zeros = torch.randint(0, 16, scale.shape, generator=g, dtype=torch.uint8)
        mod = Int4WeightOnlyLinear.from_quantized(q, scale, zeros, group_size)
        # without VNNI, from INT4_DEQUANT_MIN_ROWS rows a GEMM on the dequantized weight beats the row kernel
        native = cpu.vnni_prefill(in_f) or m < INT4_DEQUANT_MIN_ROWS
        assert mod.kernel_for(m, torch.device("cpu")) == ("avx2" if native else "gemm")
        assert _rel_err(mod(x), x @ mod.dequantized().T) < 5e-4


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 33, 70])  # 33, 70: the VNNI prefill GEMM where the CPU has it
@pytest.mark.parametrize("out_f, in_f", [(64, 64), (130, 576), (1, 8), (70, 24)])
def test_avx2_int8_kernel_rounds_activations_to_16_bits_per_block_only(m, out_f, in_f):
    # every row-tile size (1-4 rows, remainders), output tiles of 64 and partial ones, K not a multiple of 16
    g = torch.Generator().manual_seed(m * 1000 + out_f)
    q = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8, generator=g)
    scale = torch.rand(out_f, generator=g) + 0.01
    x = torch.randn(m, in_f, generator=g)
    ref = (_i16_blocks(x) @ q.double().T) * scale.double()
    y = cpu.int8_linear(x, q, scale)
    assert y.dtype == torch.float32 and y.shape == (m, out_f)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item())
    exact = (x.double() @ q.double().T) * scale.double()
    assert _rel_err(y, exact.float()) < 5e-4  # 16-bit activations: far below the int8 weights' own rounding
    mod = Int8WeightOnlyLinear.from_quantized(q, scale)
    if mod.kernel_for(m, x.device) == "avx2":
        kind, qk, sk = mod.avx2_operands()  # the module routes fp32 inputs through it (the VNNI tile layout if any)
        assert torch.equal(mod(x), y if kind == 1 else cpu.int8_linear_vnni(x, qk, sk))
        assert torch.allclose(mod(x).double(), ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item())
    int8pack = mod._matmul(x, "int8pack")  # and the torch kernel agrees within its bf16 rounding
    assert _rel_err(int8pack, ref.float()) < REL_TOL


@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_generic_device_path_matches_reference(cls, dtype):
    # The path CUDA (and any non-CPU device) takes, exercised here on CPU tensors.
    mod = cls.from_linear(_linear(32, 64))
    x = torch.randn(3, 64)
    y = mod._matmul(x.to(dtype), "generic")
    assert y.dtype == dtype
    assert _rel_err(y, x @ mod.dequantized().T) < (REL_TOL if dtype == torch.bfloat16 else 1e-5)


def test_int4_out_features_not_multiple_of_16_uses_gemm():
    # torch's int4pack layout needs out_features % 16 == 0 (accel's AVX2 kernel does not, it takes any N)
    mod = Int4WeightOnlyLinear.from_linear(_linear(40, 64), group_size=32)
    assert mod.kernel_for(1, torch.device("cpu"), torch.bfloat16) == "gemm"
    assert mod.kernel_for(1, torch.device("cpu")) == ("avx2" if cpu.available() else "gemm")


@pytest.mark.parametrize("cls, kw", [(Int8WeightOnlyLinear, {}), (Int4WeightOnlyLinear, {"group_size": 32})])
def test_concat_quantized_equals_separate_outputs(cls, kw):
    parts = [cls.from_linear(_linear(64, 64, bias=False, seed=1), **kw),
             cls.from_linear(_linear(32, 64, bias=True, seed=2), **kw)]
    fused = concat_quantized(parts)
    x = torch.randn(3, 64)
    ref = torch.cat([x @ p.dequantized().T for p in parts], dim=-1)
    ref[:, 64:] += parts[1].bias
    assert torch.allclose(fused.dequantized(), torch.cat([p.dequantized() for p in parts]))
    assert _rel_err(fused(x), ref) < REL_TOL
    with pytest.raises(ValueError, match="one scheme"):
        concat_quantized([parts[0], Int8WeightOnlyLinear.from_linear(_linear(8, 32))])


@pytest.mark.integration
def test_real_model_all_int8_close_to_fp32(real_model_path):
    # Measured: mean KL 0.0092 (0.0083 from int8 RTN weights, the rest from the bf16 activation cast), top-1 0.96.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_model_path)
    ids = tok("The quick brown fox jumps over the lazy dog. In 1492, Columbus sailed the ocean blue and",
              return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(ids).logits[0]
        apply_plan(model, {n: "int8" for n in _all_linears(model)})
        out = model(ids).logits[0]
    kl = torch.nn.functional.kl_div(out.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none")
    assert kl.sum(-1).mean().item() < 0.03
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.85


def test_int4_from_compressed_tensors_matches_the_library_packing():
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    torch.manual_seed(0)
    signed = torch.randint(-8, 8, (24, 64), dtype=torch.int8)
    zp = torch.randint(-8, 8, (20, 2), dtype=torch.int8)  # 20 rows: not a multiple of 8, exercises padding
    q, _, _ = int4_from_compressed_tensors(helpers.pack_to_int32(signed, 4), torch.ones(24, 2), torch.tensor([24, 64]))
    assert torch.equal(q.int(), signed.int() + 8)
    _, _, z = int4_from_compressed_tensors(helpers.pack_to_int32(signed[:20], 4), torch.ones(20, 2), (20, 64),
                                           weight_zero_point=helpers.pack_to_int32(zp, 4, packed_dim=0))
    assert torch.equal(z.int(), zp.int() + 8)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 13, 70, 97])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_nn_linear_on_every_row_count(m, bias):
    # AVX-512: fp32 panels at every row count (200 = 4 x 48 + 8: a partial last panel); AVX2: <= AVX2_MAX_ROWS (96)
    # rows through accel's AVX2 fp32 kernel (4 x 3 register tiles with leftovers), more through oneDNN
    from accel.kernels.linear import PackedLinear, packed_linear_available

    if not packed_linear_available():
        pytest.skip("oneDNN is not available in this torch build")
    lin = _linear(200, 96, bias=bias)
    packed = PackedLinear(lin)
    x = torch.randn(m, 96)
    assert torch.allclose(packed(x), lin(x), atol=1e-5, rtol=1e-5)
    assert packed(x.view(1, m, 96)).shape == (1, m, 200)
    assert linear_scheme(packed) == "fp32" and weight_bytes(packed) == 200 * 96 * 4 + (200 * 4 if bias else 0)


@pytest.mark.skipif(not cpu.has_avx512(), reason="fp16 weight panels need AVX-512")
@pytest.mark.parametrize("m", [1, 3, 9, 70])
def test_fp16_packed_linear_is_the_linear_on_its_fp16_weight(m):
    from accel.kernels.linear import PackedLinear

    lin = _linear(200, 96, bias=True)
    packed = PackedLinear(lin, torch.float16)
    x = torch.randn(m, 96)
    rounded = torch.nn.functional.linear(x, lin.weight.half().float(), lin.bias)
    torch.testing.assert_close(packed(x), rounded, atol=1e-5, rtol=1e-5)
    assert packed.packed.dtype == torch.float16
    assert linear_scheme(packed) == "fp16" and weight_bytes(packed) == 200 * 96 * 2 + 200 * 4


def test_fp16_weights_are_refused_where_the_panel_kernels_do_not_run(monkeypatch):
    from accel.kernels.linear import PackedLinear

    monkeypatch.setattr(cpu, "has_avx512", lambda: False)
    with pytest.raises(ValueError, match="AVX-512.*allowed here: torch.float32"):
        PackedLinear(_linear(64, 32), torch.float16)


def test_pack_float_linears_frees_each_replaced_linear_before_packing_the_next(monkeypatch):
    import weakref

    from accel.kernels import linear as lin_mod

    if not lin_mod.packed_linear_available():
        pytest.skip("oneDNN is not available in this torch build")
    model = torch.nn.Sequential(*[torch.nn.Sequential(_linear(32, 32), torch.nn.ReLU()) for _ in range(4)])
    x = torch.randn(3, 32)
    want = model(x)
    replaced, real = [], lin_mod.PackedLinear.__init__

    def init(self, linear, weight_dtype=torch.float32):
        assert all(r() is None for r in replaced), "a replaced Linear is still alive"
        real(self, linear, weight_dtype)
        replaced.append(weakref.ref(linear))

    monkeypatch.setattr(lin_mod.PackedLinear, "__init__", init)
    assert lin_mod.pack_float_linears(model) == [f"{i}.0" for i in range(4)]
    assert len(replaced) == 4 and all(r() is None for r in replaced)
    assert torch.allclose(model(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("k", [96, 104])
def test_f32_kernel_rows_do_not_depend_on_how_many_share_the_call(k):
    # speculation's exactness and batch invariance: a row's result must not change with the rows verified next to it
    torch.manual_seed(k)
    w, x = torch.randn(203, k), torch.randn(23, k)
    full = cpu.f32_linear(x, w)
    for m in range(1, 23):
        assert torch.equal(cpu.f32_linear(x[:m], w), full[:m]), m
        assert torch.equal(cpu.f32_linear(x[m:m + 1], w), full[m:m + 1]), m
    torch.testing.assert_close(full, x @ w.T, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not cpu.has_avx512(), reason="the weight panel kernels need AVX-512")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,k", [(203, 96), (96, 37), (48, 1)])
def test_panel_rows_do_not_depend_on_how_many_share_the_call(n, k, dtype):
    # the same invariance for the panel layout (fp32 and fp16 panels), through a whole last panel and a partial one
    # (203 = 4 x 48 + 11), up to prefill sizes (groups of 8 rows and one of the rest)
    torch.manual_seed(n + k)
    w, x = torch.randn(n, k), torch.randn(70, k)
    panels = cpu.f32_panels(w, dtype)
    assert panels.shape == (-(-n // 48), k, 48) and panels.dtype == dtype
    full = cpu.f32_panel_linear(x, panels, n)
    for m in [1, 2, 3, 5, 8, 9, 16, 17, 33]:
        assert torch.equal(cpu.f32_panel_linear(x[:m], panels, n), full[:m]), m
        assert torch.equal(cpu.f32_panel_linear(x[m:m + 1], panels, n), full[m:m + 1]), m
    # fp16 panels compute in fp32 on the fp16-rounded weight
    torch.testing.assert_close(full, x @ w.to(dtype).float().T, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("rows,hidden", [(1, 576), (5, 100), (40, 20)])  # 32-wide chains, 8-wide, scalar tails
def test_rms_norm_kernels_match_torch(rows, hidden):
    g = torch.Generator().manual_seed(hidden)
    x, res, w = (torch.randn(rows, hidden, generator=g) for _ in range(3))
    torch.testing.assert_close(cpu.rms_norm(x, w[0], 1e-5),
                               torch.nn.functional.rms_norm(x, (hidden,), w[0], 1e-5), atol=1e-5, rtol=1e-5)
    summed = res + x
    got = cpu.add_rms_norm_(x, res, w[0], 1e-5)
    torch.testing.assert_close(res, summed)  # residual updated in place
    torch.testing.assert_close(got, torch.nn.functional.rms_norm(summed, (hidden,), w[0], 1e-5), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("rows,inter", [(1, 1536), (7, 20), (33, 64)])  # vector, scalar-tail and multi-thread
def test_silu_mul_matches_torch(rows, inter):
    g = torch.Generator().manual_seed(rows)
    gu = torch.randn(rows, 2 * inter, generator=g) * 6
    gu[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -90.0])  # exp clamps at both ends stay finite and right
    ref = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    got = cpu.silu_mul(gu)
    assert got.shape == (rows, inter) and torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("head_dim", [64, 12])  # vectorised half (32) and scalar half (6)
def test_rope_in_place_matches_rotate_half_and_leaves_other_columns(head_dim):
    from accel.runtime.models import signed_sin

    g = torch.Generator().manual_seed(head_dim)
    t, heads, kv = 5, 3, 1
    x = torch.randn(t, (heads + 2 * kv) * head_dim, generator=g)
    ang = torch.rand(t, head_dim // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)  # [T, D], HF layout
    rot = x[:, :(heads + kv) * head_dim].view(t, heads + kv, head_dim)
    half = head_dim // 2
    rotate_half = torch.cat([-rot[..., half:], rot[..., :half]], -1)
    ref = rot * cos[:, None] + rotate_half * sin[:, None]
    v_before = x[:, (heads + kv) * head_dim:].clone()
    cpu.rope_(x, cos[:, None], signed_sin(sin)[:, None], heads + kv, head_dim)
    torch.testing.assert_close(x[:, :(heads + kv) * head_dim].view(t, heads + kv, head_dim), ref, atol=1e-6,
                               rtol=1e-6)
    assert torch.equal(x[:, (heads + kv) * head_dim:], v_before)  # v columns untouched


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("out_f", [100, 96, 976])  # 100: the row layout; 96, 976: VNNI tiles (odd count)
def test_int8_kernel_rows_do_not_depend_on_how_many_share_a_decode_call(out_f):
    # up to 32 rows (a decode or verify step) a row's result is bit-identical alone or batched, so greedy output is
    # the same with and without speculation; in the VNNI tile layout at any row count (prefill too), elsewhere larger
    # calls may take the prefill GEMM (a different sum order)
    torch.manual_seed(1)
    mod = Int8WeightOnlyLinear.from_linear(_linear(out_f, 576))
    tiles = mod.avx2_operands()[0] == 3
    x = torch.randn(97 if tiles else 32, 576)
    full = mod(x)
    for m in (1, 2, 3, 5, 7, 16, 31) + ((32, 33, 64, 97) if tiles else ()):
        assert torch.equal(mod(x[:m]), full[:m]), m
        assert torch.equal(mod(x[m - 1:m]), full[m - 1:m]), m


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("out_f", [100, 96])  # the row layout, the VNNI tiles
def test_int8g_scales_each_block_of_32_and_a_rows_result_does_not_depend_on_the_call(out_f):
    """int8g (the GGUF Q8_0 grid): one fp16 scale per row and block of 32 inputs, folded into the block's FMA, in
    the row kernels, the VNNI tiles and both prefill GEMMs; the module's result is its dequantized weight's."""
    from accel.kernels.linear import quantize_int8_groupwise

    torch.manual_seed(3)
    w = torch.randn(out_f, 576) * 0.02
    w[:, 64:96] *= 50  # one block with a far larger range: a per-row scale would flatten the rest
    q, s = quantize_int8_groupwise(w)
    assert s.shape == (out_f, 18) and torch.equal(s, s.half().float())
    mod = Int8WeightOnlyLinear.from_quantized(q, s)
    assert mod.group_size == 32 and linear_scheme(mod) == "int8g"
    deq = mod.dequantized()
    # within half a step of each block's own scale (plus its fp16 rounding): the small blocks keep their resolution
    assert ((deq - w).abs() / s.repeat_interleave(32, 1)).max() <= 0.5 + 127.5 * 2.0**-11
    x = torch.randn(97, 576)
    full = mod(x)
    ref = (_i16_blocks(x) @ deq.double().T)
    assert torch.allclose(full.double(), ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item())
    tiles = mod.avx2_operands()[0] == 3
    step = full if tiles else mod(x[:32])  # the row layout: up to 32 rows (a decode / verify step) run the row kernels
    for m in (1, 2, 3, 7, 16, 31, 32):
        assert torch.equal(mod(x[:m]), step[:m]), m
    rows = cpu.int8_linear(x, q, torch.ones(out_f), s.half())  # the row layout's kernels, prefill GEMM at 97 rows
    assert torch.allclose(rows, full, rtol=1e-5, atol=1e-5 * full.abs().max().item())
    with pytest.raises(ValueError, match="one per 32 inputs"):
        Int8WeightOnlyLinear.from_quantized(q, s[:, :9])


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
def test_int8_vnni_tile_layout_round_trips_and_computes_what_the_row_layout_gemm_does():
    q = torch.randint(-127, 128, (48, 64), dtype=torch.int8)
    qv = cpu.int8_vnni_layout(q)
    assert qv.shape == q.shape and torch.equal(cpu.int8_row_layout(qv), q)
    assert torch.equal(qv[0, :4], torch.stack([q[0, 0], q[0, 1], q[1, 0], q[1, 1]]))  # 16 rows' pair 0 first
    if not cpu.vnni_int8(64, 48):
        pytest.skip("this CPU has no AVX512-VNNI")
    scale = torch.rand(48) + 0.01
    x = torch.randn(40, 64)
    y = cpu.int8_linear_vnni(x, qv, scale)
    assert torch.equal(y, cpu.int8_linear(x, q, scale))  # 40 rows: the row layout's prefill GEMM, same sums
    ref = (_i16_blocks(x) @ q.double().T) * scale.double()
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item())
    mod = Int8WeightOnlyLinear.from_quantized(q, scale)
    assert mod.avx2_operands()[0] == 3 and torch.equal(mod(x[:3]), y[:3])
    assert torch.equal(mod.dequantized(), q.float() * scale[:, None])  # the canonical weight stays as it was


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("float_zero", [False, True])
def test_native_int4_dequant_matches_the_reference_dequantize(float_zero):
    mod = Int4WeightOnlyLinear.from_linear(_linear(70, 128), 32, float_zero=float_zero)
    ref = mod.dequantized()
    torch.testing.assert_close(mod._dequant_rows(0, 70), ref, atol=1e-7, rtol=0)
    torch.testing.assert_close(mod._dequant_rows(13, 50), ref[13:50], atol=1e-7, rtol=0)


@pytest.mark.parametrize("cls", [Int8WeightOnlyLinear, Int4WeightOnlyLinear])
def test_prefill_dequantizes_only_where_the_cpu_lacks_the_vnni_gemm(cls, monkeypatch):
    host = torch.device("cpu")
    mod = cls.from_linear(_linear(64, 128))
    monkeypatch.setattr(cpu, "vnni_prefill", lambda in_features: True)
    assert mod.kernel_for(4096, host) == ("avx2" if cpu.available() else "int8pack" if cls is
                                         Int8WeightOnlyLinear else "int4pack")
    assert mod.kernel_for(4096, host, torch.bfloat16) == "gemm"  # the GEMM takes fp32 activations only
    monkeypatch.setattr(cpu, "vnni_prefill", lambda in_features: False)
    assert mod.kernel_for(4096, host) == "gemm"
    assert cls.from_linear(_linear(64, 128), dequant_min_rows=8).kernel_for(8, host) == "gemm"  # set explicitly


@pytest.mark.skipif(not cpu.available(), reason="accel's CPU kernels are not built here")
@pytest.mark.parametrize("n", [1, 7, 8, 9, 17, 100, 49152])
def test_argmax_rows_is_torch_argmax_with_ties_nan_and_infinities(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randint(-3, 3, (6, n), generator=g).float()  # many ties: the first maximum must win
    x[1] = -float("inf")
    x[2, n // 2] = float("nan")  # a NaN counts as the largest, as torch has it
    x[3, -1] = float("inf")
    x[4] = torch.randn(n, generator=g)
    x[5, 0], x[5, -1] = -0.0, 0.0
    assert torch.equal(cpu.argmax_rows(x), x.argmax(dim=-1))
    strided = x.t().contiguous().t()  # the same values, column-major
    assert torch.equal(cpu.argmax_rows(strided), x.argmax(dim=-1))


@pytest.mark.skipif(not cpu.available(), reason="accel's CPU kernels are not built here")
@pytest.mark.parametrize("n", [1, 2, 5, 64])
def test_team_chunks_run_once_each(n):
    who = cpu.team_chunks(n, 2, -1, 0)  # the hook itself fails on a chunk run twice
    assert ((who == 0) | (who == 1)).all()


@pytest.mark.skipif(not cpu.available(), reason="accel's CPU kernels are not built here")
@pytest.mark.parametrize("late", [0, 1])
def test_team_chunks_of_a_late_thread_are_taken_by_the_others(late):
    # the late thread starts once every chunk has run (or after 30 s, were its range never taken): it finds none
    who = cpu.team_chunks(64, 2, late, 30_000_000)
    assert (who >= 0).all()
    assert (who == late).sum() == 0


def test_a_first_build_of_the_cpu_kernels_says_so(monkeypatch, caplog):
    """The first `accel serve` on a machine builds the kernels for a minute or two: a line says so, not silence."""
    import logging

    import pytest

    from accel.kernels import cpu

    if not cpu.available():
        pytest.skip("accel's AVX2 kernels did not build on this machine")
    monkeypatch.setattr(cpu, "_built", lambda name: False)
    cpu._module.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="accel.kernels.cpu"):
            assert cpu.available()
        assert any("building accel's CPU kernels" in r.getMessage() for r in caplog.records)
    finally:
        cpu._module.cache_clear()


QUIET, CONTENDED = (1.7, 1.0, 0.0), (1.7, 5.0, 0.5)  # (ns alone, ns with the team, late fraction with the team)


def test_a_quiet_machine_keeps_the_whole_team():
    assert set(cpu.governor_trace([QUIET] * 2000, 2)) == {2}
    assert set(cpu.governor_trace([CONTENDED] * 100, 1)) == {1}  # one thread: nothing to decide


def test_a_contended_team_shrinks_and_grows_back_when_the_load_ends():
    trace = cpu.governor_trace([CONTENDED] * 1000 + [QUIET] * 1000, 2)
    assert trace[:20] == [2] * 16 + [1] * 4  # a window of team steps, late, then a trial alone that was faster
    assert trace[:1000].count(1) > 900  # alone, but for the team's two steps every PROBE_STEPS
    assert set(trace[1000 + 70:]) == {2}  # once the load ended the team's steps were quiet


def test_late_waits_on_a_quiet_machine_cost_a_few_trials_that_back_off():
    """Waits over LATE_NS where the team is still faster (imbalanced phases): trials alone lose and back off."""
    trace = cpu.governor_trace([(1.7, 1.0, 0.5)] * 20000, 2)
    assert trace.count(1) <= 60 and trace[16:20] == [1] * 4 and trace[20:20 + 16] == [2] * 16


def test_a_slow_step_now_and_then_does_not_send_the_team_off():
    """A client or event loop preempting a team thread for two steps in ten: a trial alone is compared with the
    team's usual steps, not with the slow ones that started it, and loses."""
    pattern = [(1.7, 3.0, 0.5)] * 2 + [QUIET] * 8
    trace = cpu.governor_trace(pattern * 2000, 2)
    assert trace.count(1) <= 60  # a few trials of TRIAL_STEPS, backing off


def test_contention_that_starts_later_is_met_once_the_window_has_seen_it():
    trace = cpu.governor_trace([QUIET] * 500 + [CONTENDED] * 2000, 2)
    assert set(trace[:500]) == {2} and trace[500:].count(1) > 1800


@pytest.mark.skipif(not cpu.available(), reason="accel's AVX2 kernels did not build on this machine")
@pytest.mark.parametrize("m", [1, 3, 33])  # 33: the VNNI prefill GEMM where the CPU has it
@pytest.mark.parametrize("out_f, in_f", [(64, 64), (130, 576), (48, 40)])
def test_w8a8_rows_are_w8a8s_integer_arithmetic_on_every_path(m, out_f, in_f):
    """a8: each activation row rounded to INT8 with one scale (vLLM's dynamic per-token W8A8), then exact integer
    dot products: the kernels, the module's other paths and the float reference agree."""
    g = torch.Generator().manual_seed(m * 7 + in_f)
    q = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8, generator=g)
    scale = torch.rand(out_f, generator=g) + 0.01
    x = torch.randn(m, in_f, generator=g) * torch.linspace(0.1, 3.0, in_f)
    x[0, 3] = 40.0  # an outlier channel: the whole row's scale follows it
    xq, xs = quantize_int8_per_token(x)
    assert xq.abs().max() <= 127 and torch.equal(xq, xq.round()) and xs.shape == (m, 1)
    ref = (xq.double() @ q.double().T) * xs.double() * scale.double()
    y = cpu.int8_linear(x, q, scale, a8=True)
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-6 * ref.abs().max().item())
    assert not torch.allclose(y, cpu.int8_linear(x, q, scale), rtol=1e-4)  # not the 16-bit blocks
    mod = Int8WeightOnlyLinear.from_quantized(q, scale, a8=True)
    assert linear_scheme(mod) == "w8a8" and "a8=True" in repr(mod)
    for kernel in ("avx2", "gemm", "generic"):
        assert torch.allclose(mod._matmul(x, kernel).double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    zero = torch.zeros(2, in_f)
    assert torch.equal(cpu.int8_linear(zero, q, scale, a8=True), torch.zeros(2, out_f))
    with pytest.raises(ValueError, match="per-channel"):
        Int8WeightOnlyLinear(64, 32, group_size=32, a8=True)
