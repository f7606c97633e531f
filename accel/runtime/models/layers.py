"""The layers every family shares, over a flat token batch and a paged KV cache: RoPE (transformers' own frequency
functions, so every scaling type HF supports is computed as HF does), RMSNorm with the residual add fused,
attention with fused q/k/v (optional q/k norm and sliding window), the gated MLP. Module names are transformers' (`self_attn.q_proj`, `mlp.gate_proj`),
so HF safetensors load by name and a quantization plan `{hf_module_name: scheme}` applies by name; every projection
is a plain replaceable `nn.Linear`.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from accel.kernels import cpu
from accel.memory import STEADY_MMAP_THRESHOLD
from accel.runtime.attention import AttentionMetadata, PagedKVCache, paged_attention


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
    else:  # position-independent scalings (loading.ROPE_TYPES; family_of refuses the others)
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


@dataclass(frozen=True)
class LayerSpec:
    """What the native decode step runs of one decoder layer, declared by its family (`DecoderLayer.spec()`): the
    norm before attention and before the MLP, the optional q / k norms and the norms after attention and after the
    MLP (Gemma 3), and whether the layer's rotary table is the local one (sliding-window layers)."""

    pre_attn_norm: nn.Module
    pre_mlp_norm: nn.Module
    q_norm: nn.Module | None = None
    k_norm: nn.Module | None = None
    post_attn_norm: nn.Module | None = None
    post_mlp_norm: nn.Module | None = None
    local_rope: bool = False


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


def layer_window(config, i: int) -> int | None:
    """Layer i's sliding window (it attends to the last `window` positions, itself included), None if global:
    `layer_types` where the config has them (Gemma 3, Qwen2, Mistral in transformers 5), else every layer when a
    window is set and enabled."""
    window = getattr(config, "sliding_window", None)
    if window is None or not getattr(config, "use_sliding_window", True):
        return None
    types = getattr(config, "layer_types", None)
    if types is not None:
        return window if types[i] == "sliding_attention" else None
    return window


class Attention(nn.Module):
    """q/k/v projections, optional per-head q/k RMSNorm (Qwen3, Gemma 3: `norm` is the family's RMSNorm class),
    RoPE, paged attention over the layer's window, the output projection."""

    def __init__(self, config, layer_idx: int = 0, norm: type[nn.Module] | None = None,
                 scale: float | None = None) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5 if scale is None else scale
        self.window = layer_window(config, layer_idx)
        attn_bias = bool(getattr(config, "attention_bias", False))
        qkv_bias = attn_bias or config.model_type == "qwen2"  # Qwen2 always has q/k/v bias
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=attn_bias)
        if norm is not None:
            self.q_norm = norm(self.head_dim, config.rms_norm_eps)
            self.k_norm = norm(self.head_dim, config.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: PagedKVCache, meta: AttentionMetadata) -> Tensor:
        t, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if hasattr(self, "qkv_proj"):  # fused at load time (see fuse_projections)
            qkv = self.qkv_proj(x)  # [T, (H + 2 KVH) D]
            v = qkv[:, (h + kvh) * d:].view(t, kvh, d)
            if hasattr(self, "q_norm"):
                q, k = self._rope(*self._qk_norm(qkv[:, :h * d], qkv[:, h * d:(h + kvh) * d], t), cos, sin)
            elif _fused_cpu_ops(qkv):  # accel's RoPE kernel, in place on the q and k columns
                cpu.rope_(qkv, cos, sin, h + kvh, d)
                q, k = qkv[:, :h * d].view(t, h, d), qkv[:, h * d:(h + kvh) * d].view(t, kvh, d)
            else:  # q and k are adjacent columns: rotate them with one set of kernels, then split the result
                qk = apply_rope_rolled(qkv[:, :(h + kvh) * d].view(t, h + kvh, d), cos, sin)
                q, k = qk[:, :h], qk[:, h:]
        else:
            q, k = self.q_proj(x), self.k_proj(x)
            if hasattr(self, "q_norm"):
                q, k = self._qk_norm(q, k, t)
            q, k = self._rope(q.view(t, h, d), k.view(t, kvh, d), cos, sin)  # [T, H, D], [T, KVH, D]
            v = self.v_proj(x).view(t, kvh, d)
        o = paged_attention(q, k, v, cache, meta, self.scale, self.window)  # [T, H, D]
        return self.o_proj(o.reshape(t, -1))

    @staticmethod
    def _rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE of q [T, H, D] and k [T, KVH, D]: accel's kernel in place on contiguous fp32 CPU rows (as the
        native decode step runs it), else torch's ops."""
        t, d = q.shape[0], q.shape[-1]
        if q.is_contiguous() and k.is_contiguous() and _fused_cpu_ops(q.view(t, -1)):
            cpu.rope_(q.view(t, -1), cos, sin, q.shape[1], d)
            cpu.rope_(k.view(t, -1), cos, sin, k.shape[1], d)
            return q, k
        return apply_rope_rolled(q, cos, sin), apply_rope_rolled(k, cos, sin)

    def _qk_norm(self, q: Tensor, k: Tensor, t: int) -> tuple[Tensor, Tensor]:
        """q [T, H*D], k [T, KVH*D] -> each head's vector RMS-normed: [T, H, D], [T, KVH, D]."""
        d = self.head_dim
        return (self.q_norm(q.reshape(-1, d)).view(t, -1, d), self.k_norm(k.reshape(-1, d)).view(t, -1, d))


ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}
FUSED_ACTIVATIONS = {"silu": "silu_mul", "gelu_pytorch_tanh": "gelu_tanh_mul"}  # accel's kernels on [gate | up]


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU (Llama, Qwen) or GeGLU with tanh GELU (Gemma)."""

    def __init__(self, config) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
        if self.act not in ACTIVATIONS:
            raise NotImplementedError(f"hidden activation {self.act!r}; supported: {', '.join(ACTIVATIONS)}")

    def forward(self, x: Tensor) -> Tensor:
        # A long prompt runs in row blocks whose [gate | up] output stays under glibc's mmap threshold: above it each
        # call maps fresh pages and faults every one in (the 1.5B's 512-token prompt: 37 MB per layer). Rows are
        # batch-independent in every kernel, so the blocks compute what one call would.
        rows = x.numel() // x.shape[-1]
        block = max(32, STEADY_MMAP_THRESHOLD // (2 * self.down_proj.in_features * 4))
        if rows > block:
            x2 = x.reshape(rows, x.shape[-1])
            n = -(-rows // block)
            return torch.cat([self._forward(c) for c in x2.chunk(n)]).reshape(*x.shape[:-1], -1)
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        if hasattr(self, "gate_up_proj"):  # fused at load time (see fuse_projections)
            gu = self.gate_up_proj(x)
            if _fused_cpu_ops(gu):  # the native decode step runs the same kernel
                return self.down_proj(getattr(cpu, FUSED_ACTIVATIONS[self.act])(gu))
            gate, up = gu.chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(ACTIVATIONS[self.act](gate) * up)


def longs(values: list[int], device: torch.device | None = None) -> Tensor:
    """A long tensor of `values`. Why not torch.tensor: it infers each element's type, a cost a decode step's eight
    few-element lists pay with caches cold after the weight stream."""
    if not values:
        return torch.empty(0, dtype=torch.long, device=device)
    t = torch.frombuffer(array("q", values), dtype=torch.long)
    return t if device is None or device.type == "cpu" else t.to(device)
