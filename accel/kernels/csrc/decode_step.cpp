// decode_step.cpp: the decoder's decode step in one call, greedy sampling, multi-step decode.
#include "decode_step.h"
#include "attention.h"
#include "gemm_f32.h"
#include "gemm_int4.h"
#include "gemm_int8.h"
#include "gemm_vnni.h"
#include "norms_rope.h"
#include "threads.h"

// ---- the decoder's decode step in one call ---------------------------------------------------------------
// Why: at batch 1 a step runs ~12 ops per layer (norm, fused qkv, RoPE, KV write, attention, o_proj, norm,
// gate_up, SwiGLU, down_proj); from Python each one costs dispatch, argument checks and an output allocation on
// top of its arithmetic, ~1,400 torch ops per step in all. Here the same kernels run back to back on raw pointers
// into a few buffers allocated once per step, so the step is bound by its weight streaming. It computes exactly
// what the module-by-module path computes (same kernels, same order): greedy output is unchanged.

static void run_linear(const DecodeLinear& L, const float* x, int64_t M, int64_t K, float* y) {
  const int64_t N = L.N;
  if (L.kind == 0) f32_gemm(x, M, K, L.q.data_ptr<float>(), y, N);
  else if (L.kind == 5) panel_gemm(x, M, K, L.q.data_ptr<float>(), y, N);
  else if (L.kind == 6) panel_gemm(x, M, K, reinterpret_cast<const uint16_t*>(L.q.data_ptr<at::Half>()), y, N);
  else if (L.kind == 1) int8_gemm(x, M, K, L.q.data_ptr<int8_t>(), L.scale.data_ptr<float>(), y, N, L.gsp(), L.a8);
  else if (L.kind == 3) int8_gemm_vnni(x, M, K, L.q.data_ptr<int8_t>(), L.scale.data_ptr<float>(), y, N, L.gsp(), L.a8);
  else if (L.kind == 4) int4_gemm_vnni_t(x, M, K, L.q.data_ptr<uint8_t>(), L.scale, L.gs, y, N);
  else if (L.kind == 7) int4a8_gemm_vnni_t(x, M, K, L.q.data_ptr<uint8_t>(), L.scale, L.gs, y, N);
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

DecodeTensors::DecodeTensors(std::vector<torch::Tensor> w, std::vector<int64_t> spec) {
  TORCH_CHECK(!spec.empty() && (spec.size() - 1) % LAYER_FIELDS == 0, "spec: ", LAYER_FIELDS, " ints per layer + 1");
  const int64_t L = (spec.size() - 1) / LAYER_FIELDS;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t* s = spec.data() + l * LAYER_FIELDS;
    Layer y;
    y.norm1 = weight(w, s[0], at::kFloat);
    y.norm2 = weight(w, s[1], at::kFloat);
    for (int j = 0; j < 4; ++j) y.lin[j] = linear(w, s + 2 + j * LIN_FIELDS);
    const int64_t* e = s + 2 + 4 * LIN_FIELDS;
    torch::Tensor* opt[4] = {&y.q_norm, &y.k_norm, &y.post_attn, &y.post_mlp};
    for (int j = 0; j < 4; ++j)
      if (e[j] >= 0) *opt[j] = weight(w, e[j], at::kFloat);
    TORCH_CHECK(y.q_norm.defined() == y.k_norm.defined(), "q and k norms: both or neither");
    y.window = e[4]; y.rope = e[5]; y.act = e[6]; y.group = e[7];
    TORCH_CHECK(y.window >= 0 && (y.rope == 0 || y.rope == 1) && (y.act == 0 || y.act == 1) && y.group >= 0,
                "layer ", l, ": window >= 0, rope table 0 or 1, activation 0 (SiLU) or 1 (tanh GELU), group >= 0");
    num_groups = std::max(num_groups, y.group + 1);
    layers.push_back(y);
  }
  final_norm = weight(w, spec.back(), at::kFloat);
}

void DecodeTensors::set_head(std::vector<torch::Tensor> w, std::vector<int64_t> spec) {
  TORCH_CHECK(static_cast<int64_t>(spec.size()) == LIN_FIELDS, "head spec: ", LIN_FIELDS, " ints");
  head = linear(w, spec.data());
  has_head = true;
}

void DecodeTensors::set_input_proj(std::vector<torch::Tensor> w, std::vector<int64_t> spec) {
  TORCH_CHECK(static_cast<int64_t>(spec.size()) == LIN_FIELDS, "input projection spec: ", LIN_FIELDS, " ints");
  in_proj = linear(w, spec.data());
  has_in_proj = true;
}

void DecodeTensors::set_tables(torch::Tensor e, torch::Tensor c, torch::Tensor s, double scale, torch::Tensor es) {
  TORCH_CHECK(!has_in_proj, "an input projection's step takes its x, not token ids");
  for (const auto& t : {c, s})
    TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.scalar_type() == at::kFloat, "tables: fp32 contiguous 2-D");
  TORCH_CHECK(e.dim() == 2 && e.is_contiguous() && (e.scalar_type() == at::kFloat || e.scalar_type() == at::kChar ||
                                                    e.scalar_type() == at::kHalf),
              "embedding: fp32, fp16 or int8, contiguous 2-D");
  if (e.scalar_type() == at::kChar) {
    TORCH_CHECK(es.scalar_type() == at::kFloat && es.is_contiguous() && es.dim() >= 1 && es.size(0) == e.size(0) &&
                    (es.dim() == 1 || (es.dim() == 2 && es.size(1) * 32 == e.size(1))),
                "INT8 embedding scales: fp32 [vocab] or [vocab, hidden / 32]");
  } else {
    TORCH_CHECK(es.numel() == 0, "embedding scales go with an INT8 table only");
  }
  TORCH_CHECK(c.sizes() == s.sizes(), "cos and sin tables: the same shape");
  embed = e; embed_scales = es; cos = c; sin_signed = s; embed_scale = scale;
  has_tables = true;
}

void DecodeTensors::set_local_rope(torch::Tensor c, torch::Tensor s) {
  TORCH_CHECK(has_tables && c.sizes() == cos.sizes() && s.sizes() == cos.sizes() && c.is_contiguous() &&
              s.is_contiguous() && c.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat,
              "local RoPE tables: set_tables first, then fp32 tables of the same shape");
  cos_local = c; sin_local = s;
}

torch::Tensor DecodeTensors::weight(const std::vector<torch::Tensor>& w, int64_t i, at::ScalarType t) {
  TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(w.size()), "spec index ", i, " outside the weights");
  TORCH_CHECK(w[i].is_contiguous() && w[i].scalar_type() == t, "weight ", i, ": expected contiguous ", t);
  return w[i];
}

DecodeLinear DecodeTensors::linear(const std::vector<torch::Tensor>& w, const int64_t* f) {
  DecodeLinear d;
  d.kind = f[0]; d.gs = f[4]; d.N = f[6];
  TORCH_CHECK(d.kind >= 0 && d.kind <= 7, "unknown linear kind ", d.kind);
  if (d.kind == 1 || d.kind == 3) {
    TORCH_CHECK(d.gs == 0 || d.gs == 8, "INT8 activation bits: 0 (16-bit blocks) or 8 (W8A8), got ", d.gs);
    d.a8 = d.gs == 8;
    d.gs = 0;
  }
  TORCH_CHECK(HAS_VNNI || (d.kind != 3 && d.kind != 4 && d.kind != 7), "the VNNI tile layouts need AVX512-VNNI");
  TORCH_CHECK(HAS_AVX512 || (d.kind != 5 && d.kind != 6), "weight panels need AVX-512");
  const bool f32 = d.kind == 0 || d.kind == 5, plain = f32 || d.kind == 6;
  d.q = weight(w, f[1], f32 ? at::kFloat : d.kind == 6 ? at::kHalf : d.kind == 1 || d.kind == 3 ? at::kChar
                                                                                                   : at::kByte);
  if (!plain) {
    TORCH_CHECK(f[2] >= 0 && f[2] < static_cast<int64_t>(w.size()) && w[f[2]].is_contiguous(), "scale index");
    d.scale = w[f[2]];
    TORCH_CHECK(d.scale.scalar_type() == at::kFloat || ((d.kind == 2 || d.kind == 4 || d.kind == 7) &&
                (d.scale.scalar_type() == at::kHalf || d.scale.scalar_type() == at::kShort)),
                "scales: fp32 (INT4 scale_min: fp32 or fp16, or int16 (fp16 scale, zero point) pairs)");
  }
  if (f[3] >= 0) {
    TORCH_CHECK(d.kind == 1 || d.kind == 3, "group scales (the third tensor) are for INT8 kinds 1 and 3 only");
    d.gscale = weight(w, f[3], at::kHalf);
  }
  if (f[5] >= 0) d.bias = weight(w, f[5], at::kFloat);
  return d;
}

void DecodeTensors::bind_caches(std::vector<torch::Tensor> k, std::vector<torch::Tensor> v) {
  TORCH_CHECK(k.size() == layers.size() && v.size() == layers.size(), "one k and one v cache per layer");
  for (size_t l = 0; l < k.size(); ++l)
    TORCH_CHECK(k[l].scalar_type() == at::kFloat && v[l].scalar_type() == at::kFloat && k[l].is_contiguous() &&
                v[l].is_contiguous() && k[l].dim() == 4 && k[l].sizes() == k[0].sizes() &&
                v[l].sizes() == k[0].sizes(), "caches: fp32 contiguous [blocks, block_size, kv_heads, head_dim], "
                "the same for every layer");
  k_caches = std::move(k);
  v_caches = std::move(v);
}

void DecodeTensors::check(int64_t Xd, int64_t Hd, int64_t QKV, int64_t HD, int64_t I) const {
  for (const Layer& y : layers) {
    const int64_t K[4] = {Hd, HD, Hd, I}, N[4] = {QKV, Hd, 2 * I, Hd};
    for (int j = 0; j < 4; ++j) {
      TORCH_CHECK(y.lin[j].N == N[j], "projection ", j, ": out_features ", y.lin[j].N, ", the model needs ", N[j]);
      check_linear(y.lin[j], K[j], j);
    }
    TORCH_CHECK(y.norm1.numel() == Hd && y.norm2.numel() == Hd, "norm weights must be [hidden]");
    TORCH_CHECK((!y.post_attn.defined() || y.post_attn.numel() == Hd) &&
                (!y.post_mlp.defined() || y.post_mlp.numel() == Hd), "post norms must be [hidden]");
    TORCH_CHECK(y.rope == 0 || cos_local.defined(), "a layer on the local RoPE table but none set");
  }
  TORCH_CHECK(final_norm.numel() == Hd, "norm weights must be [hidden]");
  if (has_head) check_linear(head, Hd, 4);
  if (has_in_proj) {
    TORCH_CHECK(in_proj.N == Hd, "input projection: out_features ", in_proj.N, ", the model needs ", Hd);
    check_linear(in_proj, Xd, 5);
  }
}

void DecodeTensors::check_linear(const DecodeLinear& d, int64_t k, int j) {
  const int64_t n = d.N;
  const bool int4 = d.kind == 2 || d.kind == 4 || d.kind == 7;
  const int64_t panels = (n + PANEL - 1) / PANEL * PANEL;  // kinds 5, 6: N padded to whole panels
  TORCH_CHECK(d.q.numel() == (int4 ? n * k / 2 : d.kind == 5 || d.kind == 6 ? panels * k : n * k), "projection ", j,
              ": weight of ", d.q.numel(), " elements for [", n, ", ", k, "]");
  if (d.kind == 1 || d.kind == 3) TORCH_CHECK(d.scale.numel() == n, "INT8 scale must be [N]");
  if (d.gscale.defined()) TORCH_CHECK(k % 32 == 0 && d.gscale.numel() == n * (k / 32), "INT8 group scales: [N, K / 32]");
  if (int4) TORCH_CHECK(d.gs > 0 && k % d.gs == 0 && d.scale.numel() == n * (k / d.gs) * 2, "INT4 scale_min shape");
  if (d.kind == 3) TORCH_CHECK(n % 16 == 0 && k % 32 == 0, "INT8 VNNI layout: N % 16, K % 32");
  if (d.kind == 4 || d.kind == 7) TORCH_CHECK(n % 16 == 0 && k % 32 == 0 && d.gs % 32 == 0, "INT4 VNNI layout shape");
  if (d.bias.defined()) TORCH_CHECK(d.bias.numel() == n, "bias must be [N]");
}

// ---- greedy sampling ------------------------------------------------------------------------------------------
// A row's index of its largest value, as torch.argmax returns it (the first of equal maxima; a NaN counts as the
// largest). Why not torch's: on one logit row its parallel reduction's overhead costs several times what two
// vector passes over the row take.
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

// the embedding rows of token ids idx [T], as fp32 [T, hidden] (an INT8 table's rows dequantized)
static torch::Tensor gather_embed(const DecodeTensors& dw, torch::Tensor idx) {
  if (dw.embed.scalar_type() == at::kFloat) return gather_rows(dw, dw.embed, idx, "token id");
  idx = idx.contiguous();
  TORCH_CHECK(idx.dim() == 1, "token ids: [T]");
  const int64_t T = idx.numel(), n = dw.embed.size(0), w = dw.embed.size(1), G = w / 32;
  auto out = torch::empty({T, w}, dw.embed.options().dtype(at::kFloat));
  const int64_t* ip = idx.data_ptr<int64_t>();
  if (dw.embed.scalar_type() == at::kHalf) {
    for (int64_t t = 0; t < T; ++t) {
      TORCH_CHECK(ip[t] >= 0 && ip[t] < n, "token id ", ip[t], " outside the table's ", n, " rows");
      const at::Half* h = dw.embed.data_ptr<at::Half>() + ip[t] * w;
      float* o = out.data_ptr<float>() + t * w;
      for (int64_t j = 0; j < w; ++j) o[j] = static_cast<float>(h[j]);
    }
    return out;
  }
  const bool grouped = dw.embed_scales.dim() == 2;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(ip[t] >= 0 && ip[t] < n, "token id ", ip[t], " outside the table's ", n, " rows");
    const int8_t* q = dw.embed.data_ptr<int8_t>() + ip[t] * w;
    const float* s = dw.embed_scales.data_ptr<float>() + ip[t] * (grouped ? G : 1);
    float* o = out.data_ptr<float>() + t * w;
    for (int64_t j = 0; j < w; ++j) o[j] = static_cast<float>(q[j]) * s[grouped ? j / 32 : 0];
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
// Why in this call: after the step's weight stream the caches are cold, and the lm_head as a separate call from
// Python (module, its checks, a row gather, another thread team) cost a visible share of an INT8 step.
// With tables set (`set_tables`), x may be the step's token ids [T] (long) and cos its positions [T] (long; then
// sin_signed is unused): the rows are gathered here. Why: the gathers as torch ops from Python (embedding, two
// index_selects and their reshapes) each paid a dispatch with caches cold after the weight stream.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> decode_layers(
    torch::Tensor x, torch::Tensor cos, torch::Tensor sin_signed, const DecodeTensors& dw, torch::Tensor slots,
    torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor rows, torch::Tensor spans,
    torch::Tensor logit_rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale) {
  const int64_t L = static_cast<int64_t>(dw.layers.size());
  const std::vector<torch::Tensor>& k_caches = dw.k_caches;
  const std::vector<torch::Tensor>& v_caches = dw.v_caches;
  TORCH_CHECK(static_cast<int64_t>(k_caches.size()) == L, "bind_caches first");
  const int64_t H = num_heads, KVH = num_kv_heads, D = head_dim;
  if (x.scalar_type() == at::kLong) {
    x = gather_embed(dw, x);
    if (dw.embed_scale != 1.0) x.mul_(static_cast<float>(dw.embed_scale));  // in fp32, as the module path
  }
  torch::Tensor cos_l, sin_l;  // this step's rows of the local table, where a layer uses it
  if (cos.scalar_type() == at::kLong) {
    if (dw.cos_local.defined()) {
      sin_l = gather_rows(dw, dw.sin_local, cos, "position");
      cos_l = gather_rows(dw, dw.cos_local, cos, "position");
    }
    sin_signed = gather_rows(dw, dw.sin_signed, cos, "position");
    cos = gather_rows(dw, dw.cos, cos, "position");
  }
  for (const auto& ly : dw.layers) {
    TORCH_CHECK(ly.rope == 0 || cos_l.defined(), "a layer on the local RoPE table needs positions, not cos rows");
    TORCH_CHECK(!ly.q_norm.defined() || (ly.q_norm.numel() == head_dim && ly.k_norm.numel() == head_dim),
                "q / k norms must be [head_dim]");
  }
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), "x fp32 [T, hidden]");
  const int64_t T = x.size(0), Xd = x.size(1), Hd = dw.has_in_proj ? dw.in_proj.N : Xd;
  const int64_t QKV = (H + 2 * KVH) * D, I = dw.layers.empty() ? 0 : dw.layers[0].lin[2].N / 2, W = KVH * D;
  dw.check(Xd, Hd, QKV, H * D, I);
  TORCH_CHECK(L == 0 || (k_caches[0].size(2) == KVH && k_caches[0].size(3) == D), "caches: [blocks, block_size, ",
              KVH, ", ", D, "]");
  cos = cos.contiguous(); sin_signed = sin_signed.contiguous();
  TORCH_CHECK(cos.numel() == T * D && sin_signed.numel() == T * D, "cos / sin: [T, head_dim]");
  const int64_t NG = dw.num_groups;
  auto sl = slots.to(at::kLong).contiguous();
  TORCH_CHECK(sl.numel() == NG * T, "one slot per row and KV group");
  const int64_t* slp = sl.data_ptr<int64_t>();
  const int64_t cache_slots = L ? k_caches[0].size(0) * k_caches[0].size(1) : 0;
  for (int64_t t = 0; t < NG * T; ++t)
    TORCH_CHECK(slp[t] >= 0 && slp[t] < cache_slots, "slot ", slp[t], " outside the cache");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == NG * T, "one block-table row per step row and KV group");
  std::vector<AttnPlan> plans;
  for (int64_t g = 0; g < NG; ++g)
    plans.push_back(plan_attention(H, D, k_caches[0], block_tables.narrow(0, g * T, T), context_lens, rows, spans));
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
  const int64_t PRIV = 3 * T * Hd + T * I;  // per thread: residual, normed input, post-normed output, MLP activation
  const int nt = std::max(1, at::get_num_threads());
  std::vector<float> priv(static_cast<size_t>(nt) * PRIV);

  auto step = [&](int rank, int n) {
    float* res = priv.data() + rank * PRIV;
    float* h = res + T * Hd;
    float* post = h + T * Hd;  // a block's output after its post norm (Gemma), before it joins the stream
    float* act = post + T * Hd;
    const float* block_out = xp;  // what the next norm adds to the stream (layer 0: the embedding is the stream)
    if (dw.has_in_proj) run_linear(dw.in_proj, x.data_ptr<float>(), T, Xd, xin.data_ptr<float>());  // ends in a barrier
    std::memcpy(res, xp, T * Hd * sizeof(float));
    for (int64_t l = 0; l < L; ++l) {
      const DecodeTensors::Layer& ly = dw.layers[l];
      const AttnPlan& ap = plans[ly.group];
      const int64_t* lslp = slp + ly.group * T;  // this layer's group's slots
      // input norm: layer 0 normalizes the embedding (the residual stream starts as a copy of it); later layers
      // first add the previous MLP output to the stream (vLLM's fused_add_rms_norm)
      rms_rows(block_out, l == 0 ? nullptr : res, ly.norm1.data_ptr<float>(), h, T, Hd, eps, l > 0);
      prefetch_next(ly.lin[1]);
      run_linear(ly.lin[0], h, T, Hd, qp);
      if (rank == 0) {
        if (ly.q_norm.defined())  // each head's q and k vector RMS-normed in place, before RoPE (Qwen3, Gemma 3)
          for (int64_t t = 0; t < T; ++t) {
            rms_rows(qp + t * QKV, nullptr, ly.q_norm.data_ptr<float>(), qp + t * QKV, H, D, eps, false);
            rms_rows(qp + t * QKV + H * D, nullptr, ly.k_norm.data_ptr<float>(), qp + t * QKV + H * D, KVH, D, eps,
                     false);
          }
        if (ly.rope == 1) rope_raw(qp, T, QKV, cos_l.data_ptr<float>(), sin_l.data_ptr<float>(), H + KVH, D);
        else rope_raw(qp, T, QKV, cp, sp, H + KVH, D);
        for (int64_t t = 0; t < T; ++t) {
          std::memcpy(kc[l] + lslp[t] * W, qp + t * QKV + H * D, W * sizeof(float));
          std::memcpy(vc[l] + lslp[t] * W, qp + t * QKV + (H + KVH) * D, W * sizeof(float));
        }
      }
      if (n > 1) tl_team.team->barrier();
      for (int64_t t = rank; t < static_cast<int64_t>(ap.lists.size()); t += n)
        run_attention(ap, t, qp, QKV, kc[l], vc[l], static_cast<float>(scale), ap_out, ly.window);
      if (n > 1) tl_team.team->barrier();
      prefetch_next(ly.lin[2]);
      run_linear(ly.lin[1], ap_out, T, H * D, yp);
      block_out = yp;
      if (ly.post_attn.defined()) {
        rms_rows(yp, nullptr, ly.post_attn.data_ptr<float>(), post, T, Hd, eps, false);
        block_out = post;
      }
      rms_rows(block_out, res, ly.norm2.data_ptr<float>(), h, T, Hd, eps, true);
      prefetch_next(ly.lin[3]);
      run_linear(ly.lin[2], h, T, Hd, gp);
      if (ly.act == 1) gelu_tanh_mul_raw(gp, T, I, act);
      else silu_mul_raw(gp, T, I, act);
      if (l + 1 < L) prefetch_next(dw.layers[l + 1].lin[0]);
      else if (R) prefetch_next(dw.head);
      run_linear(ly.lin[3], act, T, I, yp);
      block_out = yp;
      if (ly.post_mlp.defined()) {
        rms_rows(yp, nullptr, ly.post_mlp.data_ptr<float>(), post, T, Hd, eps, false);
        block_out = post;
      }
    }
    if (rank == 0) {
      rms_rows(block_out, res, dw.final_norm.data_ptr<float>(), op, T, Hd, eps, true);
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

  run_governed(T, [&](int rank, int n) {
    step(rank, n);
    tl_pf = PrefetchCursor{};
  });
  return {out, logits, amax};
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
  const int64_t T = static_cast<int64_t>(ids.size()), NG = dw.num_groups;
  TORCH_CHECK(nb > 0 && static_cast<int64_t>(block_table.size()) == NG * T * nb, "block_table: groups x T x nb ints");
  return decode_layers(long_view(ids), long_view(positions), torch::Tensor(), dw, long_view(slots),
                       long_view(block_table).view({NG * T, nb}), long_view(context_lens), long_view(rows), long_view(spans),
                       long_view(logit_rows), num_heads, num_kv_heads, head_dim, eps, scale);
}

// Up to `num_steps` greedy decode steps of T requests (one row each) in one call, each step's argmax the next step's
// input (vLLM's multi-step scheduling): tokens [T][steps run]. The steps stop after the first in which a row's token
// is one of that row's `stop_ids`. Row t's block table (row t of [T, nb]) must hold slots for positions
// positions[t] .. positions[t] + num_steps - 1. With `features` (not empty), each step's final hidden states are
// stored there by slot. Why: between single steps the runner's Python, with caches cold after the weight stream,
// cost a visible share of every INT8 step.
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
  const int64_t NG = dw.num_groups;
  TORCH_CHECK(nb > 0 && static_cast<int64_t>(block_table.size()) == NG * T * nb, "block_table: groups x T x nb ints");
  TORCH_CHECK(num_steps >= 1, "num_steps must be >= 1, got ", num_steps);
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(positions[t] >= 0 && positions[t] + num_steps <= nb * BS, "row ", t, ": positions ", positions[t],
                " + ", num_steps, " steps exceed its block table");
  std::vector<int64_t> slots(NG * T), ctx(T), rows(T), spans(T + 1);
  for (int64_t t = 0; t <= T; ++t) spans[t] = t;
  for (int64_t t = 0; t < T; ++t) rows[t] = t;
  auto table = long_view(block_table).view({NG * T, nb});
  std::vector<std::vector<int64_t>> out(T);
  for (int64_t s = 0; s < num_steps; ++s) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = positions[t];
      for (int64_t g = 0; g < NG; ++g) slots[g * T + t] = block_table[(g * T + t) * nb + p / BS] * BS + p % BS;
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
