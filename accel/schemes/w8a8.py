"""w8a8: int8's weights with the input activations rounded to INT8 per token at run time, dynamically (vLLM's W8A8,
which its CPU kernels run where they run no weight-only INT8); the sensitivity rounds its weights only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.schemes.base import LOADERS, kernels
from accel.schemes.int8 import Int8

W8A8_ACTIVATIONS = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "token"}
"""The input activations accel runs (vLLM's dynamic per-token INT8, W8A8's): compressed-tensors' QuantizationArgs
fields that must hold; an export quantizing activations any other way is refused."""


def activation_mismatch(act: dict) -> dict:
    """The fields of an `input_activations` config where it differs from W8A8_ACTIVATIONS ({} where accel runs it)."""
    return {k: act.get(k) for k, v in W8A8_ACTIVATIONS.items() if act.get(k) != v}

if TYPE_CHECKING:
    from torch import Tensor, nn


class W8A8(Int8):
    name = "w8a8"
    rank = 41.0
    summary = "INT8 weights per channel, activations INT8 per token (vLLM's W8A8, which vLLM-CPU runs)"
    head = False
    table = False
    ties_table = False
    loaders = frozenset(LOADERS)  # vLLM-CPU's AVX2 build exactly only within 7 bits (`w8a8_weight_bits`)
    format = "int-quantized"
    input_activations = W8A8_ACTIVATIONS

    def weights_args(self, group_size: int | None, w8a8_bits: int = 8) -> dict:
        # w8a8_bits 7: quantized within [-64, 63], written as 8-bit (`accel.quant.quantize.widen_w8a8`)
        return {**super().weights_args(group_size), "num_bits": w8a8_bits}

    def reads(self, weights: dict, fmt: str | None, activations: dict | None) -> bool:
        # a 7-bit w8a8 is declared as the 8-bit weights it is stored as (`accel.quant.quantize.widen_w8a8`)
        bare = {**weights, "num_bits": 8}
        return bool(activations) and activation_mismatch(activations) == {} and super().reads(bare, fmt, None)

    def kernel(self, rows, out_features: int, in_features: int, group_size: int, bias: Tensor | None = None
               ) -> nn.Module:
        return kernels().Int8WeightOnlyLinear.from_rows(rows, out_features, in_features, None, bias, a8=True)

    def owns(self, module: nn.Module) -> bool:
        return isinstance(module, kernels().Int8WeightOnlyLinear) and bool(module.a8)
