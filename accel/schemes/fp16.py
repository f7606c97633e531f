"""fp16: the model's 16-bit dtype (kept in fp32 on a CPU, still counted as 16 bits): the fallback every loader takes."""

from __future__ import annotations

from accel.schemes.base import QuantScheme


class Fp16(QuantScheme):
    name = "fp16"
    code_bits = 16
    rank = 100.0
    summary = "the model's 16-bit dtype (fp32 where the device prefers it)"
    head = True
    table = True
