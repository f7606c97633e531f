// threads.cpp: the team governor's state machine (TeamGovernor, threads.h) and the thread team's test hooks.
#include "threads.h"

TeamGovernor g_governor;

double TeamGovernor::team_mean() const {
  const int64_t n = std::min<int64_t>(num_recent, WINDOW);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += recent[i];
  return sum / std::max<int64_t>(n, 1);
}

void TeamGovernor::record(int n, double ns_per_row, double late_frac) {
  const bool late = late_frac > LATE_FRAC;
  if (n > 1) recent[num_recent++ % WINDOW] = ns_per_row;
  switch (mode) {
    case FULL:
      if (n <= 1) return;
      if (wait > 0) --wait;
      strikes = late ? strikes + 1 : 0;
      if (strikes >= STRIKES && wait == 0 && num_recent >= WINDOW) {
        mode = TRIAL;
        trial_left = TRIAL_STEPS;
        alone_ns = 0;
      }
      return;
    case TRIAL:
      alone_ns += ns_per_row;
      if (--trial_left > 0) return;
      strikes = 0;
      if (alone_ns / TRIAL_STEPS < team_mean()) {
        mode = ALONE;
        wait = PROBE_STEPS;
        backoff = FIRST_BACKOFF;
      } else {
        mode = FULL;
        wait = backoff;
        backoff = std::min(2 * backoff, MAX_BACKOFF);
      }
      return;
    case ALONE:
      if (--wait <= 0) {
        mode = FULL;
        strikes = 0;
      }
      return;
  }
}

// Test hook: the team sizes the governor picks for `costs.size()` steps of one row, where costs[i] = {ns alone,
// ns with the whole team, late fraction with the whole team} is what step i would cost (injected: no clock).
std::vector<int64_t> governor_trace(std::vector<std::vector<double>> costs, int64_t full) {
  TeamGovernor g;
  std::vector<int64_t> out;
  for (const auto& c : costs) {
    const int n = g.threads(static_cast<int>(full));
    out.push_back(n);
    g.record(n, n > 1 ? c[1] : c[0], n > 1 ? c[2] : 0.0);
  }
  return out;
}

// Test hook: which thread ran each of n chunks of one parallel_chunks call in a team of `threads`, where thread
// `late` starts only once all n chunks have run, or after `late_us` microseconds (a preempted thread: its range is
// taken by the others). No clock decides the outcome: with stealing the late thread finds nothing left; without
// it, it waits out late_us and then runs its own range.
torch::Tensor team_chunks(int64_t n, int64_t threads, int64_t late, int64_t late_us) {
  auto who = torch::full({n}, -1, torch::kLong);
  int64_t* w = who.data_ptr<int64_t>();
  std::vector<std::atomic<int>> runs(n);
  std::atomic<int64_t> done{0};
  run_team(static_cast<int>(threads), [&](int rank, int) {
    if (rank == late) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(late_us);
      while (done.load(std::memory_order_acquire) < n && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    parallel_chunks(n, [&](int64_t c) {
      runs[c].fetch_add(1);
      w[c] = rank;
      done.fetch_add(1, std::memory_order_release);
    });
  });
  for (int64_t c = 0; c < n; ++c) TORCH_CHECK(runs[c].load() == 1, "chunk ", c, " ran ", runs[c].load(), " times");
  return who;
}
