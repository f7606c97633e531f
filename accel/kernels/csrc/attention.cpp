// attention.cpp: paged decode attention (one query token per row, fp32 cache).
#include "attention.h"

// ---- paged decode attention (one query token per row, fp32 cache) ------------------------------------------
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
// above have 4 chains that each wait on the FMA latency, well below the FMA throughput).
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

AttnPlan plan_attention(int64_t H, int64_t D, const torch::Tensor& k_cache, torch::Tensor block_tables,
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
  // grouping. Only from 400 tokens of context: at shorter ones the K/V stayed in cache and the extra tasks cost
  // more than the balance saved.
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

void run_attention(const AttnPlan& a, int64_t t, const float* qp, int64_t QS, const float* kp, const float* vp,
                   float scale, float* op, int64_t window) {
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
      int64_t first_key = Lmax;  // the span's earliest key in any of its rows' windows
      for (int64_t r = ra; r < rb; ++r)
        first_key = std::min(first_key, window > 0 ? std::max<int64_t>(0, clp[r0 + r] - window) : 0);
      for (int64_t b0 = first_key / BS * BS; b0 < Lmax; b0 += BS) {
        const int64_t blk = btp[gl * maxnb + b0 / BS];
        const float* kb = kp + blk * BS * TS;
        const float* vb = vp + blk * BS * TS;
        // blocks are scattered, so the hardware prefetcher cannot run ahead: prefetch the block PF ahead, its
        // lines spread over this block's head tiles (one burst of ~400 prefetches stalls on the miss buffers).
        // Only this task's heads, [h0, h1): per token, `tok_lines` lines at a stride of TS floats. A task of one
        // kv head had fetched every head's lines, three times its own, and a batch-1 verify step's tasks are single
        // heads.
        const char* nk = nullptr;
        const char* nv = nullptr;
        if (b0 + PF * BS < Lmax) {
          const int64_t nblk = btp[gl * maxnb + b0 / BS + PF];
          nk = reinterpret_cast<const char*>(kp + nblk * BS * TS + h0 * D);
          nv = reinterpret_cast<const char*>(vp + nblk * BS * TS + h0 * D);
        }
        // ... and the blocks further ahead, all into L2 (T1), which holds more misses in flight than L1 (the next
        // block into L1 instead measured slower): one row has almost no arithmetic per block to hide DRAM behind, and
        // a prefetch that finds the miss buffers full is dropped, so a one-row task asks for each block at four
        // distances (2-5), a verify span's rows once (2: for verify rows the further distances measured slower).
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
          const float* kh_blk = kb + h * D;  // token t of kv head h at kh_blk + t * TS
          const float* vh_blk = vb + h * D;
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
            // this row's window starts u0 keys into the block (0 without a window)
            const int64_t u0 = window > 0 ? std::max<int64_t>(0, L - window - b0) : 0;
            const int64_t n = std::min(BS, L - b0) - u0;
            if (n <= 0) continue;
            const float* kh = kh_blk + u0 * TS;
            const float* vh = vh_blk + u0 * TS;
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
                 torch::Tensor span_offsets, int64_t window) {
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2), "q rows [H, D] must be dense (any row stride)");
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
  const AttnPlan a = plan_attention(q.size(1), q.size(2), k_cache, block_tables, context_lens, rows, span_offsets);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, a.lists.size(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) run_attention(a, t, qp, q.stride(0), kp, vp, static_cast<float>(scale), op, window);
  });
}
