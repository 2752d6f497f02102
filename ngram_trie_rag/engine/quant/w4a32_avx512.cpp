// The int4 weight-only product with fp32 activations on an AVX-512 CPU:
//
//   y[m, n] = sum_k w[n, k] * x[m, k],   w[n, k] = q[n, k] * s[n, g] + b[n, g]
//
// with q in 0..15, and s, b one fp32 pair per group g of 32 inputs (b = zero - 8 s,
// llama.cpp's Q4_1 block). Layout, per output row n: K / 2 bytes, 16 per group, byte i
// of group g holding q[32 g + i] (low nibble) and q[32 g + 16 + i] (high nibble), so 16
// bytes widen to the group's two 16-lane chunks of nibbles (the high ones by a shift);
// then the (s, b) pairs, (N, K / 32, 2) fp32.
//
// Each output is summed in one fixed order, whatever the rows, threads or blocking: lane
// j takes the fused multiply-adds of k = 32 g + j, then 32 g + 16 + j, group after group,
// then the lanes are added as one tree (reduce4). Each weight is q * s + b, a product
// and a sum rounded apart (no fused multiply-add; the dense fallback computes the same
// values), taken from the group's table of its 16 possible values by the nibble. So a
// row's output is bitwise the same alone or beside any other rows: a tree verification's
// rows equal generate's one-row steps.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "lanes.h"

namespace {

constexpr int MAX_ROWS = 8;  // rows per block of accumulators (registers)
constexpr int AHEAD = 2;     // blocks of outputs prefetched ahead

// NB outputs x M rows; acc[b][m] holds the 16 lanes of output b, row m. ``w``: NB rows of
// K / 2 bytes; ``sb``: their (s, b) pairs, K / 32 per output.
template <int M, int NB>
inline void block(const float* __restrict x, int64_t K, const uint8_t* __restrict w,
                  const float* __restrict sb, float* __restrict y, int64_t ldy) {
  __m512 acc[NB][M];
#pragma GCC unroll 16
  for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) acc[b][m] = _mm512_setzero_ps();
  const int64_t groups = K / 32, row_bytes = K / 2;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t g = 0; g < groups; ++g) {
    __m512 lo_x[M], hi_x[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      lo_x[m] = _mm512_loadu_ps(x + m * K + 32 * g);
      hi_x[m] = _mm512_loadu_ps(x + m * K + 32 * g + 16);
    }
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      const uint8_t* wb = w + b * row_bytes + 16 * g;
      if ((g & 3) == 0)  // once per cache line; a prefetch never faults past the end
        _mm_prefetch(reinterpret_cast<const char*>(wb + AHEAD * NB * row_bytes), _MM_HINT_T0);
      const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb)));
      const __m512 s = _mm512_set1_ps(sb[(b * groups + g) * 2]);
      const __m512 o = _mm512_set1_ps(sb[(b * groups + g) * 2 + 1]);
      // the group's 16 possible weights i * s + o, then each weight looked up by its
      // nibble (vpermps reads an index's low 4 bits: the low nibble needs no mask)
      const __m512 table = _mm512_add_ps(_mm512_mul_ps(iota, s), o);
      const __m512 lo_w = _mm512_permutexvar_ps(q, table);
      const __m512 hi_w = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        acc[b][m] = _mm512_fmadd_ps(lo_w, lo_x[m], acc[b][m]);
        acc[b][m] = _mm512_fmadd_ps(hi_w, hi_x[m], acc[b][m]);
      }
    }
  }
  // every index below is a constant after unrolling, so acc stays in registers
  if constexpr (NB % 4 == 0) {
#pragma GCC unroll 16
    for (int b = 0; b < NB; b += 4)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m)
        _mm_storeu_ps(y + m * ldy + b,
                      reduce4(acc[b][m], acc[b + 1][m], acc[b + 2][m], acc[b + 3][m]));
  } else {
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m)
        y[m * ldy + b] = _mm_cvtss_f32(reduce4(acc[b][m], zero, zero, zero));
  }
}

// ``count`` outputs of M rows; more outputs per block where fewer rows leave registers.
template <int M>
void outputs(const float* x, int64_t K, const uint8_t* w, const float* sb, float* y,
             int64_t ldy, int64_t count) {
  constexpr int NB = M <= 2 ? 8 : (M <= 5 ? 4 : 2);
  const int64_t row_bytes = K / 2, row_pairs = K / 16;  // (s, b) floats per output
  int64_t n = 0;
  for (; n + NB <= count; n += NB)
    block<M, NB>(x, K, w + n * row_bytes, sb + n * row_pairs, y + n, ldy);
  for (; n < count; ++n) block<M, 1>(x, K, w + n * row_bytes, sb + n * row_pairs, y + n, ldy);
}

using Outputs = void (*)(const float*, int64_t, const uint8_t*, const float*, float*, int64_t,
                         int64_t);
constexpr Outputs BY_ROWS[MAX_ROWS] = {outputs<1>, outputs<2>, outputs<3>, outputs<4>,
                                       outputs<5>, outputs<6>, outputs<7>, outputs<8>};

}  // namespace

constexpr int64_t OUTPUTS = 64;  // outputs per task of the parallel loop

// y (rows, N) fp32 = x (rows, K) fp32 times the int4 weights (N, K / 2) uint8 and their
// (s, b) pairs (N, K / 32, 2) fp32, all contiguous; K a multiple of 32; threads: the
// OpenMP team's size.
extern "C" void ntr_w4a32_product(const float* x, int64_t rows, int64_t K,
                                  const uint8_t* qweight, int64_t N, const float* sb,
                                  float* y, int threads) {
  for_blocks(rows, N, OUTPUTS, MAX_ROWS, threads,
             [&](int64_t m0, int64_t m, int64_t n0, int64_t count) {
               BY_ROWS[m - 1](x + m0 * K, K, qweight + n0 * (K / 2), sb + n0 * (K / 16),
                              y + m0 * N + n0, N, count);
             });
}
