// gemm_int8.h: the activation rows every integer kernel takes (16-bit integers per block of 32, gemm_int8.cpp) and
// the INT8 GEMM on the row layout.
#pragma once

#include "common.h"

#pragma GCC visibility push(hidden)

// Activation rows as 16-bit integers per block of 32 inputs, one scale per row and block.
struct QuantBlocks {
  std::vector<int16_t> q;  // [M, K]
  std::vector<float> scale;  // [M, ceil(K / 32)]
  int64_t KB = 0;
};

// Activation rows -> 16-bit integers per block of 32; `permute` stores each block in the INT4 nibble order; `a8`:
// 8-bit integers per row instead (W8A8, `quantize_rows_i8`).
QuantBlocks quantize_blocks_i16(const float* x, int64_t M, int64_t K, bool permute, bool a8 = false);

// The int32 multiply-add of 16 int16 pairs into 8 lanes, for the kernels defined twice (AVX2, and in a VNNI `target`
// region): vpmaddwd + vpaddd, or vpdpwssd.
#define ACCEL_DOT_MADD(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
#define ACCEL_DOT_VNNI(acc, w, x) _mm256_dpwssd_epi32(acc, w, x)

// The group scales operand: fp16 [N, K / 32] values (in the weight's layout), or empty for per-channel INT8 (nullptr).
const uint16_t* group_scales(const torch::Tensor& gs, int64_t N, int64_t K);

// y [M, N] = (x [M, K] @ q[N, K]^T) * scale[N], with the group scales `gs` ([N, K / 32]) where given;
// a8: the activations as W8A8's 8-bit rows (`quantize_blocks_i16`)
void int8_gemm(const float* xp, int64_t M, int64_t K, const int8_t* qp, const float* sp, float* yp, int64_t N,
               const uint16_t* gs = nullptr, bool a8 = false);

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale, torch::Tensor gs, bool a8);

#pragma GCC visibility pop
