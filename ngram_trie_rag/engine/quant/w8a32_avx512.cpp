// The weight-only products with fp32 activations on an AVX-512 CPU:
//
//   int8 (W8A32):  y[m, n] = (sum_k float(w[n, k]) * x[m, k]) * scale[n]
//   fp32 (W32A32): y[m, n] =  sum_k w[n, k] * x[m, k]
//
// over the layer's own (N, K) weights, any number of rows. Each output is summed in
// one fixed order, whatever the rows, threads or blocking: 16 fp32 lanes, lane j holding
// the fused multiply-adds of k = j, j + 16, j + 32, ... in turn (a missing tail counts
// as +0 * 0, which changes no sum), then the lanes added as one tree (reduce4), then the
// scale. So a row's output is bitwise the same alone or beside any other rows: a tree
// verification's rows equal generate's one-row steps, and a prompt's rows do not depend
// on how it is split into chunks.
//
// Each weight is loaded (int8: widened, two instructions per 16 weights) once and
// reused by every row of the block; the weights of the block two ahead are prefetched,
// since with few rows the loop otherwise waits on memory (8 ms a step of the default
// model at one row with it, 16 ms without, int8 on a 2-core Xeon). In fp32 a block of
// eight rows reads each weight once where the BLAS's few-row product reads it up to
// once per row: the default model's 121 products take 29 / 30 / 36 ms for 1 / 4 / 8
// rows here, against 29 / 53 / 67 ms for the best of ``x W^T`` and ``W x^T``.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lanes.h"

namespace {

constexpr int MAX_ROWS = 8;  // rows per block of accumulators (registers)
constexpr int AHEAD = 2;     // blocks of outputs prefetched ahead

// The weight types: 16 weights as fp32 lanes (all, or the first of a mask), whether
// outputs are scaled, and the weights per 64-byte cache line (prefetched once each).
struct Int8 {
  using T = int8_t;
  static constexpr bool SCALED = true;
  static constexpr int PER_LINE = 64;
  static __m512 load(const int8_t* w) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
  }
  static __m512 load(const int8_t* w, __mmask16 mask) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, w)));
  }
};
struct Fp32 {
  using T = float;
  static constexpr bool SCALED = false;
  static constexpr int PER_LINE = 16;
  static __m512 load(const float* w) { return _mm512_loadu_ps(w); }
  static __m512 load(const float* w, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, w); }
};

// NB outputs x M rows; acc[b][m] holds the 16 lanes of output b, row m.
template <class W, int M, int NB>
inline void block(const float* __restrict x, int64_t K, const typename W::T* __restrict w,
                  const float* __restrict scale, float* __restrict y, int64_t ldy) {
  __m512 acc[NB][M];
#pragma GCC unroll 16
  for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) acc[b][m] = _mm512_setzero_ps();
  const int64_t whole = K / 16 * 16;
  for (int64_t k = 0; k < whole; k += 16) {
    __m512 xv[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) xv[m] = _mm512_loadu_ps(x + m * K + k);
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      if (k % W::PER_LINE == 0)  // once per cache line; a prefetch never faults past the end
        _mm_prefetch(reinterpret_cast<const char*>(w + (AHEAD * NB + b) * K + k), _MM_HINT_T0);
      const __m512 wv = W::load(w + b * K + k);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) acc[b][m] = _mm512_fmadd_ps(wv, xv[m], acc[b][m]);
    }
  }
  if (whole < K) {  // the tail: x and w past K load as 0, and fma(0, 0, acc) is acc
    const __mmask16 mask = (1u << (K - whole)) - 1;
    __m512 xv[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) xv[m] = _mm512_maskz_loadu_ps(mask, x + m * K + whole);
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      const __m512 wv = W::load(w + b * K + whole, mask);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) acc[b][m] = _mm512_fmadd_ps(wv, xv[m], acc[b][m]);
    }
  }
  // every index below is a constant after unrolling, so acc stays in registers
  if constexpr (NB % 4 == 0) {
#pragma GCC unroll 16
    for (int b = 0; b < NB; b += 4)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        __m128 sums = reduce4(acc[b][m], acc[b + 1][m], acc[b + 2][m], acc[b + 3][m]);
        if constexpr (W::SCALED) sums = _mm_mul_ps(sums, _mm_loadu_ps(scale + b));
        _mm_storeu_ps(y + m * ldy + b, sums);
      }
  } else {
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const float sum = _mm_cvtss_f32(reduce4(acc[b][m], zero, zero, zero));
        y[m * ldy + b] = W::SCALED ? sum * scale[b] : sum;
      }
  }
}

// ``count`` outputs of M rows; more outputs per block where fewer rows leave registers.
template <class W, int M>
void outputs(const float* x, int64_t K, const typename W::T* w, const float* scale, float* y,
             int64_t ldy, int64_t count) {
  constexpr int NB = M <= 2 ? 8 : (M <= 5 ? 4 : 2);
  int64_t n = 0;
  // fp32 has no scales (null): no offset into them
  const auto at = [&](int64_t n) { return W::SCALED ? scale + n : scale; };
  for (; n + NB <= count; n += NB) block<W, M, NB>(x, K, w + n * K, at(n), y + n, ldy);
  for (; n < count; ++n) block<W, M, 1>(x, K, w + n * K, at(n), y + n, ldy);
}

template <class W>
using Outputs = void (*)(const float*, int64_t, const typename W::T*, const float*, float*,
                         int64_t, int64_t);
template <class W>
constexpr Outputs<W> BY_ROWS[MAX_ROWS] = {outputs<W, 1>, outputs<W, 2>, outputs<W, 3>,
                                          outputs<W, 4>, outputs<W, 5>, outputs<W, 6>,
                                          outputs<W, 7>, outputs<W, 8>};

constexpr int64_t OUTPUTS = 64;  // outputs per task of the parallel loop

template <class W>
void product(const float* x, int64_t rows, int64_t K, const typename W::T* weights, int64_t N,
             const float* scale, float* y, int threads) {
  for_blocks(rows, N, OUTPUTS, MAX_ROWS, threads,
             [&](int64_t m0, int64_t m, int64_t n0, int64_t count) {
               BY_ROWS<W>[m - 1](x + m0 * K, K, weights + n0 * K,
                                 W::SCALED ? scale + n0 : scale, y + m0 * N + n0, N, count);
             });
}

}  // namespace

// y (rows, N) fp32 = x (rows, K) fp32 times qweight (N, K) int8 (row-major, contiguous)
// scaled by scale (N,) fp32; threads: the OpenMP team's size.
extern "C" void ntr_w8a32_product(const float* x, int64_t rows, int64_t K,
                                  const int8_t* qweight, int64_t N, const float* scale,
                                  float* y, int threads) {
  product<Int8>(x, rows, K, qweight, N, scale, y, threads);
}

// y (rows, N) fp32 = x (rows, K) fp32 times weight (N, K) fp32 (row-major, contiguous);
// scale is not read (the product kernels' common signature).
extern "C" void ntr_w32a32_product(const float* x, int64_t rows, int64_t K,
                                   const float* weight, int64_t N, const float* scale,
                                   float* y, int threads) {
  product<Fp32>(x, rows, K, weight, N, scale, y, threads);
}
