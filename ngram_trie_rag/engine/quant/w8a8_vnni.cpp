// The w8a8 product for a few rows on an AVX512-VNNI CPU: the bits of the Python path
// (``kernels.int8_dynamic_product``), computed without its eight tensor operations per layer.
//
// y[m, n] = (float(sum_k q[m, k] * w[n, k]) * scale[n]) * step[m], where row m of x is
// rounded to int8 on its own scale: step[m] = max(absmax_k |x[m, k]| / 127, 1e-12),
// q[m, k] = round-half-even(x[m, k] / step[m]). Every operation is the IEEE one the
// Python path runs, in the same order, and the integer sum is exact in any order, so
// the result is bitwise the Python path's whatever the rows, threads or blocking.
//
// vpdpbusd multiplies unsigned by signed bytes: a row enters as q + 128, and
// comp[n] = 128 * sum_k w[n, k] is subtracted from the sum. Weights stay in the
// layer's own (N, K) int8 layout; 16 int32 lanes per (output, row) hold partial sums
// over K, reduced once at the end.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int MAX_ROWS = 8;  // rows per block of accumulators (registers)
constexpr int AHEAD = 2;     // blocks of outputs prefetched ahead

// Rows of x as uint8 (q + 128), K padded to a multiple of 64 with 128 (q = 0), and
// their steps. False when a row holds NaN or infinity (the caller computes those in
// Python, where the operations define what they give).
bool quantize_rows(const float* x, int64_t rows, int64_t K, int64_t Kp, uint8_t* xu,
                   float* step) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* r = x + m * K;
    float amax = 0.f;
    for (int64_t k = 0; k < K; ++k) {
      const float a = std::fabs(r[k]);
      amax = (a > amax || a != a) ? a : amax;
    }
    if (!std::isfinite(amax)) return false;
    const float s = std::max(amax / 127.0f, 1e-12f);
    step[m] = s;
    uint8_t* out = xu + m * Kp;
    for (int64_t k = 0; k < K; ++k) out[k] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(r[k] / s)) + 128);
    for (int64_t k = K; k < Kp; ++k) out[k] = 128;
  }
  return true;
}

// The lane sums of a, b, c, d as one vector [sum a, sum b, sum c, sum d].
inline __m128i reduce4(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

// NB outputs x M rows: acc[b][m] over 64-byte chunks of K.
template <int M, int NB>
inline void block(const uint8_t* __restrict xu, int64_t Kp, int64_t K,
                  const int8_t* __restrict w, const int32_t* __restrict comp,
                  int32_t* __restrict out, int64_t ldo) {
  __m512i acc[NB][M];
#pragma GCC unroll 16
  for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) acc[b][m] = _mm512_setzero_si512();
  const int64_t chunks = K / 64;
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i xv[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) xv[m] = _mm512_loadu_si512(xu + m * Kp + c * 64);
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      // the weights two blocks on: without it the loop waits on memory (the default
      // model's step 7.7 against 6.3 ms at one row, 18.1 against 13.4 at eight)
      _mm_prefetch(reinterpret_cast<const char*>(w + (AHEAD * NB + b) * K + c * 64), _MM_HINT_T0);
      const __m512i wv = _mm512_loadu_si512(w + b * K + c * 64);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) acc[b][m] = _mm512_dpbusd_epi32(acc[b][m], xv[m], wv);
    }
  }
  if (K % 64) {  // the last partial chunk: weights past K load as 0
    const __mmask64 mask = ~0ULL >> (64 - K % 64);
    __m512i xv[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) xv[m] = _mm512_loadu_si512(xu + m * Kp + chunks * 64);
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b) {
      const __m512i wv = _mm512_maskz_loadu_epi8(mask, w + b * K + chunks * 64);
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) acc[b][m] = _mm512_dpbusd_epi32(acc[b][m], xv[m], wv);
    }
  }
  if constexpr (NB % 4 == 0) {  // four outputs' lanes summed together: 3 instructions each
#pragma GCC unroll 16
    for (int b = 0; b < NB; b += 4)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) {
        const __m128i sums = reduce4(acc[b][m], acc[b + 1][m], acc[b + 2][m], acc[b + 3][m]);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + m * ldo + b),
                         _mm_sub_epi32(sums, _mm_loadu_si128(reinterpret_cast<const __m128i*>(comp + b))));
      }
  } else {
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
      for (int m = 0; m < M; ++m) out[m * ldo + b] = _mm512_reduce_add_epi32(acc[b][m]) - comp[b];
  }
}

// ``count`` outputs of M rows; more outputs per block where fewer rows leave registers.
template <int M>
void outputs(const uint8_t* xu, int64_t Kp, int64_t K, const int8_t* w, const int32_t* comp,
             int32_t* out, int64_t ldo, int64_t count) {
  constexpr int NB = M <= 2 ? 8 : (M <= 5 ? 4 : 2);
  int64_t n = 0;
  for (; n + NB <= count; n += NB) block<M, NB>(xu, Kp, K, w + n * K, comp + n, out + n, ldo);
  for (; n < count; ++n) block<M, 1>(xu, Kp, K, w + n * K, comp + n, out + n, ldo);
}

using Outputs = void (*)(const uint8_t*, int64_t, int64_t, const int8_t*, const int32_t*,
                         int32_t*, int64_t, int64_t);
constexpr Outputs BY_ROWS[MAX_ROWS] = {outputs<1>, outputs<2>, outputs<3>, outputs<4>,
                                       outputs<5>, outputs<6>, outputs<7>, outputs<8>};

}  // namespace

constexpr int64_t OUTPUTS = 64;  // outputs per task of the parallel loop

// y (rows, N) fp32 = the product of x (rows, K) fp32 and qweight (N, K) int8 (row-major,
// contiguous) with scale (N,) and comp (N,); threads: the OpenMP team's size. Returns 0,
// or 1 (y untouched) when a row holds NaN or infinity.
extern "C" int ntr_w8a8_product(const float* x, int64_t rows, int64_t K, const int8_t* qweight,
                                int64_t N, const float* scale, const int32_t* comp, float* y,
                                int threads) {
  const int64_t Kp = (K + 63) / 64 * 64;
  std::vector<uint8_t> xu(rows * Kp);
  std::vector<float> step(rows);
  if (!quantize_rows(x, rows, K, Kp, xu.data(), step.data())) return 1;
  const int64_t tasks = (N + OUTPUTS - 1) / OUTPUTS;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t n0 = t * OUTPUTS, n1 = std::min(N, n0 + OUTPUTS);
    int32_t sums[MAX_ROWS * OUTPUTS];
    for (int64_t m0 = 0; m0 < rows; m0 += MAX_ROWS) {
      const int64_t m = std::min<int64_t>(MAX_ROWS, rows - m0);
      BY_ROWS[m - 1](xu.data() + m0 * Kp, Kp, K, qweight + n0 * K, comp + n0, sums, OUTPUTS,
                     n1 - n0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t n = n0; n < n1; ++n)
          y[(m0 + i) * N + n] = (static_cast<float>(sums[i * OUTPUTS + n - n0]) * scale[n]) * step[m0 + i];
    }
  }
  return 0;
}
