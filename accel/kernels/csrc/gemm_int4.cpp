// gemm_int4.cpp: INT4 weights x 16-bit activations, dequantization.
#include "gemm_int4.h"
#include "gemm_int8.h"
#include "gemm_vnni.h"
#include "threads.h"

std::vector<float> group_sums(const float* xp, int64_t M, int64_t K, int64_t gs) {
  const int64_t G = K / gs;
  std::vector<float> xsum(M * G);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float acc = 0.f;
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) acc += xp[m * K + k];
      xsum[m * G + g] = acc;
    }
  return xsum;
}

// Weight rows the row kernels prefetch ahead: ~2.3 KB of SmolLM2's 576-wide rows (as PF_ROWS_I8).
constexpr int64_t PF_ROWS_I4 = 8;

// ---- INT4 weights x fp32 activations (groups not made of whole blocks of 32) ---------------------------------
// y[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, g] + min[n, g]), the min term as min * (sum of x over the group)
template <int MB, typename S>
static void tile4(const float* x, const float* xsum, int64_t K, int64_t G, int64_t gs, const uint8_t* q,
                  const S* sm, float* y, int64_t N, int64_t n0, int64_t n1) {
  const __m256i lowmask = _mm256_set1_epi32(0xF);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * (K / 2);
    __m256 tot[MB];
    float mterm[MB];
    for (int m = 0; m < MB; ++m) { tot[m] = _mm256_setzero_ps(); mterm[m] = 0.f; }
    for (int64_t g = 0; g < G; ++g) {
      __m256 a[MB];
      for (int m = 0; m < MB; ++m) a[m] = _mm256_setzero_ps();
      for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2)));
        __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, lowmask));
        __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
        for (int m = 0; m < MB; ++m) {
          a[m] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + m * K + k), a[m]);
          a[m] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + m * K + k + 8), a[m]);
        }
      }
      const __m256 s = _mm256_set1_ps(f32_of(sm[2 * (n * G + g)]));
      const float mn = min_of(sm + 2 * (n * G + g));
      for (int m = 0; m < MB; ++m) {
        tot[m] = _mm256_fmadd_ps(s, a[m], tot[m]);
        mterm[m] += mn * xsum[m * G + g];
      }
    }
    for (int m = 0; m < MB; ++m) y[m * N + n] = hsum256(tot[m]) + mterm[m];
  }
}

// ---- INT4 weights x 16-bit activations ------------------------------------------------------------------------
// The widening kernel above spends ~17 uops per 32 weights (unpack, convert, two FMAs per 8 weights) and ran
// compute-bound. Here the activations are 16-bit integers per block of 32, as for INT8 (`quantize_blocks_i16`),
// and 32 weights cost a 16-byte load zero-extended to int16 lanes, a nibble split, two multiply-adds into int32
// (vpmaddwd + vpaddd, or vpdpwssd with AVX512-VNNI) and one FMA of the group scale x block scale. Rounding the
// activations to int8 per block (llama.cpp's Q8) would halve the uops again, but it moved the real model's greedy
// tokens away from transformers'; 16 bits keep them equal. The nibble layout puts inputs c0..7,
// c16..23 in the low nibbles of 16 bytes and c8..15, c24..31 in the high ones: the activations are stored so.
// A row's group scales and mins are deinterleaved 8 groups at a time first, its min term is one vector dot
// product, and each block's scale x activation-scale product is stored, so the block loop is only loads, nibble
// splits, multiply-adds and one FMA from a broadcast load: the per-group scalar work (fp16 converts, scalar
// multiplies, broadcasts) had been ~half the loop's uops and held the kernel compute-bound.
static inline void load_pairs8(const float* p, __m256& s, __m256& m) {
  const __m256 a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
  m = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}
static inline void load_pairs8(const uint16_t* p, __m256& s, __m256& m) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256 a = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
  m = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}
static inline void load_pairs8(const Z16* p, __m256& s, __m256& m) {  // (scale, zero): min = -zero * scale
  __m256 z;
  load_pairs8(reinterpret_cast<const uint16_t*>(p), s, z);
  m = _mm256_mul_ps(_mm256_set1_ps(-1.f), _mm256_mul_ps(z, s));
}

// sc[g], mn[g] for a row's G groups from its interleaved (scale, min) pairs
template <typename S>
static inline void row_scales(const S* sm, int64_t G, float* sc, float* mn) {
  int64_t g = 0;
  for (; g + 8 <= G; g += 8) {
    __m256 s, m;
    load_pairs8(sm + 2 * g, s, m);
    _mm256_storeu_ps(sc + g, s);
    _mm256_storeu_ps(mn + g, m);
  }
  for (; g < G; ++g) { sc[g] = f32_of(sm[2 * g]); mn[g] = min_of(sm + 2 * g); }
}

static inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float r = hsum256(acc);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// one block of 32 INT4 weights (16 bytes at row + b * 16) against MB activation rows, into accumulators T
// one block of 32 INT4 weights (16 bytes at row + b * 16) against MB activation rows, into accumulators T, each
// row m's int32 sum scaled by SCALE (an expression of m)
#define ACCEL_INT4_BLOCK(DOT, b, T, SCALE)                                                                       \
  {                                                                                                            \
    const int64_t k = (b) * 32;                                                                                \
    /* bytes zero-extended to int16 lanes: the low nibble is lane & 15, the high one lane >> 4 */              \
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));     \
    const __m256i wa = _mm256_and_si256(v, mask), wb = _mm256_srli_epi16(v, 4);                                \
    for (int m = 0; m < MB; ++m) {                                                                             \
      __m256i a = DOT(_mm256_setzero_si256(), wa, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + k)));  \
      a = DOT(a, wb, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + k + 16)));               \
      T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), SCALE, T[m]);                                              \
    }                                                                                                          \
  }

// One activation row (decode): the row's scales and mins are deinterleaved (`row_scales`), each block's group
// scale x activation scale is stored, and the block loop FMAs from a broadcast load with two accumulators (even /
// odd blocks) against the FMA latency. More rows: those passes cost more than they saved, so the scale product is
// formed per block and the min term per group.
#define ACCEL_DEFINE_TILE4W(NAME, DOT)                                                                           \
template <int MB, typename S>                                                                                  \
static void NAME(const int16_t* xq, const float* xs, int64_t KB, const float* xsum, int64_t K, int64_t G,        \
                 int64_t gs, const uint8_t* q, const S* sm, float* y, int64_t N, int64_t n0, int64_t n1) {      \
  const __m256i mask = _mm256_set1_epi16(0x0F);                                                               \
  const int64_t bpg = gs / 32;  /* blocks of 32 per group */                                                   \
  std::vector<float> buf(MB == 1 ? 2 * G + KB : 0);  /* one row only */                                         \
  float* sc = buf.data();                                                                                      \
  float* mn = sc + G;                                                                                          \
  float* wsx = mn + G;  /* [KB] with one row: group scale x block activation scale */                         \
  for (int64_t n = n0; n < n1; ++n) {                                                                          \
    const uint8_t* row = q + n * (K / 2);                                                                      \
    const char* ahead = n + PF_ROWS_I4 < N ? reinterpret_cast<const char*>(row + PF_ROWS_I4 * (K / 2)) : nullptr; \
    __m256 t0[MB];                                                                                             \
    float mterm[MB];                                                                                           \
    for (int m = 0; m < MB; ++m) t0[m] = _mm256_setzero_ps();                                                  \
    if constexpr (MB == 1) {                                                                                   \
      row_scales(sm + 2 * n * G, G, sc, mn);                                                                   \
      mterm[0] = dot_f32(mn, xsum, G);                                                                         \
      if (bpg == 1) {                                                                                          \
        int64_t b = 0;                                                                                         \
        for (; b + 8 <= KB; b += 8)                                                                            \
          _mm256_storeu_ps(wsx + b, _mm256_mul_ps(_mm256_loadu_ps(sc + b), _mm256_loadu_ps(xs + b)));          \
        for (; b < KB; ++b) wsx[b] = sc[b] * xs[b];                                                            \
      } else if (bpg == 2) {  /* group 64: each group scale twice; a scalar loop here showed on short rows */    \
        const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);                                         \
        int64_t b = 0;                                                                                         \
        for (; b + 8 <= KB; b += 8) {                                                                          \
          const __m256 s2 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sc + b / 2)), dup);   \
          _mm256_storeu_ps(wsx + b, _mm256_mul_ps(s2, _mm256_loadu_ps(xs + b)));                               \
        }                                                                                                      \
        for (; b < KB; ++b) wsx[b] = sc[b / 2] * xs[b];                                                        \
      } else {                                                                                                 \
        for (int64_t g = 0, b = 0; g < G; ++g)                                                                 \
          for (int64_t j = 0; j < bpg; ++j, ++b) wsx[b] = sc[g] * xs[b];                                       \
      }                                                                                                        \
      __m256 t1[1] = {_mm256_setzero_ps()};                                                                    \
      int64_t b = 0;                                                                                           \
      for (; b + 2 <= KB; b += 2) {                                                                            \
        if (ahead && (b & 3) == 0) _mm_prefetch(ahead + b * 16, _MM_HINT_T0);                                  \
        ACCEL_INT4_BLOCK(DOT, b, t0, _mm256_broadcast_ss(wsx + b))                                             \
        ACCEL_INT4_BLOCK(DOT, b + 1, t1, _mm256_broadcast_ss(wsx + b + 1))                                     \
      }                                                                                                        \
      if (b < KB) ACCEL_INT4_BLOCK(DOT, b, t0, _mm256_broadcast_ss(wsx + b))                                   \
      t0[0] = _mm256_add_ps(t0[0], t1[0]);                                                                     \
    } else {                                                                                                   \
      for (int m = 0; m < MB; ++m) mterm[m] = 0.f;                                                             \
      for (int64_t g = 0, b = 0; g < G; ++g) {                                                                 \
        const float ws = f32_of(sm[2 * (n * G + g)]), mn_g = min_of(sm + 2 * (n * G + g));                     \
        for (int64_t j = 0; j < bpg; ++j, ++b) {                                                               \
          if (ahead && (b & 3) == 0) _mm_prefetch(ahead + b * 16, _MM_HINT_T0);                                \
          ACCEL_INT4_BLOCK(DOT, b, t0, _mm256_set1_ps(ws * xs[m * KB + b]))                                    \
        }                                                                                                      \
        for (int m = 0; m < MB; ++m) mterm[m] += mn_g * xsum[m * G + g];                                       \
      }                                                                                                        \
    }                                                                                                          \
    for (int m = 0; m < MB; ++m) y[m * N + n] = hsum256(t0[m]) + mterm[m];                                     \
  }                                                                                                            \
}

ACCEL_DEFINE_TILE4W(tile4w, ACCEL_DOT_MADD)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512vnni")
ACCEL_DEFINE_TILE4W(tile4w_vnni, ACCEL_DOT_VNNI)
#pragma GCC pop_options

template <typename S>
static void int4_gemm(const float* xp, int64_t M, int64_t K, const uint8_t* qp, const S* smp, int64_t gs, float* yp,
                      int64_t N) {
  const int64_t G = K / gs;
  const std::vector<float> xsum = group_sums(xp, M, K, gs);
  const float* xs = xsum.data();
  const bool blocks = gs % 32 == 0;  // the integer path needs whole blocks of 32 per group
  if (blocks && HAS_VNNI && M >= VNNI_MIN_ROWS)
    return vnni_gemm_i4_rows(quantize_blocks_i16(xp, M, K, false), xs, M, K, gs, qp, smp, yp, N);
  const QuantBlocks xr = blocks ? quantize_blocks_i16(xp, M, K, true) : QuantBlocks{};
  const int64_t TN = std::clamp<int64_t>(65536 / K / 8 * 8, 8, 64);  // a tile's K / 2-byte rows stay in L1
  const int64_t CR = chunk_rows(M, N, K / 2 + G * 2 * static_cast<int64_t>(sizeof(S)), TN);
  parallel_chunks((N + CR - 1) / CR, [&](int64_t c) {
    for (int64_t n0 = c * CR, ce = std::min(N, n0 + CR); n0 < ce; n0 += TN) {
      const int64_t n1 = std::min(ce, n0 + TN);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const float* xsm = xs + m0 * G;
        float* ym = yp + m0 * N;
        const int mb = static_cast<int>(std::min<int64_t>(4, M - m0));
        if (blocks) {
          const int16_t* xq = xr.q.data() + m0 * K;
          const float* xrs = xr.scale.data() + m0 * xr.KB;
#define ACCEL_TILE4W(F, R) F<R, S>(xq, xrs, xr.KB, xsm, K, G, gs, qp, smp, ym, N, n0, n1)
          if (HAS_VNNI) {
            switch (mb) { case 4: ACCEL_TILE4W(tile4w_vnni, 4); break; case 3: ACCEL_TILE4W(tile4w_vnni, 3); break;
                          case 2: ACCEL_TILE4W(tile4w_vnni, 2); break; default: ACCEL_TILE4W(tile4w_vnni, 1); }
          } else {
            switch (mb) { case 4: ACCEL_TILE4W(tile4w, 4); break; case 3: ACCEL_TILE4W(tile4w, 3); break;
                          case 2: ACCEL_TILE4W(tile4w, 2); break; default: ACCEL_TILE4W(tile4w, 1); }
          }
#undef ACCEL_TILE4W
          continue;
        }
        const float* xm = xp + m0 * K;
        switch (mb) {
          case 4: tile4<4, S>(xm, xsm, K, G, gs, qp, smp, ym, N, n0, n1); break;
          case 3: tile4<3, S>(xm, xsm, K, G, gs, qp, smp, ym, N, n0, n1); break;
          case 2: tile4<2, S>(xm, xsm, K, G, gs, qp, smp, ym, N, n0, n1); break;
          default: tile4<1, S>(xm, xsm, K, G, gs, qp, smp, ym, N, n0, n1); break;
        }
      }
    }
  });
}

void int4_gemm_t(const float* x, int64_t M, int64_t K, const uint8_t* q, const torch::Tensor& sm, int64_t gs,
                 float* y, int64_t N) {
  if (sm.scalar_type() == at::kShort)
    int4_gemm(x, M, K, q, reinterpret_cast<const Z16*>(sm.data_ptr<int16_t>()), gs, y, N);
  else if (sm.scalar_type() == at::kHalf)
    int4_gemm(x, M, K, q, reinterpret_cast<const uint16_t*>(sm.data_ptr<at::Half>()), gs, y, N);
  else
    int4_gemm(x, M, K, q, sm.data_ptr<float>(), gs, y, N);
}

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale_min, int64_t group_size) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && q.size(1) * 2 == x.size(1), "shapes: x [M, K], q [N, K / 2]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kByte &&
              (scale_min.scalar_type() == at::kFloat || scale_min.scalar_type() == at::kHalf ||
               scale_min.scalar_type() == at::kShort),
              "dtypes: x fp32, q uint8, scale_min fp32 or fp16, or int16 (fp16 scale, zero point) pairs");
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0), gs = group_size;
  TORCH_CHECK(gs % 16 == 0 && K % gs == 0, "group_size must be a multiple of 16 dividing K");
  const int64_t G = K / gs;
  TORCH_CHECK(scale_min.numel() == N * G * 2, "scale_min must be [N, K / group_size, 2]");
  x = x.contiguous(); q = q.contiguous(); scale_min = scale_min.contiguous();
  auto y = torch::empty({M, N}, x.options());
  int4_gemm_t(x.data_ptr<float>(), M, K, q.data_ptr<uint8_t>(), scale_min, gs, y.data_ptr<float>(), N);
  return y;
}

// w[n, k] = q * scale + min for output rows [n0, n1) -> fp32 [n1 - n0, K]: the prefill path's dequantize before
// an fp32 GEMM. torch's unpack + subtract + multiply over the weight cost a large share of the GEMM's own time at
// prefill sizes; one vectorized pass writes each fp32 weight once.
template <typename S>
static void int4_dequant_rows(const uint8_t* q, const S* sm, int64_t K, int64_t gs, int64_t n0, int64_t n1, float* out) {
  const int64_t G = K / gs;
  at::parallel_for(n0, n1, 16, [&](int64_t a, int64_t b) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int64_t n = a; n < b; ++n) {
      const uint8_t* row = q + n * (K / 2);
      float* o = out + (n - n0) * K;
      for (int64_t g = 0; g < G; ++g) {
        const __m256 s = _mm256_set1_ps(f32_of(sm[(n * G + g) * 2])), mn = _mm256_set1_ps(min_of(sm + (n * G + g) * 2));
        for (int64_t c = g * gs; c < (g + 1) * gs; c += 16) {
          const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 2));
          const __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
          _mm256_storeu_ps(o + c, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), s, mn));
          _mm256_storeu_ps(o + c + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), s, mn));
        }
      }
    }
  });
}

torch::Tensor int4_dequant(torch::Tensor q, torch::Tensor scale_min, int64_t group_size, int64_t n0, int64_t n1) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte, "q: uint8 [N, K / 2]");
  const int64_t N = q.size(0), K = q.size(1) * 2, gs = group_size;
  TORCH_CHECK(gs % 16 == 0 && K % gs == 0 && scale_min.numel() == N * (K / gs) * 2, "group_size / scale_min shape");
  TORCH_CHECK(0 <= n0 && n0 <= n1 && n1 <= N, "rows out of range");
  q = q.contiguous(); scale_min = scale_min.contiguous();
  auto out = torch::empty({n1 - n0, K}, torch::kFloat);
  if (scale_min.scalar_type() == at::kShort)
    int4_dequant_rows(q.data_ptr<uint8_t>(), reinterpret_cast<const Z16*>(scale_min.data_ptr<int16_t>()), K, gs, n0, n1,
                      out.data_ptr<float>());
  else if (scale_min.scalar_type() == at::kHalf)
    int4_dequant_rows(q.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scale_min.data_ptr<at::Half>()), K, gs,
                      n0, n1, out.data_ptr<float>());
  else
    int4_dequant_rows(q.data_ptr<uint8_t>(), scale_min.data_ptr<float>(), K, gs, n0, n1, out.data_ptr<float>());
  return out;
}
