// The int8 weight-only product with fp32 activations on an AVX-512 CPU:
//
//   y[m, n] = (sum_k float(w[n, k]) * x[m, k]) * scale[n]
//
// over the layer's own (N, K) int8 weights, any number of rows. Each output is summed in
// one fixed order, whatever the rows, threads or blocking: 16 fp32 lanes, lane j holding
// the fused multiply-adds of k = j, j + 16, j + 32, ... in turn (a missing tail counts
// as +0 * 0, which changes no sum), then the lanes added as one tree (reduce4), then the
// scale. So a row's output is bitwise the same alone or beside any other rows: a tree
// verification's rows equal generate's one-row steps, and a prompt's rows do not depend
// on how it is split into chunks.
//
// The int8 -> fp32 widening (two instructions per 16 weights) is paid once per weight
// and reused by every row of the block; the weights of the block two ahead are
// prefetched, since with few rows the loop otherwise waits on memory (8 ms a step of
// the default model at one row with it, 16 ms without, on a 2-core Xeon).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lanes.h"

namespace {

constexpr int MAX_ROWS = 8;  // rows per block of accumulators (registers)
constexpr int AHEAD = 2;     // blocks of outputs prefetched ahead

inline __m512 widen(const int8_t* w) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
}
inline __m512 widen_masked(const int8_t* w, __mmask16 mask) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, w)));
}

// NB outputs x M rows; acc[b][m] holds the 16 lanes of output b, row m.
template <int M, int NB>
inline void block(const float* __restrict x, int64_t K, const int8_t* __restrict w,
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
      if ((k & 63) == 0)  // once per cache line; a prefetch never faults past the end
        _mm_prefetch(reinterpret_cast<const char*>(w + (AHEAD * NB + b) * K + k), _MM_HINT_T0);
      const __m512 wv = widen(w + b * K + k);
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
      const __m512 wv = widen_masked(w + b * K + whole, mask);
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
        const __m128 sums = reduce4(acc[b][m], acc[b + 1][m], acc[b + 2][m], acc[b + 3][m]);
        _mm_storeu_ps(y + m * ldy + b, _mm_mul_ps(sums, _mm_loadu_ps(scale + b)));
      }
  } else {
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m)
        y[m * ldy + b] = _mm_cvtss_f32(reduce4(acc[b][m], zero, zero, zero)) * scale[b];
  }
}

// ``count`` outputs of M rows; more outputs per block where fewer rows leave registers.
template <int M>
void outputs(const float* x, int64_t K, const int8_t* w, const float* scale, float* y,
             int64_t ldy, int64_t count) {
  constexpr int NB = M <= 2 ? 8 : (M <= 5 ? 4 : 2);
  int64_t n = 0;
  for (; n + NB <= count; n += NB) block<M, NB>(x, K, w + n * K, scale + n, y + n, ldy);
  for (; n < count; ++n) block<M, 1>(x, K, w + n * K, scale + n, y + n, ldy);
}

using Outputs = void (*)(const float*, int64_t, const int8_t*, const float*, float*, int64_t,
                         int64_t);
constexpr Outputs BY_ROWS[MAX_ROWS] = {outputs<1>, outputs<2>, outputs<3>, outputs<4>,
                                       outputs<5>, outputs<6>, outputs<7>, outputs<8>};

}  // namespace

constexpr int64_t OUTPUTS = 64;  // outputs per task of the parallel loop

// y (rows, N) fp32 = x (rows, K) fp32 times qweight (N, K) int8 (row-major, contiguous)
// scaled by scale (N,) fp32; threads: the OpenMP team's size.
extern "C" void ntr_w8a32_product(const float* x, int64_t rows, int64_t K,
                                  const int8_t* qweight, int64_t N, const float* scale,
                                  float* y, int threads) {
  for_blocks(rows, N, OUTPUTS, MAX_ROWS, threads,
             [&](int64_t m0, int64_t m, int64_t n0, int64_t count) {
               BY_ROWS[m - 1](x + m0 * K, K, qweight + n0 * K, scale + n0, y + m0 * N + n0,
                              N, count);
             });
}
