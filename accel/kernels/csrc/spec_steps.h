// spec_steps.h: greedy n-gram speculation of one request, several verify steps per call (spec_steps.cpp), and its
// draft-length rule.
#pragma once

#include "common.h"
#include "decode_step.h"

#pragma GCC visibility push(hidden)

// ---- n-gram speculation at batch 1, several verify steps per call -------------------------------------------
// The draft length of each step: `AdaptiveSpeculation._length` for one request with the free verify row, and
// `AcceptanceEstimate.update` after it (accel/speculative/adaptive.py). A named struct, bound to Python as
// `SpecPolicy` (fields by name); tests/speculative/test_spec_policy.py holds it to the Python rule step for step.
// fixed_k >= 0 where the length is not adaptive (0: speculation is off at this batch size, a guess every step).
struct SpecPolicy {
  double successes = 0.0, failures = 0.0, decay = 1.0, cost_ratio = 0.0;
  int64_t k_max = 1, last_full = 0, fixed_k = -1;
  int64_t length() const {
    if (fixed_k >= 0) return std::max<int64_t>(fixed_k, 1);
    const double total = successes + failures, alpha = total > 0 ? successes / total : 0.0;
    int64_t k = 0;
    double best = 1.0;  // adaptive.best_speculation_length: only a k that beats no speculation
    for (int64_t g = 1; g <= k_max; ++g) {  // stats.leviathan_speedup
      const double e = alpha == 1.0 ? static_cast<double>(g + 1)
                                    : (1.0 - std::pow(alpha, static_cast<double>(g + 1))) / (1.0 - alpha);
      const double s = e / (static_cast<double>(g) * cost_ratio + 1.0);
      if (s > best + 1e-12) k = g, best = s;
    }
    if (last_full && k > 0) k = std::max(k, std::min(k_max, 2 * last_full));
    return std::max<int64_t>(k, 1);  // the free row: a draft, or a guess, every step
  }
  void observe(int64_t drafted, int64_t accepted) {  // AcceptanceEstimate.update; guesses count as no draft
    if (drafted == 0) return;
    last_full = accepted == drafted ? drafted : 0;
    successes = decay * successes + static_cast<double>(accepted);
    failures = decay * failures + (accepted < drafted ? 1.0 : 0.0);
  }
};

// Greedy n-gram speculation of one request, up to `max_steps` verify steps: (tokens, per step {length asked, drafted,
// accepted, guess, propose seconds, step seconds}).
std::tuple<std::vector<int64_t>, std::vector<std::vector<double>>> spec_steps(
    std::vector<int64_t> history, const DecodeTensors& dw, std::vector<int64_t> block_table, int64_t max_steps,
    int64_t max_new, double budget_s, std::vector<int64_t> stop_ids, int64_t min_n, int64_t max_n, bool guess,
    SpecPolicy pol, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale);

#pragma GCC visibility pop
