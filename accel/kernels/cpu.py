"""Hand-written CPU kernels (csrc/*.cpp, one build), compiled on first use: fp32 / INT8 / INT4 linears, RMSNorm with
the residual add fused, SwiGLU, RoPE, KV writes, paged decode attention, and the decoder's whole decode step in
one call (`decode_layers`).

Why hand-written: at batch 1-16 a linear is memory-bound, so its speed is how fast it streams the weight, and
torch has no int8- or int4-weight x fp32-activation kernel that does (its `_weight_int8pack_mm` casts activations
to bf16 and falls well short of what 4x fewer bytes than an fp32 GEMV allow). The INT8 / INT4 kernels round the
activations to 16-bit integers per block of 32 (error <= 1.5e-5 of the block's largest value; greedy output
stays equal to transformers') and multiply-add in int32 (vpmaddwd, or vpdpwssd where AVX512-VNNI exists,
chosen at run time).
Work is split into chunks of output rows that threads take from a shared counter, on torch's OpenMP pool; the
one-call decode step runs on one team of those threads from its first layer to its last, each thread taking its
own range of a Linear's chunks first. On AVX-512, fp32 weights are held in panels of 48 outputs (`f32_panels`).

Compiled with torch.utils.cpp_extension.load into the torch extensions cache (once per machine and source): each
csrc/*.cpp compiles alone against the headers beside it, and one extension links them. `available()` is False where
there is no compiler, no AVX2/FMA, or the build fails, and callers then use the torch kernels.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("threads", "gemm_int8", "gemm_f32", "gemm_vnni", "gemm_int4", "attention", "norms_rope", "decode_step",
           "spec_steps", "machine", "bindings")
"""csrc/ split by job: the units, each compiling alone against the headers it includes (`csrc/<unit>.h` declares
what the others use of it; order does not matter). One build, one extension, its name keyed by the hash of every
.cpp and .h in csrc/."""
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp")
LDFLAGS = ("-fopenmp",)


def _source_hash() -> str:
    """12 hex digits of sha256 over every .cpp and .h in csrc/ (name and text, sorted by name): processes built from
    different sources never share a build folder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


DISABLE_ENV = "ACCEL_DISABLE_CPU_KERNELS"


@functools.cache
def _module():
    if os.environ.get(DISABLE_ENV):
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    try:
        from torch.utils.cpp_extension import load

        name = "accel_cpu_kernels_" + _source_hash()
        _remove_stale_lock(name)
        if not _built(name):  # a build takes minutes, once per machine and source: say so, not a silent stall
            log.warning("building accel's CPU kernels for this machine (once, ~1-2 minutes)")
        return load(name=name, sources=[str(CSRC / f"{unit}.cpp") for unit in SOURCES],
                    extra_include_paths=[str(CSRC)], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                    verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler / build failure: fall back to torch kernels
        log.warning("accel CPU kernels unavailable (%s: %s); using torch's kernels", type(e).__name__, e)
        return None


def _built(name: str) -> bool:
    """Whether this source's extension is already built (torch then only loads it)."""
    from torch.utils.cpp_extension import _get_build_directory

    return any(Path(_get_build_directory(name, verbose=False)).glob(f"{name}*.so"))


STALE_LOCK_S = 600  # a build takes ~1 minute; a lock this old was left by a process killed while building


def _remove_stale_lock(name: str) -> None:
    """torch waits forever on the build folder's lock file; one left by a killed build would hang every later
    process, so a lock older than STALE_LOCK_S is removed."""
    import time

    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()
            log.warning("removed a stale build lock %s", lock)
    except FileNotFoundError:
        pass


def available() -> bool:
    """True when the AVX2 kernels compiled and load on this machine."""
    return _module() is not None


def vnni_prefill(in_features: int) -> bool:
    """True when int8_linear / int4_linear run the AVX512-VNNI prefill GEMM for inputs this wide (K % 32 == 0, and
    whole blocks of 32 per INT4 group): it beats dequantize + fp32 GEMM at every number of rows."""
    return available() and in_features % 32 == 0 and _module().has_vnni()


def vnni_int8(in_features: int, out_features: int) -> bool:
    """True when an INT8 Linear of this shape runs in the VNNI tile layout (`int8_vnni_layout`): AVX512-VNNI, whole
    blocks of 32 inputs and whole tiles of 16 outputs."""
    return available() and in_features % 32 == 0 and out_features % 16 == 0 and _module().has_vnni()


def int8_vnni_layout(q: Tensor) -> Tensor:
    """int8 [N, K] -> the VNNI tile layout, same shape and bytes reordered: per tile of 16 rows and per input pair,
    the 16 rows' two values are 32 consecutive bytes ([N / 16][K / 2][16][2])."""
    n, k = q.shape
    return q.reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous().reshape(n, k)


def int8_row_layout(qv: Tensor) -> Tensor:
    """The inverse of `int8_vnni_layout`."""
    n, k = qv.shape
    return qv.reshape(n // 16, k // 2, 16, 2).permute(0, 2, 1, 3).contiguous().reshape(n, k)


def vnni_int4(in_features: int, out_features: int, group_size: int) -> bool:
    """True when an INT4 Linear of this shape runs in the VNNI tile layout (`int4_vnni_layout`): AVX512-VNNI, whole
    tiles of 16 outputs and groups of whole 32-input blocks."""
    return (available() and in_features % 32 == 0 and out_features % 16 == 0 and group_size % 32 == 0
            and _module().has_vnni())


def int4_vnni_layout(q: Tensor, scale_min: Tensor) -> tuple[Tensor, Tensor]:
    """Unpacked int4 values q [N, K] in [0, 15] and scale_min [N, G, 2] -> the VNNI tile layout: uint8 [N, K / 2]
    where, per tile of 16 rows and per two input pairs, byte j holds value j of the first pair's 32 (16 rows x 2, row
    order) in its low nibble and of the second pair's in its high one; scale_min [N / 16, G, 2, 16] (16 scales, then
    16 mins, per tile and group)."""
    n, k = q.shape
    pairs = q.to(torch.uint8).reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3)  # [T, K / 2, 16, 2]
    chunks = pairs.reshape(n // 16, k // 4, 2, 32)  # [T, K / 4, (pair 2c, pair 2c + 1), 32]
    packed = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    g = scale_min.shape[1]
    return packed, scale_min.reshape(n // 16, 16, g, 2).permute(0, 2, 3, 1).contiguous()


def int4_vnni_unlayout(qv: Tensor, smv: Tensor) -> tuple[Tensor, Tensor]:
    """The inverse of `int4_vnni_layout`: (q [N, K] uint8 in [0, 15], scale_min [N, G, 2])."""
    n, half = qv.shape
    p = qv.reshape(n // 16, half // 2, 32)  # [T, K / 4, 32]
    chunks = torch.stack([p & 0x0F, p >> 4], dim=2)  # [T, K / 4, 2, 32]
    q = chunks.reshape(n // 16, half, 16, 2).permute(0, 2, 1, 3).reshape(n, 2 * half)
    g = smv.shape[1]
    return q.contiguous(), smv.permute(0, 3, 1, 2).reshape(n, g, 2).contiguous()


def int4_linear_vnni(x: Tensor, qv: Tensor, smv: Tensor, group_size: int) -> Tensor:
    """`int4_linear` with the weight and scale_min in the VNNI tile layout; a row's result is the same at any row
    count."""
    return _module().int4_linear_vnni(x, qv, smv, group_size)


def int4a8_vnni_layout(q: Tensor, scale_min: Tensor) -> tuple[Tensor, Tensor]:
    """Unpacked int4 values q [N, K] in [0, 15] and scale_min [N, G, 2] -> w4a8's tile layout: uint8 [N, K / 2] where,
    per tile of 16 rows and per chunk of 8 inputs, row i's 4 bytes hold inputs 0..3 of the chunk in their low
    nibbles and 4..7 in their high ones (a `vpdpbusd` operand per nibble half); scale_min as `int4_vnni_layout`."""
    n, k = q.shape
    c = q.to(torch.uint8).reshape(n // 16, 16, k // 8, 2, 4).permute(0, 2, 1, 3, 4)  # [T, K / 8, 16, half, 4]
    packed = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).reshape(n, k // 2).contiguous()
    g = scale_min.shape[1]
    return packed, scale_min.reshape(n // 16, 16, g, 2).permute(0, 2, 3, 1).contiguous()


def int4a8_vnni_unlayout(qv: Tensor, smv: Tensor) -> tuple[Tensor, Tensor]:
    """The inverse of `int4a8_vnni_layout`: (q [N, K] uint8 in [0, 15], scale_min [N, G, 2])."""
    n, half = qv.shape
    p = qv.reshape(n // 16, half // 4, 16, 4)  # [T, K / 8, 16, 4]
    c = torch.stack([p & 0x0F, p >> 4], dim=3)  # [T, K / 8, 16, half, 4]
    q = c.permute(0, 2, 1, 3, 4).reshape(n, 2 * half)
    g = smv.shape[1]
    return q.contiguous(), smv.permute(0, 3, 1, 2).reshape(n, g, 2).contiguous()


def int4a8_linear_vnni(x: Tensor, qv: Tensor, smv: Tensor, group_size: int) -> Tensor:
    """w4a8: `int4_linear_vnni` on 8-bit activation blocks (`quantize_activation_blocks_int8`), q in
    `int4a8_vnni_layout`; a row's result is the same at any row count."""
    return _module().int4a8_linear_vnni(x, qv, smv, group_size)


def int8_linear_vnni(x: Tensor, qv: Tensor, scale: Tensor, gs: Tensor | None = None, a8: bool = False) -> Tensor:
    """`int8_linear` with the weight (and `gs`, `int8_group_scales_vnni_layout`) in the VNNI tile layout; a row's
    result is the same at any row count."""
    return _module().int8_linear_vnni(x, qv, scale, _NO_GROUP_SCALES if gs is None else gs, a8)


def int8_group_scales_vnni_layout(gs: Tensor) -> Tensor:
    """fp16 group scales [N, K / 32] -> the VNNI tile layout's [N / 16, K / 32, 16] (beside `int8_vnni_layout`)."""
    n, kb = gs.shape
    return gs.reshape(n // 16, 16, kb).permute(0, 2, 1).contiguous().reshape(n, kb)


def int4_repack(q: Tensor) -> Tensor:
    """Unpacked int4 values q [N, K] in [0, 15] (K % 16 == 0) -> the int4 kernel's layout uint8 [N, K / 2]:
    per 16 inputs, byte i = q[c_i] | q[c_{i+8}] << 4."""
    n, k = q.shape
    chunks = q.to(torch.uint8).reshape(n, k // 16, 2, 8)  # [N, K/16, half, 8]
    return (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def int4_unrepack(packed: Tensor) -> Tensor:
    """The inverse of `int4_repack`: q [N, K] uint8 in [0, 15]."""
    n, half = packed.shape
    p = packed.reshape(n, half // 8, 8)
    return torch.stack([p & 0x0F, p >> 4], dim=2).reshape(n, 2 * half)


def int4_linear(x: Tensor, packed: Tensor, scale_min: Tensor, group_size: int) -> Tensor:
    """x [M, K] fp32 against w[n, k] = q * scale_min[n, g, 0] + scale_min[n, g, 1] (q from `int4_repack`;
    scale_min fp32 or fp16) -> [M, N] fp32."""
    return _module().int4_linear(x, packed, scale_min, group_size)


def int4_dequant(packed: Tensor, scale_min: Tensor, group_size: int, start: int, end: int) -> Tensor:
    """Rows [start, end) of the weight `int4_linear` multiplies by, in fp32 [end - start, K]."""
    return _module().int4_dequant(packed, scale_min, group_size, start, end)


def paged_decode_attention(out: Tensor, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                           context_lens: Tensor, rows: Tensor, scale: float, span_offsets: Tensor | None = None,
                           window: int = 0) -> None:
    """Decode attention for rows `rows` of q [T, H, D] over the paged fp32 cache (K/V [blocks, bs, KVH, D],
    block_tables [G, nb], context_lens [G]); writes out[rows] (out [T, H, D], contiguous).

    span_offsets [S + 1]: rows so[s]..so[s+1]-1 belong to one request (e.g. a verify step's k + 1 rows) and read
    its blocks once together; None: every row alone. window > 0: a row of context L sees keys [L - window, L)."""
    spans = span_offsets if span_offsets is not None else torch.empty(0, dtype=torch.long)
    _module().paged_decode_attention(out, q, k_cache, v_cache, block_tables, context_lens, rows, scale, spans,
                                     window)


def kv_write_(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
    """k, v [T, KVH, D] (dense rows, any row stride) into flat slots [T] of the fp32 caches [blocks, bs, KVH, D]."""
    _module().kv_write_(k_cache, v_cache, k, v, slots)


def f32_linear(x: Tensor, w: Tensor) -> Tensor:
    """x [M, K] @ w [N, K]^T in fp32 (meant for decode sizes, M <= 96). Call only when `available()`."""
    return _module().f32_linear(x, w)


PANEL = 48  # outputs per weight panel (csrc: PANEL)


def has_avx512() -> bool:
    """Whether the weight panel kernels (fp32 and fp16 panels) run here (AVX-512F)."""
    return available() and _module().has_avx512()


def f32_panels(w: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """A float weight [N, K] as panels [ceil(N / 48), K, 48] (for each k, 48 consecutive outputs; N zero-padded),
    held in `dtype`: float32, or float16 (`f32_panel_linear` converts each weight to fp32 as it reads it)."""
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"panel dtype {dtype} is invalid; allowed: torch.float32, torch.float16")
    n, k = w.shape
    t, full = -(-n // PANEL), n // PANEL
    out = torch.empty(t, k, PANEL, dtype=dtype)  # written once: no padded copy beside it (a 152k-row
    out[:full] = w[:full * PANEL].view(full, PANEL, k).transpose(1, 2)  # lm_head's were 0.93 GB each)
    if full < t:
        out[full].zero_()
        out[full, :, :n - full * PANEL] = w[full * PANEL:].T
    return out


def f32_panel_linear(x: Tensor, panels: Tensor, out_features: int) -> Tensor:
    """x [M, K] fp32 @ w^T with w as `f32_panels` (fp32 or fp16; any M) -> fp32. Call only where `has_avx512()`."""
    return _module().f32_panel_linear(x, panels, out_features)


def core_to_core_ns(rounds: int) -> float:
    """ns per one-way pass of a cache line between two threads (0 where only one runs); see the C++ comment."""
    return _module().core_to_core_ns(rounds)


def governor_trace(costs: list[tuple[float, float, float]], full: int) -> list[int]:
    """The decode step's team size at each of len(costs) one-row steps, where costs[i] = (ns alone, ns with the whole
    team, late fraction with the whole team) is what step i would cost: TeamGovernor, driven with injected costs."""
    return _module().governor_trace([list(c) for c in costs], full)


def team_chunks(n: int, threads: int, late: int, late_us: int) -> Tensor:
    """Which thread ran each of n chunks in a team of `threads`, where thread `late` starts once all chunks have run
    (or after `late_us` microseconds): the kernels' work split, exposed for its tests."""
    return _module().team_chunks(n, threads, late, late_us)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """fp32 RMSNorm over the last dim (HF's math in fp32). Call only when `available()`."""
    return _module().rms_norm(x, weight, eps)


def add_rms_norm_(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> Tensor:
    """residual += x in place; returns RMSNorm(residual) * weight (fp32). Call only when `available()`."""
    return _module().add_rms_norm_(x, residual, weight, eps)


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up [T, 2I] fp32 (gate | up) -> silu(gate) * up [T, I]. Call only when `available()`."""
    return _module().silu_mul(gate_up)


def gelu_tanh_mul(gate_up: Tensor) -> Tensor:
    """gate_up [T, 2I] fp32 (gate | up) -> gelu_tanh(gate) * up [T, I] (Gemma's GeGLU). Call only when
    `available()`."""
    return _module().gelu_tanh_mul(gate_up)


def rope_(x: Tensor, cos: Tensor, sin_signed: Tensor, num_heads: int, head_dim: int) -> None:
    """RoPE in place on heads [0, num_heads) of each row of x [T, >= num_heads * head_dim] (last dim contiguous);
    cos / sin_signed: this step's rows [T, (1,) head_dim] (see `signed_sin`). Call only when `available()`."""
    _module().rope_(x, cos, sin_signed, num_heads, head_dim)


_NO_GROUP_SCALES = torch.empty(0, dtype=torch.float16)


def int8_linear(x: Tensor, q: Tensor, scale: Tensor, gs: Tensor | None = None, a8: bool = False) -> Tensor:
    """(x [M, K] fp32 @ q [N, K] int8 ^T) * scale [N] fp32 -> [M, N] fp32; with `gs` (int8g: fp16 [N, K / 32], one
    scale per row and block of 32 inputs) each block's sum is also scaled by its own gs; `a8`: x rounded to 8-bit
    integers per row first (W8A8, `accel.kernels.linear.quantize_int8_per_token`). Call only when `available()`."""
    return _module().int8_linear(x, q, scale, _NO_GROUP_SCALES if gs is None else gs, a8)


def argmax_rows(x: Tensor) -> Tensor:
    """x fp32 [M, N] -> each row's argmax [M] long, as torch.argmax (first maximum; NaN largest). Call only when
    `available()`."""
    return _module().argmax_rows(x)


def decode_tensors(weights: list[Tensor], spec: list[int]):
    """A model's decode-step tensors for `decode_layers`: the weights (see the C++ comment on the spec), checked and
    held once; then `.bind_caches(k_caches, v_caches)` before the first step, and optionally
    `.set_head(weights, spec)`: the lm_head as one more linear spec."""
    return _module().DecodeTensors(weights, spec)


def decode_layers(x: Tensor, cos: Tensor, sin_signed: Tensor, tensors, slots: Tensor, block_tables: Tensor,
                  context_lens: Tensor, rows: Tensor, spans: Tensor, logit_rows: Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int, eps: float, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Every decoder layer of a decode step in one call -> (final hidden [T, hidden], logits [R, vocab] of the R
    `logit_rows` by the head set on `tensors` ([0, 0] when R = 0), each logit row's argmax [R]); `tensors` from
    `decode_tensors`, caches bound. With `.set_tables(embed, cos, sin_signed, embed_scale, embed_scales)` done, x may be token ids [T] and cos
    positions [T] (long; sin_signed then unused). Call only when `available()`."""
    return _module().decode_layers(x, cos, sin_signed, tensors, slots, block_tables, context_lens, rows, spans,
                                   logit_rows, num_heads, num_kv_heads, head_dim, eps, scale)


def decode_step(ids: list[int], positions: list[int], tensors, slots: list[int], block_table: list[int], nb: int,
                context_lens: list[int], rows: list[int], spans: list[int], logit_rows: list[int], num_heads: int,
                num_kv_heads: int, head_dim: int, eps: float, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """`decode_layers` from token ids and positions (tables set) with every index a list of ints; block_table is
    [len(ids), nb] flattened. Call only when `available()`."""
    return _module().decode_step(ids, positions, tensors, slots, block_table, nb, context_lens, rows, spans,
                                 logit_rows, num_heads, num_kv_heads, head_dim, eps, scale)


def decode_steps(ids: list[int], positions: list[int], tensors, block_table: list[int], nb: int, num_steps: int,
                 stop_ids: list[list[int]], features: Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 eps: float, scale: float) -> list[list[int]]:
    """Up to `num_steps` greedy decode steps of len(ids) requests, one row each, each step's argmax the next one's
    input: the tokens of each row. Stops after the first step in which a row's token is in its `stop_ids`. Row t's
    block table ([len(ids), nb] flattened) must cover positions[t] + num_steps. `features` (fp32 [cache slots,
    hidden], or empty) receives each position's final hidden state by slot. Tables and head set. Call only when
    `available()`."""
    return _module().decode_steps(ids, positions, tensors, block_table, nb, num_steps, stop_ids, features, num_heads,
                                  num_kv_heads, head_dim, eps, scale)


def spec_policy(state) -> object:
    """The C++ `SpecPolicy` (the batch-1 draft-length rule) with the fields of `state` (a SpecPolicyState)."""
    import dataclasses

    policy = _module().SpecPolicy()
    for f in dataclasses.fields(state):
        setattr(policy, f.name, getattr(state, f.name))
    return policy


def spec_steps(history: list[int], tensors, block_table: list[int], max_steps: int, max_new: int, budget_s: float,
               stop_ids: list[int], min_n: int, max_n: int, guess: bool, policy, num_heads: int,
               num_kv_heads: int, head_dim: int, eps: float, scale: float) -> tuple[list[int], list[list[float]]]:
    """Greedy n-gram speculation of one request, up to `max_steps` verify steps in one call: (tokens, per step
    [length asked, drafted, accepted, guess, propose seconds, step seconds]). `history` is prompt + output, its last
    token not yet in the cache; `policy` the draft-length state (a SpecPolicyState). Tables and head set. Call only
    when `available()`."""
    return _module().spec_steps(history, tensors, block_table, max_steps, max_new, budget_s, stop_ids, min_n, max_n,
                                guess, spec_policy(policy), num_heads, num_kv_heads, head_dim, eps, scale)


HUGE_PAGE_MIN_BYTES = 1 << 20  # smaller tensors span a handful of pages: nothing to gain


def huge_page_copy(t: Tensor) -> Tensor:
    """A copy of `t` in memory advised for 2 MB pages (see the C++ comment); `t` itself where that does not apply."""
    if t.device.type != "cpu" or t.numel() * t.element_size() < HUGE_PAGE_MIN_BYTES or not available():
        return t
    return _module().huge_page_copy(t)


HUGE_PAGE_ARENA_BYTES = 64 << 20  # tensors moved together into one mapping of about this size
_ALIGN = 4096


def move_to_huge_pages(model: torch.nn.Module) -> int:
    """Every large CPU parameter and buffer of `model` (and PackedLinear weights) into 2 MB pages, in place; tensors
    that share storage (a tied lm_head) stay shared. Returns the bytes moved.

    Tensors are packed page-aligned into arenas of ~64 MB, each one mapping: a mapping per tensor rounds it up to
    whole 2 MB pages (Qwen2.5-1.5B at INT4: ~0.2 GB of padding over its 230 small scale and weight tensors), and an
    arena is the only copy held beside the originals while they move. Token tables stay where they are: a step
    gathers a few of their rows (a table tied to the head is moved as the head's weight)."""
    slots: dict[int, list] = {}  # data_ptr -> [(module, kind, name)]
    first: dict[int, Tensor] = {}
    for mod in model.modules():
        if isinstance(mod, torch.nn.Embedding) or type(mod).__name__ in ("Float16Embedding", "Int8Embedding"):
            continue  # a table is gathered a few rows a step, never streamed: 2 MB pages gain it nothing
        found = [(p.data, "param", n) for n, p in mod.named_parameters(recurse=False)]
        found += [(b, "buffer", n) for n, b in mod.named_buffers(recurse=False) if b is not None]
        if isinstance(getattr(mod, "packed", None), Tensor) and not getattr(mod.packed, "is_mkldnn", False):
            found.append((mod.packed, "packed", "packed"))
        for t, kind, name in found:
            if t.device.type != "cpu" or t.numel() * t.element_size() < HUGE_PAGE_MIN_BYTES or not available():
                continue
            key = t.data_ptr()
            if key in first and first[key].shape != t.shape:  # a view of another's storage: leave it
                continue
            first.setdefault(key, t)
            slots.setdefault(key, []).append((mod, kind, name))

    def place(key: int, new: Tensor) -> None:
        with torch.no_grad():
            for mod, kind, name in slots[key]:
                if kind == "param":
                    getattr(mod, name).data = new
                else:
                    setattr(mod, name, new)

    batch: list[int] = []

    def flush() -> None:
        sizes = [-(-first[k].numel() * first[k].element_size() // _ALIGN) * _ALIGN for k in batch]
        arena = _module().huge_page_zeros([sum(sizes)], torch.empty(0, dtype=torch.uint8))
        offset = 0
        for key, size in zip(batch, sizes):
            t = first.pop(key).contiguous()  # the original goes once its slots hold the copy
            view = arena[offset:offset + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            place(key, view)
            offset += size
        batch.clear()

    moved, pending = 0, 0
    for key in list(first):
        nbytes = first[key].numel() * first[key].element_size()
        moved += nbytes
        if nbytes >= HUGE_PAGE_ARENA_BYTES:
            place(key, huge_page_copy(first.pop(key)))
            continue
        batch.append(key)
        pending += nbytes
        if pending >= HUGE_PAGE_ARENA_BYTES:
            flush()
            pending = 0
    if batch:
        flush()
    return moved


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """torch.zeros, in 2 MB pages for a large CPU tensor (a KV cache: attention streams it every step)."""
    nbytes = torch.empty(0, dtype=dtype).element_size()
    for v in shape:
        nbytes *= v
    if torch.device(device).type != "cpu" or nbytes < HUGE_PAGE_MIN_BYTES or not available():
        return torch.zeros(shape, dtype=dtype, device=device)
    return _module().huge_page_zeros(list(shape), torch.empty(0, dtype=dtype))
