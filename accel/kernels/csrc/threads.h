// threads.h: the thread team of the one-call decode step (run_team, run_governed, Team's barrier), the kernels' work
// split (parallel_chunks) and its chunk sizes: templates and small inline functions every kernel unit inlines.
#pragma once

#include "common.h"
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#pragma GCC visibility push(hidden)

// What a thread waiting at a barrier of the decode step prefetches into L2, PF_WAIT_LINES cache lines per spin: its
// range of the next Linear's weights (`prefetch_next`). Why: the waits (rope on one thread, attention's 3 kv heads
// on 2 threads, the end of a Linear) leave a core's memory link idle, and the next Linear then starts from L2 (a
// small gain at INT8 batch 1, larger with the vCPUs on two CCDs; the lines per spin and the range's size barely
// mattered).
struct PrefetchCursor {
  const char* cur = nullptr;
  const char* end = nullptr;
};
inline thread_local PrefetchCursor tl_pf;
constexpr int PF_WAIT_LINES = 2;

// The threads of one-call decode step (`decode_layers`): every thread runs the whole step, each Linear's chunks
// are split among them (`parallel_chunks`), and a barrier ends each phase. Why not a parallel region per
// kernel: at batch 1 a step has ~180 of them, and their fork/join on OpenMP's pool left the second thread idle
// (spinning in libgomp) for a large part of the step (perf).
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
  alignas(64) std::atomic<int64_t> late_ns{0};  // the barrier waits over LATE_NS, summed over the team's threads

  // A wait this long is a partner that was not running (a phase's imbalance is tens of microseconds).
  static constexpr int64_t LATE_NS = 200000;

  // Spin (about half a millisecond: a phase's wait is tens of us, and sleeping sooner slowed batch 1), then
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
    const auto t0 = std::chrono::steady_clock::now();  // read by a thread that waits, twice a barrier
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
    const int64_t waited = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - t0).count();
    if (waited > LATE_NS) late_ns.fetch_add(waited, std::memory_order_relaxed);
  }
};

struct TeamSlot {
  Team* team = nullptr;
  int rank = 0;
  uint64_t phase = 0;  // parallel_chunks calls so far: every thread of the team makes the same calls
};
inline thread_local TeamSlot tl_team;

// step(rank, n) on a team of up to `threads` threads (in this thread alone, as a team of one, where there is one or
// inside another parallel region: its kernels then fork no threads). Returns the team's late waits (Team::late_ns).
template <typename F>
int64_t run_team(int threads, const F& step) {
  Team team;
  if (threads <= 1 || at::in_parallel_region()) {
    team.reserve(1);
    const TeamSlot outer = tl_team;
    tl_team = TeamSlot{&team, 0, 0};
    step(0, 1);
    tl_team = outer;
    return 0;
  }
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
  return team.late_ns.load();
}

// The team size of the decode step on a shared CPU. Where another busy process holds a core, a team thread is off
// its core for whole scheduler slices and its partner waits at every barrier of the step (~180 at batch 1):
// batch-1 decode fell to a small fraction of its quiet speed beside one `yes` (llama.cpp's too, less so). A step
// whose barrier waits over Team::LATE_NS exceed LATE_FRAC of the team's time is a strike; after STRIKES in a row
// TRIAL_STEPS steps run in this thread alone, and the step continues alone if those were faster per row than the
// mean of the team's last WINDOW steps: the rate it would keep (not the late step that started the trial: a client
// or event loop preempting a team thread now and then makes one slow step, and comparing with it slowed batch 1;
// not the median: beside `yes` half the team's steps are quick and the slow half costs the time).
// After PROBE_STEPS alone the team runs again and earns its next trial the same way. A trial that lost waits
// `backoff` steps before the next, from FIRST_BACKOFF (a load that just began has not filled the window yet)
// doubling to MAX_BACKOFF. A pure state machine over measured times: tests drive
// it with injected costs.
struct TeamGovernor {
  static constexpr double LATE_FRAC = 0.2;
  static constexpr int STRIKES = 2, WINDOW = 16, TRIAL_STEPS = 4;
  static constexpr int64_t PROBE_STEPS = 64, FIRST_BACKOFF = 16, MAX_BACKOFF = 4096;
  enum Mode { FULL, TRIAL, ALONE } mode = FULL;
  int strikes = 0, trial_left = 0;
  int64_t wait = 0, backoff = FIRST_BACKOFF;
  double alone_ns = 0;  // the trial's steps alone, time per row summed
  std::array<double, WINDOW> recent{};  // the team's last steps, time per row
  int64_t num_recent = 0;

  int threads(int full) const { return full > 1 && (mode == TRIAL || mode == ALONE) ? 1 : full; }

  double team_mean() const;  // the mean of the team's recent steps
  void record(int n, double ns_per_row, double late_frac);  // a step of n threads cost ns_per_row
};
extern TeamGovernor g_governor;  // the engine's steps come one at a time, from its one thread

// Runs the decode step `step` on the team size the governor picks, and tells it what the step cost.
template <typename F>
void run_governed(int64_t rows, const F& step) {
  const int full = std::max(1, at::get_num_threads());
  const int n = g_governor.threads(full);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t late = run_team(n, step);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  g_governor.record(n, ns / std::max<int64_t>(rows, 1), n > 1 ? late / (n * ns) : 0.0);
}

// Threads that split a kernel's work: the team's size inside a team. Every thread of a team must plan the same
// chunks, and torch's count read from a pool thread can differ from the one the team was started with.
inline int64_t work_threads() {
  return tl_team.team ? tl_team.team->n : std::max<int64_t>(1, at::get_num_threads());
}

// fn(c) for c in [0, n), the chunks handed out one at a time rather than split once up front: where the server's
// event loop or a client shares the cores, a preempted thread then delays only the chunk it holds while the others
// take the rest; with fixed splits the whole step waited at the region's end for the preempted thread's slice
// (batch-1 decode over HTTP ran well below the same engine in-process).
// Inside a team each thread takes its own contiguous range first and then steals from the others' ends
// (`Team::Range`), instead of every chunk coming from one shared counter (as ggml's mul_mat does). Why: each
// thread's weight stream then runs on through its chunks, and a claim touches the thread's own cache line. Where
// a VM puts the 2 vCPUs of a Zen 4 on different CCDs (core to core several times slower, each core with its own
// link to memory), the shared counter held INT8 batch-1 decode's weight stream well below contiguous ranges'.
// Output rows per chunk of a GEMM with `tile`-row L1 tiles. At decode sizes (M <= 8) a call is a weight stream,
// and a thread that streams 16-32 KB and then jumps to the next free chunk restarts the hardware prefetcher each
// time: the read stream ran faster in 128-256 KB chunks than in 16 KB ones. So decode chunks hold ~STREAM_CHUNK
// bytes, in a multiple of the thread count so the threads finish together; larger M computes enough per byte that
// one tile per chunk balances best.
constexpr int64_t STREAM_CHUNK = 192 << 10;
inline int64_t chunk_rows(int64_t M, int64_t N, int64_t row_bytes, int64_t tile) {
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
// step, and one pair per chunk made a 9-row INT8 step cost far more than an 8-row one; stream-sized chunks up to 16
// rows sped up batch-16 decode and n-gram speculation at batch 1.
struct TileChunks {
  int64_t n, pairs, tiles;
  int64_t begin(int64_t c) const { return std::min(tiles, 2 * (c * pairs / n)); }
  int64_t end(int64_t c) const { return std::min(tiles, 2 * ((c + 1) * pairs / n)); }
};
inline TileChunks tile_chunks(int64_t M, int64_t tiles, int64_t tile_bytes) {
  const int64_t pairs = (tiles + 1) / 2;
  if (M > 16) return {std::max<int64_t>(pairs, 1), pairs, tiles};
  const int64_t nt = work_threads();
  const int64_t per_thread = std::max<int64_t>(1, (tiles * tile_bytes + nt * STREAM_CHUNK / 2) / (nt * STREAM_CHUNK));
  return {std::max<int64_t>(1, std::min(pairs, nt * per_thread)), pairs, tiles};
}

// The next chunk of range slot `s` in phase `ph` (its range [lo, hi) set first if the slot holds an earlier
// phase): the front one for the owner, the back one for a thief; -1 when none is left. Chunk indices take 24 bits
// (a call has at most one chunk per 8 output rows).
inline int64_t claim_chunk(std::atomic<uint64_t>& s, uint64_t ph, int64_t lo, int64_t hi, bool owner) {
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
void parallel_chunks(int64_t n, const F& fn) {
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

// Test hooks (threads.cpp).
std::vector<int64_t> governor_trace(std::vector<std::vector<double>> costs, int64_t full);
torch::Tensor team_chunks(int64_t n, int64_t threads, int64_t late, int64_t late_us);

#pragma GCC visibility pop
