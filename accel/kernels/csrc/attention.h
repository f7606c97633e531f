// attention.h: paged decode attention over the fp32 KV cache (attention.cpp): planned once per step, run per task.
#pragma once

#include "common.h"

#pragma GCC visibility push(hidden)

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

// The plan for one step: H query heads of D values, the caches' [blocks, block_size, kv_heads, D] shape from
// k_cache, rows [so[s], so[s + 1]) of `rows` sharing one request's blocks (`span_offsets`; empty: every row alone).
AttnPlan plan_attention(int64_t H, int64_t D, const torch::Tensor& k_cache, torch::Tensor block_tables,
                        torch::Tensor context_lens, torch::Tensor rows, torch::Tensor span_offsets);

// Thread t's tasks of plan `a`: q rows [*, H, D] at row stride QS, one layer's caches, out [rows, H, D].
// window > 0: a sliding-window layer, a row of context L sees keys [L - window, L) (blocks before are not read).
void run_attention(const AttnPlan& a, int64_t t, const float* qp, int64_t QS, const float* kp, const float* vp,
                   float scale, float* op, int64_t window = 0);

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor rows, double scale,
                            torch::Tensor span_offsets, int64_t window);

#pragma GCC visibility pop
