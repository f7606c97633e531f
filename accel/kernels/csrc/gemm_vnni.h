// gemm_vnni.h: the AVX512-VNNI GEMMs (gemm_vnni.cpp): the prefill GEMMs on the row layouts, and the INT8 / INT4 tile
// layouts at every row count. Only where HAS_VNNI.
#pragma once

#include "common.h"
#include "gemm_int4.h"
#include "gemm_int8.h"

#pragma GCC visibility push(hidden)

// Decode and verify steps (up to 32 rows: the runtime's one-call decode path) keep the row kernels: the INT8 one's
// result for a row does not depend on the other rows of the call, so greedy output is the same with and without
// speculation. Weights in the VNNI tile layouts (`int8_linear_vnni`, `int4_linear_vnni`) take the tile kernels at
// every row count, with the prefill GEMMs' numerics.
constexpr int64_t VNNI_MIN_ROWS = 33;

// The prefill GEMMs on the row layouts, compiled for VNNI: y [M, N] = xr @ (q * scale[n])^T with the INT8 group
// scales `gs` ([N, K / 32]) where given; and the INT4 one, xsum the activations' group sums (`group_sums`), S as
// for int4_gemm (float, uint16_t or Z16; each instantiated in gemm_vnni.cpp).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
void vnni_gemm_i8_rows(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* q, const float* scale,
                       const uint16_t* gs, float* y, int64_t N);
template <typename S>
ACCEL_HIDDEN void vnni_gemm_i4_rows(const QuantBlocks& xr, const float* xsum, int64_t M, int64_t K, int64_t gs,
                                    const uint8_t* q, const S* sm, float* y, int64_t N);
#pragma GCC pop_options

// y [M, N] = (x [M, K] @ q^T) * scale[N], q (and gs) in the INT8 VNNI tile layout
void int8_gemm_vnni(const float* xp, int64_t M, int64_t K, const int8_t* qv, const float* sp, float* yp, int64_t N,
                    const uint16_t* gs = nullptr, bool a8 = false);
// the INT4 GEMM with q and scale_min in the INT4 VNNI tile layout, on a scale_min tensor of any of its dtypes
void int4_gemm_vnni_t(const float* x, int64_t M, int64_t K, const uint8_t* qv, const torch::Tensor& smv, int64_t gs,
                      float* y, int64_t N);

// the same with 8-bit activations per block of 32 (w4a8), q in the INT4 a8 tile layout, scale_min as for
// int4_gemm_vnni_t
void int4a8_gemm_vnni_t(const float* x, int64_t M, int64_t K, const uint8_t* qv, const torch::Tensor& smv, int64_t gs,
                        float* y, int64_t N);

torch::Tensor int4_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor smv, int64_t group_size);
torch::Tensor int4a8_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor smv, int64_t group_size);
torch::Tensor int8_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor scale, torch::Tensor gs, bool a8);

#pragma GCC visibility pop
