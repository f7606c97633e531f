"""A compact Llama-family causal LM (Llama, Mistral, Qwen2, SmolLM) over a flat token batch and a paged KV cache.

Module names are identical to transformers' (`model.layers.{i}.self_attn.q_proj`, `...mlp.gate_proj`,
`lm_head`), so HF safetensors load with `load_state_dict` and a quantization plan `{hf_module_name: scheme}`
applies by name. Every projection is a plain replaceable `nn.Linear`.

RoPE frequencies come from transformers' own `ROPE_INIT_FUNCTIONS` (default, linear, llama3, yarn, ...), so
every scaling type HF supports is computed exactly as HF does.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from accel.kernels import cpu
from accel.runtime.attention import AttentionMetadata, PagedKVCache, paged_attention

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def rope_cos_sin(config, max_positions: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos, sin tables [max_positions, head_dim] (fp32), as HF's rotary embedding computes them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        attention_scaling = 1.0
    elif rope_type in ("dynamic", "longrope"):
        raise NotImplementedError(f"rope_type={rope_type!r} (position-dependent rescaling) is not supported; "
                                  "supported: default, linear, llama3, yarn")
    else:
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    pos = torch.arange(max_positions, dtype=torch.float)
    freqs = torch.outer(pos, inv_freq.float())  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
    return (emb.cos() * attention_scaling).to(device), (emb.sin() * attention_scaling).to(device)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, heads, D], cos/sin [T, 1, D] -> rotated x (HF's rotate_half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def signed_sin(sin: Tensor) -> Tensor:
    """sin [..., D] -> [-sin[..., :D/2], sin[..., D/2:]], so rotate_half(x) * sin == x.roll(D/2, -1) * signed_sin."""
    s1, s2 = sin.chunk(2, dim=-1)
    return torch.cat((-s1, s2), dim=-1)


def apply_rope_rolled(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """`apply_rope` in 3 kernels instead of 6 (roll, mul, addcmul); same math: x*cos + rotate_half(x)*sin."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def _fused_cpu_ops(x: Tensor) -> bool:
    """accel's fused CPU kernels (RoPE, SwiGLU) apply: fp32 on CPU and the kernels compiled."""
    return x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and cpu.available()


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """RMSNorm(x); with `residual`, first `residual += x` in place and return RMSNorm(residual) (vLLM's
        fused_add_rms_norm: the decoder keeps the residual stream in one buffer)."""
        if x.dtype == torch.float32 and x.device.type == "cpu" and self.weight.dtype == torch.float32 \
                and cpu.available():
            if residual is None:
                return cpu.rms_norm(x, self.weight, self.eps)
            return cpu.add_rms_norm_(x, residual, self.weight, self.eps)
        if residual is not None:
            residual.add_(x)
            x = residual
        # HF computes in fp32 and casts back before the weight; F.rms_norm is the fused equivalent in fp32
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5
        attn_bias = bool(getattr(config, "attention_bias", False))
        qkv_bias = attn_bias or config.model_type == "qwen2"  # Qwen2 always has q/k/v bias
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=attn_bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: PagedKVCache, meta: AttentionMetadata) -> Tensor:
        t, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if hasattr(self, "qkv_proj"):  # fused at load time (see fuse_projections)
            qkv = self.qkv_proj(x)  # [T, (H + 2 KVH) D]
            if _fused_cpu_ops(qkv):  # accel's RoPE kernel, in place on the q and k columns
                cpu.rope_(qkv, cos, sin, h + kvh, d)
                q, k = qkv[:, :h * d].view(t, h, d), qkv[:, h * d:(h + kvh) * d].view(t, kvh, d)
            else:  # q and k are adjacent columns: rotate them with one set of kernels, then split the result
                qk = apply_rope_rolled(qkv[:, :(h + kvh) * d].view(t, h + kvh, d), cos, sin)
                q, k = qk[:, :h], qk[:, h:]
            v = qkv[:, (h + kvh) * d:].view(t, kvh, d)
        else:
            q = apply_rope_rolled(self.q_proj(x).view(t, h, d), cos, sin)  # [T, H, D]
            k = apply_rope_rolled(self.k_proj(x).view(t, kvh, d), cos, sin)  # [T, KVH, D]
            v = self.v_proj(x).view(t, kvh, d)
        o = paged_attention(q, k, v, cache, meta, self.scale)  # [T, H, D]
        return self.o_proj(o.reshape(t, -1))


class MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act={config.hidden_act!r}; supported: 'silu' (SwiGLU)")

    def forward(self, x: Tensor) -> Tensor:
        if hasattr(self, "gate_up_proj"):  # fused at load time (see fuse_projections)
            gu = self.gate_up_proj(x)
            if _fused_cpu_ops(gu):
                return self.down_proj(cpu.silu_mul(gu))
            gate, up = gu.chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: Tensor, residual: Tensor | None, cos: Tensor, sin: Tensor, cache: PagedKVCache,
                meta: AttentionMetadata) -> tuple[Tensor, Tensor]:
        """(h, residual) -> (h', residual'): the layer's input is h + residual (residual None at layer 0, where h
        is the embedding). `residual` is updated in place, so the stream lives in one buffer."""
        if residual is None:
            residual = h.clone()
            x = self.input_layernorm(h)
        else:
            x = self.input_layernorm(h, residual)
        x = self.self_attn(x, cos, sin, cache, meta)
        x = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Backbone(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Llama-family decoder: `forward` over a flat batch, `compute_logits` on the rows that sample."""

    def __init__(self, config) -> None:
        super().__init__()
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise NotImplementedError(f"model_type={config.model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Mistral/Qwen2 style sliding-window attention: not implemented, refuse rather than silently differ
        window = getattr(config, "sliding_window", None)
        use_window = getattr(config, "use_sliding_window", True)
        if window is not None and use_window and window < config.max_position_embeddings:
            raise NotImplementedError(f"sliding_window={window} < max_position_embeddings is not supported")
        self.cos: Tensor | None = None
        self.sin: Tensor | None = None
        self.sin_signed: Tensor | None = None

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    def init_rope(self, device: torch.device, dtype: torch.dtype) -> None:
        cos, sin = rope_cos_sin(self.config, self.config.max_position_embeddings, device)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)
        self.sin_signed = signed_sin(self.sin)

    def prepare_cpu_decode(self) -> bool:
        """For the CPU: build the kernels' weight layouts now, move the weights into 2 MB pages, and run decode
        steps through one native call when every layer fits it (NativeDecode). True if the native call is on."""
        from accel.kernels.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear

        self.native_decode = None
        if next(self.parameters()).device.type != "cpu" or not cpu.available():
            return False
        for m in self.modules():
            if isinstance(m, Int4WeightOnlyLinear) and m.group_size % 16 == 0 or isinstance(m, Int8WeightOnlyLinear):
                m.avx2_operands()  # built lazily otherwise, after the move
        cpu.move_to_huge_pages(self)
        self.native_decode = NativeDecode.for_model(self)
        return self.native_decode is not None

    def forward(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata,
                kv_caches: list[PagedKVCache]) -> Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden] (normed)."""
        native = getattr(self, "native_decode", None)
        if native is not None and native.takes(meta, input_ids.shape[0]):
            return native(*native.inputs(self, input_ids, positions), meta, kv_caches)[0]
        x, cos, sin = self._embed(input_ids, positions)
        residual = None
        for layer, cache in zip(self.model.layers, kv_caches):
            x, residual = layer(x, residual, cos, sin, cache, meta)
        return self.model.norm(x, residual)

    def _embed(self, input_ids: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """-> token embeddings [T, hidden], RoPE cos and signed sin [T, 1, D]."""
        cos = self.cos.index_select(0, positions).unsqueeze(1)
        return self.model.embed_tokens(input_ids), cos, self.sin_signed.index_select(0, positions).unsqueeze(1)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, hidden] -> logits [N, vocab] float32."""
        return self.lm_head(hidden).float()

    def forward_logits(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata,
                       kv_caches: list[PagedKVCache], logit_rows: list[int]
                       ) -> tuple[Tensor, Tensor, Tensor | None]:
        """forward and compute_logits of the rows `logit_rows` (indices into the T rows) -> (hidden [T, hidden],
        logits [len(logit_rows), vocab] float32, each logit row's argmax or None). The native decode step computes
        all three in one call."""
        native = getattr(self, "native_decode", None)
        if native is not None and native.has_head and native.takes(meta, input_ids.shape[0]):
            return native(*native.inputs(self, input_ids, positions), meta, kv_caches, logit_rows)
        hidden = self(input_ids, positions, meta, kv_caches)
        if not logit_rows:
            return hidden, hidden.new_empty(0, self.config.vocab_size, dtype=torch.float32), None
        return hidden, self.compute_logits(hidden[torch.tensor(logit_rows, device=hidden.device)]), None


_NO_ROWS = torch.empty(0, dtype=torch.long)


def longs(values: list[int], device: torch.device | None = None) -> Tensor:
    """A long tensor of `values`. Why not torch.tensor: it infers each element's type, and a decode step's eight
    few-element lists cost ~0.1 ms that way with caches cold after the weight stream (~3x this)."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    t = torch.frombuffer(array("q", values), dtype=torch.long)
    return t if device is None or device.type == "cpu" else t.to(device)

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
        self.scale = self.head_dim ** -0.5

    @classmethod
    def for_model(cls, model: CausalLM, input_proj: nn.Module | None = None) -> NativeDecode | None:
        """The native decode of `model`, or None where a layer does not fit it (then the modules run as usual).
        input_proj: a projection the call runs on its input first (an EAGLE draft's fc); its x is then that
        projection's input."""
        p = next(model.parameters())
        if p.device.type != "cpu" or p.dtype != torch.float32 or not cpu.available():
            return None
        weights: list[Tensor] = []
        spec: list[int] = []

        def add(t: Tensor) -> int:
            weights.append(t.contiguous())
            return len(weights) - 1

        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            mods = [getattr(attn, "qkv_proj", None), attn.o_proj, getattr(mlp, "gate_up_proj", None), mlp.down_proj]
            lins = [_native_linear(m, add) for m in mods]
            if any(x is None for x in lins):
                return None
            spec += [add(layer.input_layernorm.weight), add(layer.post_attention_layernorm.weight)]
            for x in lins:
                spec += x
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
            tables = [model.model.embed_tokens.weight, model.cos, model.sin_signed]
            if all(isinstance(t, Tensor) and t.dtype == torch.float32 and t.dim() == 2 for t in tables):
                native.tensors.set_tables(*(t.contiguous() for t in tables))
                native.has_tables = True
        return native

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
        self._bind(kv_caches)
        if sin is None:  # positions: the rows come from the tables
            cos, sin = cos, _NO_FLOATS
        else:
            cos, sin = cos.reshape(x.shape[0], -1), sin.reshape(x.shape[0], -1)
        return cpu.decode_layers(
            x.contiguous(), cos, sin, self.tensors,
            meta.slot_mapping, g.block_table, g.context_lens,
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
        return [5 if m.panels else 0, add(m.packed), -1, -1, 0, b, m.out_features]
    if isinstance(m, Int8WeightOnlyLinear) and m.in_features % 8 == 0:
        kind, q, scales = m.avx2_operands()
        return [kind, add(q), add(scales.float()), -1, 0, b, m.out_features]
    if isinstance(m, Int4WeightOnlyLinear) and m.group_size % 16 == 0:
        kind, packed, scale_min = m.avx2_operands()
        return [kind, add(packed), add(scale_min), -1, m.group_size, b, m.out_features]
    return None


def _fuse(parent: nn.Module, names: tuple[str, ...], fused_name: str) -> bool:
    """Replace plain nn.Linear siblings `names` by one nn.Linear `fused_name` (outputs concatenated in order).

    Only when all are exactly nn.Linear with the same dtype/device (i.e. not swapped for quantized kernels):
    one GEMM instead of several reads the input once and launches fewer ops, which matters at batch 1.
    """
    mods = [getattr(parent, n) for n in names]
    if any(type(m) is not nn.Linear for m in mods):
        return _fuse_quantized(parent, names, fused_name, mods)
    if len({(m.weight.dtype, m.weight.device) for m in mods}) != 1:
        return False
    w = torch.cat([m.weight for m in mods])
    has_bias = [m.bias is not None for m in mods]
    fused = nn.Linear(w.shape[1], w.shape[0], bias=any(has_bias), device=w.device, dtype=w.dtype)
    fused.weight.data.copy_(w)
    if any(has_bias):
        fused.bias.data.copy_(torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features, device=w.device,
                                         dtype=w.dtype) for m in mods]))
    for n in names:
        delattr(parent, n)
    setattr(parent, fused_name, fused.requires_grad_(False))
    return True


def _fuse_quantized(parent: nn.Module, names: tuple[str, ...], fused_name: str, mods: list[nn.Module]) -> bool:
    """Siblings quantized with one scheme (and group size) become one quantized Linear (`concat_quantized`)."""
    from accel.kernels.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear, concat_quantized

    kinds = {(type(m), getattr(m, "group_size", None)) for m in mods}
    if len(kinds) != 1 or not isinstance(mods[0], (Int8WeightOnlyLinear, Int4WeightOnlyLinear)):
        return False
    fused = concat_quantized(mods)
    for n in names:
        delattr(parent, n)
    setattr(parent, fused_name, fused)
    return True


def fuse_projections(model: CausalLM) -> list[str]:
    """Fuse q/k/v into `qkv_proj` and gate/up into `gate_up_proj` where they share one scheme (fp, int8, or int4
    with one group size); mixed-precision siblings stay separate.

    Run after a quantization plan was applied (plans name the HF modules); returns the fused module names.
    """
    fused = []
    for i, layer in enumerate(model.model.layers):
        if _fuse(layer.self_attn, ("q_proj", "k_proj", "v_proj"), "qkv_proj"):
            fused.append(f"model.layers.{i}.self_attn.qkv_proj")
        if _fuse(layer.mlp, ("gate_proj", "up_proj"), "gate_up_proj"):
            fused.append(f"model.layers.{i}.mlp.gate_up_proj")
    return fused


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> CausalLM:
    """Build the model from `path`/config.json and load its weights (HF names): plain tensors as stored, an
    export's quantized Linears as kernel modules (`accel.kernels.loader`, the one way from disk to kernels)."""
    from transformers import AutoConfig

    from accel.kernels.loader import load_weights

    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):  # the plan is in the weights
        del config.quantization_config
    with torch.device("meta"):
        model = CausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    if model.tie_word_embeddings:  # to_empty breaks the tie; restore it
        model.lm_head.weight = model.model.embed_tokens.weight
    load_weights(model, path, dtype, device, model.tie_word_embeddings)
    model.init_rope(device, dtype)
    return model.eval().requires_grad_(False)
