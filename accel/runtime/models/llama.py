"""The Llama family (Llama, Mistral, Qwen2, Qwen3, Phi-3, SmolLM): pre-norm decoder layers of attention and a SwiGLU
MLP over the shared layers, tied or untied head; Qwen3 adds per-head q/k norms, Mistral and Qwen2 may slide a
window, Phi-3 stores q/k/v and gate/up fused (split on load, so plans name the same modules for every member).
A family file is this: its layer, its backbone and its `CausalLM` with `forward` over a flat batch and
`compute_logits` on the rows that sample.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from accel.kernels import cpu
from accel.runtime.attention import AttentionMetadata, PagedKVCache
from accel.runtime.kv_cache_manager import KVLayout
from accel.runtime.models.layers import MLP, Attention, LayerSpec, RMSNorm, rope_cos_sin, signed_sin
from accel.runtime.models.native import NativeDecode

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")


class DecoderLayer(nn.Module):
    def __init__(self, config, i: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, i, norm=RMSNorm if config.model_type == "qwen3" else None)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def spec(self) -> LayerSpec:
        """Llama: the pre-MLP norm is named post_attention_layernorm; Qwen3 adds q / k norms."""
        attn = self.self_attn
        return LayerSpec(self.input_layernorm, self.post_attention_layernorm, getattr(attn, "q_norm", None),
                         getattr(attn, "k_norm", None))

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
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Llama-family decoder: `forward` over a flat batch, `compute_logits` on the rows that sample."""

    backbone = Backbone

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.model = self.backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cos: Tensor | None = None
        self.sin_signed: Tensor | None = None

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    @property
    def kv_layout(self) -> KVLayout:
        """The layers' KV groups (by sliding window; one group unless windows differ between layers)."""
        return KVLayout.of([layer.self_attn.window for layer in self.model.layers])

    def checkpoint_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's tensors under this tree's names: Phi-3's fused qkv_proj and gate_up_proj split into
        the q/k/v and gate/up modules every member has (`fuse_projections` joins them again). A quantized fused
        module stays whole: its parts leave the tree and the loader puts its kernel module in their place."""
        if self.config.model_type != "phi3":
            return state
        h, kvh, d = self.config.num_attention_heads, self.num_kv_heads, self.head_dim
        parts_of = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
        for name in [k for k in state if k.endswith((".qkv_proj.weight_scale", ".gate_up_proj.weight_scale"))]:
            parent_name, fused = name.rsplit(".", 2)[:2]
            parent = self.get_submodule(parent_name)
            for part in parts_of[fused]:
                delattr(parent, part)
        out = {}
        for name, t in state.items():
            if name.endswith("self_attn.qkv_proj.weight"):
                parts = zip(("q_proj", "k_proj", "v_proj"), t.split([h * d, kvh * d, kvh * d]))
            elif name.endswith("mlp.gate_up_proj.weight"):
                parts = zip(("gate_proj", "up_proj"), t.chunk(2))
            else:
                out[name] = t
                continue
            prefix = name.rsplit(".", 2)[0]
            out.update({f"{prefix}.{mod}.weight": w.contiguous() for mod, w in parts})
        return out

    def post_load(self) -> None:
        """After the checkpoint's weights are in: what a family changes about them (nothing here)."""

    def init_rope(self, device: torch.device, dtype: torch.dtype) -> None:
        cos, sin = rope_cos_sin(self.config, self.config.max_position_embeddings, device)
        self.cos, self.sin_signed = cos.to(dtype), signed_sin(sin.to(dtype))  # rotate_half folded into the sign

    def prepare_cpu_decode(self) -> bool:
        """For the CPU: build the kernels' weight layouts now, move the weights into 2 MB pages, and run decode
        steps through one native call when every layer fits it (NativeDecode). True if the native call is on."""
        from accel.kernels.linear import Int4WeightOnlyLinear, Int8Embedding, Int8WeightOnlyLinear

        self.native_decode = None
        if next(self.parameters()).device.type != "cpu" or not cpu.available():
            return False
        tables = {m.qweight.data_ptr() for m in self.modules() if isinstance(m, Int8Embedding)}
        for m in self.modules():
            if isinstance(m, Int4WeightOnlyLinear) and m.group_size % 16 == 0 or isinstance(m, Int8WeightOnlyLinear):
                m.avx2_operands()  # built lazily otherwise, after the move
                if m.qweight.data_ptr() not in tables:  # a tied INT8 table gathers from the canonical rows
                    m.compact_()  # the kernel layout is now the weight's only copy
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
