// A decoder layer of the Llama kind (Llama, Mistral, Qwen2) around its attention, in
// two calls instead of some forty tensor operations:
//
//   attention_inputs:  x = RMSNorm(h);  [q k v] = x W_qkv^T (+ bias);  RoPE on q and k
//   rest:              h' = h + a W_o^T;  x = RMSNorm(h');
//                      out = h' + (silu(x W_gate^T) * (x W_up^T)) W_down^T
//
// The products are the W8A32 / W4A32 / W32A32 kernels' (function pointers handed in),
// which compute each row alone. q/k/v and gate/up are one stacked matrix (a quantized
// model's) or their parts (an fp32 model's own weights), each written into its columns
// of the stacked output. Everything here is row-wise too, in one fixed order per row:
// RMSNorm's sum of squares in 16 lanes of fused multiply-adds, then the lanes as one
// tree (reduce4); RoPE elementwise as rotate-half writes it (x cos + (-x2) sin, rounded
// apart); SiLU with lanes.h's exp, one polynomial per element. So a row's output depends
// on that row alone, and a tree verification's rows are bitwise ``generate``'s one-row
// steps, which run these same calls (a quantized model's layers are pointed at them).
//
// Scratch is per calling thread; the products run on an OpenMP team of ``threads``.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lanes.h"

extern "C" {

// y (rows, N) = x (rows, K) times a layer's weights: w8a32's, w4a32's or w32a32's.
typedef void (*Product)(const float* x, int64_t rows, int64_t K, const void* weights,
                        int64_t N, const float* scales, float* y, int threads);

struct Matrix {
  Product product;
  const void* weights;
  const float* scales;  // the kernel's scales (int8), (s, b) pairs (int4), or null (fp32)
  const float* bias;    // (N,) or null
  int64_t n, k;         // outputs, inputs
};

struct Layer {
  int64_t hidden, heads, kv_heads, head_dim, intermediate;
  const float* input_norm;
  const float* post_norm;
  float input_eps, post_eps;
  // [q | k | v] and [gate | up] outputs: the whole in the first part (the others n = 0),
  // or one part each
  Matrix qkv[3], o, gate_up[2], down;
};

}  // extern "C"

namespace {

struct Scratch {
  std::vector<float> x, wide, act, part;
  void fit(int64_t rows, const Layer& L) {
    const auto grow = [](std::vector<float>& v, size_t n) { if (v.size() < n) v.resize(n); };
    grow(x, rows * L.hidden);
    grow(wide, rows * 2 * L.intermediate);
    grow(act, rows * L.intermediate);
    grow(part, rows * std::max(L.intermediate, L.qkv[0].n));
  }
};

thread_local Scratch scratch;

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

// out = weight * (h * 1 / sqrt(mean(h^2) + eps)), row by row; D any width.
void rms_norm(const float* h, int64_t rows, int64_t D, const float* weight, float eps,
              float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = h + r * D;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(tail_mask(D - d), x + d);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __m512 zero = _mm512_setzero_ps();
    const float mean = _mm_cvtss_f32(reduce4(acc, zero, zero, zero)) / float(D);
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(mean + eps));
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 m = tail_mask(D - d);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + d), inv);
      _mm512_mask_storeu_ps(out + r * D + d, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, weight + d), v));
    }
  }
}

// y (rows, N) = x M^T (+ bias)
void product(const Matrix& M, const float* x, int64_t rows, float* y, int threads) {
  M.product(x, rows, M.k, M.weights, M.n, M.scales, y, threads);
  if (M.bias == nullptr) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < M.n; ++j) y[r * M.n + j] += M.bias[j];
}

// y (rows, width) = x [M_0 | M_1 | ...]^T over ``count`` parts side by side (a part of
// n = 0 is absent); more than one part goes through ``part`` (rows * the widest part).
void product_parts(const Matrix* parts, int count, const float* x, int64_t rows, float* y,
                   int64_t width, float* part, int threads) {
  if (count == 1 || parts[1].n == 0) return product(parts[0], x, rows, y, threads);
  int64_t offset = 0;
  for (int p = 0; p < count && parts[p].n > 0; ++p) {
    const int64_t n = parts[p].n;
    product(parts[p], x, rows, part, threads);
    for (int64_t r = 0; r < rows; ++r)
      std::copy(part + r * n, part + (r + 1) * n, y + r * width + offset);
    offset += n;
  }
}

// x (heads of D values, one row) rotated in place: x cos + rotate_half(x) sin, as
// Transformers writes it (rotate_half(x) = [-x2, x1]); cos, sin (D,).
void rope(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h, x += D)
    for (int64_t d = 0; d < half; ++d) {
      const float x1 = x[d], x2 = x[d + half];
      x[d] = x1 * cos[d] + (-x2) * sin[d];
      x[d + half] = x2 * cos[d + half] + x1 * sin[d + half];
    }
}

// act (rows, I) = silu(gate) * up of gate_up (rows, 2 I): silu(g) = g / (1 + e^-g) for
// g >= 0 and g e^g / (1 + e^g) below, each exp of a non-positive value.
void silu_times(const float* gate_up, int64_t rows, int64_t I, float* act) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * I;
    const float* u = g + I;
    for (int64_t i = 0; i < I; i += 16) {
      const __mmask16 m = tail_mask(I - i);
      const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
      const __m512 e = exp_nonpositive(  // e^-|x|
          _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), sign)));
      const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
      const __m512 top = _mm512_mask_mul_ps(x, negative, x, e);  // x, or x e^x
      const __m512 silu = _mm512_div_ps(top, _mm512_add_ps(one, e));
      _mm512_mask_storeu_ps(act + r * I + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
    }
  }
}

}  // namespace

// qkv (rows, (H + 2 H_kv) D) = q, k, v of hidden rows h (rows, hidden), q and k rotated
// by cos, sin (rows, D) each.
extern "C" void ntr_layer_attention_inputs(const Layer* L, const float* h, int64_t rows,
                                           const float* cos, const float* sin, float* qkv,
                                           int threads) {
  Scratch& sc = scratch;
  sc.fit(rows, *L);
  rms_norm(h, rows, L->hidden, L->input_norm, L->input_eps, sc.x.data());
  const int64_t D = L->head_dim, width = (L->heads + 2 * L->kv_heads) * D;
  product_parts(L->qkv, 3, sc.x.data(), rows, qkv, width, sc.part.data(), threads);
  for (int64_t r = 0; r < rows; ++r)  // q's heads, then k's: adjacent in the row
    rope(qkv + r * width, L->heads + L->kv_heads, D, cos + r * D, sin + r * D);
}

// out (rows, hidden) = the layer's output from its input h and attention a (rows, H D).
extern "C" void ntr_layer_rest(const Layer* L, const float* h, const float* a, int64_t rows,
                               float* out, int threads) {
  Scratch& sc = scratch;
  sc.fit(rows, *L);
  const int64_t n = rows * L->hidden;
  product(L->o, a, rows, out, threads);
  for (int64_t i = 0; i < n; ++i) out[i] = h[i] + out[i];  // h' (the residual)
  rms_norm(out, rows, L->hidden, L->post_norm, L->post_eps, sc.x.data());
  product_parts(L->gate_up, 2, sc.x.data(), rows, sc.wide.data(), 2 * L->intermediate,
                sc.part.data(), threads);
  silu_times(sc.wide.data(), rows, L->intermediate, sc.act.data());
  product(L->down, sc.act.data(), rows, sc.x.data(), threads);
  for (int64_t i = 0; i < n; ++i) out[i] = out[i] + sc.x[i];
}
