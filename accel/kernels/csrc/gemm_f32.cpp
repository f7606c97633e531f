// gemm_f32.cpp: fp32 small GEMM and the AVX-512 panel layout.
#include "gemm_f32.h"
#include "threads.h"

// ---- fp32 small GEMM (1-96 rows: decode, verification, batched decode) -------------------------------------
// Every output is two FMA chains, one over the even and one over the odd 8-input blocks (a last lone block is
// even), summed once at the end. At one activation row a single chain per output waits on FMA latency, not memory
// (two chains stream faster; four would, but don't fit a tile in 16 ymm). Every M computes an output in this
// order, so a row's result does not depend on how many rows share the call: verifying draft tokens reproduces the
// decode step exactly.

// One activation row, one weight row: both chains live in one sequential pass (the hardware prefetcher's best
// case; two rows or halves streamed at once measured slower).
static inline float dot_row(const float* x, const float* w, int64_t K) {
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    a = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a);
    b = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(w + k + 8), b);
  }
  if (k < K) a = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a);
  return hsum256(_mm256_add_ps(a, b));
}

// A register tile of MR activation rows x NR weight rows, one chain at a time (both at once would not fit 4 x 3 in
// 16 ymm): per 8 inputs NR weight + MR activation loads feed MR * NR FMAs. `xe` holds each activation row's even
// blocks, then its odd ones (`split_blocks`), so both passes read activations contiguously; the weight tile comes
// from DRAM in the first pass and from L1 in the second. `pf_lines` lines from `pf` (a share of the next tile) are
// prefetched evenly over both passes, so the DRAM stream never waits for the second.
template <int MR, int NR>
static inline void micro(const float* xe, int64_t K, const float* w, float* y, int64_t N, const char* pf,
                         int64_t pf_lines) {
  const int64_t E = (K + 8) / 16 * 8;  // even inputs per row
  const int64_t steps = 2 * ((K + 15) / 16);  // both passes' steps: pf_lines spread evenly over them
  int64_t acc = 0;
  __m256 even[MR][NR], a[MR][NR];
  for (int pass = 0; pass < 2; ++pass) {
    for (int m = 0; m < MR; ++m)
      for (int r = 0; r < NR; ++r) a[m][r] = _mm256_setzero_ps();
    const float* xp = xe + pass * E;
    for (int64_t k = 8 * pass, i = 0; k < K; k += 16, ++i) {
      for (acc += pf_lines; acc >= steps; acc -= steps, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
      __m256 wv[NR];
      for (int r = 0; r < NR; ++r) wv[r] = _mm256_loadu_ps(w + r * K + k);
      for (int m = 0; m < MR; ++m) {
        const __m256 xv = _mm256_loadu_ps(xp + m * K + 8 * i);
        for (int r = 0; r < NR; ++r) a[m][r] = _mm256_fmadd_ps(xv, wv[r], a[m][r]);
      }
    }
    if (pass == 0)
      for (int m = 0; m < MR; ++m)
        for (int r = 0; r < NR; ++r) even[m][r] = a[m][r];
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) y[m * N + r] = hsum256(_mm256_add_ps(even[m][r], a[m][r]));
}

// Each row of x as its even 8-input blocks, then its odd ones.
static void split_blocks(const float* x, int64_t M, int64_t K, float* out) {
  const int64_t E = (K + 8) / 16 * 8;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    float* o = out + m * K;
    for (int64_t k = 0, i = 0; k < K; k += 16, i += 8) {
      std::memcpy(o + i, xr + k, 8 * sizeof(float));
      if (k + 8 < K) std::memcpy(o + E + i, xr + k + 8, 8 * sizeof(float));
    }
  }
}

// 2-4 activation rows (a verify step's draft rows) against one weight row: both chains of every row live in one
// sequential pass, dot_row's stream and summation order (a row's result is dot_row's bit for bit), the weight row
// read from DRAM once. Each 64-byte step prefetches the line 1 KB ahead: with 2-4 rows of FMAs between loads the
// hardware prefetcher alone fell behind (512 B and 2 KB ahead were worse, and one row gains nothing). Up to 4 rows
// this pass beats the 4 x 3 tiles; from 5 the tiles win (the row pass's 10-12 accumulators and the x rows it
// rereads per weight row cost more than a second tile block).
constexpr int64_t F32_ROW_PASS_MAX = 4;
template <int MR>
static inline void dot_rows(const float* x, int64_t K, const float* w, float* y, int64_t N) {
  __m256 a[MR], b[MR];
  for (int m = 0; m < MR; ++m) a[m] = b[m] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(w + k) + 1024, _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
    for (int m = 0; m < MR; ++m) {
      a[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k), w0, a[m]);
      b[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k + 8), w1, b[m]);
    }
  }
  if (k < K) {
    const __m256 w0 = _mm256_loadu_ps(w + k);
    for (int m = 0; m < MR; ++m) a[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k), w0, a[m]);
  }
  for (int m = 0; m < MR; ++m) y[m * N] = hsum256(_mm256_add_ps(a[m], b[m]));
}

// Output rows [n0, n1) for all M activation rows, weight-row tiles outermost: each tile of NR weight rows comes
// from DRAM once (prefetched during the previous tile's row blocks) and is reused from L1 by every row
// block, while the activations (M x K floats) stay in L2. Above F32_ROW_PASS_MAX rows it beats the row-pass kernel
// on the model's Linears with cold weights (scripts/bench_kernels.py); up to it, rows stream each weight row in turn
// instead (`dot_row`, `dot_rows`).
static void gemm_rows(const float* x, const float* xe, int64_t M, int64_t K, const float* w, float* y, int64_t N,
                      int64_t n0, int64_t n1) {
  if (M <= F32_ROW_PASS_MAX) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* wn = w + n * K;
      switch (M) {
        case 4: dot_rows<4>(x, K, wn, y + n, N); break;
        case 3: dot_rows<3>(x, K, wn, y + n, N); break;
        case 2: dot_rows<2>(x, K, wn, y + n, N); break;
        default: y[n] = dot_row(x, wn, K); break;
      }
    }
    return;
  }
  constexpr int NR = 3;
  const int64_t blocks = (M + 3) / 4, tile_lines = NR * K * 4 / 64;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) {
    const float* wn = w + n * K;
    // every row block prefetches its share of the next tile, so the weight stream runs through the whole tile's
    // arithmetic: the first block prefetching all of it left DRAM idle during the others (slower at 9-16 rows)
    const char* pf = reinterpret_cast<const char*>(wn + NR * K);
    const int64_t pf_lines = n + 2 * NR <= N ? tile_lines : 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t m0 = 4 * b, lines = pf_lines * (b + 1) / blocks - pf_lines * b / blocks;
      const float* xm = xe + m0 * K;
      float* ym = y + m0 * N + n;
      switch (std::min<int64_t>(4, M - m0)) {
        case 4: micro<4, NR>(xm, K, wn, ym, N, pf, lines); break;
        case 3: micro<3, NR>(xm, K, wn, ym, N, pf, lines); break;
        case 2: micro<2, NR>(xm, K, wn, ym, N, pf, lines); break;
        default: micro<1, NR>(xm, K, wn, ym, N, pf, lines); break;
      }
      pf += lines * 64;
    }
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot_row(x + m * K, w + n * K, K);
}

// AVX-512 machines keep fp32 weights in panels ([ceil(N / 48), K, 48]: for each k, 48 consecutive outputs), and a
// register tile of up to 8 rows x 48 outputs takes one weight load per 8 FMAs with one sequential chain per output
// (no horizontal sums). Why: the [N, K] dot-product tiles folded 24 zmm chains per tile, and on a 2-core Zen 4 their
// verify rows' arithmetic did not overlap the weight stream. At prefill sizes (32-512 rows) panels run level with
// or above oneDNN's reordered weights, so panels serve every row count and the weight is held once. A row's result
// is its sequential k-sum: it does not depend on the rows beside it. A software prefetch (1 KB ahead into L1)
// measured slower.
constexpr int64_t PANEL_ROWS = 8;

// fp16 panels (kind 6, `weight_dtype: float16`) hold the same layout at half the bytes: each k's 48 weights are
// converted to fp32 in registers (vcvtph2ps, AVX-512F) before the same FMAs, so a row's result is the fp32 panel's
// on the fp16-rounded weight. Why: a batch-1 step streams every weight once, and half the bytes is the step's
// largest lever for a model served unquantized.
#pragma GCC push_options
#pragma GCC target("avx512f")
static inline __m512 panel_load(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 panel_load(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <int MR, typename W>
static void panel_tile(const float* x, int64_t K, const W* p, float* y, int64_t N, int64_t cols) {
  __m512 a[MR][3];
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < 3; ++g) a[m][g] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const W* pk = p + k * PANEL;
    const __m512 w0 = panel_load(pk), w1 = panel_load(pk + 16), w2 = panel_load(pk + 32);
    for (int m = 0; m < MR; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * K + k]);
      a[m][0] = _mm512_fmadd_ps(b, w0, a[m][0]);
      a[m][1] = _mm512_fmadd_ps(b, w1, a[m][1]);
      a[m][2] = _mm512_fmadd_ps(b, w2, a[m][2]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < 3; ++g) {
      const int64_t c = std::clamp<int64_t>(cols - 16 * g, 0, 16);
      _mm512_mask_storeu_ps(y + m * N + 16 * g, static_cast<__mmask16>((1u << c) - 1), a[m][g]);
    }
}

// Output panels [t0, t1) of y [M, N]: rows in groups of PANEL_ROWS and a last one of the rest, each a pass over the
// panel (the first from memory, the rest from L2). Why full groups first: the first pass streams the panel with as
// much arithmetic as hides under it, and the later ones add only their own (faster than balanced groups at 9 and
// 12 rows). k-blocking the groups (64-128 k per block, partial sums in a local tile) and prefetching the next panel
// during the last pass both measured slower.
template <typename W>
static void panel_rows(const float* x, int64_t M, int64_t K, const W* p, float* y, int64_t N, int64_t t0,
                       int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const W* pt = p + t * K * PANEL;
    const int64_t cols = std::min<int64_t>(PANEL, N - t * PANEL);
    for (int64_t m0 = 0; m0 < M; m0 += PANEL_ROWS) {
      const int64_t m1 = std::min(M, m0 + PANEL_ROWS);
      const float* xg = x + m0 * K;
      float* yg = y + m0 * N + t * PANEL;
      switch (m1 - m0) {
        case 1: panel_tile<1>(xg, K, pt, yg, N, cols); break;
        case 2: panel_tile<2>(xg, K, pt, yg, N, cols); break;
        case 3: panel_tile<3>(xg, K, pt, yg, N, cols); break;
        case 4: panel_tile<4>(xg, K, pt, yg, N, cols); break;
        case 5: panel_tile<5>(xg, K, pt, yg, N, cols); break;
        case 6: panel_tile<6>(xg, K, pt, yg, N, cols); break;
        case 7: panel_tile<7>(xg, K, pt, yg, N, cols); break;
        default: panel_tile<8>(xg, K, pt, yg, N, cols); break;
      }
    }
  }
}
#pragma GCC pop_options

// Up to 16 rows a call streams its weights: chunks of ~STREAM_CHUNK bytes, the same number per thread; above, one
// panel per chunk.
template <typename W>
void panel_gemm(const float* x, int64_t M, int64_t K, const W* p, float* y, int64_t N) {
  const int64_t T = (N + PANEL - 1) / PANEL;
  int64_t n = T;
  if (M <= 16) {
    const int64_t nt = work_threads(), bytes = T * K * PANEL * static_cast<int64_t>(sizeof(W));
    const int64_t per_thread = std::max<int64_t>(1, (bytes + nt * STREAM_CHUNK / 2) / (nt * STREAM_CHUNK));
    n = std::max<int64_t>(1, std::min(T, nt * per_thread));
  }
  parallel_chunks(n, [&](int64_t c) { panel_rows(x, M, K, p, y, N, c * T / n, (c + 1) * T / n); });
}
template void panel_gemm<float>(const float* x, int64_t M, int64_t K, const float* p, float* y, int64_t N);
template void panel_gemm<uint16_t>(const float* x, int64_t M, int64_t K, const uint16_t* p, float* y, int64_t N);

void f32_gemm(const float* xp, int64_t M, int64_t K, const float* wp, float* yp, int64_t N) {
  const int64_t CR = chunk_rows(M, N, K * 4, 48);  // larger M: chunks of 48 output rows (whole 3- and 6-row tiles)
  // Inside a decode team every thread splits its own copy (no barrier; M x K floats is small).
  static thread_local std::vector<float> split;
  const float* xe = xp;
  if (M > F32_ROW_PASS_MAX) {
    if (static_cast<int64_t>(split.size()) < M * K) split.resize(M * K);
    split_blocks(xp, M, K, split.data());
    xe = split.data();
  }
  parallel_chunks((N + CR - 1) / CR,
                  [&](int64_t c) { gemm_rows(xp, xe, M, K, wp, yp, N, c * CR, std::min(N, (c + 1) * CR)); });
}

torch::Tensor f32_linear(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.size(1) % 8 == 0, "x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "fp32 only");
  x = x.contiguous(); w = w.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options());
  f32_gemm(x.data_ptr<float>(), M, K, w.data_ptr<float>(), y.data_ptr<float>(), N);
  return y;
}

// fp32 or fp16 panels ([ceil(N / 48), K, 48]) by the tensor's dtype.
torch::Tensor f32_panel_linear(torch::Tensor x, torch::Tensor p, int64_t N) {
  TORCH_CHECK(HAS_AVX512, "weight panels need AVX-512");
  TORCH_CHECK(x.dim() == 2 && p.dim() == 3 && p.size(2) == PANEL && x.size(1) == p.size(1) &&
              p.size(0) == (N + PANEL - 1) / PANEL, "x [M, K], panels [ceil(N / 48), K, 48]");
  const bool half = p.scalar_type() == at::kHalf;
  TORCH_CHECK(x.scalar_type() == at::kFloat && (half || p.scalar_type() == at::kFloat) && p.is_contiguous(),
              "x fp32, panels fp32 or fp16");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty({M, N}, x.options());
  if (half) panel_gemm(x.data_ptr<float>(), M, K, reinterpret_cast<const uint16_t*>(p.data_ptr<at::Half>()),
                       y.data_ptr<float>(), N);
  else panel_gemm(x.data_ptr<float>(), M, K, p.data_ptr<float>(), y.data_ptr<float>(), N);
  return y;
}
