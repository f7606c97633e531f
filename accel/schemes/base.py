"""What a quantization scheme is: one object that owns everything accel knows about one form of weights.

A scheme (vLLM's `compressed_tensors/schemes/` is the model) declares its cost in bits, its rounding, the
compressed-tensors arguments llm-compressor writes it with, the kernel module the runtime runs it in, which
loaders take it and where a recipe may use it. Everything that lists or dispatches on schemes (the recipe's
allowed values and bits floor, `--quant`'s choices, the allocator, the export's config groups, the loader table)
reads the registry (`accel.schemes`) instead of naming them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

Rows = Callable[[int, int], "Tensor"]
"""rows(a, b) -> the float weight's rows a..b: a quantizer reads a large weight a block at a time."""

LOADERS = ("accel", "transformers", "vllm", "vllm-cpu", "vllm-cpu-avx2")
"""The loaders an export is checked against (`accel.export.compatibility`)."""
HEAD = "lm_head"
TABLE = "model.embed_tokens"
"""The token table (Llama family naming); tied to the lm_head in small models."""
GRID_OBSERVER = "accel_grid"
"""llm-compressor observer of accel's own rounding (`accel.quant.quantize.register_grid_observer`): a group already
on a grid of the scheme's codes keeps it, any other is min-max, as the fake quantization rounds."""


def kernels():
    """`accel.kernels.linear` (the roundings and kernel modules), imported when a scheme first computes: the registry
    itself loads without torch, for the recipe and its schema."""
    from accel.kernels import linear

    return linear


class QuantScheme:
    """One scheme. Subclasses set the class attributes and override what differs; instances are registered."""

    name: str = ""
    code_bits: int = 16
    """Bits of one stored code (16: not quantized)."""
    rank: float = 0.0
    """Order from cheapest to most expensive as stored: allocation demotes towards lower ranks."""
    summary: str = ""
    """One line for the recipe's description and `--help`."""
    candidate: bool = True
    """The allocator may offer it (a recipe's `candidates` and `overrides`)."""
    joins_beside: str | None = None
    """A candidate it joins, unasked, where its RTN weight error is far under that one's (a form some releases'
    grids take: `accel.quant.plan.joining_candidates`), if the export's loader takes it."""
    head: bool = False
    """It may quantize the lm_head."""
    table: bool = False
    """It may hold an untied model's token table (`accel.quant.quantize.quantize_table`)."""
    ties_table: bool = False
    """An lm_head at this scheme can store a tied table once, at its own integers (`tie_int8_table`)."""
    on_load: bool = False
    """`--quant` may round a plain model to it as it loads (RTN)."""
    loaders: frozenset[str] = frozenset(LOADERS)
    """The loaders that take a Linear at this scheme (widths and fused-module rules come on top)."""
    format: str | None = None
    """compressed-tensors format of its config group (None: written unquantized)."""
    group_sized: bool = False
    """Its groups follow the recipe's INT4 group size (`int4_group_size`, chosen per unit by the allocator)."""
    float_zero: bool = False
    """Its zero points are floats (not integer codes)."""
    searched: bool = False
    """GPTQ takes llm-compressor's imatrix-weighted MSE observer for its scales (`accel.quant.quantize`)."""

    @property
    def quantized(self) -> bool:
        return self.code_bits < 16

    def bits_per_weight(self, in_features: int, group_size: int) -> float:
        """Storage bits per weight including scales and zero points, as the checkpoint stores them."""
        return 16.0

    def floor_bits(self, group_size: int) -> float:
        """The fewest bits a weight of this scheme can cost (the widest Linear), at INT4 group size `group_size`."""
        return self.bits_per_weight(math.inf, group_size)  # type: ignore[arg-type]

    def group_of(self, name: str, int4_group: int, head_group: int) -> int | None:
        """The group of inputs per scale Linear `name` is written at (`head_group`: an int8g lm_head / table's)."""
        return int4_group if self.group_sized else None

    def fake_quant(self, w: Tensor, group_size: int) -> Tensor:
        """Round a [out, in] float weight to this scheme and back (RTN), as the checkpoint would store it."""
        return w

    def weights_args(self, group_size: int | None, w8a8_bits: int = 8) -> dict:
        """compressed-tensors `QuantizationArgs` fields of its weights (llm-compressor writes the checkpoint)."""
        raise ValueError(f"scheme {self.name!r} is not quantized: it has no compressed-tensors weights")

    input_activations: dict | None = None
    """compressed-tensors `input_activations` of its config group (None: weight-only)."""

    def kernel(self, rows: Rows, out_features: int, in_features: int, group_size: int,
               bias: Tensor | None = None) -> nn.Module:
        """The runtime's kernel module of a weight rounded to this scheme (RTN), read a block of rows at a time."""
        raise ValueError(f"scheme {self.name!r} is not quantized: it has no kernel module")

    def held_bytes(self, out_features: int, in_features: int, group_size: int, dtype: torch.dtype) -> int:
        """Bytes its weight holds once loaded for the CPU kernels (bias not counted)."""
        return out_features * in_features * dtype.itemsize

    def reads(self, weights: dict, fmt: str | None, activations: dict | None) -> bool:
        """Whether a compressed-tensors config group (its weights' `QuantizationArgs` fields, format and input
        activations) stores this scheme (`accel.schemes.identify`)."""
        return False

    def read(self, state: dict[str, Tensor], prefix: str, bias: Tensor | None) -> nn.Module:
        """The kernel module of stored Linear `prefix` (its compressed-tensors tensors in `state`, HF names)."""
        raise ValueError(f"scheme {self.name!r} is not quantized: nothing to read")

    def stored_table(self, table: Tensor, group_size: int) -> tuple[dict[str, Tensor], str]:
        """An embedding table [V, H] rounded to this scheme (RTN, a row a token's vector) as the checkpoint stores
        it: ({tensor suffix: tensor}, compressed-tensors format). Only schemes with the `table` role have one."""
        raise ValueError(f"scheme {self.name!r} does not store a token table")

    def check_width(self, in_features: int, group_size: int) -> str | None:
        """Why a Linear of `in_features` inputs cannot take this scheme (None: it can)."""
        return None

    def owns(self, module: nn.Module) -> bool:
        """Whether a kernel module runs this scheme (`accel.schemes.scheme_of`)."""
        return False

    def __repr__(self) -> str:
        return f"<scheme {self.name}>"
