"""int4f: int4 with a floating-point (fp16) zero point per group: the GGUF Q4_1 / HQQ form, exact on weights of such
a release. Written as compressed-tensors' block strategy so the zero points stay float; transformers and accel load
it, vLLM has no kernel for float zero points. It joins int4's candidates where it is far better than int4
(`joins_beside`)."""

from __future__ import annotations

from accel.schemes.base import GRID_OBSERVER
from accel.schemes.int4 import Int4


class Int4f(Int4):
    name = "int4f"
    rank = 20.0
    summary = "INT4 per group, fp16 zero point (the GGUF Q4_1 form; not vLLM)"
    table = False
    float_zero = True
    searched = False
    joins_beside = "int4"
    zero_bits = 16
    loaders = frozenset({"accel", "transformers"})
    format = "int-quantized"  # llm-compressor's container; accel.quant.quantize.pack_int4f packs it to 4 bits

    def weights_args(self, group_size: int | None, w8a8_bits: int = 8) -> dict:
        return {**super().weights_args(group_size), "zp_dtype": "float16", "observer": GRID_OBSERVER}
