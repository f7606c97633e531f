"""accel.quant: schemes, per-layer sensitivity, bit allocation, library-backed quantization, kernels.

Import the submodules directly (accel.quant.sensitivity, .allocate, .quantize, .run, .kernels); this package
file stays import-light so that `import accel.quant.kernels` does not pull in llm-compressor.
"""
