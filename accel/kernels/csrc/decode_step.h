// decode_step.h: the one-call decode step (decode_step.cpp): a model's tensors held once (DecodeTensors) and the
// step, multi-step decode and greedy sampling on them; spec_steps.cpp runs its verify steps through decode_layers.
#pragma once

#include "common.h"

#pragma GCC visibility push(hidden)

// Linear specs (LIN_FIELDS ints each): kind (0 fp32 w [N, K]; 1 int8 q [N, K] + scale [N]; 3 the same in the
// VNNI tile layout; 4 int4 in its VNNI tile layout; 7 int4 with 8-bit activation blocks in its a8 tile layout (w4a8); 2 int4 packed
// [N, K / 2] + scale_min [N, G, 2] fp32 / fp16; 5 fp32 panels [ceil(N / 48), K, 48]; 6 the same in fp16), three tensor indices into
// `weights` (-1 unused: weight, scale, and INT8's fp16 group scales, int8g, in the weight's layout), the INT4 group size
// (INT8 kinds: the activation bits, 0 for 16-bit blocks or 8 for W8A8's 8-bit rows),
// the bias index (-1: none), out_features. Per layer: input-norm index, pre-MLP-norm index, the qkv, o, gate_up and
// down specs, then (EXTRA_FIELDS) the q-norm and k-norm indices and the post-attention and post-MLP norm indices
// (-1: none; Qwen3 has the first two, Gemma 3 all four), the sliding window (0: none), the RoPE table (0: global,
// 1: the local one, `set_local_rope`), the activation (0: SiLU, 1: tanh GELU) and the KV group (its block table
// and slots among a step's groups: a hybrid model's layers of different windows hold different blocks, `KVLayout`);
// the last int is the final norm's index.
constexpr int64_t LIN_FIELDS = 7, EXTRA_FIELDS = 8, LAYER_FIELDS = 2 + 4 * LIN_FIELDS + EXTRA_FIELDS;

// One projection of the spec, its tensors resolved once (`DecodeTensors`).
struct DecodeLinear {
  int64_t kind = 0, gs = 0, N = 0;
  bool a8 = false;  // INT8 kinds: W8A8's 8-bit activation rows
  torch::Tensor q, scale, bias;  // scale: fp32 [N] (INT8) or the INT4 scale_min (fp32 / fp16)
  torch::Tensor gscale;  // INT8 group scales (int8g), fp16 [N, K / 32] in the weight's layout; undefined: none
  const uint16_t* gsp() const { return gscale.defined() ? reinterpret_cast<const uint16_t*>(gscale.data_ptr<at::Half>()) : nullptr; }
};

// A model's decode-step tensors, resolved and checked once (`NativeDecode`): its weights from `weights` and the
// spec above, and the KV caches it writes (`bind_caches`). Passing ~460 tensors through pybind every step cost a
// visible share of an INT8 batch-1 step.
struct DecodeTensors {
  struct Layer {
    torch::Tensor norm1, norm2;
    DecodeLinear lin[4];  // qkv, o, gate_up, down
    torch::Tensor q_norm, k_norm, post_attn, post_mlp;  // undefined: none
    int64_t window = 0, rope = 0, act = 0, group = 0;
  };
  std::vector<Layer> layers;
  int64_t num_groups = 1;  // KV groups: a step's slots and block tables come as [num_groups * rows]
  torch::Tensor final_norm;
  DecodeLinear head;
  bool has_head = false;
  DecodeLinear in_proj;  // an EAGLE draft's fc over [embedding ; feature]: x [T, in] -> [T, hidden] first
  bool has_in_proj = false;
  torch::Tensor embed, cos, sin_signed;  // set_tables: the step's inputs from token ids and positions
  torch::Tensor embed_scales;  // an INT8 embedding's scales (empty for fp32)
  bool has_tables = false;
  double embed_scale = 1.0;  // the embedding rows are multiplied by it (Gemma: sqrt(hidden))
  torch::Tensor cos_local, sin_local;  // set_local_rope: the table of layers whose rope field is 1
  std::vector<torch::Tensor> k_caches, v_caches;

  DecodeTensors(std::vector<torch::Tensor> w, std::vector<int64_t> spec);
  // the lm_head (one linear spec), run by decode_layers on the final hidden states of the rows it is asked for
  void set_head(std::vector<torch::Tensor> w, std::vector<int64_t> spec);
  // a projection decode_layers runs on x first (x then holds its in_features per row)
  void set_input_proj(std::vector<torch::Tensor> w, std::vector<int64_t> spec);
  // the input embedding [vocab, hidden] and RoPE tables [positions, head_dim] (cos, signed sin): decode_layers then
  // takes token ids and positions and gathers the rows itself. The embedding is fp32, fp16 (a model served
  // quantized keeps its 16-bit table) or an INT8 table (a tied lm_head's own integers) with fp32 scales `es`,
  // [vocab] or one per 32 values [vocab, hidden / 32], whose gathered rows are widened here. Why: a dequantized
  // fp32 copy of Gemma 3's 262k table is 670 MB.
  void set_tables(torch::Tensor e, torch::Tensor c, torch::Tensor s, double scale, torch::Tensor es);
  // the RoPE table (cos, signed sin) of the layers whose rope field is 1 (Gemma 3's sliding layers)
  void set_local_rope(torch::Tensor c, torch::Tensor s);
  // weight i of the spec, checked to be contiguous of dtype t; one linear spec's tensors, resolved and checked
  static torch::Tensor weight(const std::vector<torch::Tensor>& w, int64_t i, at::ScalarType t);
  static DecodeLinear linear(const std::vector<torch::Tensor>& w, const int64_t* f);
  // one fp32 [blocks, block_size, kv_heads, head_dim] k and v cache per layer, the same shape for every layer
  void bind_caches(std::vector<torch::Tensor> k, std::vector<torch::Tensor> v);
  // every projection's tensors against the step's sizes (checked before the threads start: a kernel's own check
  // failing inside the team would leave the other threads at a barrier)
  void check(int64_t Xd, int64_t Hd, int64_t QKV, int64_t HD, int64_t I) const;
  // projection j's tensors against its in_features k
  static void check_linear(const DecodeLinear& d, int64_t k, int j);
};

// A list of ints as a long tensor, without a copy (the list outlives the tensor's use).
inline torch::Tensor long_view(std::vector<int64_t>& v) {
  return torch::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kLong);
}

// Every decoder layer of a decode step in one call (decode_step.cpp says how): (final hidden [T, hidden], logits
// [R, vocab] of the R `logit_rows`, each logit row's argmax [R]).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> decode_layers(
    torch::Tensor x, torch::Tensor cos, torch::Tensor sin_signed, const DecodeTensors& dw, torch::Tensor slots,
    torch::Tensor block_tables, torch::Tensor context_lens, torch::Tensor rows, torch::Tensor spans,
    torch::Tensor logit_rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale);
// `decode_layers` with the step's indices as lists of ints
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> decode_step(
    std::vector<int64_t> ids, std::vector<int64_t> positions, const DecodeTensors& dw, std::vector<int64_t> slots,
    std::vector<int64_t> block_table, int64_t nb, std::vector<int64_t> context_lens, std::vector<int64_t> rows,
    std::vector<int64_t> spans, std::vector<int64_t> logit_rows, int64_t num_heads, int64_t num_kv_heads,
    int64_t head_dim, double eps, double scale);
// up to `num_steps` greedy decode steps, each step's argmax the next one's input: the tokens of each row
std::vector<std::vector<int64_t>> decode_steps(
    std::vector<int64_t> ids, std::vector<int64_t> positions, const DecodeTensors& dw, std::vector<int64_t> block_table,
    int64_t nb, int64_t num_steps, std::vector<std::vector<int64_t>> stop_ids, torch::Tensor features,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale);
// each fp32 row's argmax, as torch.argmax
torch::Tensor argmax_rows(torch::Tensor x);

#pragma GCC visibility pop
