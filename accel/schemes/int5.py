"""int5: symmetric 5-bit codes per group of 32 with an fp16 scale (the GGUF Q5_0 form, exact on a Q5_0 release):
packed densely in the checkpoint (32 codes to five int32s), held as int8g codes at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel.schemes.base import kernels
from accel.schemes.int8g import Int8g

if TYPE_CHECKING:
    from torch import Tensor, nn


class Int5(Int8g):
    name = "int5"
    code_bits = 5
    rank = 30.0
    summary = "symmetric 5-bit per group of 32 (the GGUF Q5_0 form; not vLLM)"
    head = False
    table = False
    ties_table = False
    on_load = False
    loaders = frozenset({"accel", "transformers"})
    code_range = 5

    def group_of(self, name: str, int4_group: int, head_group: int) -> int | None:
        return kernels().INT5_GROUP

    def reads(self, weights: dict, fmt: str | None, activations: dict | None) -> bool:
        return fmt == "pack-quantized" and super().reads(weights, fmt, activations)  # 5-bit codes only packed

    def read(self, state: dict[str, Tensor], prefix: str, bias: Tensor | None) -> nn.Module:
        k = kernels()
        shape = state[f"{prefix}.weight_shape"]
        w = k.int5_from_compressed_tensors(state[f"{prefix}.weight_packed"], shape)
        return k.Int8WeightOnlyLinear.from_quantized(w, k.per_block_scales(state[f"{prefix}.weight_scale"],
                                                                           int(shape[1])), bias=bias)

    def owns(self, module) -> bool:
        return False  # held as int8g
