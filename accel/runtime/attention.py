"""Paged attention over a flat batch of tokens, on top of torch's scaled_dot_product_attention.

KV cache layout per layer: K and V each [num_blocks, block_size, num_kv_heads, head_dim]; a token at position
p of a request lives in slot `block_table[p // block_size] * block_size + p % block_size`.

The flat batch holds, per request, the tokens computed this step (a whole prompt, a chunk of one, or one
decode token). Two paths, chosen per request by the model runner once per step (not per layer):

  prefill  (query length > 1): one SDPA call per request. With no earlier context, K/V come straight from
           the projections and SDPA's causal kernel runs; otherwise K/V are gathered from the request's blocks
           and a bottom-right-aligned causal mask is used:

               keys   0 1 2 3 4 5        context_len = 6, query_len = 2
               q @4   x x x x x .        query i sits at position context_len - query_len + i
               q @5   x x x x x x

  decode   (query length 1): requests with similar context lengths are batched in one SDPA call over their
           gathered blocks, padded to the group's longest context and masked. The query heads that share a KV
           head are laid out as extra query rows ([G, kv_heads, group, head_dim]) so K/V are never repeated.

On CPU with an fp32 cache, decode groups go to accel's own paged decode kernel instead
(accel/kernels/cpu.py: reads K/V through the block table, no gather, no padding), and the model runner
then puts every decode row in one group.

Why hand-written: CPU torch has no paged-attention kernel; gathering whole blocks + SDPA keeps every loop at
the request level (never per token), which is what makes it fast enough.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from accel.kernels import cpu


@dataclass
class PrefillSpan:
    q_start: int  # first row of this request in the flat batch
    q_len: int
    context_len: int  # tokens in the cache after this step (earlier context + this chunk)
    block_ids: Tensor  # [nb] long, the request's blocks covering context_len
    mask: Tensor | None  # [q_len, context_len] bool (True = attend), None -> causal over fresh K/V


@dataclass
class DecodeGroup:
    token_idx: Tensor  # [G] long, rows of the flat batch
    block_table: Tensor  # [G, nb] long, padded with block 0 (masked out)
    mask: Tensor  # [G, 1, 1, nb * block_size] bool
    context_lens: Tensor | None = None  # [G] long (CPU); enables accel's paged decode kernel
    # [S + 1] long (CPU), kernel only: rows spans[s]..spans[s+1]-1 are one request's (a verify step's k + 1 rows),
    # read its blocks once together; None: every row alone
    spans: Tensor | None = None


@dataclass
class AttentionMetadata:
    slot_mapping: Tensor  # [T] long
    prefills: list[PrefillSpan] = field(default_factory=list)
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    # KV groups 1.. of a hybrid model (`KVLayout`): the same rows over those groups' block tables; this is group 0
    groups: list[AttentionMetadata] = field(default_factory=list)

    def for_group(self, group: int) -> AttentionMetadata:
        return self if group == 0 else self.groups[group - 1]


class PagedKVCache:
    """One layer's K/V blocks; `dtype=torch.int8` stores symmetric int8 with one fp32 scale per token and head."""

    group = 0  # the KV group whose block table addresses it (`KVLayout`)

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, compute_dtype: torch.dtype,
                 kv: tuple[Tensor, Tensor] | None = None) -> None:
        """`kv`: the zeroed (k, v) tensors to use, slices of one allocation for every layer (`allocate`)."""
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k, self.v = kv if kv is not None else (cpu.zeros(shape, dtype, device), cpu.zeros(shape, dtype, device))
        self.quantized = dtype == torch.int8
        self.compute_dtype = compute_dtype
        # fp32 CPU cache: accel's kv_write_ (one call, no index_copy_ dispatch) when the kernels are built
        self.fast_write = (dtype == torch.float32 and self.k.device.type == "cpu" and cpu.available())
        if self.quantized:
            self.k_scale = torch.ones(shape[:3], dtype=torch.float32, device=device)
            self.v_scale = torch.ones(shape[:3], dtype=torch.float32, device=device)

    @classmethod
    def allocate(cls, n: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, compute_dtype: torch.dtype) -> list[PagedKVCache]:
        """`n` caches whose K and V are slices of one zeroed allocation (in 2 MB pages on a CPU): one mapping, not
        2n each rounded up to whole 2 MB pages."""
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        arena = cpu.zeros((n, 2, *shape), dtype, device)
        return [cls(*shape, dtype, device, compute_dtype, kv=(arena[i, 0], arena[i, 1])) for i in range(n)]

    def for_group(self, group: int) -> PagedKVCache:
        """This cache's tensors addressed by another KV group's table (layers of different groups share tensors:
        a block belongs to one group at a time)."""
        view = copy.copy(self)
        view.group = group
        return view

    def write(self, slots: Tensor, k: Tensor, v: Tensor) -> None:
        """Store k, v [T, kv_heads, head_dim] into the given flat slots [T]."""
        nkv, hd = k.shape[1], k.shape[2]
        if (self.fast_write and k.dtype == v.dtype == torch.float32 and k.stride(2) == v.stride(2) == 1
                and k.stride(1) == v.stride(1) == hd):
            cpu.kv_write_(self.k, self.v, k, v, slots)
            return
        if not self.quantized:
            self.k.view(-1, nkv, hd).index_copy_(0, slots, k.to(self.k.dtype))
            self.v.view(-1, nkv, hd).index_copy_(0, slots, v.to(self.v.dtype))
            return
        for src, dst, scale in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            q, s = quantize_int8(src)
            dst.view(-1, nkv, hd).index_copy_(0, slots, q)
            scale.view(-1, nkv).index_copy_(0, slots, s)

    def read_blocks(self, block_ids: Tensor, device: torch.device) -> list[Tensor]:
        """Raw copies (K, V and int8 scales) of the given blocks, on `device` (swap out)."""
        parts = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.quantized else [])
        return [t[block_ids].to(device, copy=True) for t in parts]

    def write_blocks(self, block_ids: Tensor, saved: list[Tensor]) -> None:
        """Put copies made by `read_blocks` into (other) blocks (swap in)."""
        parts = [self.k, self.v] + ([self.k_scale, self.v_scale] if self.quantized else [])
        for dst, src in zip(parts, saved):
            dst[block_ids] = src.to(dst.device)

    def gather(self, block_ids: Tensor) -> tuple[Tensor, Tensor]:
        """K, V of the given blocks: block_ids [..., nb] -> [..., nb * block_size, kv_heads, head_dim]."""
        # index_select on the flattened ids: on CPU several times faster than advanced indexing (`self.k[block_ids]`)
        flat, lead = block_ids.reshape(-1), block_ids.shape

        def take(t: Tensor) -> Tensor:
            return t.index_select(0, flat).view(*lead, *t.shape[1:])

        k, v = take(self.k), take(self.v)  # [..., nb, bs, nkv, hd]
        if self.quantized:
            k = k.to(self.compute_dtype) * take(self.k_scale).unsqueeze(-1).to(self.compute_dtype)
            v = v.to(self.compute_dtype) * take(self.v_scale).unsqueeze(-1).to(self.compute_dtype)
        return k.flatten(-4, -3), v.flatten(-4, -3)


def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-(token, head) int8: x [T, H, D] -> (int8 [T, H, D], fp32 scale [T, H])."""
    scale = x.abs().amax(dim=-1).float().clamp(min=1e-8) / 127.0  # [T, H]
    q = torch.round(x.float() / scale.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q, scale


@functools.lru_cache(maxsize=64)
def window_band(q_len: int, context_len: int, window: int, device: torch.device) -> Tensor:
    """[q_len, context_len] bool: query i (at position context_len - q_len + i) may see key j when it lies within
    the last `window` positions up to the query itself (causal and sliding; HF's and llama.cpp's rule)."""
    qpos = torch.arange(context_len - q_len, context_len, device=device)[:, None]
    kpos = torch.arange(context_len, device=device)[None, :]
    return (kpos <= qpos) & (qpos - kpos < window)


def paged_attention(q: Tensor, k: Tensor, v: Tensor, cache: PagedKVCache, meta: AttentionMetadata,
                    scale: float, window: int | None = None) -> Tensor:
    """q [T, heads, hd], k/v [T, kv_heads, hd] of this step's tokens -> attention output [T, heads, hd].

    Writes k/v into the cache first, so requests in the same step may read each other's freshly computed
    blocks (a prefix-cache hit on a block being filled in this very step). `window`: a sliding-window layer sees
    only the last `window` positions (None: all).
    """
    meta = meta.for_group(cache.group)
    cache.write(meta.slot_mapping, k, v)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, H, D], contiguous
    num_heads, num_kv = q.shape[1], k.shape[1]
    group = num_heads // num_kv
    for p in meta.prefills:
        rows = slice(p.q_start, p.q_start + p.q_len)
        out[rows] = _prefill_attention(q[rows], k[rows], v[rows], cache, p, scale, window, group > 1)
    use_kernel = (q.device.type == "cpu" and q.dtype == torch.float32 and not cache.quantized
                  and cache.k.dtype == torch.float32 and cpu.available())
    # the kernel takes q rows with any row stride (a view into the fused qkv output: no copy)
    qc = q if q.stride(2) == 1 and q.stride(1) == q.shape[2] else q.contiguous()
    for g in meta.decode_groups:
        if use_kernel and g.context_lens is not None:
            cpu.paged_decode_attention(out, qc, cache.k, cache.v, g.block_table,
                                       g.context_lens, g.token_idx, scale, g.spans, window or 0)
            continue
        n = g.token_idx.shape[0]
        qg = q.index_select(0, g.token_idx).view(n, num_kv, group, -1)  # [G, KVH, group, D]: shared-KV heads as rows
        kc, vc = cache.gather(g.block_table)  # [G, L, KVH, D]
        mask = g.mask  # [G, 1, 1, L]: each row's keys are a prefix of its table
        if window is not None:
            keys = torch.arange(mask.shape[-1], device=mask.device)
            mask = mask & (keys >= mask.sum(-1, keepdim=True) - window)
        o = F.scaled_dot_product_attention(qg, kc.transpose(1, 2), vc.transpose(1, 2), attn_mask=mask,
                                           scale=scale)  # [G, KVH, group, D]
        out.index_copy_(0, g.token_idx, o.reshape(n, num_heads, -1))
    return out


def _prefill_attention(q: Tensor, k: Tensor, v: Tensor, cache: PagedKVCache, p: PrefillSpan, scale: float,
                       window: int | None, gqa: bool) -> Tensor:
    """One prefill span's attention: q [q, H, D], k/v [q, KVH, D] its own rows -> [q, H, D]. With earlier context
    (`p.mask`) its keys come from the cache."""
    # 4-D [1, heads, len, D]: torch's CPU flash-attention kernel only takes batched 4-D inputs; 3-D ones
    # silently fall back to the math path (bmm + softmax + masked-row fix-ups), far slower on long prompts
    qs = q.transpose(0, 1)[None]  # [1, H, q, D]
    windowed = window is not None and p.context_len > window
    if p.mask is None and not windowed:
        ks, vs = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, KVH, q, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)
        return o[0].transpose(0, 1)
    first = 0
    if p.mask is None:  # fresh K/V: the step's own rows
        ks, vs = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    else:
        # a sliding layer reads from the block of the first query's window on: the blocks before are
        # given back (`KVCacheManager`), and their table entries are placeholders
        bs = cache.k.shape[1]
        first = max(0, p.context_len - p.q_len - window + 1) // bs * bs if window else 0
        kc, vc = cache.gather(p.block_ids[first // bs:])  # [(nb - first) * bs, KVH, D]
        ks = kc[:p.context_len - first].transpose(0, 1)[None]  # [1, KVH, ctx - first, D]
        vs = vc[:p.context_len - first].transpose(0, 1)[None]
    mask = p.mask
    if windowed:
        band = window_band(p.q_len, p.context_len, window, q.device)
        mask = band if mask is None else mask & band
    if p.mask is not None and windowed and first:
        mask = mask[:, first:]
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return o[0].transpose(0, 1)
