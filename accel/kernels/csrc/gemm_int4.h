// gemm_int4.h: the INT4 weight format (group-wise scale and min), the INT4 GEMM on the row layout and dequantization
// (gemm_int4.cpp).
#pragma once

#include "common.h"

#pragma GCC visibility push(hidden)

// ---- INT4 (group-wise, w = q * scale + min with q in [0, 15]) --------------------------------------------
// Kernel layout (`int4_repack`): per row, every 16 consecutive inputs c0..c15 are 8 bytes, byte i holding c_i in
// its low nibble and c_{i+8} in its high one, so one 8-byte load widens to both halves with a mask and a shift.
// The float `min` form covers integer zero points (min = -zero * scale) and GGUF Q4_1 (scale d, min m) alike.
// Scales and mins are interleaved per group, sm[n, g] = (scale, min), in fp32 or, where that is exact (a GGUF
// grid's fp16 d and m), fp16 (uint16 bits): at group 32 the fp32 pair is half as many bytes again as the weights.
// A third form, `Z16` (int16 storage of fp16 bits), holds (scale, zero point) pairs instead: min = -zero * scale,
// formed in fp32 where it is read. With an fp16 scale and an integer zero in [0, 15] that product is exact, so an
// integer-zero-point INT4 (vLLM's W4A16 form) streams 4 bytes per group where fp32 pairs took 8: at group 64,
// 4.5 bits per weight instead of 5.0 (Q4_K_M's ~4.85).
struct Z16 { uint16_t h; };
inline float f32_of(float v) { return v; }
inline float f32_of(uint16_t h) { return _cvtsh_ss(h); }
inline float f32_of(Z16 v) { return _cvtsh_ss(v.h); }
// the min of the (scale, min) or (scale, zero) pair at p
template <typename S>
inline float min_of(const S* p) { return f32_of(p[1]); }
inline float min_of(const Z16* p) { return -(_cvtsh_ss(p[1].h) * _cvtsh_ss(p[0].h)); }

// the activations' sums per INT4 group, [M, K / gs] (the min term of every INT4 kernel)
std::vector<float> group_sums(const float* xp, int64_t M, int64_t K, int64_t gs);

// y [M, N] = sum_k x[m, k] (q[n, k] * scale[n, g] + min[n, g]), q in the row layout (`int4_repack`), on a
// scale_min tensor of any of its dtypes (fp32, fp16, or int16 (fp16 scale, zero point) pairs)
void int4_gemm_t(const float* x, int64_t M, int64_t K, const uint8_t* q, const torch::Tensor& sm, int64_t gs,
                 float* y, int64_t N);

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale_min, int64_t group_size);
torch::Tensor int4_dequant(torch::Tensor q, torch::Tensor scale_min, int64_t group_size, int64_t n0, int64_t n1);

#pragma GCC visibility pop
