// common.h: what every unit includes: torch's tensor API, the intrinsics, the machine's capabilities and the SIMD
// helpers the kernels share.
#pragma once

#include <torch/types.h>  // not torch/extension.h: a unit parses the tensor API only (bindings.cpp adds pybind11)
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

// Every header declares its unit's names hidden: bound inside the extension, so a function shared between units is
// called directly (not through the PLT, never interposed) and may be inlined in its own unit, as a `static` one is.
// The module's init function (PYBIND11_MODULE) is the extension's one export. A template's instances take their
// visibility from their arguments, not from the pragma: a template other units call is declared ACCEL_HIDDEN.
#define ACCEL_HIDDEN __attribute__((visibility("hidden")))
#pragma GCC visibility push(hidden)

// What the machine runs beyond the AVX2 + FMA the kernels are built for, read once at load.
inline const bool HAS_VNNI = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512bw");  // the prefill GEMM widens bytes with AVX512-BW
inline const bool HAS_AVX512 = __builtin_cpu_supports("avx512f");

inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

// exp, Cephes-style: 2^n * p(r), rel. error ~1e-7; inputs clamped to [-87.3, 88.3] (0 / ~2e38 at the ends)
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(fx, c1));
  r = _mm256_sub_ps(r, _mm256_mul_ps(fx, c2));
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201E-1f));
  __m256 r2 = _mm256_mul_ps(r, r);
  y = _mm256_fmadd_ps(y, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i n = _mm256_cvtps_epi32(fx);
  n = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

#pragma GCC visibility pop
