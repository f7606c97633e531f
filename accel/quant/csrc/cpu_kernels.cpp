// accel's CPU kernels (see accel/quant/cpu_kernels.py for why each exists and how it is built).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <climits>
#include <linux/futex.h>
#include <chrono>
#include <memory>
#include <thread>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>
#include <omp.h>

static inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

// Weight rows the int8 / int4 row kernels prefetch ahead: ~9 KB / ~2.3 KB of SmolLM2's 576-wide rows. AVX2 EPYC,
// whole INT8 batch-1 engine steps paired in one process: 16 rows 0.97x the time of 8 (32: 1.00x, 64: 1.06x);
// INT4 at 16 rows 1.01x of 8.
constexpr int64_t PF_ROWS_I8 = 16, PF_ROWS_I4 = 8;

// What a thread waiting at a barrier of the decode step prefetches into L2, PF_WAIT_LINES cache lines per spin: its
// range of the next Linear's weights (`prefetch_next`). Why: the waits (rope on one thread, attention's 3 kv heads
// on 2 threads, the end of a Linear) leave a core's memory link idle, and the next Linear then starts from L2.
// INT8 batch 1, 48-token decodes alternated in one process: two CCDs 1.02-1.03x (314 -> 320-323 tok/s), one CCD
// 1.01x; 1 to 4 lines per spin and 64 KB to the whole range within 1%.
struct PrefetchCursor {
  const char* cur = nullptr;
  const char* end = nullptr;
};
static thread_local PrefetchCursor tl_pf;
constexpr int PF_WAIT_LINES = 2;

// The threads of one-call decode step (`decode_layers`): every thread runs the whole step, each Linear's chunks
// are split among them (`parallel_chunks`), and a barrier ends each phase. Why not a parallel region per
// kernel: at batch 1 a step has ~180 of them, and their fork/join on OpenMP's pool left the second thread idle
// (spinning in libgomp) ~38% of the step (perf, SmolLM2 INT8 on 2 cores).
struct Team {
  // A phase's chunks: thread t owns the contiguous range [t * c / n, (t + 1) * c / n), taken from the front by
  // itself and from the back by threads that finished their own. Each slot packs (phase, front, back): any thread
  // that finds it holding an earlier phase sets this phase's range first, so a preempted owner's chunks are still
  // taken. Slots are created by the thread that starts the team (`reserve`).
  struct alignas(64) Range {
    std::atomic<uint64_t> v{0};
  };
  std::unique_ptr<Range[]> ranges;
  void reserve(int threads) { ranges.reset(new Range[threads]); }

  int n = 1;
  alignas(64) std::atomic<int> arrived{0};
  alignas(64) std::atomic<int> gen{0};
  alignas(64) std::atomic<int> sleepers{0};

  // Spin (~0.5 ms: a phase's wait is tens of us, and sleeping after 2,000 spins measured 0.96x at batch 1), then
  // sleep on a futex. Sleeping, not yielding, matters where the server's event loop shares the cores: a core that
  // goes idle pulls the preempted team thread over at once, while a spinning or yielding one keeps it queued.
  static constexpr int SPINS = 20000;

  void barrier() {
    const int g = gen.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
      arrived.store(0, std::memory_order_relaxed);
      gen.store(g + 1, std::memory_order_seq_cst);
      if (sleepers.load(std::memory_order_seq_cst) > 0)
        syscall(SYS_futex, reinterpret_cast<int*>(&gen), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
      return;
    }
    for (int spins = 0; gen.load(std::memory_order_acquire) == g; ++spins) {
      if (spins < SPINS) {
        if (tl_pf.cur < tl_pf.end) {
          for (int i = 0; i < PF_WAIT_LINES; ++i) _mm_prefetch(tl_pf.cur + 64 * i, _MM_HINT_T1);
          tl_pf.cur += 64 * PF_WAIT_LINES;
        } else {
          _mm_pause();
        }
        continue;
      }
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (gen.load(std::memory_order_seq_cst) == g)  // else the release came first: it may not have seen us
        syscall(SYS_futex, reinterpret_cast<int*>(&gen), FUTEX_WAIT_PRIVATE, g, nullptr, nullptr, 0);
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
};

struct TeamSlot {
  Team* team = nullptr;
  int rank = 0;
  uint64_t phase = 0;  // parallel_chunks calls so far: every thread of the team makes the same calls
};
static thread_local TeamSlot tl_team;

// step(rank, n) on a team of up to `threads` threads (in this thread alone where there is one, or inside another
// parallel region).
template <typename F>
static void run_team(int threads, const F& step) {
  if (threads <= 1 || at::in_parallel_region()) {
    step(0, 1);
    return;
  }
  Team team;
  team.reserve(threads);
#pragma omp parallel num_threads(threads)
  {
    const int rank = omp_get_thread_num(), n = omp_get_num_threads();
    if (rank == 0) team.n = n;
#pragma omp barrier
    tl_team = TeamSlot{n > 1 ? &team : nullptr, rank, 0};
    step(rank, n);
    tl_team = TeamSlot{};
  }
}

// Threads that split a kernel's work: the team's size inside a team. Every thread of a team must plan the same
// chunks, and torch's count read from a pool thread can differ from the one the team was started with.
static int64_t work_threads() {
  return tl_team.team ? tl_team.team->n : std::max<int64_t>(1, at::get_num_threads());
}

// fn(c) for c in [0, n), the chunks handed out one at a time rather than split once up front: where the server's
// event loop or a client shares the cores, a preempted thread then delays only the chunk it holds while the others
// take the rest; with fixed splits the whole step waited at the region's end for the preempted thread's slice
// (batch-1 decode over HTTP ran ~20% below the same engine in-process on 2 cores).
// Inside a team each thread takes its own contiguous range first and then steals from the others' ends
// (`Team::Range`), instead of every chunk coming from one shared counter (as ggml's mul_mat does). Why: each
// thread's weight stream then runs on through its chunks, and a claim touches the thread's own cache line. Where
// a VM puts the 2 vCPUs of a Zen 4 on different CCDs (~165 ns core to core against ~30, each core with its own
// link to memory: ~64 GB/s against ~37), the shared counter held INT8 batch-1 decode to ~34 GB/s of weights and
// contiguous ranges reached ~41 (252 -> 300 tok/s, medians of 160 alternated runs); on one CCD +3%.
// Output rows per chunk of a GEMM with `tile`-row L1 tiles. At decode sizes (M <= 8) a call is a weight stream,
// and a thread that streams 16-32 KB and then jumps to the next free chunk restarts the hardware prefetcher each
// time: the read stream ran at ~25 GB/s in 16 KB chunks and ~33 in 128-256 KB ones (2 cores, 134 MB of INT8
// weights). So decode chunks hold ~STREAM_CHUNK bytes, in a multiple of the thread count so the threads finish
// together; larger M computes enough per byte that one tile per chunk balances best.
constexpr int64_t STREAM_CHUNK = 192 << 10;
static int64_t chunk_rows(int64_t M, int64_t N, int64_t row_bytes, int64_t tile) {
  if (M > 8) return tile;
  const int64_t nt = work_threads();
  const int64_t per_thread = std::max<int64_t>(1, (N * row_bytes + nt * STREAM_CHUNK / 2) / (nt * STREAM_CHUNK));
  const int64_t rows = (N + nt * per_thread - 1) / (nt * per_thread);
  return (rows + 23) / 24 * 24;  // whole register tiles of the fp32 (3) and integer (8) kernels
}

// Chunks of the tile kernels, in whole tile pairs: up to 16 rows about STREAM_CHUNK bytes each and the same
// number per thread, their sizes within one pair of each other (rounding every chunk up to the same size left a
// short last chunk and one thread waiting for the other at the end of most Linears); above 16 rows, one pair each.
// Why 16 and not 8 as for the row kernels: a speculative verify step of 9-16 rows streams its weights like a decode
// step, and one pair per chunk made a 9-row INT8 step cost 10.2 ms against 6.3 at 8 rows (6.7 with stream chunks;
// 16 rows 13.8 -> 10.8 ms). SmolLM2 INT8, 2 EPYC cores (AVX512-VNNI): batch-16 decode +10-18%, n-gram
// speculation at batch 1 1.73-1.78x -> 1.92x (bench_spec.py, input-grounded, k 15, alternated runs).
struct TileChunks {
  int64_t n, pairs, tiles;
  int64_t begin(int64_t c) const { return std::min(tiles, 2 * (c * pairs / n)); }
  int64_t end(int64_t c) const { return std::min(tiles, 2 * ((c + 1) * pairs / n)); }
};
static TileChunks tile_chunks(int64_t M, int64_t tiles, int64_t tile_bytes) {
  const int64_t pairs = (tiles + 1) / 2;
  if (M > 16) return {std::max<int64_t>(pairs, 1), pairs, tiles};
  const int64_t nt = work_threads();
  const int64_t per_thread = std::max<int64_t>(1, (tiles * tile_bytes + nt * STREAM_CHUNK / 2) / (nt * STREAM_CHUNK));
  return {std::max<int64_t>(1, std::min(pairs, nt * per_thread)), pairs, tiles};
}

// The next chunk of range slot `s` in phase `ph` (its range [lo, hi) set first if the slot holds an earlier
// phase): the front one for the owner, the back one for a thief; -1 when none is left. Chunk indices take 24 bits
// (a call has at most one chunk per 8 output rows).
static int64_t claim_chunk(std::atomic<uint64_t>& s, uint64_t ph, int64_t lo, int64_t hi, bool owner) {
  auto pack = [ph](int64_t f, int64_t b) { return ph << 48 | static_cast<uint64_t>(f) << 24 | static_cast<uint64_t>(b); };
  uint64_t cur = s.load(std::memory_order_acquire);
  for (;;) {
    if (cur >> 48 != ph) {
      if (s.compare_exchange_weak(cur, pack(lo, hi), std::memory_order_acq_rel)) cur = pack(lo, hi);
      continue;
    }
    const int64_t f = (cur >> 24) & 0xFFFFFF, b = cur & 0xFFFFFF;
    if (f >= b) return -1;
    if (s.compare_exchange_weak(cur, owner ? pack(f + 1, b) : pack(f, b - 1), std::memory_order_acq_rel))
      return owner ? f : b - 1;
  }
}

template <typename F>
static void parallel_chunks(int64_t n, const F& fn) {
  if (Team* team = tl_team.team) {  // inside a team: every thread is here; take chunks, then wait for the others
    const int nt = team->n, r = tl_team.rank;
    const uint64_t ph = tl_team.phase++ % 0xFFFF + 1;  // 16 bits, never 0 (a new slot's)
    for (int k = 0; k < nt; ++k) {
      const int t = (r + k) % nt;
      for (int64_t c; (c = claim_chunk(team->ranges[t].v, ph, t * n / nt, (t + 1) * n / nt, k == 0)) >= 0;) fn(c);
    }
    team->barrier();
    return;
  }
  const int64_t nt = std::min<int64_t>(at::get_num_threads(), n);
  if (nt <= 1 || at::in_parallel_region()) {
    for (int64_t c = 0; c < n; ++c) fn(c);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, nt, 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < n;
         c = next.fetch_add(1, std::memory_order_relaxed))
      fn(c);
  });
}

// ---- INT8 weights x 16-bit activations ------------------------------------------------------------------------
// Widening every int8 weight to fp32 (load, sign-extend, convert, FMA: ~4 uops per 8 weights) made the INT8 GEMV
// compute-bound at ~21 GB/s. Here the activations are rounded once to 16-bit integers per block of 32 inputs, each
// block with its own scale (error <= 1.5e-5 of the block's largest value, so an outlier channel costs its own block
// only; per-row or 14-bit scales let near-tied greedy tokens flip against transformers'), and 32 weights go through
// sign-extends, multiply-add pairs into int32 (vpmaddwd + vpaddd, or vpdpwssd with AVX512-VNNI) and one FMA of the
// block's scale. A row's result does not depend on the other rows of the call.
constexpr int XQ_MAX = 32767;  // 16-bit activations: a block of 32 sums at most 32 * 128 * 32767 < 2^31

struct QuantBlocks {
  std::vector<int16_t> q;  // [M, K]
  std::vector<float> scale;  // [M, ceil(K / 32)]
  int64_t KB = 0;
};

// Activation rows -> 16-bit integers per block of 32; `permute` stores each block in the INT4 nibble order.
static QuantBlocks quantize_blocks_i16(const float* x, int64_t M, int64_t K, bool permute) {
  QuantBlocks r;
  r.KB = (K + 31) / 32;
  r.q.resize(M * K);
  r.scale.resize(M * r.KB);
  // rows in parallel only for prefill-sized M: at decode a parallel region costs more than the rows
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t b = 0; b < r.KB; ++b) {
        const int64_t k0 = b * 32, n = std::min<int64_t>(32, K - k0);
        const float* xb = x + m * K + k0;
        int16_t* q = r.q.data() + m * K + k0;
        if (n == 32) {  // vectorized: called for every Linear of a decode step, where the scalar loop cost ~2 us
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

// MB activation rows (1..4 or 8) against output rows [n0, n1): y[m, n] = scale[n] * sum_b xs[m, b] * dot_b(xq[m], q[n]).
// Defined twice by this macro: with vpmaddwd + vpaddd (AVX2), and inside a `target` region with vpdpwssd (the
// VNNI instruction may only appear in code compiled for it; the runtime check picks the version).
#define ACCEL_DEFINE_TILE_I16(NAME, DOT)                                                                         \
template <int MB>                                                                                              \
static void NAME(const int16_t* xq, const float* xs, int64_t KB, int64_t K, const int8_t* q, const float* scale, \
                 float* y, int64_t N, int64_t n0, int64_t n1) {                                                \
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
      for (int m = 0; m < MB; ++m) {                                                                           \
        __m256i a = DOT(_mm256_setzero_si256(), w0,                                                           \
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + k)));                \
        a = DOT(a, w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + k + 16)));             \
        tot[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_set1_ps(xs[m * KB + k / 32]), tot[m]);          \
      }                                                                                                        \
    }                                                                                                          \
    if (k < K)                                                                                                 \
      for (int m = 0; m < MB; ++m) {                                                                           \
        int32_t a = 0;                                                                                         \
        for (int64_t kk = k; kk < K; ++kk) a += static_cast<int32_t>(row[kk]) * xq[m * K + kk];                \
        tail[m] = static_cast<float>(a) * xs[m * KB + k / 32];                                                 \
      }                                                                                                        \
    const float s = scale[n];                                                                                  \
    for (int m = 0; m < MB; ++m) y[m * N + n] = (hsum256(tot[m]) + tail[m]) * s;                               \
  }                                                                                                            \
}

#define ACCEL_DOT_MADD(acc, w, x) _mm256_add_epi32(acc, _mm256_madd_epi16(w, x))
#define ACCEL_DOT_VNNI(acc, w, x) _mm256_dpwssd_epi32(acc, w, x)
ACCEL_DEFINE_TILE_I16(tile_i16, ACCEL_DOT_MADD)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512vnni")
ACCEL_DEFINE_TILE_I16(tile_i16_vnni, ACCEL_DOT_VNNI)
#pragma GCC pop_options

static const bool HAS_VNNI = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512bw");  // the prefill GEMM widens bytes with AVX512-BW

// One or two activation rows stream each weight once, in one linear pass per chunk. On Intel (Xeon with AVX-512 /
// AMX, 2 cores, ~14 GB/s) a software prefetch 4 KB ahead of that pass lifted INT8 decode 1.05-1.12x (8 KB the same,
// 1 KB 1.05x, 16 KB 1.05x); on AMD EPYC the hardware prefetcher alone ran 9-17% faster than a prefetch of the next
// tiles, so AMD keeps it.
static const int64_t STREAM_PREFETCH_AHEAD = __builtin_cpu_is("intel") ? 4096 : 0;
static inline const char* stream_ahead(const void* p) {
  return STREAM_PREFETCH_AHEAD ? static_cast<const char*>(p) + STREAM_PREFETCH_AHEAD : nullptr;
}

// the prefill GEMMs (AVX512-VNNI), defined below
// Decode and verify steps (up to 32 rows: the runtime's one-call decode path) keep the row kernels: the INT8 one's
// result for a row does not depend on the other rows of the call, so greedy output is the same with and without
// speculation. Weights in the VNNI tile layouts (`int8_linear_vnni`, `int4_linear_vnni`) take the tile kernels at
// every row count, with the prefill GEMMs' numerics.
constexpr int64_t VNNI_MIN_ROWS = 33;
static void vnni_gemm_i8_rows(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* q, const float* scale,
                              float* y, int64_t N);

// y [M, N] = (x [M, K] @ q[N, K]^T) * scale[N]
static void int8_gemm(const float* xp, int64_t M, int64_t K, const int8_t* qp, const float* sp, float* yp,
                      int64_t N) {
  const QuantBlocks xr = quantize_blocks_i16(xp, M, K, false);
  if (HAS_VNNI && M >= VNNI_MIN_ROWS && K % 32 == 0) return vnni_gemm_i8_rows(xr, M, K, qp, sp, yp, N);
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
#define ACCEL_TILE_I16(F, R) F<R>(xm, xs, xr.KB, K, qp, sp, ym, N, n0, n1)
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

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1), "shapes: x [M, K], q [N, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat,
              "dtypes: x fp32, q int8, scale fp32");
  TORCH_CHECK(x.size(1) % 8 == 0, "K must be a multiple of 8");
  x = x.contiguous(); q = q.contiguous(); scale = scale.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  auto y = torch::empty({M, N}, x.options());
  int8_gemm(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), scale.data_ptr<float>(), y.data_ptr<float>(), N);
  return y;
}

// ---- fp32 small GEMM (1-96 rows: decode, verification, batched decode) -------------------------------------
// Every output is two FMA chains, one over the even and one over the odd 8-input blocks (a last lone block is
// even), summed once at the end. At one activation row a single chain per output waits on FMA latency, not memory:
// 2 cores of an AVX2 EPYC, the model's Linears with cold weights, one chain 24.2 GB/s, two 27.6, four 29.1 (four
// don't fit a tile in 16 ymm). Every M computes an output in this order, so a row's result does not depend on how
// many rows share the call: verifying draft tokens reproduces the decode step exactly.

// One activation row, one weight row: both chains live in one sequential pass (the hardware prefetcher's best
// case). Two rows or halves streamed at once measured 0.88-0.96x of one.
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
// hardware prefetcher alone fell behind (1.09x / 1.02x / 1.03x at 2 / 3 / 4 rows; 512 B and 2 KB ahead were
// worse, and one row gains nothing). Whole decode steps of the engine, 2 cores of an AVX2 EPYC, against the 4 x 3
// tiles: the tiles' steps take 1.11x at 3 rows and 1.04x at 4, but 0.88x at 5 and 0.84x at 6 (the row pass's
// 10-12 accumulators and the x rows it rereads per weight row cost more than a second tile block).
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
// block, while the activations (M x K floats) stay in L2. Measured on a 2-core AVX2 CPU, the model's 30 layers of
// Linears with cold weights: +15-45% over the row-pass kernel at 12-64 rows (scripts/bench_kernels.py). Up to
// F32_ROW_PASS_MAX rows stream each weight row in turn instead (`dot_row`, `dot_rows`).
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
    // arithmetic: the first block prefetching all of it left DRAM idle during the others (all fp32 Linears of a
    // step, 2 AVX2 EPYC cores: 1.10x / 1.13x / 1.15x at 9 / 12 / 16 rows, 0.99x at 32)
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
// verify rows' arithmetic did not overlap the weight stream. 60 Linears of 3072 x 576 (424 MB), 2 threads, ms, the
// [N, K] tiles against panels, vCPUs on two CCDs: 1 row 9.6 / 8.6, 4 rows 10.5 / 8.4, 8 rows 14.7 / 9.6, 16 rows
// 23.4 / 17.1; on one CCD 12.2 / 12.1, 12.9 / 11.8, 14.6 / 12.0, 21.8 / 17.8. Prefill sizes (32-512 rows) run at
// 200-227 GFLOPS, level with or above oneDNN's reordered weights (187-224), so panels serve every row count and
// the weight is held once. A row's result is its sequential k-sum: it does not depend on the rows beside it.
// Software prefetch (1 KB ahead into L1) cost 1.2-1.3x.
constexpr int64_t PANEL = 48, PANEL_ROWS = 8;
static const bool HAS_AVX512 = __builtin_cpu_supports("avx512f");

#pragma GCC push_options
#pragma GCC target("avx512f")
template <int MR>
static void panel_tile(const float* x, int64_t K, const float* p, float* y, int64_t N, int64_t cols) {
  __m512 a[MR][3];
  for (int m = 0; m < MR; ++m)
    for (int g = 0; g < 3; ++g) a[m][g] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* pk = p + k * PANEL;
    const __m512 w0 = _mm512_loadu_ps(pk), w1 = _mm512_loadu_ps(pk + 16), w2 = _mm512_loadu_ps(pk + 32);
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
// much arithmetic as hides under it, and the later ones add only their own (424 MB as above, two CCDs: 9 rows 12.9
// -> 11.5 ms, 12 rows 14.2 -> 13.2 against balanced groups). k-blocking the groups (64-128 k per block, partial sums
// in a local tile) and prefetching the next panel during the last pass both cost 1.1-1.8x.
static void panel_rows(const float* x, int64_t M, int64_t K, const float* p, float* y, int64_t N, int64_t t0,
                       int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const float* pt = p + t * K * PANEL;
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
static void panel_gemm(const float* x, int64_t M, int64_t K, const float* p, float* y, int64_t N) {
  const int64_t T = (N + PANEL - 1) / PANEL;
  int64_t n = T;
  if (M <= 16) {
    const int64_t nt = work_threads();
    const int64_t per_thread = std::max<int64_t>(1, (T * K * PANEL * 4 + nt * STREAM_CHUNK / 2) / (nt * STREAM_CHUNK));
    n = std::max<int64_t>(1, std::min(T, nt * per_thread));
  }
  parallel_chunks(n, [&](int64_t c) { panel_rows(x, M, K, p, y, N, c * T / n, (c + 1) * T / n); });
}

static void f32_gemm(const float* xp, int64_t M, int64_t K, const float* wp, float* yp, int64_t N) {
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

torch::Tensor f32_panel_linear(torch::Tensor x, torch::Tensor p, int64_t N) {
  TORCH_CHECK(HAS_AVX512, "fp32 panels need AVX-512");
  TORCH_CHECK(x.dim() == 2 && p.dim() == 3 && p.size(2) == PANEL && x.size(1) == p.size(1) &&
              p.size(0) == (N + PANEL - 1) / PANEL, "x [M, K], panels [ceil(N / 48), K, 48]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && p.scalar_type() == at::kFloat && p.is_contiguous(), "fp32 only");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  auto y = torch::empty({M, N}, x.options());
  panel_gemm(x.data_ptr<float>(), M, K, p.data_ptr<float>(), y.data_ptr<float>(), N);
  return y;
}

// ---- INT4 (group-wise, w = q * scale + min with q in [0, 15]) --------------------------------------------
// Kernel layout (`int4_repack`): per row, every 16 consecutive inputs c0..c15 are 8 bytes, byte i holding c_i in
// its low nibble and c_{i+8} in its high one, so one 8-byte load widens to both halves with a mask and a shift.
// The float `min` form covers integer zero points (min = -zero * scale) and GGUF Q4_1 (scale d, min m) alike.
// Scales and mins are interleaved per group, sm[n, g] = (scale, min), in fp32 or, where that is exact (a GGUF
// grid's fp16 d and m), fp16 (uint16 bits): at group 32 the fp32 pair is half as many bytes again as the weights.
static inline float f32_of(float v) { return v; }
static inline float f32_of(uint16_t h) { return _cvtsh_ss(h); }

// ---- prefill GEMM (AVX512-VNNI) ------------------------------------------------------------------------------
// At prefill sizes (M >= VNNI_MIN_ROWS) a Linear is compute-bound. The row kernels above form one dot product per
// (activation row, weight row) and pay a convert and an FMA per block of 32 for each: about fp32 GEMM speed. Here
// the register tile is an outer product: a tile of 32 weight rows is widened to int16 once per call into
// `vpdpwssd` order (per input pair, 16 rows' pairs in one vector), and each 4-row block of activations broadcasts
// its int16 pairs against it, so 16 multiply-adds share one convert + FMA per block. Same numerics as the row
// kernels (16-bit activations per block of 32, exact int32 block sums, one FMA of the block's scale per block).
// vpdpwssd multiplies 32 int16 pairs per instruction against fp32 FMA's 16 lanes: SmolLM2's 30 layers of Linears at
// 512 rows took 310 ms (INT8) and 340 ms (INT4 g64) against 500 ms for oneDNN's prepacked fp32 GEMM, 2 Zen4 cores;
// 6 activation rows per register tile (4: 341 / 370 ms; 8 spills registers: 368 / 407 ms).
// the activations' sums per INT4 group, [M, K / gs] (the min term of every INT4 kernel)
static std::vector<float> group_sums(const float* xp, int64_t M, int64_t K, int64_t gs) {
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
// tile at n0 in `pack_tile`'s layout
template <typename P>
static void vnni_gemm_i8(const QuantBlocks& xr, int64_t M, int64_t K, const float* scale, float* y, int64_t N,
                         const P& pack) {
  parallel_chunks((N + VT - 1) / VT, [&](int64_t c) {
    thread_local std::vector<int32_t> buf;
    buf.resize(K / 2 * VT);
    const int64_t n0 = c * VT;
    pack(n0, buf.data());
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
      vnni_rows<MB>(xr.q.data() + m0 * K, K, buf.data(), acc,
                    [&](int m, int64_t b, int) { return _mm512_set1_ps(xs[m * xr.KB + b]); });
      for (int m = 0; m < MB; ++m)
        for (int v = 0; v < 2; ++v) store_tile(y + m0 * N, N, n0, m, v, _mm512_mul_ps(acc[m][v], rs[v]));
    };
    vnni_row_blocks(M, run);
  });
}

// q in the row layout [N, K]
static void vnni_gemm_i8_rows(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* q, const float* scale,
                              float* y, int64_t N) {
  vnni_gemm_i8(xr, M, K, scale, y, N, [&](int64_t n0, int32_t* wp) {
    pack_tile(n0, N, K, wp, [&](int64_t n, int64_t b) {
      return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + n * K + b * 32)));
    });
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
// SmolLM2-135M's Linears and lm_head, 2 Zen4 cores, against the row kernel: 1.00-1.02x at one row, 1.06-1.10x at
// 2, 1.39-1.49x at 16, 1.67x at 32; n-gram speculation on an INT8 target (bench_spec.py, input-grounded, k 15) went
// from 1.56x to 1.80x, a 16-row verify step from 5.0 to 3.1 decode steps.
// One or two activation rows read one tile at a time (a single linear stream through the chunk, as the row kernel
// reads): two tiles in turn measured 0.82-0.86x the row kernel at one row. In the whole engine at one row (paired
// runs), 256-bit halves (`vnni_tile1_i8`): 1.10x the row kernel's decode rate.

// MB activation rows against NT consecutive 16-row tiles at `tile` (a weight vector per tile serves the MB rows, a
// broadcast activation pair the NT tiles); `ahead`: the next NT tiles, prefetched 512 bytes per tile and block into
// L2, where the stream keeps going during the arithmetic (the model's Linears, cold, one Zen 4 thread, against into
// L1: 0.70x the time at 3-4 rows, 0.83x at 8, 0.90x at 16; INT4's tiles, compute-bound, gained nothing)
template <int MB, int NT>
static inline void vnni_tiles_i8(const int16_t* xq, const float* xs, int64_t KB, int64_t K, const int8_t* tile,
                                 const float* scale, float* y, int64_t N, const char* ahead) {
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
    for (int m = 0; m < MB; ++m)
      for (int u = 0; u < NT; ++u) {
        __m512i tot = s[m][u][0];
        for (int h = 1; h < SPLIT; ++h) tot = _mm512_add_epi32(tot, s[m][u][h]);
        acc[m][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_set1_ps(xs[m * KB + b]), acc[m][u]);
      }
  }
  for (int u = 0; u < NT; ++u) {
    const __m512 sc = _mm512_loadu_ps(scale + u * 16);
    for (int m = 0; m < MB; ++m) _mm512_storeu_ps(y + m * N + u * 16, _mm512_mul_ps(acc[m][u], sc));
  }
}

// One activation row against one tile in 256-bit halves (rows 0-7 and 8-15): per input pair, two 16-byte loads widened
// to int16 and two `vpdpwssd` of 8 rows each. The same per-row operations as `vnni_tiles_i8` (identical results);
// at one row the 512-bit widening cost the decode step ~6% (SmolLM2 INT8, whole engine, paired runs).
static inline void vnni_tile1_i8(const int16_t* xq, const float* xs, int64_t KB, const int8_t* tile,
                                 const float* scale, float* y, const char* ahead) {
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
    for (int h = 0; h < 2; ++h)
      acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s[h][0], s[h][1])), xb, acc[h]);
  }
  for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y + 8 * h, _mm256_mul_ps(acc[h], _mm256_loadu_ps(scale + 8 * h)));
}

template <int NT>
static void vnni_pass_i8(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* tile, const float* scale, float* y,
                         int64_t N, const char* ahead) {
  const int64_t KB = K / 32;
  for (int64_t m0 = 0, mb; m0 < M; m0 += mb) {
    mb = std::min<int64_t>(6, M - m0);
    const int16_t* xq = xr.q.data() + m0 * K;
    const float* xs = xr.scale.data() + m0 * KB;
    float* ym = y + m0 * N;
    const char* pf = m0 == 0 ? ahead : nullptr;
    switch (mb) {
#define ACCEL_PASS_CASE(R) case R: vnni_tiles_i8<R, NT>(xq, xs, KB, K, tile, scale, ym, N, pf); break;
      ACCEL_PASS_CASE(6) ACCEL_PASS_CASE(5) ACCEL_PASS_CASE(4) ACCEL_PASS_CASE(3) ACCEL_PASS_CASE(2)
      default: vnni_tiles_i8<1, NT>(xq, xs, KB, K, tile, scale, ym, N, pf);
#undef ACCEL_PASS_CASE
    }
  }
}

static void vnni_gemm_i8_tiles(const QuantBlocks& xr, int64_t M, int64_t K, const int8_t* qv, const float* scale,
                               float* y, int64_t N) {
  if (M >= VNNI_MIN_ROWS)  // prefill: the GEMM's 32-row x 6-row register tile, packed by widening only
    return vnni_gemm_i8(xr, M, K, scale, y, N, [&](int64_t n0, int32_t* wp) {
      for (int64_t v = 0; v < VT / 16; ++v) {
        const int64_t t = n0 / 16 + v;
        for (int64_t kp = 0; kp < K / 2; ++kp)
          _mm512_storeu_si512(wp + kp * VT + v * 16, t * 16 < N ? _mm512_cvtepi8_epi16(_mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(qv + (t * (K / 2) + kp) * 32))) : _mm512_setzero_si512());
      }
    });
  const int64_t tiles = N / 16;
  const TileChunks ch = tile_chunks(M, tiles, 16 * K);
  parallel_chunks(ch.n, [&](int64_t c) {
    const int64_t t1 = ch.end(c);
    for (int64_t t = ch.begin(c); t < t1;) {
      const int8_t* tile = qv + t * 16 * K;
      if (M > 2 && t + 2 <= t1) {  // one or two rows: one tile at a time, a single linear stream through the chunk
        const char* ahead = t + 4 <= t1 ? reinterpret_cast<const char*>(tile + 32 * K) : nullptr;
        vnni_pass_i8<2>(xr, M, K, tile, scale + t * 16, y + t * 16, N, ahead);
        t += 2;
      } else {
        const char* ahead = stream_ahead(tile);
        if (M == 1)
          vnni_tile1_i8(xr.q.data(), xr.scale.data(), K / 32, tile, scale + t * 16, y + t * 16, ahead);
        else
          vnni_pass_i8<1>(xr, M, K, tile, scale + t * 16, y + t * 16, N, ahead);
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
static void vnni_gemm_i4_rows(const QuantBlocks& xr, const float* xsum, int64_t M, int64_t K, int64_t gs,
                              const uint8_t* q, const S* sm, float* y, int64_t N) {
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
        mn[g * VT + i] = f32_of(sm[((n0 + i) * G + g) * 2 + 1]);
      }
  });
}

// ---- INT4 in the VNNI tile layout --------------------------------------------------------------------------
// `int4_vnni_layout`: per tile of 16 output rows and per two input pairs (k..k + 3), 32 bytes: byte j holds value j
// of pair (k, k + 1) in its low nibble and of pair (k + 2, k + 3) in its high one, values in row order (row 0's
// two, row 1's two, ...). A mask, a shift and two widenings give two `vpdpwssd` operands of 16 rows each (~3
// instructions per 16 weight bytes; the row kernel spends ~17 per 32 weights). Group scales and mins are stored
// per tile and group as 16 scales then 16 mins ([N / 16][G][2][16], fp32 or fp16). Numerics are the INT4 prefill
// GEMM's at every row count, so a row's result does not depend on the call's row count. Needs N % 16 == 0,
// K % 32 == 0 and whole blocks of 32 per group (`cpu_kernels.vnni_int4`). SmolLM2-135M's Linears and lm_head, 2
// Zen4 cores, against the row kernel: int4f g32 (fp16 scales) 1.45x at one row, 2.2x at 2, 2.3x at 16, 2.8x at 32;
// int4 g64 1.25x at one row, 1.7x at 2, 2.1x at 16.
static inline __m512 load16_f32(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_f32(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
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
      const __m512 mv = load16_f32(tsm + u * SMS + g * 32 + 16);
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
          _mm512_storeu_ps(mn + g * VT + v * 16, load16_f32(smv + (t * G + g) * 32 + 16));
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
#pragma GCC pop_options

// y [M, N] = (x [M, K] @ q^T) * scale[N], q in the VNNI tile layout (only where HAS_VNNI)
static void int8_gemm_vnni(const float* xp, int64_t M, int64_t K, const int8_t* qv, const float* sp, float* yp,
                           int64_t N) {
  TORCH_CHECK(HAS_VNNI, "the INT8 VNNI tile layout needs AVX512-VNNI");
  TORCH_CHECK(N % 16 == 0 && K % 32 == 0, "the INT8 VNNI tile layout needs N % 16 == 0 and K % 32 == 0");
  vnni_gemm_i8_tiles(quantize_blocks_i16(xp, M, K, false), M, K, qv, sp, yp, N);
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

static void int4_gemm_vnni_t(const float* x, int64_t M, int64_t K, const uint8_t* qv, const torch::Tensor& smv,
                             int64_t gs, float* y, int64_t N) {
  if (smv.scalar_type() == at::kHalf)
    int4_gemm_vnni(x, M, K, qv, reinterpret_cast<const uint16_t*>(smv.data_ptr<at::Half>()), gs, y, N);
  else
    int4_gemm_vnni(x, M, K, qv, smv.data_ptr<float>(), gs, y, N);
}

torch::Tensor int4_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor smv, int64_t group_size) {
  TORCH_CHECK(x.dim() == 2 && qv.dim() == 2 && qv.size(1) * 2 == x.size(1), "shapes: x [M, K], q [N, K / 2]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && qv.scalar_type() == at::kByte &&
              (smv.scalar_type() == at::kFloat || smv.scalar_type() == at::kHalf),
              "dtypes: x fp32, q uint8, scale_min fp32 or fp16");
  const int64_t M = x.size(0), K = x.size(1), N = qv.size(0);
  TORCH_CHECK(group_size > 0 && K % group_size == 0 && smv.numel() == N * (K / group_size) * 2,
              "scale_min must be [N / 16, K / group_size, 2, 16]");
  x = x.contiguous(); qv = qv.contiguous(); smv = smv.contiguous();
  auto y = torch::empty({M, N}, x.options());
  int4_gemm_vnni_t(x.data_ptr<float>(), M, K, qv.data_ptr<uint8_t>(), smv, group_size, y.data_ptr<float>(), N);
  return y;
}

torch::Tensor int8_linear_vnni(torch::Tensor x, torch::Tensor qv, torch::Tensor scale) {
  TORCH_CHECK(x.dim() == 2 && qv.dim() == 2 && x.size(1) == qv.size(1), "shapes: x [M, K], q [N, K] (tile layout)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && qv.scalar_type() == at::kChar && scale.scalar_type() == at::kFloat,
              "dtypes: x fp32, q int8, scale fp32");
  x = x.contiguous(); qv = qv.contiguous(); scale = scale.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = qv.size(0);
  auto y = torch::empty({M, N}, x.options());
  int8_gemm_vnni(x.data_ptr<float>(), M, K, qv.data_ptr<int8_t>(), scale.data_ptr<float>(), y.data_ptr<float>(), N);
  return y;
}


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
      const float mn = f32_of(sm[2 * (n * G + g) + 1]);
      for (int m = 0; m < MB; ++m) {
        tot[m] = _mm256_fmadd_ps(s, a[m], tot[m]);
        mterm[m] += mn * xsum[m * G + g];
      }
    }
    for (int m = 0; m < MB; ++m) y[m * N + n] = hsum256(tot[m]) + mterm[m];
  }
}

// y[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, g] + min[n, g]), the min term as min * (sum of x over the group)
// ---- INT4 weights x 16-bit activations ------------------------------------------------------------------------
// The widening kernel above spends ~17 uops per 32 weights (unpack, convert, two FMAs per 8 weights) and ran
// compute-bound. Here the activations are 16-bit integers per block of 32, as for INT8 (`quantize_blocks_i16`),
// and 32 weights cost a 16-byte load zero-extended to int16 lanes, a nibble split, two multiply-adds into int32
// (vpmaddwd + vpaddd, or vpdpwssd with AVX512-VNNI) and one FMA of the group scale x block scale. Rounding the
// activations to int8 per block (llama.cpp's Q8) would halve the uops again, but it moved the real model's greedy
// tokens away from transformers' on 2-4 of 6 prompts; 16 bits keep them equal. The nibble layout puts inputs c0..7,
// c16..23 in the low nibbles of 16 bytes and c8..15, c24..31 in the high ones: the activations are stored so.
// A row's group scales and mins are deinterleaved 8 groups at a time first, its min term is one vector dot
// product, and each block's scale x activation-scale product is stored, so the block loop is only loads, nibble
// splits, multiply-adds and one FMA from a broadcast load: the per-group scalar work (fp16 converts, scalar
// multiplies, broadcasts) had been ~half the loop's uops and held the kernel at ~12 GB/s per thread.
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
  for (; g < G; ++g) { sc[g] = f32_of(sm[2 * g]); mn[g] = f32_of(sm[2 * g + 1]); }
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
// odd blocks) against the FMA latency. More rows: those passes cost more than they saved (int4 g64 at 16 rows:
// 49 vs 30 ms for the model's Linears), so the scale product is formed per block and the min term per group.
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
      } else if (bpg == 2) {  /* group 64: each group scale twice; a scalar loop here cost ~1/3 of short rows */ \
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
        const float ws = f32_of(sm[2 * (n * G + g)]), mn_g = f32_of(sm[2 * (n * G + g) + 1]);                  \
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

// the INT4 GEMM on a scale/min tensor of either dtype
static void int4_gemm_t(const float* x, int64_t M, int64_t K, const uint8_t* q, const torch::Tensor& sm, int64_t gs,
                        float* y, int64_t N) {
  if (sm.scalar_type() == at::kHalf)
    int4_gemm(x, M, K, q, reinterpret_cast<const uint16_t*>(sm.data_ptr<at::Half>()), gs, y, N);
  else
    int4_gemm(x, M, K, q, sm.data_ptr<float>(), gs, y, N);
}

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor q, torch::Tensor scale_min, int64_t group_size) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && q.size(1) * 2 == x.size(1), "shapes: x [M, K], q [N, K / 2]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && q.scalar_type() == at::kByte &&
              (scale_min.scalar_type() == at::kFloat || scale_min.scalar_type() == at::kHalf),
              "dtypes: x fp32, q uint8, scale_min fp32 or fp16");
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
// an fp32 GEMM. torch's unpack + subtract + multiply over the weight cost about half as much as the GEMM itself at
// 512 rows (SmolLM2's Linears: 968 vs 661 ms for 30 layers); one vectorized pass writes each fp32 weight once.
template <typename S>
static void int4_dequant_rows(const uint8_t* q, const S* sm, int64_t K, int64_t gs, int64_t n0, int64_t n1, float* out) {
  const int64_t G = K / gs;
  at::parallel_for(n0, n1, 16, [&](int64_t a, int64_t b) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int64_t n = a; n < b; ++n) {
      const uint8_t* row = q + n * (K / 2);
      float* o = out + (n - n0) * K;
      for (int64_t g = 0; g < G; ++g) {
        const __m256 s = _mm256_set1_ps(f32_of(sm[(n * G + g) * 2])), mn = _mm256_set1_ps(f32_of(sm[(n * G + g) * 2 + 1]));
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
  if (scale_min.scalar_type() == at::kHalf)
    int4_dequant_rows(q.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scale_min.data_ptr<at::Half>()), K, gs,
                      n0, n1, out.data_ptr<float>());
  else
    int4_dequant_rows(q.data_ptr<uint8_t>(), scale_min.data_ptr<float>(), K, gs, n0, n1, out.data_ptr<float>());
  return out;
}

// ---- paged decode attention (one query token per row, fp32 cache) ------------------------------------------
// exp, Cephes-style: 2^n * p(r), rel. error ~1e-7; inputs clamped to [-87.3, 88.3] (0 / ~2e38 at the ends)
static inline __m256 exp256(__m256 x) {
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

// s[t] = scale * dot(q, k_t) for the n tokens of a block (k_t at k + t * ts): four tokens at a time, so four
// independent FMA chains are in flight and one hadd tree reduces all four sums.
static inline void block_scores(const float* q, const float* k, int64_t ts, int64_t n, int64_t D, float scale,
                                float* s) {
  const int64_t D8 = D / 8 * 8;
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* k0 = k + t * ts;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t d = 0; d < D8; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + ts + d), a1);
      a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * ts + d), a2);
      a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * ts + d), a3);
    }
    const __m256 hs = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(hs), _mm256_extractf128_ps(hs, 1));  // [t, t+1, t+2, t+3]
    alignas(16) float tmp[4];
    _mm_store_ps(tmp, r);
    for (int64_t u = 0; u < 4; ++u) {
      const float* ku = k0 + u * ts;
      for (int64_t d = D8; d < D; ++d) tmp[u] += q[d] * ku[d];
      s[t + u] = tmp[u] * scale;
    }
  }
  for (; t < n; ++t) {
    const float* kt = k + t * ts;
    __m256 a0 = _mm256_setzero_ps();
    for (int64_t d = 0; d < D8; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kt + d), a0);
    float r = hsum256(a0);
    for (int64_t d = D8; d < D; ++d) r += q[d] * kt[d];
    s[t] = r * scale;
  }
}

// acc[0:D] = acc * corr + sum_t p[t] * v_t over the n tokens of a block (v_t at v + t * ts): the accumulator
// stays in registers across the block, 32 floats (four chains) at a time.
static inline void block_accumulate(const float* p, const float* v, int64_t ts, int64_t n, int64_t D, float corr,
                                    float* acc) {
  const __m256 cv = _mm256_set1_ps(corr);
  int64_t d = 0;
  for (; d + 32 <= D; d += 32) {
    __m256 c0 = _mm256_mul_ps(cv, _mm256_loadu_ps(acc + d)), c1 = _mm256_mul_ps(cv, _mm256_loadu_ps(acc + d + 8));
    __m256 c2 = _mm256_mul_ps(cv, _mm256_loadu_ps(acc + d + 16)), c3 = _mm256_mul_ps(cv, _mm256_loadu_ps(acc + d + 24));
    for (int64_t t = 0; t < n; ++t) {
      const __m256 w = _mm256_set1_ps(p[t]);
      const float* vt = v + t * ts + d;
      c0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vt), c0);
      c1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vt + 8), c1);
      c2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vt + 16), c2);
      c3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(vt + 24), c3);
    }
    _mm256_storeu_ps(acc + d, c0); _mm256_storeu_ps(acc + d + 8, c1);
    _mm256_storeu_ps(acc + d + 16, c2); _mm256_storeu_ps(acc + d + 24, c3);
  }
  for (; d + 8 <= D; d += 8) {
    __m256 c0 = _mm256_mul_ps(cv, _mm256_loadu_ps(acc + d));
    for (int64_t t = 0; t < n; ++t) c0 = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + t * ts + d), c0);
    _mm256_storeu_ps(acc + d, c0);
  }
  for (; d < D; ++d) {
    float c = acc[d] * corr;
    for (int64_t t = 0; t < n; ++t) c += p[t] * v[t * ts + d];
    acc[d] = c;
  }
}

// GQA tiles (D % 8 == 0): the NQ query heads that share a kv head go through a block together, so every K/V
// vector loaded serves NQ FMAs, and the tiles keep 8-12 independent FMA chains in flight (the one-head loops
// above have 4 chains that each wait on the FMA latency, ~2.5x below the FMA throughput).
// s[j * ss + t] = scale * dot(q_j, k_t) for the NQ heads j (q_j at q + j * D) and the n tokens t of a block.
template <int NQ>
static inline void gqa_scores(const float* q, const float* k, int64_t ts, int64_t n, int64_t D, float scale,
                              float* s, int64_t ss) {
  constexpr int TT = NQ <= 2 ? 4 : (NQ == 3 ? 4 : 2);  // tokens per tile: NQ * TT accumulators <= 12
  int64_t t = 0;
  for (; t + TT <= n; t += TT) {
    __m256 a[NQ][TT];
    for (int j = 0; j < NQ; ++j)
      for (int u = 0; u < TT; ++u) a[j][u] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      __m256 kv[TT];
      for (int u = 0; u < TT; ++u) kv[u] = _mm256_loadu_ps(k + (t + u) * ts + d);
      for (int j = 0; j < NQ; ++j) {
        const __m256 qv = _mm256_loadu_ps(q + j * D + d);
        for (int u = 0; u < TT; ++u) a[j][u] = _mm256_fmadd_ps(qv, kv[u], a[j][u]);
      }
    }
    for (int j = 0; j < NQ; ++j)
      for (int u = 0; u < TT; ++u) s[j * ss + t + u] = hsum256(a[j][u]) * scale;
  }
  for (; t < n; ++t) {
    __m256 a[NQ];
    for (int j = 0; j < NQ; ++j) a[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 kv = _mm256_loadu_ps(k + t * ts + d);
      for (int j = 0; j < NQ; ++j) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * D + d), kv, a[j]);
    }
    for (int j = 0; j < NQ; ++j) s[j * ss + t] = hsum256(a[j]) * scale;
  }
}

// acc_j = acc_j * corr_j + sum_t p[j * ps + t] * v_t for the NQ heads (acc_j at acc + j * D), 8-12 chains.
template <int NQ>
static inline void gqa_accumulate(const float* p, int64_t ps, const float* v, int64_t ts, int64_t n, int64_t D,
                                  const float* corr, float* acc) {
  constexpr int DC = NQ <= 3 ? 4 : 2;  // 8-float chunks of D per pass: NQ * DC accumulators <= 12
  int64_t d = 0;
  for (; d + 8 * DC <= D; d += 8 * DC) {
    __m256 c[NQ][DC];
    for (int j = 0; j < NQ; ++j) {
      const __m256 cv = _mm256_set1_ps(corr[j]);
      for (int i = 0; i < DC; ++i) c[j][i] = _mm256_mul_ps(cv, _mm256_loadu_ps(acc + j * D + d + 8 * i));
    }
    for (int64_t t = 0; t < n; ++t) {
      __m256 vv[DC];
      for (int i = 0; i < DC; ++i) vv[i] = _mm256_loadu_ps(v + t * ts + d + 8 * i);
      for (int j = 0; j < NQ; ++j) {
        const __m256 w = _mm256_set1_ps(p[j * ps + t]);
        for (int i = 0; i < DC; ++i) c[j][i] = _mm256_fmadd_ps(w, vv[i], c[j][i]);
      }
    }
    for (int j = 0; j < NQ; ++j)
      for (int i = 0; i < DC; ++i) _mm256_storeu_ps(acc + j * D + d + 8 * i, c[j][i]);
  }
  for (; d < D; d += 8) {
    __m256 c[NQ];
    for (int j = 0; j < NQ; ++j) c[j] = _mm256_mul_ps(_mm256_set1_ps(corr[j]), _mm256_loadu_ps(acc + j * D + d));
    for (int64_t t = 0; t < n; ++t) {
      const __m256 vv = _mm256_loadu_ps(v + t * ts + d);
      for (int j = 0; j < NQ; ++j) c[j] = _mm256_fmadd_ps(_mm256_set1_ps(p[j * ps + t]), vv, c[j]);
    }
    for (int j = 0; j < NQ; ++j) _mm256_storeu_ps(acc + j * D + d, c[j]);
  }
}

// Scores of one query head against 8 consecutive tokens of a block (D % 8 == 0), as one vector: eight independent
// FMA chains, then one hadd tree reduces all eight dot products (a horizontal sum per score cost about as much as
// its FMAs, and scalar score stores stalled the vector loads that followed them).
static inline __m256 scores8(const float* q, const float* k, int64_t ts, int64_t D) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  __m256 a4 = _mm256_setzero_ps(), a5 = _mm256_setzero_ps(), a6 = _mm256_setzero_ps(), a7 = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + d), a0);
    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + ts + d), a1);
    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 2 * ts + d), a2);
    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 3 * ts + d), a3);
    a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 4 * ts + d), a4);
    a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 5 * ts + d), a5);
    a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 6 * ts + d), a6);
    a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + 7 * ts + d), a7);
  }
  const __m256 q0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  // [t0..t3 | t0..t3] halves
  const __m256 q1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
}

static inline float hmax256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// The online-softmax update of NQ query heads (q_j at q + j * D) over the n tokens of a block (BS % 8 == 0): scores
// in vectors of 8 (lanes past n read the block's unused slots and are masked to -inf, so a token's score does not
// depend on n), each head's running max m[j] and sum l[j] updated, its weights left in p[j * ps : + BS] and the
// rescale factor of its accumulator in corr[j]. All heads' exps run in one loop: one head's two were a latency chain.
template <int NQ>
static inline void tile_block_softmax(const float* q, const float* k, int64_t ts, int64_t n, int64_t D, float scale,
                                      float* p, int64_t ps, float* m, float* l, float* corr) {
  const __m256 sv = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
  const int64_t nc = (n + 7) / 8;
  const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
      _mm256_set1_epi32(static_cast<int>(n - (nc - 1) * 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  __m256 nmv[NQ];
  for (int j = 0; j < NQ; ++j) {
    __m256 vmax = ninf;
    for (int64_t c = 0; c < nc; ++c) {
      __m256 s = _mm256_mul_ps(scores8(q + j * D, k + c * 8 * ts, ts, D), sv);
      if (c == nc - 1) s = _mm256_blendv_ps(ninf, s, valid);
      _mm256_storeu_ps(p + j * ps + c * 8, s);
      vmax = _mm256_max_ps(vmax, s);
    }
    const float nm = std::max(m[j], hmax256(vmax));
    // exp(0) = 1 and exp(-inf) = 0 exactly: the call is needed only when the max moved from a finite value
    corr[j] = nm == m[j] ? 1.f : (m[j] == -INFINITY ? 0.f : std::exp(m[j] - nm));
    m[j] = nm;
    nmv[j] = _mm256_set1_ps(nm);
  }
  __m256 lsum[NQ];
  for (int j = 0; j < NQ; ++j) {
    lsum[j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < nc; ++c) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j * ps + c * 8), nmv[j]));
      _mm256_storeu_ps(p + j * ps + c * 8, e);
      lsum[j] = _mm256_add_ps(lsum[j], e);
    }
  }
  for (int j = 0; j < NQ; ++j) l[j] = l[j] * corr[j] + hsum256(lsum[j]);
}

#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 1
#endif
// Decode attention over the paged fp32 cache, flash-decoding style (online softmax, no score buffer over the
// whole context). A task owns one span and a range of kv heads [h0, h1). A span is the query rows of one request
// in this step: one decode token, or the k + 1 rows of a speculative verification (row r at context length L_r,
// each row seeing its own causal prefix). The task walks the request's blocks once and, per block, scores and
// accumulates every row and head of its range, so the block's K and V (all kv heads contiguous in the
// [blocks, block_size, kv_heads, D] layout) come from DRAM once for all the span's rows: a verify step of 8 rows
// reads the context once, not 8 times. Spans are split across threads when there are enough of them; otherwise
// each span is split by kv head so every thread works.
// The split of one step's attention over threads: the same for every layer of the step (block tables and context
// lengths are shared), so the one-call decode plans it once.
struct AttnPlan {
  torch::Tensor bt, cl, rw;  // long copies of the block tables, context lengths and row indices
  const int64_t* btp = nullptr;
  const int64_t* clp = nullptr;
  const int64_t* rp = nullptr;
  int64_t G = 0, maxnb = 0, H = 0, D = 0, BS = 0, KVH = 0, group = 0, maxR = 1, splits = 1, HPS = 0, RG = 1, QG = 1,
          TPS = 1;
  std::vector<int64_t> so, longest;
  std::vector<std::vector<int64_t>> lists;  // per thread: its tasks
};

static AttnPlan plan_attention(int64_t H, int64_t D, const torch::Tensor& k_cache, torch::Tensor block_tables,
                               torch::Tensor context_lens, torch::Tensor rows, torch::Tensor span_offsets) {
  AttnPlan a;
  a.bt = block_tables.to(at::kLong).contiguous();
  a.cl = context_lens.to(at::kLong).contiguous();
  a.rw = rows.to(at::kLong).contiguous();
  a.G = a.bt.size(0); a.maxnb = a.bt.size(1); a.H = H; a.D = D;
  a.BS = k_cache.size(1); a.KVH = k_cache.size(2); a.group = H / a.KVH;
  a.btp = a.bt.data_ptr<int64_t>(); a.clp = a.cl.data_ptr<int64_t>(); a.rp = a.rw.data_ptr<int64_t>();
  const int64_t G = a.G, maxnb = a.maxnb, BS = a.BS, KVH = a.KVH, group = a.group;
  const int64_t* clp = a.clp;
  // spans: rows [so[s], so[s + 1]) of the arrays share one request's blocks (empty: every row is its own span)
  std::vector<int64_t>& so = a.so;
  if (span_offsets.numel() == 0) {
    so.resize(G + 1);
    for (int64_t g = 0; g <= G; ++g) so[g] = g;
  } else {
    auto o = span_offsets.to(at::kLong).contiguous();
    so.assign(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel());
    TORCH_CHECK(so.front() == 0 && so.back() == G, "span offsets must run from 0 to the number of rows");
  }
  const int64_t S = static_cast<int64_t>(so.size()) - 1;
  std::vector<int64_t>& longest = a.longest;
  longest.resize(S);
  std::vector<int64_t> cost(S);  // per span: the row with the longest context (its table covers all)
  int64_t maxR = 1;
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(so[s + 1] > so[s], "empty span");
    maxR = std::max(maxR, so[s + 1] - so[s]);
    longest[s] = so[s];
    cost[s] = 0;
    for (int64_t g = so[s]; g < so[s + 1]; ++g) {
      TORCH_CHECK(clp[g] <= maxnb * BS, "context longer than the block table");
      if (clp[g] > clp[longest[s]]) longest[s] = g;
      cost[s] += clp[g] / 4;  // extra rows reuse the span's K/V from cache: a fraction of a row's cost
    }
    cost[s] += clp[longest[s]] + BS;  // the context read once, + a block's worth of per-span fixed cost
  }
  a.maxR = maxR;
  const int64_t splits = S >= 2 * at::get_num_threads() ? 1 : KVH;  // kv-head ranges per span
  a.splits = splits;
  a.HPS = KVH / splits;
  // With few spans, a span's rows are split into groups as well, so kv heads x row groups spread over the threads:
  // 3 kv heads on 2 threads left one thread idle a third of the time (a verify step of SmolLM2 at batch 1). Each
  // row's arithmetic is the same whichever group it is in.
  const int64_t RG = splits == 1 ? 1 : std::min<int64_t>(maxR, at::get_num_threads());
  a.RG = RG;
  // ... and where that still leaves a remainder (one decode row) over a long context, each kv head's query heads in
  // two halves, the second re-reading the head's K/V from cache. Per head, the arithmetic is the same in any
  // grouping. SmolLM2's 30 layers, one row, 2 threads: 1.09x at 500 tokens of context, 1.20x at 800; 0.89-0.91x at
  // 200-300, where the K/V stayed in cache and the extra tasks cost more than the balance saved.
  int64_t longest_ctx = 0;
  for (int64_t s = 0; s < S; ++s) longest_ctx = std::max(longest_ctx, clp[longest[s]]);
  a.QG = splits > 1 && (KVH * RG) % at::get_num_threads() != 0 && group >= 2 && longest_ctx >= 400 ? 2 : 1;
  a.TPS = splits * RG * a.QG;  // tasks per span
  const int64_t TPS = a.TPS;
  // Work per span follows its context length, and decode rows arrive sorted by it: at::parallel_for's equal
  // contiguous ranges would give one thread every long context. Spans are dealt to threads longest first, each
  // to the least-loaded thread (LPT), and each thread walks its own list.
  const int64_t nt = std::min<int64_t>(at::get_num_threads(), S * TPS);
  std::vector<std::vector<int64_t>>& lists = a.lists;
  lists.resize(std::max<int64_t>(nt, 1));
  if (splits == 1 && nt > 1) {
    std::vector<int64_t> order(S), load(nt, 0);
    for (int64_t s = 0; s < S; ++s) order[s] = s;
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return cost[x] > cost[y]; });
    for (int64_t s : order) {
      const int64_t t = std::min_element(load.begin(), load.end()) - load.begin();
      lists[t].push_back(s);
      load[t] += cost[s];
    }
  } else {
    const int64_t per = (S * TPS + lists.size() - 1) / lists.size();
    for (int64_t i = 0; i < S * TPS; ++i) lists[i / per].push_back(i);
  }
  return a;
}

// Thread t's tasks of plan `a`: q rows [*, H, D] at row stride QS, one layer's caches, out [rows, H, D].
static void run_attention(const AttnPlan& a, int64_t t, const float* qp, int64_t QS, const float* kp, const float* vp,
                          float scale, float* op) {
  const int64_t H = a.H, D = a.D, BS = a.BS, KVH = a.KVH, group = a.group, maxnb = a.maxnb, maxR = a.maxR;
  const int64_t splits = a.splits, HPS = a.HPS, RG = a.RG, QG = a.QG, TPS = a.TPS;
  const int64_t* btp = a.btp;
  const int64_t* clp = a.clp;
  const int64_t* rp = a.rp;
  const std::vector<int64_t>& so = a.so;
  const std::vector<int64_t>& longest = a.longest;
  const float sc = scale;
  const int64_t TS = KVH * D;  // floats between consecutive tokens of one kv head
  const int64_t PF = PREFETCH_BLOCKS;
  {
    const int64_t BSP = (BS + 7) / 8 * 8;
    std::vector<float> sbuf(H * BSP), mv(maxR * H), lv(maxR * H);
    std::vector<float> accv(maxR * H * D + 8);
    for (int64_t i : a.lists[t]) {
      const int64_t s = i / TPS, h0 = (i / (RG * QG) % splits) * HPS, h1 = h0 + HPS, g = i / QG % RG, qg = i % QG;
      const int64_t r0 = so[s], R = so[s + 1] - r0, gl = longest[s], Lmax = clp[gl];
      const int64_t ra = R * g / RG, rb = R * (g + 1) / RG;  // this task's rows of the span
      if (ra == rb) continue;
      const int64_t qa = group * qg / QG, qb = group * (qg + 1) / QG;  // query heads of each kv head: [qa, qb)
      const int64_t j0 = h0 * group + qa, j1 = (h1 - 1) * group + qb;  // query heads of this task (QG > 1: one kv head)
      for (int64_t r = ra; r < rb; ++r) {
        for (int64_t j = j0; j < j1; ++j) { mv[r * H + j] = -INFINITY; lv[r * H + j] = 0.f; }
        for (int64_t x = j0 * D; x < j1 * D; ++x) accv[r * H * D + x] = 0.f;
      }
      for (int64_t b0 = 0; b0 < Lmax; b0 += BS) {
        const int64_t blk = btp[gl * maxnb + b0 / BS];
        const float* kb = kp + blk * BS * TS;
        const float* vb = vp + blk * BS * TS;
        // blocks are scattered, so the hardware prefetcher cannot run ahead: prefetch the block PF ahead, its
        // lines spread over this block's head tiles (one burst of ~400 prefetches stalls on the miss buffers).
        // Only this task's heads, [h0, h1): per token, `tok_lines` lines at a stride of TS floats. A task of one
        // kv head had fetched every head's lines, three times its own (a batch-1 verify step's tasks are single
        // heads: SmolLM2, 16 rows at ~250 tokens, its attention 2.83 -> 2.64 ms a step, the step 31.07 -> 30.83).
        const char* nk = nullptr;
        const char* nv = nullptr;
        if (b0 + PF * BS < Lmax) {
          const int64_t nblk = btp[gl * maxnb + b0 / BS + PF];
          nk = reinterpret_cast<const char*>(kp + nblk * BS * TS + h0 * D);
          nv = reinterpret_cast<const char*>(vp + nblk * BS * TS + h0 * D);
        }
        // ... and the blocks further ahead, all into L2 (T1), which holds more misses in flight than L1 (the next
        // block into L1 instead: 0.96-0.99x): one row has almost no arithmetic per block to hide DRAM behind, and a
        // prefetch that finds the miss buffers full is dropped, so a one-row task asks for each block at four
        // distances (2-5), a verify span's rows once (2).
        // SmolLM2 on 2 Zen 4 cores, paired runs: INT8 batch 1 at 800 tokens, the step 7.28 -> 5.85 ms (distance 2
        // alone 6.54, 2 and 5 6.13); fp32 at 250, attention 1.23 -> 0.81 ms a step; INT8 batch 16 at 250, 29.6 ->
        // 23.8 ms (2 alone 24.6); fp32 batch 64 at 200, 152 -> 137 ms; 16 verify rows at 250, attention 2.52 ->
        // 2.38 ms with 2 alone, 2.55 with 2-5.
        const char* fk[4];
        const char* fv[4];
        int nfar = 0;
        for (int64_t d = 2; d <= (rb - ra == 1 ? 5 : 2) && b0 + d * BS < Lmax; ++d, ++nfar) {
          const int64_t fblk = btp[gl * maxnb + b0 / BS + d];
          fk[nfar] = reinterpret_cast<const char*>(kp + fblk * BS * TS + h0 * D);
          fv[nfar] = reinterpret_cast<const char*>(vp + fblk * BS * TS + h0 * D);
        }
        const int64_t tok_lines = ((h1 - h0) * D * 4 + 63) / 64, lines = BS * tok_lines;
        const int64_t per_head = (lines + (h1 - h0) - 1) / (h1 - h0);
        // ... and within a head, over its rows: a verify span's 16 rows each issue a sixteenth
        const int64_t per_row = (per_head + (rb - ra) - 1) / (rb - ra);
        for (int64_t h = h0; h < h1; ++h) {
          const float* kh = kb + h * D;  // token t of kv head h at kh + t * TS
          const float* vh = vb + h * D;
          for (int64_t r = ra; r < rb; ++r) {
            if (nk) {
              const int64_t x0 = (h - h0) * per_head + (r - ra) * per_row;
              const int64_t x1 = std::min({lines, (h - h0 + 1) * per_head, x0 + per_row});
              for (int64_t x = x0, t = x0 / tok_lines, j = x0 % tok_lines; x < x1; ++x) {
                const int64_t off = t * TS * 4 + j * 64;  // bytes: token t, line j of its heads
                _mm_prefetch(nk + off, _MM_HINT_T1);
                _mm_prefetch(nv + off, _MM_HINT_T1);
                for (int f = 0; f < nfar; ++f) {
                  _mm_prefetch(fk[f] + off, _MM_HINT_T1);
                  _mm_prefetch(fv[f] + off, _MM_HINT_T1);
                }
                if (++j == tok_lines) j = 0, ++t;
              }
            }
            const int64_t L = clp[r0 + r];
            if (b0 >= L) continue;  // this row's causal prefix ends before the block
            const int64_t n = std::min(BS, L - b0);
            const float* qrow = qp + rp[r0 + r] * QS;
            float* m = mv.data() + r * H;
            float* l = lv.data() + r * H;
            float* acc = accv.data() + r * H * D;
            for (int64_t j0q = h * group + qa; j0q < h * group + qb; j0q += 4) {  // query heads in tiles of <= 4
              const int64_t nq = std::min<int64_t>(4, h * group + qb - j0q);
              float* sq = sbuf.data() + j0q * BSP;
              float corr[4];
              if (D % 8 == 0 && BS % 8 == 0) {
                float* mj = m + j0q;
                float* lj = l + j0q;
                switch (nq) {
                  case 4: tile_block_softmax<4>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP, mj, lj, corr); break;
                  case 3: tile_block_softmax<3>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP, mj, lj, corr); break;
                  case 2: tile_block_softmax<2>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP, mj, lj, corr); break;
                  default: tile_block_softmax<1>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP, mj, lj, corr); break;
                }
              } else {
                if (D % 8 == 0) {
                  switch (nq) {
                    case 4: gqa_scores<4>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP); break;
                    case 3: gqa_scores<3>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP); break;
                    case 2: gqa_scores<2>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP); break;
                    default: gqa_scores<1>(qrow + j0q * D, kh, TS, n, D, sc, sq, BSP); break;
                  }
                } else {
                  for (int64_t j = 0; j < nq; ++j) block_scores(qrow + (j0q + j) * D, kh, TS, n, D, sc, sq + j * BSP);
                }
                for (int64_t jj = 0; jj < nq; ++jj) {
                  const int64_t j = j0q + jj;
                  float* sj = sq + jj * BSP;
                  float bm = -INFINITY;
                  for (int64_t u = 0; u < n; ++u) bm = std::max(bm, sj[u]);
                  for (int64_t u = n; u < BSP; ++u) sj[u] = -INFINITY;
                  const float nm = std::max(m[j], bm);
                  corr[jj] = std::exp(m[j] - nm);  // 0 on the first block (m = -inf)
                  m[j] = nm;
                  const __m256 nmv = _mm256_set1_ps(nm);
                  __m256 lsum = _mm256_setzero_ps();
                  for (int64_t u = 0; u < BSP; u += 8) {
                    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sj + u), nmv));
                    _mm256_storeu_ps(sj + u, e);
                    lsum = _mm256_add_ps(lsum, e);
                  }
                  l[j] = l[j] * corr[jj] + hsum256(lsum);
                }
              }
              if (D % 8 == 0) {
                switch (nq) {
                  case 4: gqa_accumulate<4>(sq, BSP, vh, TS, n, D, corr, acc + j0q * D); break;
                  case 3: gqa_accumulate<3>(sq, BSP, vh, TS, n, D, corr, acc + j0q * D); break;
                  case 2: gqa_accumulate<2>(sq, BSP, vh, TS, n, D, corr, acc + j0q * D); break;
                  default: gqa_accumulate<1>(sq, BSP, vh, TS, n, D, corr, acc + j0q * D); break;
                }
              } else {
                for (int64_t j = 0; j < nq; ++j)
                  block_accumulate(sq + j * BSP, vh, TS, n, D, corr[j], acc + (j0q + j) * D);
              }
            }
          }
        }
      }
      for (int64_t r = ra; r < rb; ++r) {
        float* orow = op + rp[r0 + r] * H * D;
        const float* acc = accv.data() + r * H * D;
        const float* l = lv.data() + r * H;
        for (int64_t j = j0; j < j1; ++j) {
          const __m256 inv = _mm256_set1_ps(1.f / l[j]);
          int64_t d = 0;
          for (; d + 8 <= D; d += 8)
            _mm256_storeu_ps(orow + j * D + d, _mm256_mul_ps(inv, _mm256_loadu_ps(acc + j * D + d)));
          for (; d < D; ++d) orow[j * D + d] = acc[j * D + d] / l[j];
        }
      }
    }
  }
}

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                 torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor rows, double scale,
                 torch::Tensor span_offsets) {
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2), "q rows [H, D] must be dense (any row stride)");
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
  const AttnPlan a = plan_attention(q.size(1), q.size(2), k_cache, block_tables, context_lens, rows, span_offsets);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, a.lists.size(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) run_attention(a, t, qp, q.stride(0), kp, vp, static_cast<float>(scale), op);
  });
}

// RMSNorm of fp32 rows, optionally adding `residual` first (vLLM's fused_add_rms_norm): one pass over the row
// instead of torch's add + pow + mean + rsqrt + mul + mul kernels, which at decode sizes cost more in launch
// overhead than in arithmetic.
static void rms_rows(const float* x, float* res, const float* w, float* out, int64_t rows, int64_t H, double eps,
                     bool add) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * H;
      float* o = out + r * H;
      const float* src = xr;
      if (add) {
        float* rr = res + r * H;
        for (int64_t i = 0; i < H; ++i) rr[i] += xr[i];
        src = rr;
      }
      // sum of squares in 4 vector chains: a scalar `ss += x * x` loop is one serial FMA chain (the compiler may
      // not reorder float adds), ~0.8 us per 576-wide row
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
      int64_t i0 = 0;
      for (; i0 + 32 <= H; i0 += 32) {
        const __m256 a = _mm256_loadu_ps(src + i0), b = _mm256_loadu_ps(src + i0 + 8);
        const __m256 c = _mm256_loadu_ps(src + i0 + 16), d = _mm256_loadu_ps(src + i0 + 24);
        s0 = _mm256_fmadd_ps(a, a, s0); s1 = _mm256_fmadd_ps(b, b, s1);
        s2 = _mm256_fmadd_ps(c, c, s2); s3 = _mm256_fmadd_ps(d, d, s3);
      }
      for (; i0 + 8 <= H; i0 += 8) { const __m256 a = _mm256_loadu_ps(src + i0); s0 = _mm256_fmadd_ps(a, a, s0); }
      float ss = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
      for (; i0 < H; ++i0) ss += src[i0] * src[i0];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + static_cast<float>(eps));
      for (int64_t i = 0; i < H; ++i) o[i] = w[i] * (src[i] * inv);
    }
  });
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "fp32 only");
  x = x.contiguous();
  auto out = torch::empty_like(x);
  const int64_t H = x.size(-1);
  rms_rows(x.data_ptr<float>(), nullptr, w.contiguous().data_ptr<float>(), out.data_ptr<float>(), x.numel() / H, H,
           eps, false);
  return out;
}

// residual += x (in place); returns rms_norm(residual) * w
torch::Tensor add_rms_norm_(torch::Tensor x, torch::Tensor residual, torch::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && residual.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "fp32 only");
  TORCH_CHECK(residual.is_contiguous() && x.sizes() == residual.sizes(), "residual must be contiguous, shaped as x");
  x = x.contiguous();
  auto out = torch::empty_like(x);
  const int64_t H = x.size(-1);
  rms_rows(x.data_ptr<float>(), residual.data_ptr<float>(), w.contiguous().data_ptr<float>(), out.data_ptr<float>(),
           x.numel() / H, H, eps, true);
  return out;
}

// ---- small fused elementwise ops -----------------------------------------------------------------------------
// Why by hand: at decode sizes each torch op costs more in dispatch and OpenMP fork/join than in arithmetic, and a
// decoder layer issues ~15 of them; these two replace 6 (chunk + silu + mul; mul + roll + addcmul).

// SwiGLU: gu [T, 2I] (gate | up, as the fused gate_up projection writes it) -> silu(gate) * up [T, I]
static void silu_mul_raw(const float* gp, int64_t T, int64_t I, float* op) {
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / std::max<int64_t>(I, 1)), [&](int64_t t0, int64_t t1) {
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = gp + t * 2 * I;
      const float* u = g + I;
      float* o = op + t * I;
      int64_t i = 0;
      for (; i + 8 <= I; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 den = _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv)));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
      }
      for (; i < I; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gu) {
  TORCH_CHECK(gu.scalar_type() == at::kFloat && gu.dim() == 2 && gu.size(1) % 2 == 0, "fp32 [T, 2I] expected");
  gu = gu.contiguous();
  const int64_t T = gu.size(0), I = gu.size(1) / 2;
  auto out = torch::empty({T, I}, gu.options());
  silu_mul_raw(gu.data_ptr<float>(), T, I, out.data_ptr<float>());
  return out;
}

// RoPE in place on the first `nheads` heads of each row of x [T, >= nheads * D] (row stride x.stride(0)), HF's
// rotate_half convention with the sign folded into sin: x = x * cos + roll(x, D / 2) * sin_signed, where cos and
// sin_signed are this step's rows [T, D] (index_select of the tables by position).
static void rope_raw(float* xp, int64_t T, int64_t rs, const float* cp, const float* sp, int64_t nheads, int64_t D) {
  const int64_t half = D / 2;
  at::parallel_for(0, T, std::max<int64_t>(1, 4096 / std::max<int64_t>(nheads * D, 1)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = cp + t * D;
      const float* sn = sp + t * D;
      for (int64_t h = 0; h < nheads; ++h) {
        float* a = xp + t * rs + h * D;  // first half
        float* b = a + half;             // second half
        int64_t i = 0;
        for (; i + 8 <= half; i += 8) {
          const __m256 av = _mm256_loadu_ps(a + i), bv = _mm256_loadu_ps(b + i);
          _mm256_storeu_ps(a + i, _mm256_fmadd_ps(bv, _mm256_loadu_ps(sn + i), _mm256_mul_ps(av, _mm256_loadu_ps(c + i))));
          _mm256_storeu_ps(b + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(sn + half + i),
                                                  _mm256_mul_ps(bv, _mm256_loadu_ps(c + half + i))));
        }
        for (; i < half; ++i) {
          const float av = a[i], bv = b[i];
          a[i] = av * c[i] + bv * sn[i];
          b[i] = bv * c[half + i] + av * sn[half + i];
        }
      }
    }
  });
}

void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin_signed, int64_t nheads, int64_t D) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
              sin_signed.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) >= nheads * D && D % 2 == 0, "x [T, >= nheads * D]");
  cos = cos.contiguous().view({-1, D});
  sin_signed = sin_signed.contiguous().view({-1, D});
  TORCH_CHECK(cos.size(0) == x.size(0) && sin_signed.size(0) == x.size(0), "one cos/sin row per token");
  rope_raw(x.data_ptr<float>(), x.size(0), x.stride(0), cos.data_ptr<float>(), sin_signed.data_ptr<float>(), nheads,
           D);
}

// KV cache write: token t's k/v rows [KVH * D] (any row stride, e.g. views into the fused qkv output) into flat
// slot slots[t] of the [blocks * block_size, KVH * D] caches. One call for K and V instead of two index_copy_
// ops (each ~35 us of dispatch at decode sizes, twice per layer per step).
void kv_write_(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor k, torch::Tensor v, torch::Tensor slots) {
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat &&
              k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat, "fp32 only");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  const int64_t T = k.size(0), W = k.numel() / std::max<int64_t>(T, 1);
  const int64_t nslots = k_cache.numel() / std::max<int64_t>(W, 1);
  TORCH_CHECK(v.size(0) == T && v.numel() == k.numel() && slots.numel() == T, "k, v [T, KVH, D], slots [T]");
  TORCH_CHECK(k.stride(-1) == 1 && v.stride(-1) == 1 && (k.dim() < 3 || k.stride(1) == k.size(2)) &&
              (v.dim() < 3 || v.stride(1) == v.size(2)), "k/v rows must be dense");
  auto sl = slots.to(at::kLong).contiguous();
  const int64_t* sp = sl.data_ptr<int64_t>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const int64_t ks = k.stride(0), vs = v.stride(0);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(sp[t] >= 0 && sp[t] < nslots, "slot ", sp[t], " outside the cache (", nslots, " slots)");
    std::memcpy(kc + sp[t] * W, kp + t * ks, W * sizeof(float));
    std::memcpy(vc + sp[t] * W, vp + t * vs, W * sizeof(float));
  }
}

// ---- the decoder's decode step in one call ---------------------------------------------------------------
// Why: at batch 1 a step runs ~12 ops per layer (norm, fused qkv, RoPE, KV write, attention, o_proj, norm,
// gate_up, SwiGLU, down_proj); from Python each one costs dispatch, argument checks and an output allocation on
// top of its arithmetic, ~1,400 torch ops per step in all. Here the same kernels run back to back on raw pointers
// into a few buffers allocated once per step, so the step is bound by its weight streaming. It computes exactly
// what the module-by-module path computes (same kernels, same order): greedy output is unchanged.
//
// Linear specs (LIN_FIELDS ints each): kind (0 fp32 w [N, K]; 1 int8 q [N, K] + scale [N]; 3 the same in the
// VNNI tile layout; 4 int4 in its VNNI tile layout; 2 int4 packed
// [N, K / 2] + scale_min [N, G, 2] fp32 / fp16; 5 fp32 panels [ceil(N / 48), K, 48]), three tensor indices into `weights` (-1 unused), the INT4 group size,
// the bias index (-1: none), out_features. Per layer: input-norm index, post-attention-norm index, then the
// qkv, o, gate_up and down specs; the last int is the final norm's index.
constexpr int64_t LIN_FIELDS = 7, LAYER_FIELDS = 2 + 4 * LIN_FIELDS;

// One projection of the spec, its tensors resolved once (`DecodeTensors`).
struct DecodeLinear {
  int64_t kind = 0, gs = 0, N = 0;
  torch::Tensor q, scale, bias;  // scale: fp32 [N] (INT8) or the INT4 scale_min (fp32 / fp16)
};

static void run_linear(const DecodeLinear& L, const float* x, int64_t M, int64_t K, float* y) {
  const int64_t N = L.N;
  if (L.kind == 0) f32_gemm(x, M, K, L.q.data_ptr<float>(), y, N);
  else if (L.kind == 5) panel_gemm(x, M, K, L.q.data_ptr<float>(), y, N);
  else if (L.kind == 1) int8_gemm(x, M, K, L.q.data_ptr<int8_t>(), L.scale.data_ptr<float>(), y, N);
  else if (L.kind == 3) int8_gemm_vnni(x, M, K, L.q.data_ptr<int8_t>(), L.scale.data_ptr<float>(), y, N);
  else if (L.kind == 4) int4_gemm_vnni_t(x, M, K, L.q.data_ptr<uint8_t>(), L.scale, L.gs, y, N);
  else int4_gemm_t(x, M, K, L.q.data_ptr<uint8_t>(), L.scale, L.gs, y, N);
  if (L.bias.defined()) {
    if (tl_team.rank == 0) {
      const float* b = L.bias.data_ptr<float>();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) y[m * N + n] += b[n];
    }
    if (tl_team.team) tl_team.team->barrier();
  }
}

// This thread's share of L's weight bytes (the chunks it owns first: chunk order is memory order) for barrier waits.
static void prefetch_next(const DecodeLinear& L) {
  if (!tl_team.team) return;
  const int64_t bytes = L.q.nbytes(), n = tl_team.team->n, r = tl_team.rank;
  const char* base = static_cast<const char*>(L.q.data_ptr());
  tl_pf = PrefetchCursor{base + bytes * r / n, base + bytes * (r + 1) / n};
}

// A model's decode-step tensors, resolved and checked once (`NativeDecode`): its weights from `weights` and the
// spec above, and the KV caches it writes (`bind_caches`). Passing ~460 tensors through pybind every step cost ~5%
// of an INT8 batch-1 step.
struct DecodeTensors {
  struct Layer {
    torch::Tensor norm1, norm2;
    DecodeLinear lin[4];  // qkv, o, gate_up, down
  };
  std::vector<Layer> layers;
  torch::Tensor final_norm;
  DecodeLinear head;
  bool has_head = false;
  DecodeLinear in_proj;  // an EAGLE draft's fc over [embedding ; feature]: x [T, in] -> [T, hidden] first
  bool has_in_proj = false;
  torch::Tensor embed, cos, sin_signed;  // set_tables: the step's inputs from token ids and positions
  bool has_tables = false;
  std::vector<torch::Tensor> k_caches, v_caches;

  DecodeTensors(std::vector<torch::Tensor> w, std::vector<int64_t> spec) {
    TORCH_CHECK(!spec.empty() && (spec.size() - 1) % LAYER_FIELDS == 0, "spec: ", LAYER_FIELDS, " ints per layer + 1");
    const int64_t L = (spec.size() - 1) / LAYER_FIELDS;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t* s = spec.data() + l * LAYER_FIELDS;
      Layer y;
      y.norm1 = weight(w, s[0], at::kFloat);
      y.norm2 = weight(w, s[1], at::kFloat);
      for (int j = 0; j < 4; ++j) y.lin[j] = linear(w, s + 2 + j * LIN_FIELDS);
      layers.push_back(y);
    }
    final_norm = weight(w, spec.back(), at::kFloat);
  }

  // the lm_head (one linear spec), run by decode_layers on the final hidden states of the rows it is asked for
  void set_head(std::vector<torch::Tensor> w, std::vector<int64_t> spec) {
    TORCH_CHECK(static_cast<int64_t>(spec.size()) == LIN_FIELDS, "head spec: ", LIN_FIELDS, " ints");
    head = linear(w, spec.data());
    has_head = true;
  }

  // a projection decode_layers runs on x first (x then holds its in_features per row)
  void set_input_proj(std::vector<torch::Tensor> w, std::vector<int64_t> spec) {
    TORCH_CHECK(static_cast<int64_t>(spec.size()) == LIN_FIELDS, "input projection spec: ", LIN_FIELDS, " ints");
    in_proj = linear(w, spec.data());
    has_in_proj = true;
  }

  // the input embedding [vocab, hidden] and RoPE tables [positions, head_dim] (cos, signed sin): decode_layers then
  // takes token ids and positions and gathers the rows itself
  void set_tables(torch::Tensor e, torch::Tensor c, torch::Tensor s) {
    TORCH_CHECK(!has_in_proj, "an input projection's step takes its x, not token ids");
    for (const auto& t : {e, c, s})
      TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.scalar_type() == at::kFloat, "tables: fp32 contiguous 2-D");
    TORCH_CHECK(c.sizes() == s.sizes(), "cos and sin tables: the same shape");
    embed = e; cos = c; sin_signed = s;
    has_tables = true;
  }

  static torch::Tensor weight(const std::vector<torch::Tensor>& w, int64_t i, at::ScalarType t) {
    TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(w.size()), "spec index ", i, " outside the weights");
    TORCH_CHECK(w[i].is_contiguous() && w[i].scalar_type() == t, "weight ", i, ": expected contiguous ", t);
    return w[i];
  }

  static DecodeLinear linear(const std::vector<torch::Tensor>& w, const int64_t* f) {
    DecodeLinear d;
    d.kind = f[0]; d.gs = f[4]; d.N = f[6];
    TORCH_CHECK(d.kind >= 0 && d.kind <= 5, "unknown linear kind ", d.kind);
    TORCH_CHECK(HAS_VNNI || (d.kind != 3 && d.kind != 4), "the VNNI tile layouts need AVX512-VNNI");
    TORCH_CHECK(HAS_AVX512 || d.kind != 5, "fp32 panels need AVX-512");
    const bool f32 = d.kind == 0 || d.kind == 5;
    d.q = weight(w, f[1], f32 ? at::kFloat : d.kind == 1 || d.kind == 3 ? at::kChar : at::kByte);
    if (!f32) {
      TORCH_CHECK(f[2] >= 0 && f[2] < static_cast<int64_t>(w.size()) && w[f[2]].is_contiguous(), "scale index");
      d.scale = w[f[2]];
      TORCH_CHECK(d.scale.scalar_type() == at::kFloat || ((d.kind == 2 || d.kind == 4) &&
                  d.scale.scalar_type() == at::kHalf), "scales: fp32 (INT4 scale_min: fp32 or fp16)");
    }
    if (f[5] >= 0) d.bias = weight(w, f[5], at::kFloat);
    return d;
  }

  // one fp32 [blocks, block_size, kv_heads, head_dim] k and v cache per layer, the same shape for every layer
  void bind_caches(std::vector<torch::Tensor> k, std::vector<torch::Tensor> v) {
    TORCH_CHECK(k.size() == layers.size() && v.size() == layers.size(), "one k and one v cache per layer");
    for (size_t l = 0; l < k.size(); ++l)
      TORCH_CHECK(k[l].scalar_type() == at::kFloat && v[l].scalar_type() == at::kFloat && k[l].is_contiguous() &&
                  v[l].is_contiguous() && k[l].dim() == 4 && k[l].sizes() == k[0].sizes() &&
                  v[l].sizes() == k[0].sizes(), "caches: fp32 contiguous [blocks, block_size, kv_heads, head_dim], "
                  "the same for every layer");
    k_caches = std::move(k);
    v_caches = std::move(v);
  }

  // every projection's tensors against the step's sizes (checked before the threads start: a kernel's own check
  // failing inside the team would leave the other threads at a barrier)
  void check(int64_t Xd, int64_t Hd, int64_t QKV, int64_t HD, int64_t I) const {
    for (const Layer& y : layers) {
      const int64_t K[4] = {Hd, HD, Hd, I}, N[4] = {QKV, Hd, 2 * I, Hd};
      for (int j = 0; j < 4; ++j) {
        TORCH_CHECK(y.lin[j].N == N[j], "projection ", j, ": out_features ", y.lin[j].N, ", the model needs ", N[j]);
        check_linear(y.lin[j], K[j], j);
      }
      TORCH_CHECK(y.norm1.numel() == Hd && y.norm2.numel() == Hd, "norm weights must be [hidden]");
    }
    TORCH_CHECK(final_norm.numel() == Hd, "norm weights must be [hidden]");
    if (has_head) check_linear(head, Hd, 4);
    if (has_in_proj) {
      TORCH_CHECK(in_proj.N == Hd, "input projection: out_features ", in_proj.N, ", the model needs ", Hd);
      check_linear(in_proj, Xd, 5);
    }
  }

  static void check_linear(const DecodeLinear& d, int64_t k, int j) {
    const int64_t n = d.N;
    const bool int4 = d.kind == 2 || d.kind == 4;
    const int64_t panels = (n + PANEL - 1) / PANEL * PANEL;  // kind 5: N padded to whole panels
    TORCH_CHECK(d.q.numel() == (int4 ? n * k / 2 : d.kind == 5 ? panels * k : n * k), "projection ", j,
                ": weight of ", d.q.numel(), " elements for [", n, ", ", k, "]");
    if (d.kind == 1 || d.kind == 3) TORCH_CHECK(d.scale.numel() == n, "INT8 scale must be [N]");
    if (int4) TORCH_CHECK(d.gs > 0 && k % d.gs == 0 && d.scale.numel() == n * (k / d.gs) * 2, "INT4 scale_min shape");
    if (d.kind == 3) TORCH_CHECK(n % 16 == 0 && k % 32 == 0, "INT8 VNNI layout: N % 16, K % 32");
    if (d.kind == 4) TORCH_CHECK(n % 16 == 0 && k % 32 == 0 && d.gs % 32 == 0, "INT4 VNNI layout shape");
    if (d.bias.defined()) TORCH_CHECK(d.bias.numel() == n, "bias must be [N]");
  }
};

// ---- greedy sampling ------------------------------------------------------------------------------------------
// A row's index of its largest value, as torch.argmax returns it (the first of equal maxima; a NaN counts as the
// largest). torch's took ~50 us for one 49,152-logit row on 2 threads (its parallel reduction's overhead), ~1% of
// a batch-1 decode step; two vector passes over the row take ~10.
static int64_t argmax_row(const float* r, int64_t N) {
  __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= N; i += 8) {
    const __m256 v = _mm256_loadu_ps(r + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, v);
  }
  float best = -INFINITY;
  bool has_nan = _mm256_movemask_ps(nan) != 0;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  for (float f : lanes) best = std::max(best, f);
  for (int64_t j = i; j < N; ++j) {
    if (std::isnan(r[j])) has_nan = true;
    else best = std::max(best, r[j]);
  }
  int64_t idx = 0;
  if (has_nan) {
    while (!std::isnan(r[idx])) ++idx;
    return idx;
  }
  const __m256 b = _mm256_set1_ps(best);
  int64_t j = 0;
  for (; j + 8 <= N; j += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(r + j), b, _CMP_EQ_OQ));
    if (mask) break;
  }
  while (r[j] != best) ++j;  // the first equal lane of that vector, or the tail
  return j;
}

torch::Tensor argmax_rows(torch::Tensor x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) > 0, "x: fp32 [M, N], N > 0");
  x = x.contiguous();
  const int64_t M = x.size(0), N = x.size(1);
  auto out = torch::empty({M}, x.options().dtype(at::kLong));
  for (int64_t m = 0; m < M; ++m) out.data_ptr<int64_t>()[m] = argmax_row(x.data_ptr<float>() + m * N, N);
  return out;
}

// rows idx [T] (long) of a table set by `set_tables`, as fp32 [T, width]
static torch::Tensor gather_rows(const DecodeTensors& dw, const torch::Tensor& table, torch::Tensor idx, const char* what) {
  TORCH_CHECK(dw.has_tables, what, "s given but no tables set (set_tables)");
  idx = idx.contiguous();
  TORCH_CHECK(idx.dim() == 1, what, "s: [T]");
  const int64_t T = idx.numel(), n = table.size(0), w = table.size(1);
  auto out = torch::empty({T, w}, table.options());
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(ip[t] >= 0 && ip[t] < n, what, " ", ip[t], " outside the table's ", n, " rows");
    std::memcpy(out.data_ptr<float>() + t * w, table.data_ptr<float>() + ip[t] * w, w * sizeof(float));
  }
  return out;
}

// Every decoder layer of a decode step (T <= 32 rows, all on the paged decode kernel) in one call, on one team of
// threads for the whole step (see `Team`). Each thread keeps its own residual stream, normed input and SwiGLU
// output (identical copies, computed redundantly: a few KB, cheaper than a barrier); the Linears' and attention's
// outputs are shared, written in disjoint chunks. The arithmetic per row is that of the module-by-module path.
// With an input projection set (`set_input_proj`), x is its input and the team runs it first (an EAGLE draft's fc).
// With a head set (`set_head`), the same team then computes the logits of `logit_rows` (indices into the step's
// rows): returns (final hidden [T, hidden], logits [R, vocab], each logit row's argmax [R]; R = 0 without them).
// Why in this call: after the step's ~135 MB weight stream the caches are cold, and the lm_head as a separate call
// from Python (module, its checks, a row gather, another thread team) cost ~0.2-0.3 ms of an INT8 step of ~8.
// With tables set (`set_tables`), x may be the step's token ids [T] (long) and cos its positions [T] (long; then
// sin_signed is unused): the rows are gathered here. Why: the gathers as torch ops from Python (embedding, two
// index_selects and their reshapes) cost ~0.1 ms a step with caches cold after the weight stream.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> decode_layers(
    torch::Tensor x, torch::Tensor cos, torch::Tensor sin_signed, const DecodeTensors& dw, torch::Tensor slots,
    torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor rows, torch::Tensor spans,
    torch::Tensor logit_rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale) {
  const int64_t L = static_cast<int64_t>(dw.layers.size());
  const std::vector<torch::Tensor>& k_caches = dw.k_caches;
  const std::vector<torch::Tensor>& v_caches = dw.v_caches;
  TORCH_CHECK(static_cast<int64_t>(k_caches.size()) == L, "bind_caches first");
  const int64_t H = num_heads, KVH = num_kv_heads, D = head_dim;
  if (x.scalar_type() == at::kLong) x = gather_rows(dw, dw.embed, x, "token id");
  if (cos.scalar_type() == at::kLong) {
    sin_signed = gather_rows(dw, dw.sin_signed, cos, "position");
    cos = gather_rows(dw, dw.cos, cos, "position");
  }
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x fp32 [T, hidden]");
  const int64_t T = x.size(0), Xd = x.size(1), Hd = dw.has_in_proj ? dw.in_proj.N : Xd;
  const int64_t QKV = (H + 2 * KVH) * D, I = dw.layers.empty() ? 0 : dw.layers[0].lin[2].N / 2, W = KVH * D;
  dw.check(Xd, Hd, QKV, H * D, I);
  TORCH_CHECK(L == 0 || (k_caches[0].size(2) == KVH && k_caches[0].size(3) == D), "caches: [blocks, block_size, ",
              KVH, ", ", D, "]");
  cos = cos.contiguous(); sin_signed = sin_signed.contiguous();
  TORCH_CHECK(cos.numel() == T * D && sin_signed.numel() == T * D, "cos / sin: [T, head_dim]");
  auto sl = slots.to(at::kLong).contiguous();
  TORCH_CHECK(sl.numel() == T, "one slot per row");
  const int64_t* slp = sl.data_ptr<int64_t>();
  const int64_t cache_slots = L ? k_caches[0].size(0) * k_caches[0].size(1) : 0;
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(slp[t] >= 0 && slp[t] < cache_slots, "slot ", slp[t], " outside the cache");
  const AttnPlan ap = plan_attention(H, D, k_caches[0], block_tables, context_lens, rows, spans);
  TORCH_CHECK(ap.G == T, "one block-table row per step row");
  auto opts = x.options();
  auto qkv = torch::empty({T, QKV}, opts), attn = torch::empty({T, H, D}, opts), gu = torch::empty({T, 2 * I}, opts);
  auto y = torch::empty({T, Hd}, opts), out = torch::empty({T, Hd}, opts);
  auto lr = logit_rows.to(at::kLong).contiguous();
  const int64_t R = lr.numel();
  TORCH_CHECK(R == 0 || dw.has_head, "logit_rows given but no head set (set_head)");
  const int64_t* lrp = lr.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) TORCH_CHECK(lrp[r] >= 0 && lrp[r] < T, "logit row ", lrp[r], " outside the ", T, " rows");
  auto logits = torch::empty({R, R ? dw.head.N : 0}, opts);
  auto amax = torch::empty({R}, opts.dtype(at::kLong));
  auto head_in = torch::empty({R, Hd}, opts);
  auto xin = dw.has_in_proj ? torch::empty({T, Hd}, opts) : x;  // the first layer's input
  const float* xp = xin.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin_signed.data_ptr<float>();
  float* qp = qkv.data_ptr<float>();
  float* ap_out = attn.data_ptr<float>();
  float* gp = gu.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* op = out.data_ptr<float>();
  std::vector<float*> kc(L), vc(L);
  for (int64_t l = 0; l < L; ++l) { kc[l] = k_caches[l].data_ptr<float>(); vc[l] = v_caches[l].data_ptr<float>(); }
  const int64_t PRIV = 2 * T * Hd + T * I;  // per thread: residual, normed input, SwiGLU output
  const int nt = std::max(1, at::get_num_threads());
  std::vector<float> priv(static_cast<size_t>(nt) * PRIV);

  auto step = [&](int rank, int n) {
    float* res = priv.data() + rank * PRIV;
    float* h = res + T * Hd;
    float* act = h + T * Hd;
    if (dw.has_in_proj) run_linear(dw.in_proj, x.data_ptr<float>(), T, Xd, xin.data_ptr<float>());  // ends in a barrier
    std::memcpy(res, xp, T * Hd * sizeof(float));
    for (int64_t l = 0; l < L; ++l) {
      const DecodeTensors::Layer& ly = dw.layers[l];
      // input norm: layer 0 normalizes the embedding (the residual stream starts as a copy of it); later layers
      // first add the previous MLP output to the stream (vLLM's fused_add_rms_norm)
      rms_rows(l == 0 ? xp : yp, l == 0 ? nullptr : res, ly.norm1.data_ptr<float>(), h, T, Hd, eps, l > 0);
      prefetch_next(ly.lin[1]);
      run_linear(ly.lin[0], h, T, Hd, qp);
      if (rank == 0) {
        rope_raw(qp, T, QKV, cp, sp, H + KVH, D);
        for (int64_t t = 0; t < T; ++t) {
          std::memcpy(kc[l] + slp[t] * W, qp + t * QKV + H * D, W * sizeof(float));
          std::memcpy(vc[l] + slp[t] * W, qp + t * QKV + (H + KVH) * D, W * sizeof(float));
        }
      }
      if (n > 1) tl_team.team->barrier();
      for (int64_t t = rank; t < static_cast<int64_t>(ap.lists.size()); t += n)
        run_attention(ap, t, qp, QKV, kc[l], vc[l], static_cast<float>(scale), ap_out);
      if (n > 1) tl_team.team->barrier();
      prefetch_next(ly.lin[2]);
      run_linear(ly.lin[1], ap_out, T, H * D, yp);
      rms_rows(yp, res, ly.norm2.data_ptr<float>(), h, T, Hd, eps, true);
      prefetch_next(ly.lin[3]);
      run_linear(ly.lin[2], h, T, Hd, gp);
      silu_mul_raw(gp, T, I, act);
      if (l + 1 < L) prefetch_next(dw.layers[l + 1].lin[0]);
      else if (R) prefetch_next(dw.head);
      run_linear(ly.lin[3], act, T, I, yp);
    }
    if (rank == 0) {
      rms_rows(yp, res, dw.final_norm.data_ptr<float>(), op, T, Hd, eps, true);
      for (int64_t r = 0; r < R; ++r)
        std::memcpy(head_in.data_ptr<float>() + r * Hd, op + lrp[r] * Hd, Hd * sizeof(float));
    }
    if (R) {
      if (n > 1) tl_team.team->barrier();
      run_linear(dw.head, head_in.data_ptr<float>(), R, Hd, logits.data_ptr<float>());  // ends in a barrier
      for (int64_t r = rank; r < R; r += n)  // while the rows are in cache (the sampler's greedy tokens)
        amax.data_ptr<int64_t>()[r] = argmax_row(logits.data_ptr<float>() + r * dw.head.N, dw.head.N);
    }
  };

  run_team(nt, [&](int rank, int n) {
    step(rank, n);
    tl_pf = PrefetchCursor{};
  });
  return {out, logits, amax};
}

// A list of ints as a long tensor, without a copy (the list outlives the tensor's use).
static torch::Tensor long_view(std::vector<int64_t>& v) {
  return torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kLong);
}

// `decode_layers` with the step's indices as Python lists of ints (token ids, positions, slots, the block table
// flattened to [T, nb], context lengths, the rows' indices, spans, logit rows), viewed here without a copy. Why: at
// batch 1 the runner built them as ~11 small tensors from Python, and with caches cold after the weight stream
// each torch call from Python cost several microseconds.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> decode_step(
    std::vector<int64_t> ids, std::vector<int64_t> positions, const DecodeTensors& dw, std::vector<int64_t> slots,
    std::vector<int64_t> block_table, int64_t nb, std::vector<int64_t> context_lens, std::vector<int64_t> rows,
    std::vector<int64_t> spans, std::vector<int64_t> logit_rows, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, double eps, double scale) {
  TORCH_CHECK(dw.has_tables, "set_tables first");
  const int64_t T = static_cast<int64_t>(ids.size());
  TORCH_CHECK(nb > 0 && static_cast<int64_t>(block_table.size()) == T * nb, "block_table: T x nb ints");
  return decode_layers(long_view(ids), long_view(positions), torch::Tensor(), dw, long_view(slots),
                       long_view(block_table).view({T, nb}), long_view(context_lens), long_view(rows), long_view(spans),
                       long_view(logit_rows), num_heads, num_kv_heads, head_dim, eps, scale);
}

// Up to `num_steps` greedy decode steps of T requests (one row each) in one call, each step's argmax the next step's
// input (vLLM's multi-step scheduling): tokens [T][steps run]. The steps stop after the first in which a row's token
// is one of that row's `stop_ids`. Row t's block table (row t of [T, nb]) must hold slots for positions
// positions[t] .. positions[t] + num_steps - 1. With `features` (not empty), each step's final hidden states are
// stored there by slot. Why: between single steps the runner's Python, with caches cold after
// the weight stream, cost ~0.2 ms of an INT8 step of ~3.
std::vector<std::vector<int64_t>> decode_steps(
    std::vector<int64_t> ids, std::vector<int64_t> positions, const DecodeTensors& dw, std::vector<int64_t> block_table,
    int64_t nb, int64_t num_steps, std::vector<std::vector<int64_t>> stop_ids, torch::Tensor features,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale) {
  TORCH_CHECK(dw.has_tables && dw.has_head, "set_tables and set_head first");
  TORCH_CHECK(!dw.k_caches.empty(), "bind_caches first");
  const int64_t T = static_cast<int64_t>(ids.size()), BS = dw.k_caches[0].size(1);
  const bool keep = features.defined() && features.numel() > 0;
  TORCH_CHECK(!keep || (features.scalar_type() == at::kFloat && features.dim() == 2 && features.is_contiguous() &&
                        features.size(0) >= dw.k_caches[0].size(0) * BS),
              "features: fp32 [cache slots, hidden], contiguous");
  TORCH_CHECK(T > 0 && static_cast<int64_t>(positions.size()) == T && static_cast<int64_t>(stop_ids.size()) == T,
              "one position and one stop list per row");
  TORCH_CHECK(nb > 0 && static_cast<int64_t>(block_table.size()) == T * nb, "block_table: T x nb ints");
  TORCH_CHECK(num_steps >= 1, "num_steps must be >= 1, got ", num_steps);
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(positions[t] >= 0 && positions[t] + num_steps <= nb * BS, "row ", t, ": positions ", positions[t],
                " + ", num_steps, " steps exceed its block table");
  std::vector<int64_t> slots(T), ctx(T), rows(T), spans(T + 1);
  for (int64_t t = 0; t <= T; ++t) spans[t] = t;
  for (int64_t t = 0; t < T; ++t) rows[t] = t;
  auto table = long_view(block_table).view({T, nb});
  std::vector<std::vector<int64_t>> out(T);
  for (int64_t s = 0; s < num_steps; ++s) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = positions[t];
      slots[t] = block_table[t * nb + p / BS] * BS + p % BS;
      ctx[t] = p + 1;
    }
    auto res = decode_layers(long_view(ids), long_view(positions), torch::Tensor(), dw, long_view(slots), table,
                             long_view(ctx), long_view(rows), long_view(spans), long_view(rows), num_heads, num_kv_heads,
                             head_dim, eps, scale);
    const int64_t* am = std::get<2>(res).data_ptr<int64_t>();
    if (keep) {  // the final hidden state of each position, by slot as its K/V (an EAGLE draft's features)
      const torch::Tensor& h = std::get<0>(res);
      const int64_t Hd = h.size(1);
      TORCH_CHECK(features.size(1) == Hd, "features: ", Hd, " values per slot");
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(features.data_ptr<float>() + slots[t] * Hd, h.data_ptr<float>() + t * Hd, Hd * sizeof(float));
    }
    bool stop = false;
    for (int64_t t = 0; t < T; ++t) {
      out[t].push_back(am[t]);
      for (int64_t id : stop_ids[t]) stop |= am[t] == id;
      ids[t] = am[t];
      ++positions[t];
    }
    if (stop) break;
  }
  return out;
}

// ---- n-gram speculation at batch 1, several verify steps per call -------------------------------------------
// The draft length of each step: `AdaptiveSpeculation._length` for one request with the free verify row
// (accel/speculative/adaptive.py; tests hold the two to the same choices). policy = {successes, failures, decay,
// cost_ratio, min_speedup, k_max, last_full, fixed_k}; fixed_k >= 0 where the length is not adaptive.
struct SpecPolicy {
  double succ, fail, decay, cost, min_speedup;
  int64_t k_max, last_full, fixed_k;
  explicit SpecPolicy(const std::vector<double>& p) {
    TORCH_CHECK(p.size() == 8, "policy: 8 numbers");
    succ = p[0]; fail = p[1]; decay = p[2]; cost = p[3]; min_speedup = p[4];
    k_max = static_cast<int64_t>(p[5]); last_full = static_cast<int64_t>(p[6]); fixed_k = static_cast<int64_t>(p[7]);
  }
  int64_t length() const {
    if (fixed_k >= 0) return std::max<int64_t>(fixed_k, 1);
    const double total = succ + fail, alpha = total > 0 ? succ / total : 0.0;
    int64_t k = 0;
    double best = min_speedup;
    for (int64_t g = 1; g <= k_max; ++g) {  // stats.leviathan_speedup
      const double e = alpha == 1.0 ? static_cast<double>(g + 1)
                                    : (1.0 - std::pow(alpha, static_cast<double>(g + 1))) / (1.0 - alpha);
      const double s = e / (static_cast<double>(g) * cost + 1.0);
      if (s > best + 1e-12) k = g, best = s;
    }
    if (last_full && k > 0) k = std::max(k, std::min(k_max, 2 * last_full));
    return std::max<int64_t>(k, 1);  // the free row: a draft, or a guess, every step
  }
  void observe(int64_t drafted, int64_t accepted) {  // AcceptanceEstimate.update; guesses count as no draft
    if (drafted == 0) return;
    last_full = accepted == drafted ? drafted : 0;
    succ = decay * succ + static_cast<double>(accepted);
    fail = decay * fail + (accepted < drafted ? 1.0 : 0.0);
  }
};

// ngram.propose_ngram: the tokens after the most recent earlier occurrence of the longest suffix of max_n..min_n
// tokens, at most k of them. A scan per step, not an index: a few microseconds at a few thousand tokens.
static void ngram_propose(const std::vector<int64_t>& t, int64_t k, int64_t min_n, int64_t max_n,
                          std::vector<int64_t>& out) {
  out.clear();
  const int64_t L = static_cast<int64_t>(t.size());
  for (int64_t n = std::min(max_n, L - 1); n >= min_n; --n) {
    for (int64_t s = L - 1 - n; s >= 0; --s) {
      if (std::equal(t.begin() + s, t.begin() + s + n, t.begin() + (L - n))) {
        for (int64_t i = s + n; i < std::min(L, s + n + k); ++i) out.push_back(t[i]);
        return;
      }
    }
  }
}

// NgramIndex.guess: the most frequent follower of the last token (ties: the most recent); -1 if it never occurred.
static int64_t ngram_guess(const std::vector<int64_t>& t) {
  const int64_t L = static_cast<int64_t>(t.size());
  if (L < 2) return -1;
  std::vector<std::array<int64_t, 3>> f;  // follower, count, where it last followed
  for (int64_t e = 0; e + 1 < L; ++e) {
    if (t[e] != t[L - 1]) continue;
    auto it = std::find_if(f.begin(), f.end(), [&](const std::array<int64_t, 3>& x) { return x[0] == t[e + 1]; });
    if (it == f.end()) f.push_back({t[e + 1], 1, e});
    else (*it)[1] += 1, (*it)[2] = e;
  }
  int64_t best = -1, bc = -1, bl = -1;
  for (const auto& x : f)
    if (x[1] > bc || (x[1] == bc && x[2] > bl)) best = x[0], bc = x[1], bl = x[2];
  return best;
}

// Greedy n-gram speculation of one request, step after step in one call: each step proposes (lookup, else a
// one-token guess where `guess`), verifies the drafts in one decode step of 1 + drafts rows and keeps them up to the
// first that differs from the target's argmax, plus the argmax after them (the output of plain greedy decoding).
// `history`: prompt + output, its last token not yet in the cache (position history.size() - 1). Stops after
// `max_steps` steps, at `max_new` tokens, after a step that drew one of `stop_ids`, where the block table cannot
// hold the next step's rows, or when another step would end past `budget_s` seconds at the last step's cost.
// Returns (tokens, per step {length asked, drafted, accepted, guess, propose seconds, step seconds}). Why: at batch 1
// the engine's Python around each verify step cost ~0.45 ms, cold after the weight stream, of a 10-27 ms fp32 step.
std::tuple<std::vector<int64_t>, std::vector<std::vector<double>>> spec_steps(
    std::vector<int64_t> history, const DecodeTensors& dw, std::vector<int64_t> block_table, int64_t max_steps,
    int64_t max_new, double budget_s, std::vector<int64_t> stop_ids, int64_t min_n, int64_t max_n, bool guess,
    std::vector<double> policy, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale) {
  TORCH_CHECK(dw.has_tables && dw.has_head, "set_tables and set_head first");
  TORCH_CHECK(!dw.k_caches.empty(), "bind_caches first");
  TORCH_CHECK(!history.empty() && !block_table.empty(), "a history and a block table");
  TORCH_CHECK(1 <= min_n && min_n <= max_n, "1 <= min_n <= max_n");
  SpecPolicy pol(policy);
  const int64_t BS = dw.k_caches[0].size(1), nb = static_cast<int64_t>(block_table.size()), cap = nb * BS;
  auto table = long_view(block_table).view({1, nb});
  std::vector<int64_t> tokens, draft, ids, pos, slots, ctx, rows, spans{0, 0};
  std::vector<std::vector<double>> records;
  const auto start = std::chrono::steady_clock::now();
  double last_s = 0.0;
  for (int64_t s = 0; s < max_steps; ++s) {
    const int64_t p = static_cast<int64_t>(history.size()) - 1, left = max_new - static_cast<int64_t>(tokens.size());
    if (left <= 0 || p >= cap) break;
    if (s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() + last_s > budget_s)
      break;
    const auto t0 = std::chrono::steady_clock::now();
    // SpecDecoder.propose's caps: accepted drafts + the bonus token within max_new, and the rows within the table
    const int64_t k = std::min({pol.length(), left - 1, cap - p - 1});
    bool guessed = false;
    draft.clear();
    if (k > 0) {
      ngram_propose(history, k, min_n, max_n, draft);
      if (draft.empty() && guess) {
        const int64_t g = ngram_guess(history);
        if (g >= 0) draft.push_back(g), guessed = true;
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    const int64_t T = 1 + static_cast<int64_t>(draft.size());
    ids.assign(1, history.back());
    ids.insert(ids.end(), draft.begin(), draft.end());
    pos.resize(T); slots.resize(T); ctx.resize(T); rows.resize(T);
    for (int64_t r = 0; r < T; ++r) {
      pos[r] = p + r;
      slots[r] = block_table[(p + r) / BS] * BS + (p + r) % BS;
      ctx[r] = p + r + 1;
      rows[r] = r;
    }
    spans[1] = T;
    auto res = decode_layers(long_view(ids), long_view(pos), torch::Tensor(), dw, long_view(slots),
                             table.expand({T, nb}).contiguous(), long_view(ctx), long_view(rows), long_view(spans),
                             long_view(rows), num_heads, num_kv_heads, head_dim, eps, scale);
    const int64_t* am = std::get<2>(res).data_ptr<int64_t>();
    int64_t a = 0;
    while (a < T - 1 && draft[a] == am[a]) ++a;
    bool stop = false;
    for (int64_t r = 0; r <= a; ++r) {
      tokens.push_back(am[r]);
      history.push_back(am[r]);
      for (int64_t id : stop_ids) stop |= am[r] == id;
    }
    const auto t2 = std::chrono::steady_clock::now();
    last_s = std::chrono::duration<double>(t2 - t0).count();
    const int64_t d = static_cast<int64_t>(draft.size());
    pol.observe(guessed ? 0 : d, guessed ? 0 : a);
    records.push_back({static_cast<double>(k), static_cast<double>(d), static_cast<double>(a), guessed ? 1.0 : 0.0,
                       std::chrono::duration<double>(t1 - t0).count(), last_s});
    if (stop) break;
  }
  return {tokens, records};
}

// Test hook: which thread ran each of n chunks of one parallel_chunks call in a team of `threads`, where thread
// `late` starts `late_us` microseconds after the others (a preempted thread: its range is taken by the others).
torch::Tensor team_chunks(int64_t n, int64_t threads, int64_t late, int64_t late_us) {
  auto who = torch::full({n}, -1, torch::kLong);
  int64_t* w = who.data_ptr<int64_t>();
  std::vector<std::atomic<int>> runs(n);
  run_team(static_cast<int>(threads), [&](int rank, int) {
    if (rank == late) std::this_thread::sleep_for(std::chrono::microseconds(late_us));
    parallel_chunks(n, [&](int64_t c) {
      runs[c].fetch_add(1);
      w[c] = rank;
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // the work of a chunk
    });
  });
  for (int64_t c = 0; c < n; ++c) TORCH_CHECK(runs[c].load() == 1, "chunk ", c, " ran ", runs[c].load(), " times");
  return who;
}

// ---- machine probe ------------------------------------------------------------------------------------------
// Two threads pass a counter back and forth through one cache line `rounds` times: ns per one-way pass (0 with one
// thread). Where a VM's vCPUs share a CCD this is ~30 ns, on two CCDs ~165: then each core has its own link to
// memory (about twice the read bandwidth) and every exchange between threads costs more (accel.bench.machine).
double core_to_core_ns(int64_t rounds) {
  TORCH_CHECK(rounds >= 1, "rounds must be >= 1, got ", rounds);
  alignas(64) std::atomic<int64_t> flag{0};
  double ns = 0;
#pragma omp parallel num_threads(2)
  if (omp_get_num_threads() == 2) {
    const int rank = omp_get_thread_num();
#pragma omp barrier
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < rounds; ++i) {
      if (rank == 0) {
        flag.store(2 * i + 1, std::memory_order_release);
        while (flag.load(std::memory_order_acquire) != 2 * i + 2) {}
      } else {
        while (flag.load(std::memory_order_acquire) != 2 * i + 1) {}
        flag.store(2 * i + 2, std::memory_order_release);
      }
    }
    if (rank == 0) ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (2 * rounds);
  }
  return ns;
}

// ---- weights in 2 MB pages ----------------------------------------------------------------------------------
// A decode step streams every weight once; with 4 KB pages that is a TLB miss every 4 KB, and the fp32 step ran
// at ~25 GB/s instead of ~33 (SmolLM2-135M, 2 threads: 40 -> 65 tok/s). torch's allocator asks for huge pages only
// under THP_MEM_ALLOC_ENABLE, read once at its first allocation, so large tensors are copied into an anonymous
// mapping advised MADV_HUGEPAGE before it is first touched (the kernel then backs it with 2 MB pages where it can;
// where it cannot, this is an ordinary copy).
#include <sys/mman.h>
torch::Tensor huge_page_copy(torch::Tensor t) {
  t = t.contiguous();
  const size_t bytes = t.numel() * t.element_size();
  const size_t huge = size_t(2) << 20, len = (bytes + huge - 1) / huge * huge;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return t;
  madvise(p, len, MADV_HUGEPAGE);
  std::memcpy(p, t.data_ptr(), bytes);
  return torch::from_blob(p, t.sizes(), [len](void* q) { munmap(q, len); }, t.options());
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux >= 5.14; older kernels answer EINVAL and the pages are touched instead
#endif

// zeros [sizes] of `like`'s dtype in memory advised for 2 MB pages (an anonymous mapping reads as zeros), faulted in
// here, as torch.zeros' memset does and as vLLM and llama.cpp clear their KV buffers at startup. Left to fault on
// first use, a KV cache's pages arrived inside decode steps, each a 2 MB page allocation that may compact memory
// (up to ~2.6 s per GB on a 2-core EPYC) while the other thread of the step waited: an engine's first run of 64
// long-tailed requests measured 246 tok/s against 288 with the cache faulted in beforehand (SmolLM2 INT8).
torch::Tensor huge_page_zeros(std::vector<int64_t> sizes, torch::Tensor like) {
  int64_t n = 1;
  for (auto v : sizes) n *= v;
  const size_t bytes = n * like.element_size();
  const size_t huge = size_t(2) << 20, len = std::max<size_t>(huge, (bytes + huge - 1) / huge * huge);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return torch::zeros(sizes, like.options());
  madvise(p, len, MADV_HUGEPAGE);
  if (madvise(p, len, MADV_POPULATE_WRITE) != 0)
    for (size_t i = 0; i < len; i += 4096) static_cast<volatile char*>(p)[i] = 0;
  return torch::from_blob(p, sizes, [len](void* q) { munmap(q, len); }, like.options());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("huge_page_copy", &huge_page_copy, "a copy of a tensor in memory advised for 2 MB pages");
  m.def("huge_page_zeros", &huge_page_zeros, "zeros in memory advised for 2 MB pages, faulted in");
  m.def("kv_write_", &kv_write_, "k/v rows into flat cache slots");
  m.def("int4_linear_vnni", &int4_linear_vnni, "int4_linear with q and scale_min in the VNNI tile layout", py::call_guard<py::gil_scoped_release>());
  m.def("int8_linear_vnni", &int8_linear_vnni, "int8_linear with q in the VNNI tile layout", py::call_guard<py::gil_scoped_release>());
  m.def("int8_linear", &int8_linear, "y = (x @ q^T) * scale; x fp32 [M, K], q int8 [N, K], scale fp32 [N]", py::call_guard<py::gil_scoped_release>());
  m.def("int4_linear", &int4_linear, "y[m, n] = sum_k x[m, k] * (q[n, k] * sm[n, g, 0] + sm[n, g, 1])", py::call_guard<py::gil_scoped_release>());
  m.def("core_to_core_ns", &core_to_core_ns, "ns per one-way pass of a cache line between two threads", py::call_guard<py::gil_scoped_release>());
  m.def("team_chunks", &team_chunks, "test hook: the thread that ran each chunk, one thread started late");
  m.def("argmax_rows", &argmax_rows, "each fp32 row's argmax, as torch.argmax");
  m.def("has_vnni", []() { return HAS_VNNI; }, "whether the AVX512-VNNI kernels (and the prefill GEMM) run here");
  m.def("int4_dequant", &int4_dequant, "w[n0:n1] = q * sm[n, g, 0] + sm[n, g, 1] in fp32", py::call_guard<py::gil_scoped_release>());
  m.def("has_avx512", []() { return HAS_AVX512; }, "whether the fp32 panel kernels run here");
  m.def("f32_panel_linear", &f32_panel_linear, "y = x @ w^T with w in fp32 panels [ceil(N / 48), K, 48]",
        py::call_guard<py::gil_scoped_release>());
  m.def("f32_linear", &f32_linear, "y = x @ w^T for a few fp32 rows", py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm", &rms_norm, "RMSNorm of fp32 rows");
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over a paged fp32 KV cache", py::call_guard<py::gil_scoped_release>());
  m.def("add_rms_norm_", &add_rms_norm_, "residual += x; return RMSNorm(residual)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused [T, 2I] gate_up output");
  m.def("rope_", &rope_, "RoPE in place on the first nheads heads of each row");
  // the GIL is released while a step runs, so the server's event loop streams the previous step's tokens meanwhile
  // module-local: builds of other sources (each named by its hash) can be loaded side by side, as A/B checks do
  py::class_<DecodeTensors>(m, "DecodeTensors", py::module_local(),
                            "a model's decode-step weights and KV caches for decode_layers")
      .def(py::init<std::vector<torch::Tensor>, std::vector<int64_t>>())
      .def("bind_caches", &DecodeTensors::bind_caches, "the KV caches decode_layers writes and reads")
      .def("set_head", &DecodeTensors::set_head, "the lm_head decode_layers runs on its logit_rows")
      .def("set_input_proj", &DecodeTensors::set_input_proj, "a projection decode_layers runs on x first")
      .def("set_tables", &DecodeTensors::set_tables, "the embedding and RoPE tables decode_layers gathers rows from");
  m.def("decode_layers", &decode_layers, "every decoder layer of a decode step, one call",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_step", &decode_step, "decode_layers with the step's indices as lists of ints",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_steps", &decode_steps, "greedy decode steps, each step's argmax the next one's input",
        py::call_guard<py::gil_scoped_release>());
  m.def("spec_steps", &spec_steps, "greedy n-gram speculation of one request, several verify steps",
        py::call_guard<py::gil_scoped_release>());
}
