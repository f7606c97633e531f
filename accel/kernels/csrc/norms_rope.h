// norms_rope.h: the decoder's small ops on fp32 rows (norms_rope.cpp): RMSNorm with the residual add, SwiGLU and
// GeGLU, RoPE, KV cache writes. The *_raw ones and rms_rows run inside the one-call decode step.
#pragma once

#include "common.h"

#pragma GCC visibility push(hidden)

// out = RMSNorm(x) * w over `rows` rows of H; with `add`, res += x first and the norm is of res
void rms_rows(const float* x, float* res, const float* w, float* out, int64_t rows, int64_t H, double eps, bool add);
// gu [T, 2I] (gate | up) -> silu(gate) * up, or gelu_tanh(gate) * up, into op [T, I]
void silu_mul_raw(const float* gp, int64_t T, int64_t I, float* op);
void gelu_tanh_mul_raw(const float* gp, int64_t T, int64_t I, float* op);
// RoPE in place on the first `nheads` heads of each of the T rows of x (row stride rs); cos / sin_signed rows [T, D]
void rope_raw(float* xp, int64_t T, int64_t rs, const float* cp, const float* sp, int64_t nheads, int64_t D);

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps);
torch::Tensor add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps);
torch::Tensor silu_mul(torch::Tensor gu);
torch::Tensor gelu_tanh_mul(torch::Tensor gu);
void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin_signed, int64_t nheads, int64_t D);
void kv_write_(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor k, torch::Tensor v, torch::Tensor slots);

#pragma GCC visibility pop
