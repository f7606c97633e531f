// gemm_f32.h: the fp32 GEMMs (gemm_f32.cpp): [N, K] weights for a few rows, and AVX-512 weight panels (fp32 or fp16)
// at any row count.
#pragma once

#include "common.h"

#pragma GCC visibility push(hidden)

constexpr int64_t PANEL = 48;  // outputs per weight panel: [ceil(N / 48), K, 48]

// y [M, N] = x [M, K] @ w [N, K]^T in fp32 (decode sizes, M <= 96)
void f32_gemm(const float* xp, int64_t M, int64_t K, const float* wp, float* yp, int64_t N);

// y [M, N] = x [M, K] @ w^T with w as panels of W (float, or uint16_t fp16 bits; both instantiated in gemm_f32.cpp);
// only where HAS_AVX512
template <typename W>
ACCEL_HIDDEN void panel_gemm(const float* x, int64_t M, int64_t K, const W* p, float* y, int64_t N);

torch::Tensor f32_linear(torch::Tensor x, torch::Tensor w);
torch::Tensor f32_panel_linear(torch::Tensor x, torch::Tensor p, int64_t N);

#pragma GCC visibility pop
