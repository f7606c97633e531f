"""int8g: INT8 with one symmetric fp16 scale per 32 inputs (the GGUF Q8_0 form); an lm_head / table's group is the
recipe's lm_head_group_size. A group already on a grid of int8 codes keeps it (`accel.kernels.linear.grid_fit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.schemes.base import GRID_OBSERVER, HEAD, TABLE, QuantScheme, kernels


if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn


class Int8g(QuantScheme):
    name = "int8g"
    code_bits = 8
    rank = 50.0
    summary = "INT8 per group of 32 inputs (the GGUF Q8_0 form)"
    head = True
    table = True
    ties_table = True
    on_load = True
    loaders = frozenset({"accel", "transformers", "vllm"})
    format = "pack-quantized"
    code_range = 8  # the codes' bits: int5 is this with 5

    def bits_per_weight(self, in_features: int, group_size: int) -> float:
        return self.code_range + 16.0 / kernels().INT8_GROUP

    def group_of(self, name: str, int4_group: int, head_group: int) -> int | None:
        return head_group if name in (HEAD, TABLE) else kernels().INT8_GROUP

    def fake_quant(self, w: Tensor, group_size: int) -> Tensor:
        k = kernels()
        return k.dequantize_int8_per_channel(*k.quantize_symmetric_groupwise(w, group_size, self.code_range)).to(w.dtype)

    def weights_args(self, group_size: int | None, w8a8_bits: int = 8) -> dict:
        return {"num_bits": self.code_range, "type": "int", "symmetric": True, "strategy": "group",
                "group_size": group_size, "scale_dtype": "float16", "observer": GRID_OBSERVER}

    def kernel(self, rows, out_features: int, in_features: int, group_size: int, bias: Tensor | None = None
               ) -> nn.Module:
        return kernels().Int8WeightOnlyLinear.from_rows(rows, out_features, in_features, kernels().INT8_GROUP, bias)

    def held_bytes(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype) -> int:
        n = out_features * in_features
        return n + 2 * n // kernels().INT8_GROUP + 4 * out_features

    def check_width(self, in_features: int, group_size: int) -> str | None:
        if in_features % kernels().INT8_GROUP:
            return f"{self.name} needs in_features divisible by {kernels().INT8_GROUP}; got {in_features}"
        return None

    def stored_table(self, table: Tensor, group_size: int) -> tuple[dict[str, Tensor], str]:
        q, scale = kernels().quantize_int8_groupwise(table, group_size)
        return {"weight": q, "weight_scale": scale.half()}, "int-quantized"

    def reads(self, weights: dict, fmt: str | None, activations: dict | None) -> bool:
        return (not activations and weights.get("num_bits") == self.code_range and weights.get("type", "int") == "int"
                and weights.get("symmetric", True) and weights.get("strategy") == "group")

    def read(self, state: dict[str, Tensor], prefix: str, bias: Tensor | None) -> nn.Module:
        from accel.schemes.int8 import read_int8

        return read_int8(state, prefix, bias)

    def owns(self, module: nn.Module) -> bool:
        return isinstance(module, kernels().Int8WeightOnlyLinear) and bool(module.group_size)
