// gemm_vnni.cpp: the VNNI prefill GEMMs and the INT8 / INT4 tile layouts.
#include "gemm_vnni.h"
#include "gemm_int4.h"
#include "gemm_int8.h"
#include "threads.h"

// One or two activation rows stream each weight once, in one linear pass per chunk. On Intel (Xeon with AVX-512 /
// AMX) a software prefetch 4 KB ahead of that pass lifted INT8 decode (8 KB the same, 1 KB and 16 KB less); on AMD
// EPYC the hardware prefetcher alone measured faster than a prefetch of the next tiles, so AMD keeps it.
static const int64_t STREAM_PREFETCH_AHEAD = __builtin_cpu_is("intel") ? 4096 : 0;
static inline const char* stream_ahead(const void* p) {
  return STREAM_PREFETCH_AHEAD ? static_cast<const char*>(p) + STREAM_PREFETCH_AHEAD : nullptr;
}

// ---- prefill GEMM (AVX512-VNNI) ------------------------------------------------------------------------------
// At prefill sizes (M >= VNNI_MIN_ROWS) a Linear is compute-bound. The row kernels (gemm_int8.cpp, gemm_int4.cpp)
// form one dot product per (activation row, weight row) and pay a convert and an FMA per block of 32 for each: about
// fp32 GEMM speed. Here the register tile is an outer product: a tile of 32 weight rows is widened to int16 once per
// call into `vpdpwssd` order (per input pair, 16 rows' pairs in one vector), and each 4-row block of activations
// broadcasts its int16 pairs against it, so 16 multiply-adds share one convert + FMA per block. Same numerics as the
// row kernels (16-bit activations per block of 32, exact int32 block sums, one FMA of the block's scale per block).
// vpdpwssd multiplies 32 int16 pairs per instruction against fp32 FMA's 16 lanes, so at prefill sizes this beats
// oneDNN's prepacked fp32 GEMM; 6 activation rows per register tile (4 measured slower; 8 spills registers).

constexpr int64_t VT = 32;  // weight rows per packed tile: two vectors of 16

#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512vnni")
// r[i] holds row i's 16 int32 pairs; afterwards r[j] holds pair j of the 16 rows
static inline void transpose16_epi32(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // u[4q + c], 128-bit lane L: rows 4q..4q+3 of pair 4L + c
    u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// Weight rows [n0, n0 + VT) (rows >= N zero) into wp [K / 2][VT] int32 (one int16 pair each); `block(n, b)` gives row
// n's 32 values of block b as int16.
template <typename B>
static void pack_tile(int64_t n0, int64_t N, int64_t K, int32_t* wp, const B& block) {
  __m512i r[16];
  for (int64_t v = 0; v < VT / 16; ++v)
    for (int64_t b = 0; b < K / 32; ++b) {
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t n = n0 + v * 16 + i;
        r[i] = n < N ? block(n, b) : _mm512_setzero_si512();
      }
      transpose16_epi32(r);
      for (int64_t j = 0; j < 16; ++j) _mm512_storeu_si512(wp + (b * 16 + j) * VT + v * 16, r[j]);
    }
}

// acc[m][v] (fp32, 16 rows each) += sum over blocks of dot_b(xq[m], tile) * bscale(m, b, v), MB activation rows
template <int MB, typename F>
static inline void vnni_rows(const int16_t* xq, int64_t K, const int32_t* wp, __m512 acc[][VT / 16], const F& bscale) {
  for (int64_t b = 0; b < K / 32; ++b) {
    __m512i s[MB][2];
    for (int m = 0; m < MB; ++m) s[m][0] = s[m][1] = _mm512_setzero_si512();
    for (int64_t j = 0; j < 16; ++j) {
      const int64_t kp = b * 16 + j;
      const __m512i w0 = _mm512_loadu_si512(wp + kp * VT), w1 = _mm512_loadu_si512(wp + kp * VT + 16);
      for (int m = 0; m < MB; ++m) {
        int32_t pair;  // the activation pair (xq[2kp], xq[2kp + 1]) as one int32 lane value
        std::memcpy(&pair, xq + m * K + 2 * kp, sizeof(pair));
        const __m512i x = _mm512_set1_epi32(pair);
        s[m][0] = _mm512_dpwssd_epi32(s[m][0], w0, x);
        s[m][1] = _mm512_dpwssd_epi32(s[m][1], w1, x);
      }
    }
    for (int m = 0; m < MB; ++m)
      for (int v = 0; v < 2; ++v) acc[m][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][v]), bscale(m, b, v), acc[m][v]);
  }
}

// run(std::integral_constant<int, MB>, m0) over the activation rows in blocks of 6 (the register tile), then the rest
template <typename F>
static inline void vnni_row_blocks(int64_t M, const F& run) {
  int64_t m0 = 0;
  for (; m0 + 6 <= M; m0 += 6) run(std::integral_constant<int, 6>{}, m0);
  switch (M - m0) {
    case 5: run(std::integral_constant<int, 5>{}, m0); break;
    case 4: run(std::integral_constant<int, 4>{}, m0); break;
    case 3: run(std::integral_constant<int, 3>{}, m0); break;
    case 2: run(std::integral_constant<int, 2>{}, m0); break;
    case 1: run(std::integral_constant<int, 1>{}, m0); break;
  }
}

// y[m, n0 + 16 v + l] for the tile's rows below N
static inline void store_tile(float* y, int64_t N, int64_t n0, int m, int v, __m512 a) {
  const int64_t n = n0 + v * 16, left = N - n;
  if (left <= 0) return;
  _mm512_mask_storeu_ps(y + m * N + n, left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1), a);
}

// y [M, N] = x @ (q * scale[n])^T with x already in 16-bit blocks (permute = false); pack(n0, wp) fills the VT-row
// tile at n0 in `pack_tile`'s layout; with group scales (int8g), gscales(n0, g) fills g [K / 32][VT] with the tile's
// rows' block scales and returns true (false: per-channel)
template <typename P, typename GS>
static void vnni_gemm_i8(const QuantBlocks& xr, int64_t M, int64_t K, const float* scale, float* y, int64_t N,
                         const P& pack, const GS& gscales) {
  parallel_chunks((N + VT - 1) / VT, [&](int64_t c) {
    thread_local std::vector<int32_t> buf;
    thread_local std::vector<float> gbuf;
    buf.resize(K / 2 * VT);
    gbuf.assign(K / 32 * VT, 0.f);
    const int64_t n0 = c * VT;
    pack(n0, buf.data());
    const bool grouped = gscales(n0, gbuf.data());
    __m512 rs[2];
    for (int v = 0; v < 2; ++v) {
      const int64_t n = n0 + v * 16, left = std::min<int64_t>(16, N - n);
      rs[v] = left > 0 ? _mm512_maskz_loadu_ps(__mmask16((1u << left) - 1), scale + n) : _mm512_setzero_ps();
    }
    auto run = [&](auto mb_tag, int64_t m0) {
      constexpr int MB = decltype(mb_tag)::value;
      __m512 acc[MB][2];
      for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
      const float* xs = xr.scale.data() + m0 * xr.KB;
      vnni_rows<MB>(xr.q.data() + m0 * K, K, buf.data(), acc, [&](int m, int64_t b, int v) {
        const __m512 f = _mm512_set1_ps(xs[m * xr.KB + b]);
        return grouped ? _mm512_mul_ps(f, _mm512_loadu_ps(gbuf.data() + b * VT + v * 16)) : f;
      });
      for (int m = 0; m < MB; ++m)
        for (int v = 0; v < 2; ++v) store_tile(y + m0 * N, N, n0, m, v, _mm512_mul_ps(acc[m][v], rs[v]));
    };
    vnni_row_blocks(M, run);
  });
}

// q in the row layout [N, K], group scales (if any) [N, K / 32]
void vnni_gemm_i8_rows(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* q, const float* scale,
                       const uint16_t* gs, float* y, int64_t N) {
  const int64_t KB = K / 32;
  vnni_gemm_i8(xr, M, K, scale, y, N, [&](int64_t n0, int32_t* wp) {
    pack_tile(n0, N, K, wp, [&](int64_t n, int64_t b) {
      return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + n * K + b * 32)));
    });
  }, [&](int64_t n0, float* g) {
    if (!gs) return false;
    for (int64_t i = 0; i < VT && n0 + i < N; ++i)
      for (int64_t b = 0; b < KB; ++b) g[b * VT + i] = _cvtsh_ss(gs[(n0 + i) * KB + b]);
    return true;
  });
}

// ---- INT8 in the VNNI tile layout --------------------------------------------------------------------------
// `int8_vnni_layout`: per tile of 16 output rows and per input pair (k, k + 1), the 16 rows' two int8 values are 32
// consecutive bytes, [N / 16][K / 2][16][2]. One 32-byte load widened to int16 is then a vpdpwssd operand for 16
// rows at once against the pair broadcast from the activations: ~4 instructions per 32 weight bytes at one row
// (the row kernels: ~11, each row its own dot product and a convert + FMA per block), and a weight vector shared by
// every activation row of the register tile. Numerics are the prefill GEMM's (each block's exact int32 sum, one
// FMA of the block's activation scale per block in block order, times scale[n]) at every row count, so a row's
// result does not depend on how many rows share the call: speculation's verify steps and prefill compute exactly
// what a one-row decode step does. Needs N % 16 == 0 and K % 32 == 0 (`cpu_kernels.vnni_int8`).
// Against the row kernel it is level at one row and gains more with every row a call shares (a 16-row verify step
// costs fewer decode steps, so n-gram speculation on an INT8 target speeds up).
// One or two activation rows read one tile at a time (a single linear stream through the chunk, as the row kernel
// reads): two tiles in turn measured slower than the row kernel at one row; 256-bit halves (`vnni_tile1_i8`)
// beat the row kernel's decode rate in the whole engine.

// MB activation rows against NT consecutive 16-row tiles at `tile` (a weight vector per tile serves the MB rows, a
// broadcast activation pair the NT tiles); `ahead`: the next NT tiles, prefetched 512 bytes per tile and block into
// L2, where the stream keeps going during the arithmetic (faster than into L1 at 3-16 rows, cold weights; INT4's
// tiles, compute-bound, gained nothing)
template <int MB, int NT>
static inline void vnni_tiles_i8(const int16_t* xq, const float* xs, int64_t KB, int64_t K, const int8_t* tile,
                                 const float* scale, const uint16_t* gs, float* y, int64_t N, const char* ahead) {
  constexpr int SPLIT = MB * NT >= 4 ? 1 : MB * NT >= 2 ? 2 : 4;  // independent vpdpwssd chains against its latency
  const int64_t TB = 16 * K;  // bytes per tile
  __m512 acc[MB][NT];
  for (int m = 0; m < MB; ++m)
    for (int u = 0; u < NT; ++u) acc[m][u] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    if (ahead)
      for (int u = 0; u < NT; ++u)
        for (int64_t j = 0; j < 512; j += 64) _mm_prefetch(ahead + u * TB + b * 512 + j, _MM_HINT_T1);
    __m512i s[MB][NT][SPLIT];
    for (int m = 0; m < MB; ++m)
      for (int u = 0; u < NT; ++u)
        for (int h = 0; h < SPLIT; ++h) s[m][u][h] = _mm512_setzero_si512();
    for (int64_t j = 0; j < 16; j += SPLIT) {
#pragma GCC unroll 4
      for (int h = 0; h < SPLIT; ++h) {  // h constant after unrolling: the chains stay in registers
        const int64_t kp = b * 16 + j + h;
        __m512i w[NT];
#pragma GCC unroll 2
        for (int u = 0; u < NT; ++u)
          w[u] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + u * TB + kp * 32)));
#pragma GCC unroll 8
        for (int m = 0; m < MB; ++m) {
          int32_t pair;
          std::memcpy(&pair, xq + m * K + 2 * kp, sizeof(pair));
          const __m512i x = _mm512_set1_epi32(pair);
#pragma GCC unroll 2
          for (int u = 0; u < NT; ++u) s[m][u][h] = _mm512_dpwssd_epi32(s[m][u][h], w[u], x);
        }
      }
    }
    __m512 g[NT];  // the tiles' block scales (int8g), or ones
    for (int u = 0; u < NT; ++u)
      g[u] = gs ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gs + (u * KB + b) * 16)))
                : _mm512_set1_ps(1.f);
    for (int m = 0; m < MB; ++m)
      for (int u = 0; u < NT; ++u) {
        __m512i tot = s[m][u][0];
        for (int h = 1; h < SPLIT; ++h) tot = _mm512_add_epi32(tot, s[m][u][h]);
        acc[m][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(_mm512_set1_ps(xs[m * KB + b]), g[u]),
                                    acc[m][u]);
      }
  }
  for (int u = 0; u < NT; ++u) {
    const __m512 sc = _mm512_loadu_ps(scale + u * 16);
    for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * N + u * 16, _mm512_mul_ps(acc[m][u], sc));
  }
}

// One activation row against one tile in 256-bit halves (rows 0-7 and 8-15): per input pair, two 16-byte loads widened
// to int16 and two `vpdpwssd` of 8 rows each. The same per-row operations as `vnni_tiles_i8` (identical results);
// at one row the 512-bit widening slowed the whole decode step.
static inline void vnni_tile1_i8(const int16_t* xq, const float* xs, int64_t KB, const int8_t* tile,
                                 const float* scale, const uint16_t* gs, float* y, const char* ahead) {
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < KB; ++b) {
    if (ahead)
      for (int64_t j = 0; j < 512; j += 64) _mm_prefetch(ahead + b * 512 + j, _MM_HINT_T0);
    __m256i s[2][2] = {{_mm256_setzero_si256(), _mm256_setzero_si256()}, {_mm256_setzero_si256(), _mm256_setzero_si256()}};
#pragma GCC unroll 16
    for (int64_t j = 0; j < 16; ++j) {
      const int64_t kp = b * 16 + j;
      int32_t pair;
      std::memcpy(&pair, xq + 2 * kp, sizeof(pair));
      const __m256i x = _mm256_set1_epi32(pair);
      const int8_t* w = tile + kp * 32;
      for (int h = 0; h < 2; ++h)
        s[h][j & 1] = _mm256_dpwssd_epi32(s[h][j & 1], _mm256_cvtepi8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * h))), x);
    }
    const __m256 xb = _mm256_set1_ps(xs[b]);
    for (int h = 0; h < 2; ++h) {
      const __m256 f = gs ? _mm256_mul_ps(xb, _mm256_cvtph_ps(_mm_loadu_si128(
                                reinterpret_cast<const __m128i*>(gs + b * 16 + 8 * h)))) : xb;
      acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s[h][0], s[h][1])), f, acc[h]);
    }
  }
  for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(acc[h], _mm256_loadu_ps(scale + 8 * h)));
}

template <int NT>
static void vnni_pass_i8(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* tile, const float* scale,
                         const uint16_t* gs, float* y, int64_t N, const char* ahead) {
  const int64_t KB = K / 32;
  for (int64_t m0 = 0, mb; m0 < M; m0 += mb) {
    mb = std::min<int64_t>(6, M - m0);
    const int16_t* xq = xr.q.data() + m0 * K;
    const float* xs = xr.scale.data() + m0 * KB;
    float* ym = y + m0 * N;
    const char* pf = m0 == 0 ? ahead : nullptr;
    switch (mb) {
#define ACCEL_PASS_CASE(R) case R: vnni_tiles_i8<R, NT>(xq, xs, KB, K, tile, scale, gs, ym, N, pf); break;
      ACCEL_PASS_CASE(6) ACCEL_PASS_CASE(5) ACCEL_PASS_CASE(4) ACCEL_PASS_CASE(3) ACCEL_PASS_CASE(2)
      default: vnni_tiles_i8<1, NT>(xq, xs, KB, K, tile, scale, gs, ym, N, pf);
#undef ACCEL_PASS_CASE
    }
  }
}

// group scales (if any) in the tile layout [N / 16, K / 32, 16]
static void vnni_gemm_i8_tiles(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* qv, const float* scale,
                               const uint16_t* gs, float* y, int64_t N) {
  const int64_t KB = K / 32;
  if (M >= VNNI_MIN_ROWS)  // prefill: the GEMM's 32-row x 6-row register tile, packed by widening only
    return vnni_gemm_i8(xr, M, K, scale, y, N, [&](int64_t n0, int32_t* wp) {
      for (int64_t v = 0; v < VT / 16; ++v) {
        const int64_t t = n0 / 16 + v;
        for (int64_t kp = 0; kp < K / 2; ++kp)
          _mm512_storeu_si512(wp + kp * VT + v * 16, t * 16 < N ? _mm512_cvtepi8_epi16(_mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(qv + (t * (K / 2) + kp) * 32))) : _mm512_setzero_si512());
      }
    }, [&](int64_t n0, float* g) {
      if (!gs) return false;
      for (int64_t v = 0; v < VT / 16 && (n0 / 16 + v) * 16 < N; ++v)
        for (int64_t b = 0; b < KB; ++b)
          _mm512_storeu_ps(g + b * VT + v * 16, _mm512_cvtph_ps(_mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(gs + ((n0 / 16 + v) * KB + b) * 16))));
      return true;
    });
  const int64_t tiles = N / 16;
  const TileChunks ch = tile_chunks(M, tiles, 16 * K);
  parallel_chunks(ch.n, [&](int64_t c) {
    const int64_t t1 = ch.end(c);
    for (int64_t t = ch.begin(c); t < t1;) {
      const int8_t* tile = qv + t * 16 * K;
      if (M > 2 && t + 2 <= t1) {  // one or two rows: one tile at a time, a single linear stream through the chunk
        const char* ahead = t + 4 <= t1 ? reinterpret_cast<const char*>(tile + 32 * K) : nullptr;
        vnni_pass_i8<2>(xr, M, K, tile, scale + t * 16, gs ? gs + t * KB * 16 : nullptr, y + t * 16, N, ahead);
        t += 2;
      } else {
        const char* ahead = stream_ahead(tile);
        if (M == 1)
          vnni_tile1_i8(xr.q.data(), xr.scale.data(), K / 32, tile, scale + t * 16, gs ? gs + t * KB * 16 : nullptr,
                        y + t * 16, ahead);
        else
          vnni_pass_i8<1>(xr, M, K, tile, scale + t * 16, gs ? gs + t * KB * 16 : nullptr, y + t * 16, N, ahead);
        t += 1;
      }
    }
  });
}

// y [M, N] = sum_k x[m, k] (q[n, k] * scale[n, g] + min[n, g]), x in 16-bit blocks (permute = false), xsum [M, G]
// the activations' sums per group (for the min term); pack(n0, wp) fills the VT-row tile at n0 in `pack_tile`'s
// layout, scales(n0, sc, mn) its rows' group scales and mins ([G][VT] each)
template <typename P, typename SM>
static void vnni_gemm_i4(const QuantBlocks& xr, const float* xsum, int64_t M, int64_t K, int64_t gs, float* y,
                         int64_t N, const P& pack, const SM& scales) {
  const int64_t G = K / gs, bpg = gs / 32;
  parallel_chunks((N + VT - 1) / VT, [&](int64_t c) {
    thread_local std::vector<int32_t> buf;
    thread_local std::vector<float> sc, mn;  // [G][VT] group scales and mins of the tile's rows
    buf.resize(K / 2 * VT);
    sc.assign(G * VT, 0.f);
    mn.assign(G * VT, 0.f);
    const int64_t n0 = c * VT;
    pack(n0, buf.data());
    scales(n0, sc.data(), mn.data());
    auto run = [&](auto mb_tag, int64_t m0) {
      constexpr int MB = decltype(mb_tag)::value;
      __m512 acc[MB][2];
      for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
      const float* xs = xr.scale.data() + m0 * xr.KB;
      vnni_rows<MB>(xr.q.data() + m0 * K, K, buf.data(), acc, [&](int m, int64_t b, int v) {
        return _mm512_mul_ps(_mm512_set1_ps(xs[m * xr.KB + b]), _mm512_loadu_ps(sc.data() + b / bpg * VT + v * 16));
      });
      for (int64_t g = 0; g < G; ++g)
        for (int v = 0; v < 2; ++v) {
          const __m512 mv = _mm512_loadu_ps(mn.data() + g * VT + v * 16);
          for (int m = 0; m < MB; ++m)
            acc[m][v] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[(m0 + m) * G + g]), acc[m][v]);
        }
      for (int m = 0; m < MB; ++m)
        for (int v = 0; v < 2; ++v) store_tile(y + m0 * N, N, n0, m, v, acc[m][v]);
    };
    vnni_row_blocks(M, run);
  });
}

// q in the INT4 row kernel layout (`int4_repack`), sm [N, G, 2] (scale, min) pairs
template <typename S>
void vnni_gemm_i4_rows(const QuantBlocks& xr, const float* xsum, int64_t M, int64_t K, int64_t gs, const uint8_t* q,
                       const S* sm, float* y, int64_t N) {
  const int64_t G = K / gs;
  vnni_gemm_i4(xr, xsum, M, K, gs, y, N, [&](int64_t n0, int32_t* wp) {
    const __m128i low = _mm_set1_epi8(0x0F);
    pack_tile(n0, N, K, wp, [&](int64_t n, int64_t b) {
      // 16 bytes: low nibbles c0..7, c16..23 and high ones c8..15, c24..31 of the block (see int4_repack)
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + n * (K / 2) + b * 16));
      const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      const __m256i ordered = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
      return _mm512_cvtepu8_epi16(ordered);
    });
  }, [&](int64_t n0, float* sc, float* mn) {
    for (int64_t i = 0; i < VT && n0 + i < N; ++i)
      for (int64_t g = 0; g < G; ++g) {
        sc[g * VT + i] = f32_of(sm[((n0 + i) * G + g) * 2]);
        mn[g * VT + i] = min_of(sm + ((n0 + i) * G + g) * 2);
      }
  });
}
// the scale / min forms gemm_int4.cpp's int4_gemm takes: fp32, fp16 and (fp16 scale, zero point) pairs
#define ACCEL_I4_ROWS(S)                                                                                         \
  template void vnni_gemm_i4_rows<S>(const QuantBlocks& xr, const float* xsum, int64_t M, int64_t K, int64_t gs,     \
                                     const uint8_t* q, const S* sm, float* y, int64_t N);
ACCEL_I4_ROWS(float)
ACCEL_I4_ROWS(uint16_t)
ACCEL_I4_ROWS(Z16)
#undef ACCEL_I4_ROWS

// ---- INT4 in the VNNI tile layout --------------------------------------------------------------------------
// `int4_vnni_layout`: per tile of 16 output rows and per two input pairs (k..k + 3), 32 bytes: byte j holds value j
// of pair (k, k + 1) in its low nibble and of pair (k + 2, k + 3) in its high one, values in row order (row 0's
// two, row 1's two, ...). A mask, a shift and two widenings give two `vpdpwssd` operands of 16 rows each (~3
// instructions per 16 weight bytes; the row kernel spends ~17 per 32 weights). Group scales and mins are stored
// per tile and group as 16 scales then 16 mins ([N / 16][G][2][16], fp32 or fp16). Numerics are the INT4 prefill
// GEMM's at every row count, so a row's result does not depend on the call's row count. Needs N % 16 == 0,
// K % 32 == 0 and whole blocks of 32 per group (`cpu_kernels.vnni_int4`). Faster than the row kernel from one row
// on, the more so the more rows a call shares.
static inline __m512 load16_f32(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_f32(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline __m512 load16_f32(const Z16* p) { return load16_f32(reinterpret_cast<const uint16_t*>(p)); }
// a tile's 16 mins of one group from p (its 16 scales, then 16 mins or zero points)
template <typename S>
static inline __m512 load16_mins(const S* p) { return load16_f32(p + 16); }
static inline __m512 load16_mins(const Z16* p) {
  return _mm512_mul_ps(_mm512_set1_ps(-1.f), _mm512_mul_ps(load16_f32(p + 16), load16_f32(p)));
}

template <int MB, int NT, typename S>
static inline void vnni_tiles_i4(const int16_t* xq, const float* xs, const float* xsum, int64_t KB, int64_t K,
                                 int64_t G, int64_t bpg, const uint8_t* tile, const S* tsm, float* y, int64_t N,
                                 const char* ahead) {
  constexpr int SPLIT = MB * NT >= 4 ? 1 : 2;  // the two pairs of a chunk on their own chains against the latency
  const int64_t TB = 8 * K, SMS = G * 32;  // bytes of weights, and scale / min values, per tile
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m512 acc[MB][NT];
  for (int m = 0; m < MB; ++m)
    for (int u = 0; u < NT; ++u) acc[m][u] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    if (ahead)
      for (int u = 0; u < NT; ++u)
        for (int64_t j = 0; j < 256; j += 64) _mm_prefetch(ahead + u * TB + b * 256 + j, _MM_HINT_T0);
    __m512i s[MB][NT][SPLIT];
    for (int m = 0; m < MB; ++m)
      for (int u = 0; u < NT; ++u)
        for (int h = 0; h < SPLIT; ++h) s[m][u][h] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int64_t j = 0; j < 8; ++j) {  // chunk j: pairs kp, kp + 1
      const int64_t kp = b * 16 + 2 * j;
      __m512i wa[NT], wb[NT];
#pragma GCC unroll 2
      for (int u = 0; u < NT; ++u) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + u * TB + (b * 8 + j) * 32));
        wa[u] = _mm512_cvtepu8_epi16(_mm256_and_si256(v, low));
        wb[u] = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low));
      }
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        int32_t pa, pb;
        std::memcpy(&pa, xq + m * K + 2 * kp, sizeof(pa));
        std::memcpy(&pb, xq + m * K + 2 * kp + 2, sizeof(pb));
        const __m512i xa = _mm512_set1_epi32(pa), xb = _mm512_set1_epi32(pb);
#pragma GCC unroll 2
        for (int u = 0; u < NT; ++u) {
          s[m][u][0] = _mm512_dpwssd_epi32(s[m][u][0], wa[u], xa);
          s[m][u][SPLIT - 1] = _mm512_dpwssd_epi32(s[m][u][SPLIT - 1], wb[u], xb);
        }
      }
    }
    const int64_t g = b / bpg;
    for (int u = 0; u < NT; ++u) {
      const __m512 sc = load16_f32(tsm + u * SMS + g * 32);
      for (int m = 0; m < MB; ++m) {
        const __m512i tot = SPLIT == 2 ? _mm512_add_epi32(s[m][u][0], s[m][u][SPLIT - 1]) : s[m][u][0];
        acc[m][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(_mm512_set1_ps(xs[m * KB + b]), sc),
                                    acc[m][u]);
      }
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int u = 0; u < NT; ++u) {
      const __m512 mv = load16_mins(tsm + u * SMS + g * 32);
      for (int m = 0; m < MB; ++m) acc[m][u] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[m * G + g]), acc[m][u]);
    }
  for (int u = 0; u < NT; ++u)
    for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * N + u * 16, acc[m][u]);
}

template <int NT, typename S>
static void vnni_pass_i4(const QuantBlocks& xr, const float* xsum, int64_t M, int64_t K, int64_t G, int64_t bpg,
                         const uint8_t* tile, const S* tsm, float* y, int64_t N, const char* ahead) {
  const int64_t KB = K / 32;
  for (int64_t m0 = 0, mb; m0 < M; m0 += mb) {
    mb = std::min<int64_t>(6, M - m0);
    const int16_t* xq = xr.q.data() + m0 * K;
    const float* xs = xr.scale.data() + m0 * KB;
    const float* xsm = xsum + m0 * G;
    float* ym = y + m0 * N;
    const char* pf = m0 == 0 ? ahead : nullptr;
    switch (mb) {
#define ACCEL_PASS_CASE(R) case R: vnni_tiles_i4<R, NT, S>(xq, xs, xsm, KB, K, G, bpg, tile, tsm, ym, N, pf); break;
      ACCEL_PASS_CASE(6) ACCEL_PASS_CASE(5) ACCEL_PASS_CASE(4) ACCEL_PASS_CASE(3) ACCEL_PASS_CASE(2)
      default: vnni_tiles_i4<1, NT, S>(xq, xs, xsm, KB, K, G, bpg, tile, tsm, ym, N, pf);
#undef ACCEL_PASS_CASE
    }
  }
}

template <typename S>
static void vnni_gemm_i4_tiles(const QuantBlocks& xr, const float* xsum, int64_t M, int64_t K, int64_t gs,
                               const uint8_t* qv, const S* smv, float* y, int64_t N) {
  const int64_t G = K / gs, bpg = gs / 32, tiles = N / 16;
  if (M >= VNNI_MIN_ROWS)  // prefill: the GEMM's register tile, packed from the tiles by unpacking only
    return vnni_gemm_i4(xr, xsum, M, K, gs, y, N, [&](int64_t n0, int32_t* wp) {
      const __m256i low = _mm256_set1_epi8(0x0F);
      for (int64_t v = 0; v < VT / 16; ++v) {
        const int64_t t = n0 / 16 + v;
        for (int64_t c = 0; c < K / 4; ++c) {
          __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
          if (t < tiles) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qv + (t * (K / 4) + c) * 32));
            a = _mm512_cvtepu8_epi16(_mm256_and_si256(w, low));
            b = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), low));
          }
          _mm512_storeu_si512(wp + (2 * c) * VT + v * 16, a);
          _mm512_storeu_si512(wp + (2 * c + 1) * VT + v * 16, b);
        }
      }
    }, [&](int64_t n0, float* sc, float* mn) {
      for (int64_t v = 0; v < VT / 16; ++v) {
        const int64_t t = n0 / 16 + v;
        if (t >= tiles) continue;
        for (int64_t g = 0; g < G; ++g) {
          _mm512_storeu_ps(sc + g * VT + v * 16, load16_f32(smv + (t * G + g) * 32));
          _mm512_storeu_ps(mn + g * VT + v * 16, load16_mins(smv + (t * G + g) * 32));
        }
      }
    });
  const TileChunks ch = tile_chunks(M, tiles, 8 * K);
  parallel_chunks(ch.n, [&](int64_t c) {
    const int64_t t1 = ch.end(c);
    for (int64_t t = ch.begin(c); t < t1;) {
      const uint8_t* tile = qv + t * 8 * K;
      const S* tsm = smv + t * G * 32;
      if (M > 2 && t + 2 <= t1) {  // one or two rows: one tile at a time, a single linear stream through the chunk
        const char* ahead = t + 4 <= t1 ? reinterpret_cast<const char*>(tile + 16 * K) : nullptr;
        vnni_pass_i4<2, S>(xr, xsum, M, K, G, bpg, tile, tsm, y + t * 16, N, ahead);
        t += 2;
      } else {
        const char* ahead = stream_ahead(tile);
        vnni_pass_i4<1, S>(xr, xsum, M, K, G, bpg, tile, tsm, y + t * 16, N, ahead);
        t += 1;
      }
    }
  });
}
// ---- INT4 weights x 8-bit activations (w4a8) ------------------------------------------------------------------
// At 16-bit activations every INT4 kernel is bound by the VNNI multiply rate, not by its bytes (`vpdpwssd`: 32
// multiply-adds per instruction). With activations rounded to 8 bits per block of 32 (llama.cpp's Q8 blocks; scale
// = max |x| / 127, round half to even), `vpdpbusd` multiplies the unwidened nibbles (unsigned) by the activation
// bytes (signed), 64 multiply-adds per instruction: half the VNNI instructions per weight, at every row count.
// Layout (`int4a8_vnni_layout`): per tile of 16 output rows and per chunk of 8 inputs (k..k + 7), 64 bytes: row i's
// 4 bytes hold inputs k..k + 3 in their low nibbles and k + 4..k + 7 in their high ones, so a mask (and a shift)
// gives a `vpdpbusd` operand of 16 rows x 4 inputs against the 4 activation bytes broadcast. Scales and mins are
// the INT4 VNNI tile layout's. Numerics: each block's exact int32 sum, one FMA of (activation scale x group scale)
// per block in block order, then the min term from the float activations' group sums, as the 16-bit kernels; the
// prefill GEMM computes the same per row, so a row's result does not depend on the call's row count.
constexpr int XQ8_BLOCK_MAX = 127;

struct QuantBlocks8 {
  std::vector<int8_t> q;  // [M, K]
  std::vector<float> scale;  // [M, K / 32]
  int64_t KB = 0;
};

static QuantBlocks8 quantize_blocks_i8(const float* x, int64_t M, int64_t K) {
  QuantBlocks8 r;
  r.KB = K / 32;
  r.q.resize(M * K);
  r.scale.resize(M * r.KB);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < r.KB; ++b) {
        const float* xb = x + m * K + b * 32;
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float sc = mx > 0.f ? mx / XQ8_BLOCK_MAX : 1.f;
        r.scale[m * r.KB + b] = sc;
        const __m512 inv = _mm512_set1_ps(1.f / sc);  // cvtps rounds to nearest even
        int8_t* q = r.q.data() + m * K + b * 32;
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv))));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16),
                         _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv))));
      }
  });
  return r;
}

static inline __m512i bcast4(const int8_t* p) {  // 4 activation bytes as one int32 lane value, in every lane
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

template <int MB, int NT, typename S>
static inline void vnni_tiles_i4a8(const int8_t* xq, const float* xs, const float* xsum, int64_t KB, int64_t K,
                                   int64_t G, int64_t bpg, const uint8_t* tile, const S* tsm, float* y, int64_t N) {
  const int64_t TB = 8 * K, SMS = G * 32;
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512 acc[MB][NT];
  for (int m = 0; m < MB; ++m)
    for (int u = 0; u < NT; ++u) acc[m][u] = _mm512_setzero_ps();
  for (int64_t b = 0; b < KB; ++b) {
    __m512i s[MB][NT][2];
    for (int m = 0; m < MB; ++m)
      for (int u = 0; u < NT; ++u) s[m][u][0] = s[m][u][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int64_t j = 0; j < 4; ++j) {  // chunk j: inputs 8j..8j + 7 of the block
      __m512i wa[NT], wb[NT];
#pragma GCC unroll 2
      for (int u = 0; u < NT; ++u) {
        const __m512i v = _mm512_loadu_si512(tile + u * TB + (b * 4 + j) * 64);
        wa[u] = _mm512_and_si512(v, low);
        wb[u] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        const int8_t* xk = xq + m * K + b * 32 + 8 * j;
        const __m512i xa = bcast4(xk), xb = bcast4(xk + 4);
#pragma GCC unroll 2
        for (int u = 0; u < NT; ++u) {
          s[m][u][0] = _mm512_dpbusd_epi32(s[m][u][0], wa[u], xa);
          s[m][u][1] = _mm512_dpbusd_epi32(s[m][u][1], wb[u], xb);
        }
      }
    }
    const int64_t g = b / bpg;
    for (int u = 0; u < NT; ++u) {
      const __m512 sc = load16_f32(tsm + u * SMS + g * 32);
      for (int m = 0; m < MB; ++m)
        acc[m][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s[m][u][0], s[m][u][1])),
                                    _mm512_mul_ps(_mm512_set1_ps(xs[m * KB + b]), sc), acc[m][u]);
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int u = 0; u < NT; ++u) {
      const __m512 mv = load16_mins(tsm + u * SMS + g * 32);
      for (int m = 0; m < MB; ++m) acc[m][u] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[m * G + g]), acc[m][u]);
    }
  for (int u = 0; u < NT; ++u)
    for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * N + u * 16, acc[m][u]);
}

template <int NT, typename S>
static void vnni_pass_i4a8(const QuantBlocks8& xr, const float* xsum, int64_t M, int64_t K, int64_t G, int64_t bpg,
                           const uint8_t* tile, const S* tsm, float* y, int64_t N) {
  const int64_t KB = K / 32;
  for (int64_t m0 = 0, mb; m0 < M; m0 += mb) {
    mb = std::min<int64_t>(6, M - m0);
    const int8_t* xq = xr.q.data() + m0 * K;
    const float* xs = xr.scale.data() + m0 * KB;
    const float* xsm = xsum + m0 * G;
    float* ym = y + m0 * N;
    switch (mb) {
#define ACCEL_PASS_CASE(R) case R: vnni_tiles_i4a8<R, NT, S>(xq, xs, xsm, KB, K, G, bpg, tile, tsm, ym, N); break;
      ACCEL_PASS_CASE(6) ACCEL_PASS_CASE(5) ACCEL_PASS_CASE(4) ACCEL_PASS_CASE(3) ACCEL_PASS_CASE(2)
      default: vnni_tiles_i4a8<1, NT, S>(xq, xs, xsm, KB, K, G, bpg, tile, tsm, ym, N);
#undef ACCEL_PASS_CASE
    }
  }
}

// acc[m][v] += sum over blocks of dot_b(xq[m], tile) * bscale(m, b, v): `vnni_rows` on 8-bit activations, the tile
// wp [K / 4][VT] int32 lanes of 4 unsigned weight bytes each
template <int MB, typename F>
static inline void vnni_rows_a8(const int8_t* xq, int64_t K, const int32_t* wp, __m512 acc[][VT / 16],
                                const F& bscale) {
  for (int64_t b = 0; b < K / 32; ++b) {
    __m512i s[MB][2];
    for (int m = 0; m < MB; ++m) s[m][0] = s[m][1] = _mm512_setzero_si512();
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t kq = b * 8 + j;
      const __m512i w0 = _mm512_loadu_si512(wp + kq * VT), w1 = _mm512_loadu_si512(wp + kq * VT + 16);
      for (int m = 0; m < MB; ++m) {
        const __m512i x = bcast4(xq + m * K + 4 * kq);
        s[m][0] = _mm512_dpbusd_epi32(s[m][0], w0, x);
        s[m][1] = _mm512_dpbusd_epi32(s[m][1], w1, x);
      }
    }
    for (int m = 0; m < MB; ++m)
      for (int v = 0; v < 2; ++v) acc[m][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][v]), bscale(m, b, v), acc[m][v]);
  }
}

template <typename S>
static void vnni_gemm_i4a8_tiles(const QuantBlocks8& xr, const float* xsum, int64_t M, int64_t K, int64_t gs,
                                 const uint8_t* qv, const S* smv, float* y, int64_t N) {
  const int64_t G = K / gs, bpg = gs / 32, tiles = N / 16;
  if (M >= VNNI_MIN_ROWS) {  // prefill: a 32-row x 6-row register tile, the tiles' nibbles unpacked once per call
    parallel_chunks((N + VT - 1) / VT, [&](int64_t c) {
      thread_local std::vector<int32_t> buf;
      thread_local std::vector<float> sc, mn;  // [G][VT] group scales and mins of the tile's rows
      buf.resize(K / 4 * VT);
      sc.assign(G * VT, 0.f);
      mn.assign(G * VT, 0.f);
      const int64_t n0 = c * VT;
      const __m512i low = _mm512_set1_epi8(0x0F);
      for (int64_t v = 0; v < VT / 16; ++v) {
        const int64_t t = n0 / 16 + v;
        for (int64_t ch = 0; ch < K / 8; ++ch) {
          __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
          if (t < tiles) {
            const __m512i w = _mm512_loadu_si512(qv + t * 8 * K + ch * 64);
            a = _mm512_and_si512(w, low);
            b = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
          }
          _mm512_storeu_si512(buf.data() + (2 * ch) * VT + v * 16, a);
          _mm512_storeu_si512(buf.data() + (2 * ch + 1) * VT + v * 16, b);
        }
        if (t >= tiles) continue;
        for (int64_t g = 0; g < G; ++g) {
          _mm512_storeu_ps(sc.data() + g * VT + v * 16, load16_f32(smv + (t * G + g) * 32));
          _mm512_storeu_ps(mn.data() + g * VT + v * 16, load16_mins(smv + (t * G + g) * 32));
        }
      }
      auto run = [&](auto mb_tag, int64_t m0) {
        constexpr int MB = decltype(mb_tag)::value;
        __m512 acc[MB][2];
        for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
        const float* xs = xr.scale.data() + m0 * xr.KB;
        vnni_rows_a8<MB>(xr.q.data() + m0 * K, K, buf.data(), acc, [&](int m, int64_t b, int v) {
          return _mm512_mul_ps(_mm512_set1_ps(xs[m * xr.KB + b]), _mm512_loadu_ps(sc.data() + b / bpg * VT + v * 16));
        });
        for (int64_t g = 0; g < G; ++g)
          for (int v = 0; v < 2; ++v) {
            const __m512 mv = _mm512_loadu_ps(mn.data() + g * VT + v * 16);
            for (int m = 0; m < MB; ++m)
              acc[m][v] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[(m0 + m) * G + g]), acc[m][v]);
          }
        for (int m = 0; m < MB; ++m)
          for (int v = 0; v < 2; ++v) store_tile(y + m0 * N, N, n0, m, v, acc[m][v]);
      };
      vnni_row_blocks(M, run);
    });
    return;
  }
  const TileChunks ch = tile_chunks(M, tiles, 8 * K);
  parallel_chunks(ch.n, [&](int64_t c) {
    const int64_t t1 = ch.end(c);
    for (int64_t t = ch.begin(c); t < t1;) {
      const uint8_t* tile = qv + t * 8 * K;
      const S* tsm = smv + t * G * 32;
      if (M > 2 && t + 2 <= t1) {
        vnni_pass_i4a8<2, S>(xr, xsum, M, K, G, bpg, tile, tsm, y + t * 16, N);
        t += 2;
      } else {
        vnni_pass_i4a8<1, S>(xr, xsum, M, K, G, bpg, tile, tsm, y + t * 16, N);
        t += 1;
      }
    }
  });
}
#pragma GCC pop_options

void int8_gemm_vnni(const float* xp, int64_t M, int64_t K, const int8_t* qv, const float* sp, float* yp, int64_t N,
                    const uint16_t* gs, bool a8) {
  TORCH_CHECK(HAS_VNNI, "the INT8 VNNI tile layout needs AVX512-VNNI");
  TORCH_CHECK(N % 16 == 0 && K % 32 == 0, "the INT8 VNNI tile layout needs N % 16 == 0 and K % 32 == 0");
  vnni_gemm_i8_tiles(quantize_blocks_i16(xp, M, K, false, a8), M, K, qv, sp, gs, yp, N);
}

// y [M, N] = sum_k x[m, k] (q[n, k] * scale[n, g] + min[n, g]), q and the scales in the INT4 VNNI tile layout
template <typename S>
static void int4_gemm_vnni(const float* xp, int64_t M, int64_t K, const uint8_t* qv, const S* smv, int64_t gs,
                           float* yp, int64_t N) {
  TORCH_CHECK(HAS_VNNI, "the INT4 VNNI tile layout needs AVX512-VNNI");
  TORCH_CHECK(N % 16 == 0 && K % 32 == 0 && gs % 32 == 0 && K % gs == 0,
              "the INT4 VNNI tile layout needs N % 16 == 0, K % 32 == 0 and groups of whole 32-blocks");
  const std::vector<float> xsum = group_sums(xp, M, K, gs);
  vnni_gemm_i4_tiles(quantize_blocks_i16(xp, M, K, false), xsum.data(), M, K, gs, qv, smv, yp, N);
}

void int4_gemm_vnni_t(const float* x, int64_t M, int64_t K, const uint8_t* qv, const torch::Tensor& smv, int64_t gs,
                      float* y, int64_t N) {
  if (smv.scalar_type() == at::kShort)
    int4_gemm_vnni(x, M, K, qv, reinterpret_cast<const Z16*>(smv.data_ptr<int16_t>()), gs, y, N);
  else if (smv.scalar_type() == at::kHalf)
    int4_gemm_vnni(x, M, K, qv, reinterpret_cast<const uint16_t*>(smv.data_ptr<at::Half>()), gs, y, N);
  else
    int4_gemm_vnni(x, M, K, qv, smv.data_ptr<float>(), gs, y, N);
}

template <typename S>
static void int4a8_gemm_vnni(const float* xp, int64_t M, int64_t K, const uint8_t* qv, const S* smv, int64_t gs,
                             float* yp, int64_t N) {
  TORCH_CHECK(HAS_VNNI, "the INT4 a8 tile layout needs AVX512-VNNI");
  TORCH_CHECK(N % 16 == 0 && K % 32 == 0 && gs % 32 == 0 && K % gs == 0,
              "the INT4 a8 tile layout needs N % 16 == 0, K % 32 == 0 and groups of whole 32-blocks");
  const std::vector<float> xsum = group_sums(xp, M, K, gs);
  vnni_gemm_i4a8_tiles(quantize_blocks_i8(xp, M, K), xsum.data(), M, K, gs, qv, smv, yp, N);
}

void int4a8_gemm_vnni_t(const float* x, int64_t M, int64_t K, const uint8_t* qv, const torch::Tensor& smv, int64_t gs,
                        float* y, int64_t N) {
  if (smv.scalar_type() == at::kShort)
    int4a8_gemm_vnni(x, M, K, qv, reinterpret_cast<const Z16*>(smv.data_ptr<int16_t>()), gs, y, N);
  else if (smv.scalar_type() == at::kHalf)
    int4a8_gemm_vnni(x, M, K, qv, reinterpret_cast<const uint16_t*>(smv.data_ptr<at::Half>()), gs, y, N);
  else
    int4a8_gemm_vnni(x, M, K, qv, smv.data_ptr<float>(), gs, y, N);
}

// x [M, K] fp32 against the INT4 VNNI or a8 tile layout (`gemm`: int4_gemm_vnni_t or int4a8_gemm_vnni_t)
template <typename F>
static torch::Tensor int4_tiles_linear(torch::Tensor x, torch::Tensor qv, torch::Tensor smv, int64_t group_size,
                                       const F& gemm) {
  TORCH_CHECK(x.dim() == 2 && qv.dim() == 2 && qv.size(1) * 2 == x.size(1), "shapes: x [M, K], q [N, K / 2]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && qv.scalar_type() == at::kByte &&
              (smv.scalar_type() == at::kFloat || smv.scalar_type() == at::kHalf || smv.scalar_type() == at::kShort),
              "dtypes: x fp32, q uint8, scale_min fp32 or fp16, or int16 (fp16 scale, zero point) pairs");
  const int64_t M = x.size(0), K = x.size(1), N = qv.size(0);
  TORCH_CHECK(group_size > 0 && K % group_size == 0 && smv.numel() == N * (K / group_size) * 2,
              "scale_min must be [N / 16, K / group_size, 2, 16]");
  x = x.contiguous(); qv = qv.contiguous(); smv = smv.contiguous();
  auto y = torch::empty({M, N}, x.options());
  gemm(x.data_ptr<float>(), M, K, qv.data_ptr<uint8_t>(), smv, group_size, y.data_ptr<float>(), N);
  return y;
}

torch::Tensor int4a8_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor smv, int64_t group_size) {
  return int4_tiles_linear(x, qv, smv, group_size, int4a8_gemm_vnni_t);
}

torch::Tensor int4_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor smv, int64_t group_size) {
  return int4_tiles_linear(x, qv, smv, group_size, int4_gemm_vnni_t);
}

torch::Tensor int8_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor scale, torch::Tensor gs, bool a8) {
  TORCH_CHECK(x.dim() == 2 && qv.dim() == 2 && x.size(1) == qv.size(1), "shapes: x [M, K], q [N, K] (tile layout)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && qv.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat,
              "dtypes: x fp32, q int8, scale fp32");
  x = x.contiguous(); qv = qv.contiguous(); scale = scale.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = qv.size(0);
  auto y = torch::empty({M, N}, x.options());
  int8_gemm_vnni(x.data_ptr<float>(), M, K, qv.data_ptr<int8_t>(), scale.data_ptr<float>(), y.data_ptr<float>(), N,
                 group_scales(gs, N, K), a8);
  return y;
}
