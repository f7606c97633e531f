"""Weight-only quantized Linear layers (INT8 per-channel and per group, INT4 group-wise) and the one RTN rounding.

Two verbs, as in gpt-fast: *quantize* a float weight offline (pure functions below, which are also the float
reference), then *convert* it into a module whose forward calls the fastest correct kernel for its device.

Quantization conventions (the "canonical" layout every other part of accel reads and writes):

  int8  symmetric per output channel:   w[o, i] ~= q[o, i] * scale[o]            q int8 in [-127, 127]
  int8g symmetric per group of 32 inputs: w[o, i] ~= q[o, i] * scale[o, i // 32]  (the GGUF Q8_0 grid)
  int4  asymmetric per group of g inputs: w[o, i] ~= (q[o, i] - zero[o, i // g]) * scale[o, i // g]
        q and zero are unsigned integers in [0, 15] (zero is an integer zero point, so 0.0 is exact)

compressed-tensors (what llm-compressor's GPTQ writes) stores the same math in signed form: int4 values and
zero points in [-8, 7] ("pack-quantized": eight 4-bit values per int32 along the input dim, lowest nibble
first; group zero points packed the same way along the *output* dim) and int8 channel-wise values as a plain
int8 `weight` with `weight_scale` [out, 1]. `int4_from_compressed_tensors` converts: ours = theirs + 8.

Kernels, chosen per device and per number of rows M of the activation (`kernel_for`; measured with
scripts/bench_kernels.py on a 2-core AVX2 CPU; the decisions are in docs/DESIGN.md, CPU kernels):

  "avx2"                    CPU, fp32 activations, M < dequant_min_rows, when accel's own AVX2 kernels compiled
                            (accel/kernels/cpu.py): int8 faster than int8pack at M = 1-32, and exact
                            in fp32 (no bf16 cast of the activations); int4 likewise against int4pack. Where the
                            CPU has AVX512-VNNI, calls of more than 32 rows run its prefill GEMM (faster than
                            oneDNN's prepacked fp32 GEMM at 512 rows), so nothing is dequantized at any M. INT8 and
                            INT4 there run in VNNI tile layouts at every M (`avx2_operands`): a row's result is then
                            the same whatever the row count, and 16 weight rows share each instruction (faster than
                            the row kernels at 16 rows, and for INT4 at one row too).
  "int8pack" / "int4pack"   CPU, M < dequant_min_rows (int8: 1024, int4: 64): aten._weight_int8pack_mm /
                            aten._weight_int4pack_mm_for_cpu with bf16 activations. The weight is read as 1 / 0.5
                            byte per element, which is what wins memory-bound decode. Their fp32-activation
                            variants exist but are far slower (not vectorised), so x is cast to bf16 and back
                            (~3e-3 relative error per matmul).
  "gemm"                    CPU without VNNI, M >= dequant_min_rows: dequantize to fp32 on the fly (INT4 natively,
                            `int4_dequant`), chunked over output rows,
                            then MKL sgemm (compute-bound prefill; bf16 GEMM is several times slower than fp32 on a
                            CPU without native bf16): short of fp32 nn.Linear's speed at M >= 64. We do NOT
                            cache a dequantized fp32 copy: it would hold 5 (int8) / 4.5 (int4) bytes per weight,
                            more than the fp32 model, to win back only that prefill margin. The chunking bounds
                            the transient copy (lm_head is 49152 x 576).
  "generic"                 CUDA and any other device: dequantize to the activation dtype and F.linear (gpt-fast's
                            int8 formula `F.linear(x, q.to(x.dtype)) * scale`). Correct everywhere, not tuned:
                            no GPU was available to validate tinygemm (`_weight_int4pack_mm`) packing.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from accel.kernels import cpu

INT4_GROUP_SIZES = (32, 64, 128, 256)
INT8_GROUP = 32  # int8g's group: the kernels' activation block, so a group's scale folds into the block's FMA
# Rows of x at which a CPU without AVX512-VNNI switches from the native kernels to dequantize + fp32 GEMM (see
# module docstring); with VNNI the native prefill GEMM is faster at every M and nothing is dequantized.
# INT8 (8 rows per weight pass): native faster at every M up to the 512-token prefill budget (SmolLM2 shapes, 2
# threads; down_proj at M=512 a tie), so only larger batches dequantize. INT4: native faster below ~64 rows,
# dequantize (natively, `int4_dequant`) + GEMM from there.
INT8_DEQUANT_MIN_ROWS = 1024
INT4_DEQUANT_MIN_ROWS = 64
# fp16 scale / min pairs where they differ from the fp32 ones by at most this fraction of the group's range: fp32
# rounding noise (a Q4_1 release's int4f layers deviate ~4e-8), far below the activations' 16-bit rounding
FP16_GRID_TOLERANCE = 2.0**-20
# Output rows dequantized at once on the GEMM path: bounds the transient fp32 weight to 8192 * in * 4 bytes.
_DEQUANT_CHUNK_ROWS = 8192
_QUANT_CHUNK_ROWS = 8192  # rows rounded at once (`from_rows`): a 151,936-row lm_head's temporaries stay small
Rows = Callable[[int, int], Tensor]  # rows(start, end) -> a weight's rows [end - start, in]


# ----------------------------------------------------------------------------------------------------------
# Pure quantize / dequantize functions (the float reference).
# ----------------------------------------------------------------------------------------------------------


# The one RTN rounding: every part that rounds a weight to INT8 / INT4 (sensitivity's fake quantization, `--quant`
# on load, the scale tuning's starting point) rounds as compressed-tensors stores it, so what is measured is what
# is served and what transformers and vLLM load.

def fp16_scale(scale: Tensor) -> Tensor:
    """Scales rounded to fp16, as a checkpoint stores them (compressed-tensors' `scale_dtype`); an all-zero group
    gets fp16's eps, as the library gives it."""
    s = scale.half().float()
    return torch.where(s == 0, torch.finfo(torch.float16).eps, s)


def quantize_int8_per_channel(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel RTN: w [out, in] -> (q int8 [out, in] in [-128, 127], scales fp32 [out]):
    scale = absmax / 127.5 rounded to fp16 (compressed-tensors' symmetric min-max observer)."""
    _check_weight(w)
    w = w.float()
    scales = fp16_scale(w.abs().amax(dim=1) / 127.5)  # [out]
    q = torch.round(w / scales[:, None]).clamp_(-128, 127).to(torch.int8)
    return q, scales


def quantize_int8_per_token(x: Tensor) -> tuple[Tensor, Tensor]:
    """W8A8's activations as vLLM-CPU rounds them (its dynamic per-token INT8, the engine W8A8 exports are served
    on): x [M, K] -> (q [M, K] as float, scales fp32 [M, 1]), scale = max |x| / 127 (1 for a zero row), q = x *
    float(1 / scale) rounded half to even. (compressed-tensors' own forward, which transformers runs, takes
    max |x| / 127.5.) The kernels' `a8` rows (csrc quantize_rows_i8) are this."""
    x = x.float()
    scales = x.abs().amax(dim=-1, keepdim=True) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return torch.round(x * (1.0 / scales.double()).float()).clamp_(-128, 127), scales


ACTIVATION_BLOCK = 32
"""Inputs per activation scale of the integer kernels (16-bit blocks, and w4a8's 8-bit ones)."""


def quantize_activation_blocks_int8(x: Tensor) -> Tensor:
    """w4a8's activations as the kernels round them (llama.cpp's Q8 blocks): x [M, K] -> the rounded activations as
    float, per block of 32 inputs scale = max |x| / 127 (1 for a zero block), q = x * (1 / scale) rounded half to
    even. The kernels' 8-bit blocks (csrc quantize_blocks_i8) are this."""
    x = x.float()
    b = x.reshape(*x.shape[:-1], -1, ACTIVATION_BLOCK)
    scales = b.abs().amax(dim=-1, keepdim=True) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return (torch.round(b * (1.0 / scales)) * scales).reshape(x.shape)


def dequantize_int8_per_channel(q: Tensor, scales: Tensor) -> Tensor:
    """q int8 [out, in], scales [out] -> fp32 [out, in]; scales [out, in / 32]: group-wise (int8g)."""
    if scales.dim() == 2 and scales.shape[1] > 1:
        return q.float() * scales.float().repeat_interleave(q.shape[1] // scales.shape[1], dim=1)
    return q.float() * scales.float().reshape(-1)[:, None]


def quantize_int8_groupwise(w: Tensor, group_size: int = INT8_GROUP) -> tuple[Tensor, Tensor]:
    """Symmetric RTN per group of `group_size` inputs (int8g): w [out, in] -> (q int8 [out, in], scales fp32
    [out, in / g]): a group already on a grid of int8 codes keeps it (`grid_fit`: a GGUF Q8_0 table is stored
    bit for bit), any other scale = the group's absmax / 127.5 rounded to fp16, as compressed-tensors' group
    strategy stores it (`quantize_int8_per_channel` per group)."""
    return quantize_symmetric_groupwise(w, group_size, 8)


def quantize_symmetric_groupwise(w: Tensor, group_size: int, bits: int) -> tuple[Tensor, Tensor]:
    """Symmetric group-wise RTN at `bits` (int8g, int5): codes in [-2^(b-1), 2^(b-1) - 1], w ~ q * scale. Each
    group on a grid of such codes keeps that grid (`grid_fit`; its scale may be negative, as a GGUF Q5_0 block's
    is when its largest value is positive); any other gets compressed-tensors' min-max scale, absmax /
    ((2^b - 1) / 2), rounded to fp16."""
    _check_weight(w)
    if w.shape[1] % group_size:
        raise ValueError(f"{bits}-bit groups of {group_size} do not divide in_features {w.shape[1]}")
    g = w.float().reshape(w.shape[0], -1, group_size)
    grid, _, found = grid_fit(w, group_size, bits, symmetric=True)
    scales = fp16_scale(torch.where(found, grid, g.abs().amax(dim=2) / ((2 ** bits - 1) / 2)))  # [out, G]
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    q = torch.round(g / scales[..., None]).clamp_(lo, hi).to(torch.int8).reshape(w.shape)
    return q, scales


INT5_GROUP = 32  # int5: the GGUF Q5_0 block


def quantize_int5_groupwise(w: Tensor) -> tuple[Tensor, Tensor]:
    """int5: symmetric 5-bit codes in [-16, 15] per group of 32 inputs with an fp16 scale (the GGUF Q5_0 form,
    5.5 bits a weight as stored): w [out, in] -> (q int8 [out, in], scales fp32 [out, in / 32]). The runtime holds
    the codes as int8g (`Int8WeightOnlyLinear`, 8 bits in memory); the checkpoint packs them to 5 bits."""
    return quantize_symmetric_groupwise(w, INT5_GROUP, 5)


def per_block_scales(scales: Tensor, in_features: int) -> Tensor:
    """Group-wise int8 scales [out, in / g] for any g that is a multiple of INT8_GROUP -> the kernels' [out, in / 32]
    (each repeated g / 32 times); per-channel scales pass unchanged."""
    if scales.dim() != 2 or scales.shape[1] == 1:
        return scales
    g = in_features // scales.shape[1]
    if g % INT8_GROUP or g * scales.shape[1] != in_features:
        raise ValueError(f"group-wise int8 scales {tuple(scales.shape)} do not divide {in_features} inputs into groups "
                         f"of a multiple of {INT8_GROUP}")
    return scales.repeat_interleave(g // INT8_GROUP, dim=1) if g != INT8_GROUP else scales


GRID_TOLERANCE = 1e-3  # |w / scale - its nearest code|, in codes: fp32 rounding of a dequantized grid is ~1e-6
_GRID_ROWS = 8192  # rows searched at once (bounds the [rows, G, g] fp32 temporaries of a 262k-row table)


@torch.no_grad()
def grid_fit(w: Tensor, group_size: int, bits: int, symmetric: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Per group of `group_size` inputs of w [out, in], whether its values already lie on a grid of 2^bits codes:
    (scale [out, G], offset [out, G], found [out, G] bool), w = offset + scale * k for integers k in [0, 2^b - 1]
    (offset = the group's min), or symmetric: offset 0 and k in [-2^(b-1), 2^(b-1) - 1] (scale negative where the
    codes fit only mirrored). Weights dequantized from a quantized release are on such grids: GGUF Q8_0 / Q5_0
    blocks (symmetric, 8 / 5 bits), Q4_0 / Q4_1 / Q4_K sub-blocks (a float min, 4 bits), and re-rounding them
    with any other scale (min-max's) loses what the release kept. Candidates: the smallest gap between the group's
    values over k = 1..4 (codes left unused), and the min-max scales. Pure search, no fitting: a group off every
    grid is reported not found (callers round it with their own rule)."""
    out_f, in_f = w.shape
    n_groups = in_f // group_size
    scale = torch.zeros(out_f, n_groups)
    offset = torch.zeros(out_f, n_groups)
    found = torch.zeros(out_f, n_groups, dtype=torch.bool)
    lo_code, hi_code = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2 ** bits - 1)
    for r0 in range(0, out_f, _GRID_ROWS):
        wg = w[r0:r0 + _GRID_ROWS].float().reshape(-1, n_groups, group_size)  # [R, G, g]
        base = torch.zeros_like(wg[..., :1]) if symmetric else wg.amin(-1, keepdim=True)
        vals = torch.cat([wg, base], -1) if symmetric else wg  # a symmetric grid holds 0
        gaps = vals.sort(-1).values.diff(dim=-1)
        delta = torch.where(gaps > 0, gaps, torch.inf).amin(-1, keepdim=True)  # [R, G, 1]
        amax = wg.abs().amax(-1, keepdim=True)
        cands = [delta / k for k in range(1, 5)]
        if symmetric:
            signed_max = torch.gather(wg, -1, wg.abs().argmax(-1, keepdim=True))
            cands += [amax / hi_code, -signed_max / lo_code]
        else:
            cands.append((wg.amax(-1, keepdim=True) - base) / hi_code)
        best, ok_any = torch.zeros_like(delta), torch.zeros_like(delta, dtype=torch.bool)
        for s in cands:
            s = torch.where(torch.isfinite(s) & (s != 0), s, torch.ones_like(s))  # a constant group: any scale
            r = (wg - base) / s
            k = r.round()
            ok = ((r - k).abs() <= GRID_TOLERANCE).all(-1, keepdim=True)
            k_lo, k_hi = k.amin(-1, keepdim=True), k.amax(-1, keepdim=True)
            fits = (k_lo >= lo_code) & (k_hi <= hi_code)
            if symmetric:
                mirrored = (-k_hi >= lo_code) & (-k_lo <= hi_code)
                s = torch.where(fits, s, -s)
                fits |= mirrored
            ok &= fits & ~ok_any
            best = torch.where(ok, s, best)
            ok_any |= ok
        scale[r0:r0 + _GRID_ROWS] = best.squeeze(-1)
        offset[r0:r0 + _GRID_ROWS] = base.squeeze(-1)
        found[r0:r0 + _GRID_ROWS] = ok_any.squeeze(-1)
    return scale, offset, found


def quantize_int4_groupwise(w: Tensor, group_size: int, float_zero: bool = False,
                            float_dtype: torch.dtype = torch.float16) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric group-wise RTN as compressed-tensors stores it: w [out, in] -> (q uint8 [out, in] in [0, 15],
    scales fp32 [out, in // g], zeros [out, in // g] in [0, 15]), w ~ (q - zero) * scale.

    Each group's range is widened to include 0 (min <= 0 <= max); scale = (max - min) / 15 rounded to fp16; the
    zero point comes from the unrounded scale and the values from the stored one (the library's order). Codes are
    the signed [-8, 7] + 8; zeros are uint8. float_zero ("int4f"): the zero point is a float, not rounded to an
    integer, so each group's min and max land on codes 0 and 15 (the GGUF Q4_1 form); zeros are then fp32, and
    scale and zero are held at `float_dtype`: fp16 where an export stores them (compressed-tensors' scale and zp
    dtypes), fp32 where the runtime quantizes on load (`--quant int4f`), which keeps a Q4_1 grid exact and its
    scale / min pairs on the fp16 grid the kernel streams at half the bytes.
    """
    _check_weight(w)
    check_group_size(w.shape[1], group_size)
    out_f, in_f = w.shape
    wg = w.float().reshape(out_f, in_f // group_size, group_size)  # [out, G, g]
    lo = wg.amin(dim=-1).clamp(max=0.0)  # [out, G]
    hi = wg.amax(dim=-1).clamp(min=0.0)
    exact = ((hi - lo) / 15.0).clamp_min(torch.finfo(torch.float32).eps)
    if float_zero:  # a group already on a 16-code grid (GGUF Q4_1 / Q4_K) keeps it: `grid_fit`
        grid, offset, found = grid_fit(w, group_size, 4, symmetric=False)
        exact, lo = torch.where(found, grid, exact), torch.where(found, offset, lo)
    if float_zero and float_dtype == torch.float32:  # computed on the codes' own [0, 15] range: no fp32 shift by 8
        zeros = -lo / exact  # [out, G]
        q = torch.clamp(torch.round(wg / exact[..., None] + zeros[..., None]), 0, 15)
        return q.reshape(out_f, in_f).to(torch.uint8), exact, zeros
    if float_zero:
        scales = fp16_scale(exact)
        zp = (-8 - lo / exact).half().float()  # [out, G]
        q = torch.clamp(torch.round(wg / scales[..., None] + zp[..., None]), -8, 7)
    else:
        scales = fp16_scale(exact)
        zp = torch.clamp(-8 - torch.round(lo / exact), -8, 7)
        q = torch.clamp(torch.round(wg / scales[..., None]) + zp[..., None], -8, 7)
    zeros = zp + 8
    return (q + 8).reshape(out_f, in_f).to(torch.uint8), scales, (zeros if float_zero else zeros.to(torch.uint8))


def dequantize_int4_groupwise(q: Tensor, scales: Tensor, zeros: Tensor, group_size: int) -> Tensor:
    """q [out, in] in [0, 15], scales / zeros [out, in // g] -> fp32 [out, in]."""
    out_f, in_f = q.shape
    qg = q.float().reshape(out_f, in_f // group_size, group_size)  # [out, G, g]
    w = (qg - zeros.float()[..., None]) * scales.float()[..., None]
    return w.reshape(out_f, in_f)


def pack_int4(q: Tensor) -> Tensor:
    """[out, in] values in [0, 15] -> uint8 [out, in // 2], column 2j in the low nibble, 2j+1 in the high one."""
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: Tensor) -> Tensor:
    """Inverse of `pack_int4`: uint8 [out, in // 2] -> uint8 [out, in]."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def int4_from_compressed_tensors(
    weight_packed: Tensor, weight_scale: Tensor, weight_shape: tuple[int, int] | Tensor,
    weight_zero_point: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """compressed-tensors "pack-quantized" 4-bit tensors -> canonical (q [out, in], scales [out, G], zeros [out, G]).

    weight_packed int32 [out, ceil(in / 8)] (signed values + 8, lowest nibble first); weight_scale [out, G];
    weight_zero_point: None for symmetric (zero point 0 -> ours 8), int32 [ceil(out / 8), G] packed along dim 0, or
    float [out, G] unpacked (int4f's `block` strategy, accel.quant.quantize): zeros are then fp32, an int4f module.
    Activation ordering (`weight_g_idx`) is not supported: GPTQ with actorder must be exported without it.
    """
    packed, scales, zeros = int4_packed_from_compressed_tensors(weight_packed, weight_scale, weight_shape,
                                                                weight_zero_point)
    return unpack_int4(packed), scales, zeros


def int4_packed_from_compressed_tensors(
    weight_packed: Tensor, weight_scale: Tensor, weight_shape: tuple[int, int] | Tensor,
    weight_zero_point: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`int4_from_compressed_tensors` with q still packed, as `pack_int4` packs it (uint8 [out, in / 2]): the int32
    words' bytes on a little-endian machine are exactly that (two values a byte, the lower one in the low nibble),
    so an export's 4-bit weights load as a view of what is stored, never unpacked (the unpacking took 4 bytes a
    weight: 2.2 GB for a 7B's lm_head)."""
    out_f, in_f = (int(v) for v in weight_shape)
    if weight_packed.dtype != torch.int32:
        raise ValueError(f"compressed-tensors packed tensors are int32; got {weight_packed.dtype}")
    if sys.byteorder == "little" and in_f % 2 == 0:
        q = weight_packed.contiguous().view(torch.uint8)[:, :in_f // 2].contiguous()
    else:
        q = pack_int4(_unpack_int32_nibbles(weight_packed, dim=1)[:, :in_f])  # already +8 offset: [0, 15]
    scales = weight_scale.float().reshape(out_f, -1)
    if weight_zero_point is None:
        zeros = torch.full_like(scales, 8, dtype=torch.uint8)
    elif weight_zero_point.is_floating_point():
        zeros = weight_zero_point.float().reshape(scales.shape) + 8.0
    else:
        zeros = _unpack_int32_nibbles(weight_zero_point, dim=0)[:out_f]
    return q, scales, zeros


def int8_from_compressed_tensors(weight_packed: Tensor, weight_shape: tuple[int, int] | Tensor) -> Tensor:
    """compressed-tensors "pack-quantized" 8-bit weights -> int8 [out, in].

    weight_packed int32 [out, ceil(in / 4)]: four values + 128 per word, lowest byte first (symmetric, no zero
    point)."""
    if weight_packed.dtype != torch.int32:
        raise ValueError(f"compressed-tensors packed tensors are int32; got {weight_packed.dtype}")
    out_f, in_f = (int(v) for v in weight_shape)
    if sys.byteorder == "little":  # the words' bytes are the values + 128 in order: flip the top bit, one copy
        return (weight_packed.contiguous().view(torch.uint8)[:, :in_f] ^ 0x80).view(torch.int8).contiguous()
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=weight_packed.device)  # [4]
    fields = (weight_packed.unsqueeze(-1) >> shifts) & 0xFF  # [out, in/4, 4]
    return (fields.reshape(weight_packed.shape[0], -1)[:, :in_f] - 128).to(torch.int8).contiguous()


def int5_from_compressed_tensors(weight_packed: Tensor, weight_shape: tuple[int, int] | Tensor) -> Tensor:
    """compressed-tensors "pack-quantized" 5-bit weights (32 values in five int32 words, no padding bits) -> int8
    codes [out, in] in [-16, 15]: the library's own unpacking, so what it packed is what accel runs."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    out_f, in_f = (int(v) for v in weight_shape)
    return unpack_from_int32(weight_packed, 5, torch.Size((out_f, in_f))).contiguous()


def _unpack_int32_nibbles(packed: Tensor, dim: int) -> Tensor:
    """Eight 4-bit fields per int32 (lowest first) unpacked along `dim` -> uint8 values in [0, 15]."""
    if packed.dtype != torch.int32:
        raise ValueError(f"compressed-tensors packed tensors are int32; got {packed.dtype}")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)  # [8]
    fields = (packed.unsqueeze(-1) >> shifts) & 0xF  # [..., 8]
    if dim == 1:
        return fields.reshape(packed.shape[0], -1).to(torch.uint8)
    return fields.permute(0, 2, 1).reshape(-1, packed.shape[1]).to(torch.uint8)


def _check_weight(w: Tensor) -> None:
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"expected a float weight [out, in]; got dtype {w.dtype}, shape {tuple(w.shape)}")


def check_group_size(in_features: int, group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES or in_features % group_size:
        allowed = [g for g in INT4_GROUP_SIZES if in_features % g == 0]
        raise ValueError(f"int4 group_size={group_size} is invalid for in_features={in_features}; allowed: {allowed}")


# ----------------------------------------------------------------------------------------------------------
# Modules.
# ----------------------------------------------------------------------------------------------------------


_LAYOUT_ROWS = 4096  # weight rows laid out at once (whole 16-row tiles): a layout's temporaries stay small


def _by_tiles(w: Tensor, fn, rows: bool = False) -> tuple[Tensor, ...]:
    """fn over blocks of `_LAYOUT_ROWS` rows of w (whole 16-row tiles, which every kernel layout keeps apart), its
    outputs concatenated: the same tensors as fn(w), without fn's temporaries for the whole matrix (a 151,936-row
    lm_head's unpacked codes alone are 0.23 GB). `rows`: fn also takes the block's first row."""
    n, outs = w.shape[0], None
    for r in range(0, n, _LAYOUT_ROWS):
        block = w[r:r + _LAYOUT_ROWS]
        parts = fn(block, r) if rows else fn(block)
        if outs is None:
            if len(block) == n:
                return parts
            # each output's first dimension counts the block's rows (or its tiles): the whole matrix's, allocated once
            outs = [torch.empty((t.shape[0] * n // len(block), *t.shape[1:]), dtype=t.dtype) for t in parts]
        for out, t in zip(outs, parts):
            k = t.shape[0] * r // len(block) if len(block) == _LAYOUT_ROWS else out.shape[0] - t.shape[0]
            out[k:k + t.shape[0]] = t
    return tuple(outs)


def _refuse_if_compact(module: nn.Module) -> None:
    if getattr(module, "compact", False):
        raise RuntimeError(f"{type(module).__name__} was compacted for serving (compact_: the kernel layout is its "
                           "only copy); it cannot be moved, cast, loaded or saved")


class _WeightOnlyLinear(nn.Module):
    """What the INT8 and INT4 Linears share: the forward over whichever kernel `kernel_for` picks."""

    def forward(self, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, self.in_features)  # [M, in]
        y = self._matmul(x2, self.kernel_for(x2.shape[0], x.device, x.dtype))  # [M, out], x.dtype
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


class Int8WeightOnlyLinear(_WeightOnlyLinear):
    """Linear with int8 weights, per output channel or (`group_size` 32, scheme "int8g") per group of 32 inputs;
    activations stay float, or with `a8` (scheme "w8a8", per-channel weights only) are rounded to 8-bit integers per
    row first, as W8A8 runs in vLLM (`quantize_int8_per_token`). forward(x [..., in]) -> [..., out], x.dtype.

    Persistent buffers (canonical layout): qweight int8 [out, in], scales fp32 [out] (int8g: [out, in / 32]), bias
    (optional, float). Where the CPU has AVX512-VNNI, fp32 forwards run the weight in the VNNI tile layout
    (`avx2_operands`, a non-persistent copy built once, as Int4WeightOnlyLinear keeps its kernel layout). int8g's
    scales reach the kernels as fp16 (exact: they are stored at fp16) in the weight's layout (`group_scales_operand`).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 dequant_min_rows: int | None = None, group_size: int | None = None, a8: bool = False) -> None:
        super().__init__()
        if group_size not in (None, INT8_GROUP) or group_size and in_features % group_size:
            raise ValueError(f"int8 group_size must be None (per channel) or {INT8_GROUP} dividing in_features "
                             f"{in_features}; got {group_size}")
        if a8 and group_size:
            raise ValueError("8-bit activations (w8a8) go with per-channel int8 weights, not group_size "
                             f"{group_size}")
        self.in_features, self.out_features, self.group_size, self.a8 = in_features, out_features, group_size, a8
        self.dequant_min_rows = dequant_min_rows  # None: INT8_DEQUANT_MIN_ROWS, or never with the VNNI GEMM
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, in_features // group_size) if group_size
                             else torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self.register_buffer("_scales_bf16", None, persistent=False)  # kernel operand, built lazily
        self.register_buffer("_vnni", None, persistent=False)  # qweight in the VNNI tile layout, built lazily
        self.register_buffer("_gs", None, persistent=False)  # int8g: fp16 group scales in the weight's layout
        self.register_buffer("_ones", None, persistent=False)  # int8g: the kernels' per-row scale
        self.compact = False  # `compact_`: the canonical buffers dropped, the kernel layout is the weight

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int | None = None, **kwargs) -> Self:
        """Quantize an nn.Linear (RTN). The linear's own weight tensor is left untouched (tied weights stay)."""
        w = linear.weight.detach()
        return cls.from_rows(lambda a, b: w[a:b], *w.shape, group_size, linear.bias, **kwargs).to(w.device)

    @classmethod
    def from_rows(cls, rows: Rows, out_features: int, in_features: int, group_size: int | None = None,
                  bias: Tensor | None = None, **kwargs) -> Self:
        """Quantize (RTN) a weight read `_QUANT_CHUNK_ROWS` rows at a time (from a file as it loads, `--quant`)
        into the module's own buffers: only a block of rows is ever float."""
        m = cls(in_features, out_features, bias=bias is not None, group_size=group_size, **kwargs)
        for r in range(0, out_features, _QUANT_CHUNK_ROWS):
            w = rows(r, min(r + _QUANT_CHUNK_ROWS, out_features)).float()
            q, scale = quantize_int8_groupwise(w, group_size) if group_size else quantize_int8_per_channel(w)
            m.qweight[r:r + len(w)] = q
            m.scales[r:r + len(w)] = scale
        if bias is not None:
            m.bias = bias.detach().clone().float()
        return m

    @classmethod
    def from_quantized(cls, qweight: Tensor, scales: Tensor, bias: Tensor | None = None, **kwargs) -> Self:
        """Build from canonical tensors: qweight int8 [out, in], scales [out] or [out, 1] (compressed-tensors), or
        [out, in / 32] (group-wise, int8g)."""
        if qweight.dim() != 2 or qweight.dtype != torch.int8:
            raise ValueError(f"qweight must be int8 [out, in]; got {qweight.dtype} {tuple(qweight.shape)}")
        out_f, in_f = qweight.shape
        grouped = scales.dim() == 2 and scales.shape[1] > 1
        if grouped and tuple(scales.shape) != (out_f, in_f // INT8_GROUP):
            raise ValueError(f"group-wise int8 scales must be [{out_f}, {in_f // INT8_GROUP}] (one per "
                             f"{INT8_GROUP} inputs); got {tuple(scales.shape)}")
        if not grouped and scales.numel() != out_f:
            raise ValueError(f"scales must have {out_f} values (one per output channel); got {tuple(scales.shape)}")
        m = cls(in_f, out_f, bias=bias is not None, group_size=INT8_GROUP if grouped else None,
                **kwargs).to(qweight.device)
        m.qweight.copy_(qweight)
        m.scales.copy_(scales.float() if grouped else scales.reshape(-1).float())
        if bias is not None:
            m.bias = bias.detach().clone().float()
        return m

    def canonical(self) -> tuple[Tensor, Tensor]:
        """(qweight, scales) in the canonical layout, rebuilt from the kernel layout once compacted."""
        if not self.compact:
            return self.qweight, self.scales
        n, k = self._vnni.shape
        scales = self.scales if not self.group_size else \
            self._gs.reshape(n // 16, k // INT8_GROUP, 16).permute(0, 2, 1).reshape(n, -1).float()
        return cpu.int8_row_layout(self._vnni), scales

    def compact_(self) -> int:
        """Serving only: where the weight runs in the VNNI tile layout, drop the canonical qweight (and int8g's fp32
        group scales) that layout duplicates, so the weight is held once; returns the bytes freed. A compacted
        module computes as before and rebuilds the canonical tensors on demand (`canonical`), but is neither moved
        nor saved."""
        kind, _, _ = self.avx2_operands()
        if kind != 3 or self.compact:
            return 0
        self.group_scales_operand()
        freed = self.qweight.numel() + (self.scales.numel() * 4 if self.group_size else 0)
        self.qweight = torch.empty(0, dtype=torch.int8)
        if self.group_size:
            self.scales = torch.empty(0)
        self.compact = True
        return freed

    def dequantized(self) -> Tensor:
        """The float reference weight [out, in] fp32."""
        return dequantize_int8_per_channel(*self.canonical())

    def kernel_for(self, rows: int, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
        """Which path forward takes for `rows` activation rows: "avx2", "int8pack", "gemm" or "generic"."""
        if self.compact:
            return "avx2"
        if device.type != "cpu":
            return "generic"
        if rows >= _dequant_min_rows(self.dequant_min_rows, INT8_DEQUANT_MIN_ROWS, self.in_features, dtype):
            return "gemm"
        if dtype == torch.float32 and self.in_features % 8 == 0 and cpu.available():
            return "avx2"
        return "gemm" if self.group_size else "int8pack"  # torch's int8pack kernel has no group scales

    def avx2_operands(self) -> tuple[int, Tensor, Tensor]:
        """(decode_layers kind, weight, scales) of accel's kernel: kind 3 with the weight in the VNNI tile layout
        (built once) where `cpu.vnni_int8` holds, else kind 1 with qweight as it is. int8g: scales are ones, the
        group scales are `group_scales_operand()`."""
        if self._vnni is None and self.qweight.device.type == "cpu" and cpu.vnni_int8(self.in_features,
                                                                                                self.out_features):
            self._vnni = _by_tiles(self.qweight, lambda q: (cpu.int8_vnni_layout(q),))[0]
        scales = self.scales
        if self.group_size:
            if self._ones is None:
                self._ones = torch.ones(self.out_features)
            scales = self._ones
        return (3, self._vnni, scales) if self._vnni is not None else (1, self.qweight, scales)

    def group_scales_operand(self) -> Tensor | None:
        """int8g: the fp16 group scales in the layout of `avx2_operands`' weight (None for per-channel INT8)."""
        if not self.group_size:
            return None
        if self._gs is None:
            gs = self.scales.half()
            self._gs = cpu.int8_group_scales_vnni_layout(gs) if self.avx2_operands()[0] == 3 else gs.contiguous()
        return self._gs

    def _matmul(self, x2: Tensor, kernel: str) -> Tensor:
        if kernel == "avx2":
            kind, q, scales = self.avx2_operands()
            return (cpu.int8_linear_vnni if kind == 3 else cpu.int8_linear)(x2, q, scales, self.group_scales_operand(),
                                                                            self.a8)
        if self.a8:  # the other kernels take float activations: W8A8's rounded ones, exactly representable
            q, s = quantize_int8_per_token(x2)
            x2 = (q * s).to(x2.dtype)
        if kernel == "int8pack" and self.in_features % 16 != 0:
            # torch's kernel segfaults on some CPUs when K is not a multiple of 16 and M >= 2 (measured with torch
            # 2.13 on a Xeon with AVX-512 and AMX: K = 8, 24, 40, 56, 72, 100 crash; 16, 32, 48, 64, 96, 576 run)
            kernel = "generic"
        if kernel == "int8pack":
            # bf16 in/out is the fast (and only vectorised) CPU variant of this kernel.
            if self._scales_bf16 is None:
                self._scales_bf16 = self.scales.bfloat16()
            return torch.ops.aten._weight_int8pack_mm(x2.to(torch.bfloat16), self.qweight,
                                                      self._scales_bf16).to(x2.dtype)
        if kernel == "gemm":
            return _chunked_dequant_matmul(x2, self.out_features, self._dequant_rows).to(x2.dtype)
        if self.group_size:
            return F.linear(x2, self.dequantized().to(x2.dtype))
        return F.linear(x2, self.qweight.to(x2.dtype)) * self.scales.to(x2.dtype)

    def _dequant_rows(self, start: int, end: int) -> Tensor:
        return dequantize_int8_per_channel(self.qweight[start:end], self.scales[start:end])

    def _apply(self, fn, recurse=True):
        _refuse_if_compact(self)
        self._scales_bf16 = self._vnni = self._gs = self._ones = None  # derived: rebuild after a move / cast
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args, **kwargs):
        _refuse_if_compact(self)
        self._scales_bf16 = self._vnni = self._gs = self._ones = None
        super()._load_from_state_dict(*args, **kwargs)

    def _save_to_state_dict(self, *args, **kwargs):
        _refuse_if_compact(self)
        super()._save_to_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.group_size else ""
        g += ", a8=True" if self.a8 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{g}"


class Int8Embedding(nn.Module):
    """An embedding table of INT8 rows with one scale per row, or per group of 32 (int8g): the tied lm_head's own
    integers, so a tied model stores its table once at 8 bits. A lookup dequantizes only the gathered rows (a few KB
    per token), which torch's indexing does as fast as a native gather would.

    Buffers: qweight int8 [vocab, hidden], scales fp32 [vocab] (int8g: [vocab, hidden / 32]). forward(ids) ->
    [..., hidden] in `dtype`.
    """

    def __init__(self, qweight: Tensor, scales: Tensor, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        grouped = scales.dim() == 2 and scales.shape[1] > 1
        shape_ok = (tuple(scales.shape) == (qweight.shape[0], qweight.shape[1] // INT8_GROUP) if grouped
                    else scales.numel() == qweight.shape[0])
        if qweight.dim() != 2 or qweight.dtype != torch.int8 or not shape_ok:
            raise ValueError(f"an INT8 table needs qweight int8 [vocab, hidden] and one scale per row (or per "
                             f"{INT8_GROUP} values of a row); got {qweight.dtype} {tuple(qweight.shape)} and "
                             f"{tuple(scales.shape)} scales")
        self.num_embeddings, self.embedding_dim = qweight.shape
        self.dtype = dtype
        self.register_buffer("qweight", qweight)
        # a scaled table's factor (transformers' Gemma: sqrt(hidden)), set by the loader; None: unscaled
        self.register_buffer("embed_scale", None, persistent=False)
        self.register_buffer("scales", scales.float() if grouped else scales.reshape(-1).float())

    def forward(self, ids: Tensor) -> Tensor:
        s = self.scales[ids]
        if s.dim() > ids.dim():  # group-wise: [..., G] -> [..., G, 32]
            q = self.qweight[ids]
            rows = torch.mul(q.reshape(*q.shape[:-1], s.shape[-1], -1), s.unsqueeze(-1)).reshape(q.shape)
        else:
            rows = torch.mul(self.qweight[ids], s.unsqueeze(-1))  # int8 * fp32 -> fp32, one op
        rows = rows if rows.dtype == self.dtype else rows.to(self.dtype)
        return rows if self.embed_scale is None else rows * self.embed_scale.to(self.dtype)

    @property
    def weight(self) -> Tensor:
        """The dequantized table (EAGLE drafts read the target's embedding rows)."""
        return dequantize_int8_per_channel(self.qweight, self.scales).to(self.dtype)


class Int4Embedding(nn.Module):
    """An embedding table of INT4 rows, asymmetric per group of `group_size` values (the int4 scheme's grid), as an
    export stores it: a lookup unpacks and dequantizes only the gathered rows.

    Buffers: qweight uint8 [vocab, hidden / 2] (`pack_int4`), scales fp32 and zeros uint8 [vocab, hidden / g].
    forward(ids) -> [..., hidden] in `dtype`.
    """

    def __init__(self, qweight: Tensor, scales: Tensor, zeros: Tensor, group_size: int,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        vocab, hidden = qweight.shape[0], 2 * qweight.shape[1]
        if (qweight.dtype != torch.uint8 or hidden % group_size or
                tuple(scales.shape) != (vocab, hidden // group_size) or tuple(zeros.shape) != tuple(scales.shape)):
            raise ValueError(f"an INT4 table needs packed uint8 [vocab, hidden / 2] and [vocab, hidden / {group_size}] "
                             f"scales and zero points; got {qweight.dtype} {tuple(qweight.shape)}, "
                             f"{tuple(scales.shape)}, {tuple(zeros.shape)}")
        self.num_embeddings, self.embedding_dim, self.group_size, self.dtype = vocab, hidden, group_size, dtype
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales.float())
        self.register_buffer("zeros", zeros)
        self.register_buffer("embed_scale", None, persistent=False)  # as Int8Embedding's

    def forward(self, ids: Tensor) -> Tensor:
        flat = ids.reshape(-1)
        rows = dequantize_int4_groupwise(unpack_int4(self.qweight[flat]), self.scales[flat], self.zeros[flat],
                                         self.group_size).reshape(*ids.shape, self.embedding_dim)
        rows = rows if rows.dtype == self.dtype else rows.to(self.dtype)
        return rows if self.embed_scale is None else rows * self.embed_scale.to(self.dtype)


class Float16Embedding(nn.Module):
    """A float table held at 16 bits (as an export stores it) whose lookups return `dtype` rows: the model is served
    quantized, so holding its largest matrix at fp32 would double what the checkpoint keeps (Qwen2.5-1.5B's untied
    table: 0.47 GB, not 0.93).

    Buffers: weight fp16 [vocab, hidden]. forward(ids) -> [..., hidden] in `dtype`.
    """

    def __init__(self, weight: Tensor, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if weight.dim() != 2 or weight.dtype != torch.float16:
            raise ValueError(f"a 16-bit table needs fp16 [vocab, hidden]; got {weight.dtype} {tuple(weight.shape)}")
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype
        self.register_buffer("weight", weight)
        self.register_buffer("embed_scale", None, persistent=False)  # as Int8Embedding's

    def forward(self, ids: Tensor) -> Tensor:
        rows = F.embedding(ids, self.weight).to(self.dtype)
        return rows if self.embed_scale is None else rows * self.embed_scale.to(self.dtype)


class Int4WeightOnlyLinear(_WeightOnlyLinear):
    """Linear with int4 group-wise asymmetric weights; forward(x [..., in]) -> [..., out] in x.dtype.

    Persistent buffers (canonical layout): qweight uint8 [out, in // 2] (`pack_int4`), scales fp32 [out, G],
    zeros [out, G] in [0, 15]: uint8, or fp32 with `float_zero` (scheme "int4f"), bias (optional). On CPU the weight is also converted once into the layout of
    `_weight_int4pack_mm_for_cpu` (a non-persistent cache of the same size, so RAM holds ~1 byte per weight;
    the checkpoint holds 0.5).
    """

    def __init__(self, in_features: int, out_features: int, group_size: int = 64, bias: bool = False,
                 dequant_min_rows: int | None = None, float_zero: bool = False, a8: bool = False) -> None:
        super().__init__()
        check_group_size(in_features, group_size)
        if a8 and float_zero:  # (check_group_size keeps groups whole 32-input activation blocks)
            raise ValueError("8-bit activations (w4a8) go with integer zero points; got float_zero=True")
        self.a8 = a8
        if in_features % 2:
            raise ValueError(f"int4 needs an even in_features; got {in_features}")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.dequant_min_rows = dequant_min_rows
        n_groups = in_features // group_size
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, n_groups))
        self.float_zero = float_zero
        self.register_buffer("zeros", torch.full((out_features, n_groups), 8,
                                                 dtype=torch.float32 if float_zero else torch.uint8))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        # Kernel-layout cache, built by _prepare() for the device the weights live on.
        self.register_buffer("_cpu_packed", None, persistent=False)
        self.register_buffer("_cpu_scales_zeros", None, persistent=False)
        self.register_buffer("_avx2_packed", None, persistent=False)  # accel's AVX2 kernel layout
        self._avx2_kind = 2  # decode_layers kind of that layout (see avx2_operands)
        self.register_buffer("_avx2_scale_min", None, persistent=False)
        self.compact = False  # `compact_`: the canonical buffers dropped, the kernel layout is the weight

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 64, float_zero: bool = False, **kwargs) -> Self:
        """Quantize an nn.Linear (RTN). The linear's own weight tensor is left untouched (tied weights stay)."""
        w = linear.weight.detach()
        return cls.from_rows(lambda a, b: w[a:b], *w.shape, group_size, float_zero, linear.bias,
                             **kwargs).to(w.device)

    @classmethod
    def from_rows(cls, rows: Rows, out_features: int, in_features: int, group_size: int = 64,
                  float_zero: bool = False, bias: Tensor | None = None, **kwargs) -> Self:
        """Quantize (RTN) a weight read `_QUANT_CHUNK_ROWS` rows at a time (from a file as it loads, `--quant`)
        into the module's own buffers: only a block of rows is ever float. int4f keeps its scale and zero in fp32
        here (the runtime's rounding; an export stores them at fp16)."""
        m = cls(in_features, out_features, group_size=group_size, bias=bias is not None, float_zero=float_zero,
                **kwargs)
        for r in range(0, out_features, _QUANT_CHUNK_ROWS):
            w = rows(r, min(r + _QUANT_CHUNK_ROWS, out_features)).float()
            q, scale, zero = quantize_int4_groupwise(w, group_size, float_zero, torch.float32)
            m.qweight[r:r + len(w)] = pack_int4(q)
            m.scales[r:r + len(w)] = scale
            m.zeros[r:r + len(w)] = zero.to(m.zeros.dtype)
        if bias is not None:
            m.bias = bias.detach().clone().float()
        return m

    @classmethod
    def from_packed(cls, packed: Tensor, scales: Tensor, zeros: Tensor, group_size: int,
                    bias: Tensor | None = None, **kwargs) -> Self:
        """Build from q already packed (`pack_int4`, uint8 [out, in / 2]), taken as the module's buffer."""
        if packed.dtype != torch.uint8 or packed.dim() != 2:
            raise ValueError(f"packed int4 must be uint8 [out, in / 2]; got {packed.dtype} {tuple(packed.shape)}")
        out_f, in_f = packed.shape[0], 2 * packed.shape[1]
        kwargs.setdefault("float_zero", zeros.is_floating_point())
        # integer zeros are codes; float ones (int4f) any offset: a grid kept from a release may lie off 0 entirely
        if not zeros.is_floating_point() and (int(zeros.min()) < 0 or int(zeros.max()) > 15):
            raise ValueError("int4 qweight (and integer zeros) must hold values in [0, 15]")
        if zeros.is_floating_point() and not bool(torch.isfinite(zeros).all()):
            raise ValueError("int4f zeros must be finite")
        with torch.device("meta"):  # shapes checked, nothing allocated: the buffers are the given tensors
            m = cls(in_f, out_f, group_size=group_size, bias=bias is not None, **kwargs)
        if scales.shape != m.scales.shape or zeros.shape != m.zeros.shape:
            raise ValueError(f"scales and zeros must be {tuple(m.scales.shape)}; got {tuple(scales.shape)}, "
                             f"{tuple(zeros.shape)}")
        m.qweight = packed
        m.scales = scales.to(packed.device, torch.float32, copy=True).contiguous()
        m.zeros = zeros.to(packed.device, m.zeros.dtype, copy=True).contiguous()
        m.bias = None if bias is None else bias.detach().clone().float().to(packed.device)
        return m

    @classmethod
    def from_quantized(cls, qweight: Tensor, scales: Tensor, zeros: Tensor, group_size: int,
                       bias: Tensor | None = None, **kwargs) -> Self:
        """Build from canonical tensors: qweight [out, in] in [0, 15] (unpacked), scales / zeros [out, in // g].

        Floating-point zeros make a float-zero-point ("int4f") module; integer zeros an "int4" one."""
        if qweight.dim() != 2:
            raise ValueError(f"qweight must be [out, in] values in [0, 15]; got shape {tuple(qweight.shape)}")
        in_f = qweight.shape[1]
        if int(qweight.min()) < 0 or int(qweight.max()) > 15:
            raise ValueError("int4 qweight (and integer zeros) must hold values in [0, 15]")
        if in_f % 2:
            raise ValueError(f"int4 needs an even in_features; got {in_f}")
        return cls.from_packed(pack_int4(qweight), scales, zeros, group_size, bias, **kwargs)

    def compact_(self) -> int:
        """Serving only: drop the canonical qweight, scales and zeros that the kernel layout (`avx2_operands`: the
        packed weight and its scale / min stream) duplicates, so the weight is held once, at the bytes an export
        stores; returns the bytes freed. A compacted module computes as before and dequantizes from the kernel's
        own operands (`dequantized`: what the kernel multiplies by), but is neither moved nor saved."""
        if self.compact or self.qweight.device.type != "cpu" or self.group_size % 16 or not cpu.available():
            return 0
        self.avx2_operands()
        freed = sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))
        self.qweight = torch.empty(0, dtype=torch.uint8)
        self.scales = torch.empty(0)
        self.zeros = torch.empty(0, dtype=self.zeros.dtype)
        self._cpu_packed = self._cpu_scales_zeros = None
        self.compact = True
        return freed

    def _a8_reference(self, x2: Tensor) -> Tensor:
        """w4a8 in torch, as its kernel computes it: w = q * scale + min per group, the activations rounded to 8-bit
        blocks (`quantize_activation_blocks_int8`) meet q * scale, the float ones the mins."""
        n, k, g = self.out_features, self.in_features, self.group_size
        scales = self.scales.float()
        qs = (unpack_int4(self.qweight).float().reshape(n, -1, g) * scales[..., None]).reshape(n, k)
        mins = (-self.zeros.float() * scales)[..., None].expand(n, k // g, g).reshape(n, k)
        x2 = x2.float()
        return quantize_activation_blocks_int8(x2) @ qs.T + x2 @ mins.T

    def _kernel_weight(self) -> Tensor:
        """The weight the kernel multiplies by, fp32 [out, in], from its operands: q * scale + min per group."""
        kind, packed, sm = self.avx2_operands()
        unlayout = {4: cpu.int4_vnni_unlayout, 7: cpu.int4a8_vnni_unlayout}.get(kind)
        q, sm = unlayout(packed, sm) if unlayout else (cpu.int4_unrepack(packed), sm)
        if sm.dtype == torch.int16:  # (fp16 scale, fp16 zero point): min = -zero * scale, formed in fp32
            h = sm.view(torch.float16).float()
            scale, low = h[..., 0], -(h[..., 1] * h[..., 0])
        else:
            scale, low = sm[..., 0].float(), sm[..., 1].float()
        g = self.group_size
        w = q.float().reshape(self.out_features, -1, g) * scale[..., None] + low[..., None]
        return w.reshape(self.out_features, self.in_features)

    def dequantized(self) -> Tensor:
        """The float reference weight [out, in] fp32 (once compacted: the kernel's own, `_kernel_weight`)."""
        if self.compact:
            return self._kernel_weight()
        return dequantize_int4_groupwise(unpack_int4(self.qweight), self.scales, self.zeros, self.group_size)

    def _prepare_cpu(self) -> None:
        # The CPU kernel wants int32 [out, in] values in [0, 15] and per group (scale, zero_f) [G, out, 2] with
        # w = (q - 8) * scale + zero_f, a float zero offset from the mid-point: zero_f = (8 - zero) * scale.
        q = unpack_int4(self.qweight).to(torch.int32)
        self._cpu_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8)  # innerKTiles unused on CPU
        scales = self.scales.float()  # [out, G]
        zero_f = (8.0 - self.zeros.float()) * scales
        self._cpu_scales_zeros = torch.stack([scales, zero_f], dim=-1).transpose(0, 1).contiguous().bfloat16()

    def kernel_for(self, rows: int, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
        """Which path forward takes for `rows` activation rows: "avx2", "int4pack", "gemm" or "generic" ("a8": w4a8's
        reference where its VNNI kernel does not run; the same numerics in torch, at every row count)."""
        if self.a8:
            return "avx2" if device.type == "cpu" and cpu.vnni_int4(self.in_features, self.out_features,
                                                                    self.group_size) else "a8"
        if self.compact:
            return "avx2" if dtype == torch.float32 and rows < _dequant_min_rows(
                self.dequant_min_rows, INT4_DEQUANT_MIN_ROWS, self.in_features if self.group_size % 32 == 0 else 1,
                dtype) else "gemm"
        if device.type != "cpu":
            return "generic"
        width = self.in_features if self.group_size % 32 == 0 else 1  # the VNNI GEMM needs whole blocks per group
        if rows >= _dequant_min_rows(self.dequant_min_rows, INT4_DEQUANT_MIN_ROWS, width, dtype):
            return "gemm"
        if dtype == torch.float32 and self.group_size % 16 == 0 and cpu.available():
            return "avx2"
        # The CPU int4 kernel's packing needs out_features divisible by 16; other shapes use the GEMM path.
        return "int4pack" if self.out_features % 16 == 0 else "gemm"

    def avx2_operands(self) -> tuple[int, Tensor, Tensor]:
        """(decode_layers kind, packed weight, scale_min) in the layout of accel's kernel (built once): w = q * scale
        + min. Kind 4, the VNNI tile layout (`cpu.int4_vnni_layout`), where `cpu.vnni_int4` holds:
        a row's result is then the same at any row count; else kind 2, `int4_repack` with scale_min [out, G, 2].

        scale_min is the kernel's stream beside the weights (fp32 pairs at group 64 are a fifth of the bytes):
        - integer zero points with fp16 scales (every export, `--quant int4`): int16 pairs of fp16 bits (scale,
          zero), the kernel forming min = -zero * scale exactly in fp32 (4.5 bits per weight at group 64, not 5.0);
        - fp16 (scale, min) where that holds every value to fp32 rounding noise (a GGUF grid's fp16 d and m, as the
          int4f weights of a Q4_1 release are);
        - else fp32 (scale, min).
        """
        if self._avx2_packed is None:
            scales = self.scales.float()
            sm = torch.stack([scales, -self.zeros.float() * scales], dim=-1).contiguous()
            half = sm.half()
            span = sm[..., :1].abs() * 15 + sm[..., 1:].abs()  # the group's weight range
            if not self.float_zero and torch.equal(scales.half().float(), scales):
                sm = torch.stack([scales.half(), self.zeros.half()], dim=-1).contiguous().view(torch.int16)
            elif bool(((half.float() - sm).abs() <= span * FP16_GRID_TOLERANCE).all()):
                sm = half
            if self.a8:
                if not cpu.vnni_int4(self.in_features, self.out_features, self.group_size):
                    raise ValueError("w4a8's kernel layout needs AVX512-VNNI and whole 16-row tiles")
                self._avx2_kind = 7
                self._avx2_packed, self._avx2_scale_min = _by_tiles(
                    self.qweight, lambda p, r: cpu.int4a8_vnni_layout(unpack_int4(p), sm[r:r + len(p)]), rows=True)
            elif self.qweight.device.type == "cpu" and cpu.vnni_int4(self.in_features, self.out_features,
                                                                             self.group_size):
                self._avx2_kind = 4
                self._avx2_packed, self._avx2_scale_min = _by_tiles(
                    self.qweight, lambda p, r: cpu.int4_vnni_layout(unpack_int4(p), sm[r:r + len(p)]), rows=True)
            else:
                self._avx2_kind = 2
                self._avx2_packed, self._avx2_scale_min = _by_tiles(
                    self.qweight, lambda p: (cpu.int4_repack(unpack_int4(p)),))[0], sm
        return self._avx2_kind, self._avx2_packed, self._avx2_scale_min

    def _matmul(self, x2: Tensor, kernel: str) -> Tensor:
        if kernel == "avx2":
            kind, packed, scale_min = self.avx2_operands()
            linear = {4: cpu.int4_linear_vnni, 7: cpu.int4a8_linear_vnni}.get(kind, cpu.int4_linear)
            return linear(x2.float(), packed, scale_min, self.group_size).to(x2.dtype)
        if kernel == "a8":
            return self._a8_reference(x2).to(x2.dtype)
        if kernel == "int4pack":
            if self._cpu_packed is None:
                self._prepare_cpu()
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2.to(torch.bfloat16), self._cpu_packed, self.group_size, self._cpu_scales_zeros
            ).to(x2.dtype)
        if kernel == "gemm":
            return _chunked_dequant_matmul(x2, self.out_features, self._dequant_rows).to(x2.dtype)
        return F.linear(x2, self._dequant_rows(0, self.out_features).to(x2.dtype))

    def _dequant_rows(self, start: int, end: int) -> Tensor:
        if (self.compact or self.qweight.device.type == "cpu") and self.group_size % 16 == 0 and cpu.available():
            kind, packed, scale_min = self.avx2_operands()
            if kind == 2:
                return cpu.int4_dequant(packed, scale_min, self.group_size, start, end)
            if self.compact:
                return self._kernel_weight()[start:end]
        return dequantize_int4_groupwise(unpack_int4(self.qweight[start:end]), self.scales[start:end],
                                         self.zeros[start:end], self.group_size)

    def _apply(self, fn, recurse=True):
        _refuse_if_compact(self)
        # A device move invalidates the kernel-layout cache (its layout is device specific).
        self._cpu_packed = self._cpu_scales_zeros = self._avx2_packed = self._avx2_scale_min = None
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args, **kwargs):
        _refuse_if_compact(self)
        self._cpu_packed = self._cpu_scales_zeros = self._avx2_packed = self._avx2_scale_min = None
        super()._load_from_state_dict(*args, **kwargs)

    def _save_to_state_dict(self, *args, **kwargs):
        _refuse_if_compact(self)
        super()._save_to_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, "
                f"float_zero={self.float_zero}, bias={self.bias is not None}" + (", a8=True" if self.a8 else ""))


class PackedLinear(nn.Module):
    """A float nn.Linear whose weight is laid out once for the CPU kernels (inference only).

    AVX-512: weight panels (`cpu.f32_panels`) for every row count, held in fp32 or, with `weight_dtype`
    float16, in fp16 (converted to fp32 in the kernel: half the bytes a decode step streams); they run prefill
    sizes level with or above oneDNN and stream decode and verify rows faster than the plain layout. AVX2: the plain
    fp32 weight for accel's kernel up to AVX2_MAX_ROWS rows (faster than oneDNN where decode is memory-bound),
    oneDNN on the same weight above. Without accel's kernels: oneDNN's reordered weight (on AVX2 it ran these skinny
    shapes faster than torch's default MKL GEMM). The packed weight is opaque, so this module is built by
    `pack_float_linears` for the runtime only and has no state_dict of its own besides the bias.
    """

    def __init__(self, linear: nn.Linear, weight_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        w = linear.weight.detach()
        if w.dtype not in (torch.float32, weight_dtype) or w.device.type != "cpu":
            raise ValueError(f"PackedLinear takes an fp32 (or {weight_dtype}) CPU weight; got {w.dtype} on {w.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.panels = cpu.has_avx512()
        if weight_dtype != torch.float32 and not self.panels:
            raise ValueError(f"weights held in {weight_dtype} need accel's AVX-512 panel kernels, which this CPU "
                             "does not run; allowed here: torch.float32")
        self.weight_dtype = weight_dtype
        self.avx2 = not self.panels and cpu.available() and self.in_features % 8 == 0
        if self.panels:
            self.packed = cpu.f32_panels(w, weight_dtype)
        elif self.avx2:
            self.packed = w.contiguous()
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w, None)  # opaque mkldnn tensor
        self.register_buffer("bias", linear.bias.detach().clone() if linear.bias is not None else None)

    AVX2_MAX_ROWS = 96

    def forward(self, x: Tensor) -> Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        if self.panels or (self.avx2 and x2.shape[0] <= self.AVX2_MAX_ROWS):
            y = (cpu.f32_panel_linear(x2, self.packed, self.out_features) if self.panels
                 else cpu.f32_linear(x2, self.packed))
            if self.bias is not None:
                y = y + self.bias
        else:
            y = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        raise RuntimeError("PackedLinear is inference-only and cannot be moved or cast; pack after placing the model")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def packed_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack_float_linears(model: nn.Module, weight_dtype: torch.dtype = torch.float32) -> list[str]:
    """Swap every fp32 CPU nn.Linear of `model` for a PackedLinear holding its weight in `weight_dtype` (in place);
    returns the swapped names.

    Run last (after a quantization plan and projection fusion). A tied lm_head gets its own packed copy; the
    embedding keeps the original tensor. No-op where oneDNN is missing or the weights are not fp32 (or already
    `weight_dtype`, as `load_weights`' linear_dtype reads them) on CPU.
    """
    if not packed_linear_available():
        return []
    # names first, modules fetched one at a time: a list of the modules would keep every replaced Linear's fp32
    # weight alive to the end (a second copy of the Linears' weights at the peak)
    names = [(name, child_name) for name, mod in model.named_modules() for child_name, child in mod.named_children()
             if type(child) is nn.Linear and child.weight.dtype in (torch.float32, weight_dtype)
             and child.weight.device.type == "cpu"]
    for name, child_name in names:
        mod = model.get_submodule(name)
        setattr(mod, child_name, PackedLinear(getattr(mod, child_name), weight_dtype))
    return [f"{name}.{child_name}" if name else child_name for name, child_name in names]


def _dequant_min_rows(explicit: int | None, default: int, in_features: int, dtype: torch.dtype) -> int | float:
    """The row count from which a CPU Linear dequantizes to fp32 and runs a GEMM: the module's own setting, else
    never where the native VNNI prefill GEMM runs, else `default`."""
    if explicit is not None:
        return explicit
    return math.inf if dtype == torch.float32 and cpu.vnni_prefill(in_features) else default


def _chunked_dequant_matmul(x2: Tensor, out_features: int, dequant_rows) -> Tensor:
    """x2 [M, in] @ W^T with W dequantized to fp32 `_DEQUANT_CHUNK_ROWS` output rows at a time -> fp32 [M, out]."""
    xf = x2.float()
    if out_features <= _DEQUANT_CHUNK_ROWS:
        return F.linear(xf, dequant_rows(0, out_features))
    y = torch.empty(xf.shape[0], out_features, dtype=torch.float32, device=xf.device)
    for start in range(0, out_features, _DEQUANT_CHUNK_ROWS):
        end = min(start + _DEQUANT_CHUNK_ROWS, out_features)
        torch.matmul(xf, dequant_rows(start, end).T, out=y[:, start:end])
    return y


def concat_quantized(mods: list[nn.Module]) -> nn.Module:
    """Stack quantized Linears that share their input along the output dim (q/k/v -> qkv, gate/up -> gate_up).

    All must be Int8WeightOnlyLinear, or all Int4WeightOnlyLinear with one group size; one kernel call then
    replaces several (fewer, larger matmuls are faster at decode). Missing biases count as zeros.
    """
    kinds = {(type(m), getattr(m, "group_size", None), m.in_features) for m in mods}
    if len(kinds) != 1 or not isinstance(mods[0], (Int8WeightOnlyLinear, Int4WeightOnlyLinear)):
        raise ValueError(f"concat_quantized needs quantized Linears of one scheme, group size and in_features; "
                         f"got {sorted((t.__name__, g, i) for t, g, i in kinds)}")
    bias = None
    if any(m.bias is not None for m in mods):
        bias = torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features, device=m.scales.device)
                          for m in mods])
    first = mods[0]
    if isinstance(first, Int8WeightOnlyLinear):  # per channel or int8g alike (group_size is in `kinds`)
        return Int8WeightOnlyLinear.from_quantized(torch.cat([m.qweight for m in mods]),
                                                   torch.cat([m.scales for m in mods]), bias,
                                                   dequant_min_rows=first.dequant_min_rows)
    return Int4WeightOnlyLinear.from_packed(torch.cat([m.qweight for m in mods]),  # packed row by row
                                            torch.cat([m.scales for m in mods]), torch.cat([m.zeros for m in mods]),
                                            first.group_size, bias, dequant_min_rows=first.dequant_min_rows)


def module_bytes(model: nn.Module) -> int:
    """Bytes of every tensor `model` holds (parameters, buffers, kernel layouts; storage shared counted once)."""
    seen: dict[int, int] = {}
    for m in model.modules():
        tensors = [*m._parameters.values(), *m._buffers.values(), getattr(m, "packed", None)]
        for t in tensors:
            if isinstance(t, Tensor) and not t.is_meta and not getattr(t, "is_mkldnn", False):
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
            elif isinstance(t, Tensor) and getattr(t, "is_mkldnn", False):
                seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def weight_bytes(module: nn.Module) -> int:
    """Bytes of the module's persistent state (weights, scales, zero points, bias): its checkpoint size.

    Kernel-layout caches are not counted. A tied lm_head nn.Linear counts its (shared) weight.
    """
    if not isinstance(module, (nn.Linear, PackedLinear, _WeightOnlyLinear)):
        raise ValueError(f"{type(module).__name__} is not a Linear accel knows")
    if isinstance(module, PackedLinear):
        return module.in_features * module.out_features * module.weight_dtype.itemsize + \
            (module.bias.numel() * 4 if module.bias is not None else 0)
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())
