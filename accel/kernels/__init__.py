"""The kernels below the runtime and quantization: `cpu` (the hand-written CPU kernels, csrc/ split by job, one
build), `linear` (the quantized and packed Linear modules and the one RTN rounding every part uses) and `loader`
(a checkpoint's tensors to those modules, the one way in). Imports nothing of accel above it
but the scheme registry (`accel.schemes`), which says which module runs which scheme."""
