"""Gemma 3 (text): the Llama layout with Gemma's changes, over the shared layers.

- RMSNorm scales by (1 + w): the checkpoint's w gets + 1 once after loading, so the shared RMSNorm and its kernels
  run it unchanged.
- four norms per layer: before and after attention, before and after the MLP (the "post" norms apply to the
  block's output before it joins the residual stream).
- per-head q/k RMSNorm before RoPE; queries scaled by query_pre_attn_scalar^-1/2.
- GeGLU MLP with tanh GELU; embeddings multiplied by sqrt(hidden) (in the weights' dtype, as HF).
- sliding-window layers (`layer_types`) with their own RoPE base next to the global layers'.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from accel.runtime.attention import AttentionMetadata, PagedKVCache
from accel.runtime.models import llama
from accel.runtime.models.layers import MLP, Attention, LayerSpec, RMSNorm, rope_cos_sin, signed_sin

SUPPORTED_MODEL_TYPES = ("gemma3_text",)


class GemmaRMSNorm(RMSNorm):
    """RMSNorm whose checkpoint weight w means a scale of 1 + w (`CausalLM.post_load` adds the 1)."""


class DecoderLayer(nn.Module):
    def __init__(self, config, i: int) -> None:
        super().__init__()
        self.attention_type = config.layer_types[i]
        self.self_attn = Attention(config, i, norm=GemmaRMSNorm, scale=config.query_pre_attn_scalar ** -0.5)
        self.mlp = MLP(config)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def spec(self) -> LayerSpec:
        """Gemma 3: post-attention and post-MLP norms around a pre-MLP norm, q / k norms, a local rotary table on
        sliding layers."""
        return LayerSpec(self.input_layernorm, self.pre_feedforward_layernorm, self.self_attn.q_norm,
                         self.self_attn.k_norm, self.post_attention_layernorm, self.post_feedforward_layernorm,
                         self.attention_type == "sliding_attention")

    def forward(self, h: Tensor, residual: Tensor | None, ropes: dict[str, tuple[Tensor, Tensor]],
                cache: PagedKVCache, meta: AttentionMetadata) -> tuple[Tensor, Tensor]:
        """(h, residual) -> (h', residual'), as the Llama layer: the residual stream is updated in place."""
        if residual is None:
            residual = h.clone()
            x = self.input_layernorm(h)
        else:
            x = self.input_layernorm(h, residual)
        x = self.self_attn(x, *ropes[self.attention_type], cache, meta)
        x = self.pre_feedforward_layernorm(self.post_attention_layernorm(x), residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class Backbone(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(llama.CausalLM):
    """Gemma 3 text decoder (Gemma3ForCausalLM): the Llama engine interface, Gemma's layer."""

    backbone = Backbone

    def __init__(self, config) -> None:
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(config, name, None) is not None:
                raise NotImplementedError(f"{name}={getattr(config, name)} (Gemma 2); supported: None (Gemma 3)")
        super().__init__(config)
        self.ropes: dict[str, tuple[Tensor, Tensor]] = {}
        self.embed_scale = config.hidden_size ** 0.5

    def post_load(self) -> None:
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, GemmaRMSNorm):
                    m.weight.add_(1.0)

    def init_rope(self, device: torch.device, dtype: torch.dtype) -> None:
        """One cos / signed-sin table per layer type (each with its own RoPE parameters)."""
        self.tables = {}
        for kind, params in self.config.rope_parameters.items():
            view = _RopeView(self.config, params)
            cos, sin = rope_cos_sin(view, self.config.max_position_embeddings, device)
            self.tables[kind] = (cos.to(dtype), signed_sin(sin.to(dtype)))
        self.cos, self.sin_signed = self.tables["full_attention"]
        self.sin = None

    def forward(self, input_ids: Tensor, positions: Tensor, meta: AttentionMetadata,
                kv_caches: list[PagedKVCache]) -> Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden] (normed)."""
        native = getattr(self, "native_decode", None)
        if native is not None and native.takes(meta, input_ids.shape[0]):
            return native(*native.inputs(self, input_ids, positions), meta, kv_caches)[0]
        table = self.model.embed_tokens
        x = table(input_ids) * torch.tensor(self.embed_scale, dtype=getattr(table, "dtype", None) or table.weight.dtype)
        ropes = {kind: (cos.index_select(0, positions).unsqueeze(1), sin.index_select(0, positions).unsqueeze(1))
                 for kind, (cos, sin) in self.tables.items()}
        residual = None
        for layer, cache in zip(self.model.layers, kv_caches):
            x, residual = layer(x, residual, ropes, cache, meta)
        return self.model.norm(x, residual)


class _RopeView:
    """The config as `rope_cos_sin` reads it, with one layer type's RoPE parameters."""

    def __init__(self, config, params: dict) -> None:
        self._config, self.rope_parameters = config, params

    def __getattr__(self, name: str):
        return getattr(self._config, name)
