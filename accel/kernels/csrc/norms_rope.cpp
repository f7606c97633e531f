// norms_rope.cpp: RMSNorm (with the residual add), SiLU x mul, RoPE, KV writes.
#include "norms_rope.h"

// RMSNorm of fp32 rows, optionally adding `residual` first (vLLM's fused_add_rms_norm): one pass over the row
// instead of torch's add + pow + mean + rsqrt + mul + mul kernels, which at decode sizes cost more in launch
// overhead than in arithmetic.
void rms_rows(const float* x, float* res, const float* w, float* out, int64_t rows, int64_t H, double eps, bool add) {
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
      // not reorder float adds)
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
void silu_mul_raw(const float* gp, int64_t T, int64_t I, float* op) {
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

// out[t, i] = gelu_tanh(g[t, i]) * u[t, i] for gu [T, 2I] = [g | u]: GeGLU with torch's tanh GELU
// (0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))), tanh(z) as 1 - 2 / (exp(2z) + 1) on exp256.
void gelu_tanh_mul_raw(const float* gp, int64_t T, int64_t I, float* op) {
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / std::max<int64_t>(I, 1)), [&](int64_t t0, int64_t t1) {
    const __m256 one = _mm256_set1_ps(1.f), two = _mm256_set1_ps(2.f), half = _mm256_set1_ps(0.5f);
    const __m256 c0 = _mm256_set1_ps(0.7978845608028654f), c1 = _mm256_set1_ps(0.044715f);
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = gp + t * 2 * I;
      const float* u = g + I;
      float* o = op + t * I;
      int64_t i = 0;
      for (; i + 8 <= I; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 z = _mm256_mul_ps(c0, _mm256_fmadd_ps(_mm256_mul_ps(c1, x), _mm256_mul_ps(x, x), x));
        const __m256 th = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp256(_mm256_mul_ps(two, z)), one)));
        const __m256 y = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, th));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(y, _mm256_loadu_ps(u + i)));
      }
      for (; i < I; ++i) {
        const float x = g[i];
        o[i] = 0.5f * x * (1.f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
      }
    }
  });
}

torch::Tensor gelu_tanh_mul(torch::Tensor gu) {
  TORCH_CHECK(gu.scalar_type() == at::kFloat && gu.dim() == 2 && gu.size(1) % 2 == 0, "fp32 [T, 2I] expected");
  gu = gu.contiguous();
  const int64_t T = gu.size(0), I = gu.size(1) / 2;
  auto out = torch::empty({T, I}, gu.options());
  gelu_tanh_mul_raw(gu.data_ptr<float>(), T, I, out.data_ptr<float>());
  return out;
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
void rope_raw(float* xp, int64_t T, int64_t rs, const float* cp, const float* sp, int64_t nheads, int64_t D) {
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
// ops (each a torch dispatch at decode sizes, twice per layer per step).
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
