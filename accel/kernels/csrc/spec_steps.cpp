// spec_steps.cpp: n-gram speculation at batch 1: several verify steps per call (SpecPolicy).
#include "spec_steps.h"

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
// the engine's Python around each verify step, cold after the weight stream, cost a visible share of the step.
std::tuple<std::vector<int64_t>, std::vector<std::vector<double>>> spec_steps(
    std::vector<int64_t> history, const DecodeTensors& dw, std::vector<int64_t> block_table, int64_t max_steps,
    int64_t max_new, double budget_s, std::vector<int64_t> stop_ids, int64_t min_n, int64_t max_n, bool guess,
    SpecPolicy pol, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale) {
  TORCH_CHECK(dw.has_tables && dw.has_head, "set_tables and set_head first");
  TORCH_CHECK(!dw.k_caches.empty(), "bind_caches first");
  TORCH_CHECK(!history.empty() && !block_table.empty(), "a history and a block table");
  TORCH_CHECK(1 <= min_n && min_n <= max_n, "1 <= min_n <= max_n");
  const int64_t NG = dw.num_groups, BS = dw.k_caches[0].size(1);
  TORCH_CHECK(static_cast<int64_t>(block_table.size()) % NG == 0, "block_table: one table per KV group");
  const int64_t nb = static_cast<int64_t>(block_table.size()) / NG, cap = nb * BS;
  auto table = long_view(block_table).view({NG, 1, nb});
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
    pos.resize(T); slots.resize(NG * T); ctx.resize(T); rows.resize(T);
    for (int64_t r = 0; r < T; ++r) {
      pos[r] = p + r;
      for (int64_t g = 0; g < NG; ++g) slots[g * T + r] = block_table[g * nb + (p + r) / BS] * BS + (p + r) % BS;
      ctx[r] = p + r + 1;
      rows[r] = r;
    }
    spans[1] = T;
    auto res = decode_layers(long_view(ids), long_view(pos), torch::Tensor(), dw, long_view(slots),
                             table.expand({NG, T, nb}).reshape({NG * T, nb}), long_view(ctx), long_view(rows), long_view(spans),
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
