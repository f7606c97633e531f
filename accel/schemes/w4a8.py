"""w4a8: int4's weights (asymmetric per group, integer zero point) with the input activations rounded to 8-bit
integers per block of 32 at run time (llama.cpp's Q8 blocks, which its 4-bit dot products take). At 16-bit
activations the INT4 kernels are bound by the VNNI multiply rate; at 8 bits `vpdpbusd` takes the nibbles unwidened
and does twice the multiply-adds per instruction (docs/DESIGN.md, Quantization: `w4a8`). Stored as int4 is, with
the activations' rounding declared; only accel runs it. The sensitivity rounds its weights only."""

from __future__ import annotations

from accel.schemes.int4 import Int4

W4A8_ACTIVATIONS = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True, "strategy": "group",
                    "group_size": 32}
"""The input activations accel runs for w4a8 (`accel.kernels.linear.quantize_activation_blocks_int8`), as
compressed-tensors' QuantizationArgs fields."""


class W4A8(Int4):
    name = "w4a8"
    rank = 11.0
    summary = "INT4 per group as int4, activations INT8 per block of 32 (twice int4's multiply rate; accel only)"
    table = False
    searched = True
    loaders = frozenset({"accel"})
    a8 = True
    input_activations = W4A8_ACTIVATIONS

    def reads(self, weights: dict, fmt: str | None, activations: dict | None) -> bool:
        act = activations or {}
        return bool(activations) and all(act.get(k) == v for k, v in W4A8_ACTIVATIONS.items()) and super().reads(
            weights, fmt, None)
