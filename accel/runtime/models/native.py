"""A decode step's decoder layers as one native call (`cpu.decode_layers`), for fp32 CPU models whose projections
are fused and run on accel's kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from accel.kernels import cpu
from accel.runtime.attention import AttentionMetadata, PagedKVCache
from accel.runtime.models.layers import longs

if TYPE_CHECKING:
    from accel.runtime.models.llama import CausalLM


_NO_ROWS = torch.empty(0, dtype=torch.long)


_NO_FLOATS = torch.empty(0)


class NativeDecode:
    """A decode step's decoder layers as one native call (`cpu.decode_layers`), for fp32 CPU models whose
    projections are fused (qkv_proj, gate_up_proj) and run on accel's kernels (fp32, INT8, INT4/int4f).

    Why: at batch 1 the module-by-module path issues ~1,400 torch ops per step, and their dispatch, checks and
    allocations cost more than the arithmetic; the native call runs the same kernels on raw pointers in the same
    order, so its output is identical. It takes steps whose rows all ride the paged decode kernel (decode and
    short verify spans, no prefill) and at most MAX_ROWS rows (above that the Linears switch to GEMM kernels).
    The weights are handed to the native side once; so are a runner's KV caches, re-bound when a step comes with
    another runner's (engines sharing a model step it from one thread at a time).
    """

    MAX_ROWS = 32

    def __init__(self, model: CausalLM, weights: list[Tensor], spec: list[int]) -> None:
        self.tensors = cpu.decode_tensors(weights, spec)
        self.has_head = False  # set_head done: a step can return the lm_head's logits too
        self.has_tables = False  # set_tables done: a step takes token ids and positions
        self._caches: list[PagedKVCache] | None = None  # the cache list bound to `tensors`
        c = model.config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, model.num_kv_heads, model.head_dim
        self.eps = float(c.rms_norm_eps)
        self.scale = model.model.layers[0].self_attn.scale  # the family's (Gemma: query_pre_attn_scalar^-1/2)

    @classmethod
    def for_model(cls, model: CausalLM, input_proj: nn.Module | None = None) -> NativeDecode | None:
        """The native decode of `model`, or None where a layer does not fit it (then the modules run as usual).
        input_proj: a projection the call runs on its input first (an EAGLE draft's fc); its x is then that
        projection's input."""
        p = next(model.parameters())
        if p.device.type != "cpu" or p.dtype != torch.float32 or not cpu.available():
            return None
        from accel.runtime.models.layers import FUSED_ACTIVATIONS

        if any(layer.mlp.act not in FUSED_ACTIVATIONS for layer in model.model.layers):
            return None
        weights: list[Tensor] = []
        spec: list[int] = []

        def add(t: Tensor) -> int:
            weights.append(t.contiguous())
            return len(weights) - 1

        local_rope = False
        layer_group = model.kv_layout.layer_group
        for i, layer in enumerate(model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            mods = [getattr(attn, "qkv_proj", None), attn.o_proj, getattr(mlp, "gate_up_proj", None), mlp.down_proj]
            lins = [_native_linear(m, add) for m in mods]
            if any(x is None for x in lins):
                return None
            ls = layer.spec()  # the family's own declaration of its norms and rotary table
            spec += [add(ls.pre_attn_norm.weight), add(ls.pre_mlp_norm.weight)]
            for x in lins:
                spec += x
            norms = [ls.q_norm, ls.k_norm, ls.post_attn_norm, ls.post_mlp_norm]
            rope = int(ls.local_rope)
            local_rope |= ls.local_rope
            spec += [add(n.weight) if n is not None else -1 for n in norms]
            spec += [attn.window or 0, rope, list(FUSED_ACTIVATIONS).index(mlp.act), layer_group[i]]
        spec.append(add(model.model.norm.weight))
        native = cls(model, weights, spec)
        head = _native_linear(model.lm_head, add)  # None: the lm_head runs as its module (compute_logits)
        if head is not None:
            native.tensors.set_head(weights, head)
            native.has_head = True
        if input_proj is not None:
            proj = _native_linear(input_proj, add)
            if proj is None:
                return None
            native.tensors.set_input_proj(weights, proj)
        else:
            native._set_tables(model, local_rope)
        if local_rope and not native.has_tables:
            return None  # the local table is only gathered from positions
        return native

    def _set_tables(self, model: CausalLM, local_rope: bool) -> None:
        """Hand the step the token table and rotary tables where it can gather from them itself (has_tables)."""
        from accel.kernels.linear import Int8Embedding

        table = model.model.embed_tokens
        # an INT8 table's own integers and scales (its `.weight` would be a dequantized fp32 copy); an INT4
        # table has none the native gather reads: its rows are gathered before the call (`inputs`)
        embed, embed_scales = ((table.qweight, table.scales) if isinstance(table, Int8Embedding)
                               else (getattr(table, "weight", None), _NO_FLOATS))
        tables = [model.cos, model.sin_signed]
        if (embed is not None and all(isinstance(t, Tensor) and t.dtype == torch.float32 and t.dim() == 2
                                      for t in tables)
                and embed.dtype in (torch.float32, torch.float16, torch.int8)
                and getattr(table, "embed_scale", None) is None):
            self.tensors.set_tables(embed.contiguous(), *(t.contiguous() for t in tables),
                                    getattr(model, "embed_scale", 1.0), embed_scales.contiguous())
            if local_rope:
                self.tensors.set_local_rope(*(t.contiguous() for t in model.tables["sliding_attention"]))
            self.has_tables = True

    def inputs(self, model: CausalLM, input_ids: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """The call's (x, cos, sin): token ids and positions where the tables are set, else the gathered rows."""
        if self.has_tables:
            return input_ids, positions, None
        return model._embed(input_ids, positions)

    def takes(self, meta: AttentionMetadata, rows: int) -> bool:
        return (rows <= self.MAX_ROWS and not meta.prefills and len(meta.decode_groups) == 1
                and meta.decode_groups[0].context_lens is not None)

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor | None, meta: AttentionMetadata,
                 kv_caches: list[PagedKVCache], logit_rows: list[int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x [T, hidden] or token ids [T]; cos / sin [T, 1, D], or positions [T] and None (`inputs`) ->
        (final hidden [T, hidden], logits of `logit_rows` [R, vocab], their argmax [R]; R = 0 without them)."""
        g = meta.decode_groups[0]
        slots, tables = meta.slot_mapping, g.block_table
        if meta.groups:  # KV groups stacked: slots [groups * T], tables [groups * T, nb]
            others = [m.decode_groups[0].block_table for m in meta.groups]
            nb = max(t.shape[1] for t in [tables] + others)
            slots = torch.cat([slots] + [m.slot_mapping for m in meta.groups])
            tables = torch.cat([torch.nn.functional.pad(t, (0, nb - t.shape[1])) for t in [tables] + others])
        self._bind(kv_caches)
        if sin is None:  # positions: the rows come from the tables
            cos, sin = cos, _NO_FLOATS
        else:
            cos, sin = cos.reshape(x.shape[0], -1), sin.reshape(x.shape[0], -1)
        return cpu.decode_layers(
            x.contiguous(), cos, sin, self.tensors,
            slots, tables, g.context_lens,
            g.token_idx, g.spans if g.spans is not None else _NO_ROWS,
            longs(logit_rows) if logit_rows else _NO_ROWS, self.num_heads,
            self.num_kv_heads, self.head_dim, self.eps, self.scale)


    def step(self, kv_caches: list[PagedKVCache], ids: list[int], positions: list[int], slots: list[int],
             block_table: list[int], nb: int, context_lens: list[int], rows: list[int], spans: list[int],
             logit_rows: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """`__call__` from token ids and positions with the metadata as lists (`ModelRunner.native_inputs`):
        no tensor is built from Python. Needs the tables and the head set."""
        self._bind(kv_caches)
        return cpu.decode_step(ids, positions, self.tensors, slots, block_table, nb, context_lens, rows, spans,
                                       logit_rows, self.num_heads, self.num_kv_heads, self.head_dim, self.eps,
                                       self.scale)

    def steps(self, kv_caches: list[PagedKVCache], ids: list[int], positions: list[int], block_table: list[int],
              nb: int, num_steps: int, stop_ids: list[list[int]], features: Tensor | None = None) -> list[list[int]]:
        """Up to `num_steps` greedy steps of single-row requests in one call (`cpu.decode_steps`): each
        row's tokens; the steps end after one in which a row produced one of its `stop_ids`. `features`: where each
        position's final hidden state goes by slot (the runner's feature cache), if anywhere."""
        self._bind(kv_caches)
        return cpu.decode_steps(ids, positions, self.tensors, block_table, nb, num_steps, stop_ids,
                                        _NO_FLOATS if features is None else features, self.num_heads,
                                        self.num_kv_heads, self.head_dim, self.eps, self.scale)

    def spec_steps(self, kv_caches: list[PagedKVCache], history: list[int], block_table: list[int], max_steps: int,
                   max_new: int, budget_s: float, stop_ids: list[int], min_n: int, max_n: int, guess: bool,
                   policy) -> tuple[list[int], list[list[float]]]:
        """Greedy n-gram speculation of one request in one call (`cpu.spec_steps`): its tokens and, per verify
        step, [length asked, drafted, accepted, guess, propose seconds, step seconds]."""
        self._bind(kv_caches)
        return cpu.spec_steps(history, self.tensors, block_table, max_steps, max_new, budget_s, stop_ids, min_n,
                              max_n, guess, policy, self.num_heads, self.num_kv_heads, self.head_dim, self.eps,
                              self.scale)

    def _bind(self, kv_caches: list[PagedKVCache]) -> None:
        if kv_caches is not self._caches:  # a runner's cache tensors never change: bound once, not passed per step
            if any(c.quantized or c.k.dtype != torch.float32 for c in kv_caches):
                raise ValueError("the native decode step needs an fp32 KV cache")
            self.tensors.bind_caches([c.k for c in kv_caches], [c.v for c in kv_caches])
            self._caches = kv_caches


def _native_linear(m: nn.Module | None, add) -> list[int] | None:
    """The 7-int spec of one projection for `cpu.decode_layers`, or None if it has no native kernel."""
    from accel.kernels.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear, PackedLinear

    if m is None:
        return None
    bias = getattr(m, "bias", None)
    b = add(bias.float()) if bias is not None else -1
    if isinstance(m, PackedLinear) and (m.avx2 or m.panels):
        kind = (6 if m.packed.dtype == torch.float16 else 5) if m.panels else 0
        return [kind, add(m.packed), -1, -1, 0, b, m.out_features]
    if isinstance(m, Int8WeightOnlyLinear) and m.in_features % 8 == 0:
        kind, q, scales = m.avx2_operands()
        gs = m.group_scales_operand()
        return [kind, add(q), add(scales.float()), -1 if gs is None else add(gs), 8 if m.a8 else 0, b, m.out_features]
    if isinstance(m, Int4WeightOnlyLinear) and m.group_size % 16 == 0 and (
            not m.a8 or m.kernel_for(1, torch.device("cpu")) == "avx2"):  # w4a8 natively only in its VNNI layout
        kind, packed, scale_min = m.avx2_operands()
        return [kind, add(packed), add(scale_min), -1, m.group_size, b, m.out_features]
    return None
