"""accel.quant: schemes, per-layer sensitivity, bit allocation, library-backed quantization, scale tuning.

Import the submodules directly (accel.quant.sensitivity, .allocate, .quantize, .run); this package file stays
import-light so that importing one does not pull in llm-compressor. The kernels and the one rounding live below
it, in accel.kernels.
"""
