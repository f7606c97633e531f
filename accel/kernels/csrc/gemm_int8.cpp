// gemm_int8.cpp: INT8 weights x 16-bit activations (AVX2 / AVX-512 VNNI rows).
#include "gemm_int8.h"
#include "gemm_vnni.h"
#include "threads.h"

// ---- INT8 weights x 16-bit activations ------------------------------------------------------------------------
// Widening every int8 weight to fp32 (load, sign-extend, convert, FMA: ~4 uops per 8 weights) made the INT8 GEMV
// compute-bound. Here the activations are rounded once to 16-bit integers per block of 32 inputs, each
// block with its own scale (error <= 1.5e-5 of the block's largest value, so an outlier channel costs its own block
// only; per-row or 14-bit scales let near-tied greedy tokens flip against transformers'), and 32 weights go through
// sign-extends, multiply-add pairs into int32 (vpmaddwd + vpaddd, or vpdpwssd with AVX512-VNNI) and one FMA of the
// block's scale. A row's result does not depend on the other rows of the call.
constexpr int XQ_MAX = 32767;  // 16-bit activations: a block of 32 sums at most 32 * 128 * 32767 < 2^31

// W8A8 (`a8`): each activation row rounded to 8-bit integers with one scale, as vLLM-CPU's dynamic per-token INT8
// quantization does (scale = max |x| / 127, q = x * float(1.0 / scale) rounded half to even, clamped); every block
// of the row then carries that scale, so the INT8 kernels compute W8A8's integer dot products exactly. The float
// reference is accel.kernels.linear.quantize_int8_per_token.
constexpr int XQ8_MAX = 127;
static void quantize_rows_i8(const float* x, int64_t M, int64_t K, QuantBlocks& r) {
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* xm = x + m * K;
      float amax = 0.f;
      for (int64_t i = 0; i < K; ++i) amax = std::max(amax, std::fabs(xm[i]));
      const float sc = amax > 0.f ? amax / XQ8_MAX : 1.f, inv = static_cast<float>(1.0 / sc);
      int16_t* q = r.q.data() + m * K;
      for (int64_t i = 0; i < K; ++i)
        q[i] = static_cast<int16_t>(std::clamp<float>(std::nearbyint(xm[i] * inv), -XQ8_MAX - 1, XQ8_MAX));
      std::fill_n(r.scale.data() + m * r.KB, r.KB, sc);
    }
  });
}

QuantBlocks quantize_blocks_i16(const float* x, int64_t M, int64_t K, bool permute, bool a8) {
  QuantBlocks r;
  r.KB = (K + 31) / 32;
  r.q.resize(M * K);
  r.scale.resize(M * r.KB);
  if (a8) {
    TORCH_CHECK(!permute, "8-bit activation rows are for INT8 weights");
    quantize_rows_i8(x, M, K, r);
    return r;
  }
  // rows in parallel only for prefill-sized M: at decode a parallel region costs more than the rows
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < r.KB; ++b) {
        const int64_t k0 = b * 32, n = std::min<int64_t>(32, K - k0);
        const float* xb = x + m * K + k0;
        int16_t* q = r.q.data() + m * K + k0;
        if (n == 32) {  // vectorized: called for every Linear of a decode step, where a scalar loop showed
          __m256 v[4];
          __m256 amax = _mm256_setzero_ps();
          const __m256 sign = _mm256_set1_ps(-0.f);
          for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
          }
          __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
          h = _mm_max_ps(h, _mm_movehl_ps(h, h));
          h = _mm_max_ss(h, _mm_movehdup_ps(h));
          const float mx = _mm_cvtss_f32(h);
          const float sc = mx > 0.f ? mx / XQ_MAX : 1.f;
          r.scale[m * r.KB + b] = sc;
          const __m256 inv = _mm256_set1_ps(1.f / sc);
          __m256i qi[4];  // cvtps rounds to nearest even, as lrint does in the default rounding mode
          for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
          // INT4 nibble order of a block: c0..7, c16..23, c8..15, c24..31
          const int a0 = 0, a1 = permute ? 2 : 1, a2 = permute ? 1 : 2, a3 = 3;
          const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[a0], qi[a1]), 0xD8);
          const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[a2], qi[a3]), 0xD8);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), lo);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), hi);
          continue;
        }
        float amax = 0.f;
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const float sc = amax > 0.f ? amax / XQ_MAX : 1.f, inv = 1.f / sc;
        r.scale[m * r.KB + b] = sc;
        for (int64_t i = 0; i < n; ++i) q[i] = static_cast<int16_t>(std::lrint(xb[i] * inv));
      }
  });
  return r;
}

// Group-wise INT8 ("int8g", the GGUF Q8_0 grid): one fp16 scale per row and block of 32 inputs, `gs` (uint16 bits) in
// the weight's own layout ([N, K / 32] beside the row layout, [N / 16, K / 32, 16] beside the tile layout), folded
// into the block's FMA (activation scale x weight scale); scale[n] is then 1. nullptr: per-channel INT8.
static inline float gscale_at(const uint16_t* gs, int64_t i) { return gs ? _cvtsh_ss(gs[i]) : 1.f; }

// Weight rows the row kernel prefetches ahead: ~9 KB of SmolLM2's 576-wide rows (whole engine steps barely changed
// between 8 and 64 rows).
constexpr int64_t PF_ROWS_I8 = 16;

// MB activation rows (1..4 or 8) against output rows [n0, n1): y[m, n] = scale[n] * sum_b xs[m, b] * gs[n, b] *
// dot_b(xq[m], q[n]).
// Defined twice by this macro: with vpmaddwd + vpaddd (AVX2), and inside a `target` region with vpdpwssd (the
// VNNI instruction may only appear in code compiled for it; the runtime check picks the version).
#define ACCEL_DEFINE_TILE_I16(NAME, DOT)                                                                         \
template <int MB>                                                                                              \
static void NAME(const int16_t* xq, const float* xs, int64_t KB, int64_t K, const int8_t* q, const float* scale, \
                 const uint16_t* gs, float* y, int64_t N, int64_t n0, int64_t n1) {                            \
  for (int64_t n = n0; n < n1; ++n) {                                                                          \
    const int8_t* row = q + n * K;                                                                             \
    const char* ahead = n + PF_ROWS_I8 < N ? reinterpret_cast<const char*>(row + PF_ROWS_I8 * K) : nullptr;    \
    __m256 tot[MB];                                                                                            \
    float tail[MB];                                                                                            \
    for (int m = 0; m < MB; ++m) { tot[m] = _mm256_setzero_ps(); tail[m] = 0.f; }                             \
    int64_t k = 0;                                                                                             \
    for (; k + 32 <= K; k += 32) {                                                                             \
      if (ahead && (k & 63) == 0) _mm_prefetch(ahead + k, _MM_HINT_T0);                                        \
      const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));     \
      const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16))); \
      const float g = gscale_at(gs, n * KB + k / 32);                                                          \
      for (int m = 0; m < MB; ++m) {                                                                           \
        __m256i a = DOT(_mm256_setzero_si256(), w0,                                                           \
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + k)));                \
        a = DOT(a, w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + k + 16)));             \
        tot[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(xs[m * KB + k / 32] * g), tot[m]);      \
      }                                                                                                        \
    }                                                                                                          \
    if (k < K)                                                                                                 \
      for (int m = 0; m < MB; ++m) {                                                                           \
        int32_t a = 0;                                                                                         \
        for (int64_t kk = k; kk < K; ++kk) a += static_cast<int32_t>(row[kk]) * xq[m * K + kk];                \
        tail[m] = static_cast<float>(a) * (xs[m * KB + k / 32] * gscale_at(gs, n * KB + k / 32));              \
      }                                                                                                        \
    const float s = scale[n];                                                                                  \
    for (int m = 0; m < MB; ++m) y[m * N + n] = (hsum256(tot[m]) + tail[m]) * s;                               \
  }                                                                                                            \
}

ACCEL_DEFINE_TILE_I16(tile_i16, ACCEL_DOT_MADD)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512vnni")
ACCEL_DEFINE_TILE_I16(tile_i16_vnni, ACCEL_DOT_VNNI)
#pragma GCC pop_options

void int8_gemm(const float* xp, int64_t M, int64_t K, const int8_t* qp, const float* sp, float* yp, int64_t N,
               const uint16_t* gs, bool a8) {
  const QuantBlocks xr = quantize_blocks_i16(xp, M, K, false, a8);
  if (HAS_VNNI && M >= VNNI_MIN_ROWS && K % 32 == 0) return vnni_gemm_i8_rows(xr, M, K, qp, sp, gs, yp, N);
  // Output rows in tiles of up to 64: a tile's weights (TN x K bytes, <= 32 KB so they stay in L1) are reused by
  // every 4-row block of x, so the weight is streamed from memory once per call whatever M is.
  const int64_t TN = std::clamp<int64_t>(32768 / K / 8 * 8, 8, 64), CR = chunk_rows(M, N, K, TN);
  parallel_chunks((N + CR - 1) / CR, [&](int64_t c) {
    for (int64_t n0 = c * CR, ce = std::min(N, n0 + CR); n0 < ce; n0 += TN) {
      const int64_t n1 = std::min(ce, n0 + TN);
      // 8 activation rows per pass over the tile when there are that many (prefill): the widened weights are
      // shared by more rows, so the pass is closer to compute-bound
      for (int64_t m0 = 0, mb; m0 < M; m0 += mb) {
        mb = M - m0 >= 8 ? 8 : std::min<int64_t>(4, M - m0);
        const int16_t* xm = xr.q.data() + m0 * K;
        const float* xs = xr.scale.data() + m0 * xr.KB;
        float* ym = yp + m0 * N;
#define ACCEL_TILE_I16(F, R) F<R>(xm, xs, xr.KB, K, qp, sp, gs, ym, N, n0, n1)
        if (HAS_VNNI) {
          switch (mb) {
            case 8: ACCEL_TILE_I16(tile_i16_vnni, 8); break;
            case 4: ACCEL_TILE_I16(tile_i16_vnni, 4); break; case 3: ACCEL_TILE_I16(tile_i16_vnni, 3); break;
            case 2: ACCEL_TILE_I16(tile_i16_vnni, 2); break; default: ACCEL_TILE_I16(tile_i16_vnni, 1);
          }
        } else {
          switch (mb) {
            case 8: ACCEL_TILE_I16(tile_i16, 8); break;
            case 4: ACCEL_TILE_I16(tile_i16, 4); break; case 3: ACCEL_TILE_I16(tile_i16, 3); break;
            case 2: ACCEL_TILE_I16(tile_i16, 2); break; default: ACCEL_TILE_I16(tile_i16, 1);
          }
        }
#undef ACCEL_TILE_I16
      }
    }
  });
}

const uint16_t* group_scales(const torch::Tensor& gs, int64_t N, int64_t K) {
  if (!gs.defined() || gs.numel() == 0) return nullptr;
  TORCH_CHECK(K % 32 == 0 && gs.scalar_type() == at::kHalf && gs.is_contiguous() && gs.numel() == N * (K / 32),
              "group scales: fp16 contiguous, one per output row and block of 32 inputs (K % 32 == 0)");
  return reinterpret_cast<const uint16_t*>(gs.data_ptr<at::Half>());
}

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale, torch::Tensor gs, bool a8) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1), "shapes: x [M, K], q [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat,
              "dtypes: x fp32, q int8, scale fp32");
  TORCH_CHECK(x.size(1) % 8 == 0, "K must be a multiple of 8");
  x = x.contiguous(); q = q.contiguous(); scale = scale.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  auto y = torch::empty({M, N}, x.options());
  int8_gemm(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), scale.data_ptr<float>(), y.data_ptr<float>(), N,
            group_scales(gs, N, K), a8);
  return y;
}
