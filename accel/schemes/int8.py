"""int8: weight-only INT8, one symmetric fp16 scale per output row (compressed-tensors' channel strategy, W8A16)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.schemes.base import HEAD, TABLE, QuantScheme, kernels


if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn


def read_int8(state: dict[str, Tensor], prefix: str, bias: Tensor | None, a8: bool = False) -> nn.Module:
    """INT8 codes as stored (packed 8-bit, or an int8 `weight`; a tied table's lm_head reads the table's integers)
    with their scales, per channel or per group (int8g, int8 with a head group), into `Int8WeightOnlyLinear`."""
    import torch

    k = kernels()
    if f"{prefix}.weight_packed" in state:
        w = k.int8_from_compressed_tensors(state[f"{prefix}.weight_packed"], state[f"{prefix}.weight_shape"])
    else:
        w = state.get(f"{prefix}.weight")
        if w is None and prefix == HEAD:
            w = state[f"{TABLE}.weight"]
        if w.dtype != torch.int8:
            raise ValueError(f"{prefix}.weight is {w.dtype}; expected int8 for an int-quantized layer")
    scale = k.per_block_scales(state[f"{prefix}.weight_scale"], w.shape[1])
    if a8 and scale.dim() == 2 and scale.shape[1] > 1:
        raise ValueError(f"{prefix}: 8-bit activations (W8A8) need per-channel INT8 weights, not group-wise")
    return k.Int8WeightOnlyLinear.from_quantized(w, scale, bias=bias, a8=a8)


class Int8(QuantScheme):
    name = "int8"
    code_bits = 8
    rank = 40.0
    summary = "INT8 per output channel"
    head = True
    table = True
    ties_table = True
    on_load = True
    loaders = frozenset({"accel", "transformers", "vllm"})  # vLLM-CPU's WNA16 kernel takes 4-bit weights only
    format = "pack-quantized"  # vLLM loads weight-only INT8 (W8A16) from this format only

    def bits_per_weight(self, in_features: int, group_size: int) -> float:
        return 8.0 + 16.0 / in_features

    def fake_quant(self, w: Tensor, group_size: int) -> Tensor:
        return kernels().dequantize_int8_per_channel(*kernels().quantize_int8_per_channel(w)).to(w.dtype)

    def weights_args(self, group_size: int | None, w8a8_bits: int = 8) -> dict:
        return {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "scale_dtype": "float16"}

    def kernel(self, rows, out_features: int, in_features: int, group_size: int, bias: Tensor | None = None
               ) -> nn.Module:
        return kernels().Int8WeightOnlyLinear.from_rows(rows, out_features, in_features, None, bias)

    def held_bytes(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype) -> int:
        return out_features * in_features + 4 * out_features

    def stored_table(self, table: Tensor, group_size: int) -> tuple[dict[str, Tensor], str]:
        q, scale = kernels().quantize_int8_per_channel(table)
        return {"weight": q, "weight_scale": scale[:, None].half()}, "int-quantized"

    def reads(self, weights: dict, fmt: str | None, activations: dict | None) -> bool:
        return (not activations and weights.get("num_bits") == 8 and weights.get("type", "int") == "int"
                and weights.get("symmetric", True) and weights.get("strategy") == "channel")

    def read(self, state: dict[str, Tensor], prefix: str, bias: Tensor | None) -> nn.Module:
        return read_int8(state, prefix, bias, a8=bool(self.input_activations))

    def owns(self, module: nn.Module) -> bool:
        return isinstance(module, kernels().Int8WeightOnlyLinear) and not module.group_size and not module.a8
