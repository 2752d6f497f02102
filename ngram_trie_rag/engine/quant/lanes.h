// Shared by this package's AVX-512 kernels: adding up the 16 lanes of a vector in one
// fixed order, so a sum's bits depend on its own lanes only; exp of non-positive values,
// one polynomial per element; and the parallel loop of a weight-only product.

#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

// The lane sums of a, b, c, d as [sum a, sum b, sum c, sum d]; each sum's order depends
// on its own lanes only, so reduce4(a, 0, 0, 0)[0] is bitwise reduce4(a, b, c, d)[0].
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512d abd = _mm512_castps_pd(ab), cdd = _mm512_castps_pd(cd);
  const __m512 abcd = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(abd, cdd)),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(abd, cdd)));
  const __m256 half = _mm256_add_ps(
      _mm512_castps512_ps256(abcd),
      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}


// exp(x) for x <= 0 (scores minus their maximum), elementwise: x = n ln2 + r with
// |r| <= ln2 / 2, a degree-7 Taylor polynomial of exp(r) (relative error ~2e-8), scaled
// by 2^n; below -87 (where fp32 would go subnormal) it is 0.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, ln2 split in two so r keeps its low bits
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512 scaled = _mm512_scalef_ps(p, n);
  // NaN stays NaN (the comparison is false for it)
  return _mm512_mask_mov_ps(scaled, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ),
                            _mm512_setzero_ps());
}


// The parallel loop of a product of ``rows`` rows by N outputs: tasks of ``outputs``
// outputs each (split statically over ``threads``), each task taking the rows in blocks
// of at most ``max_rows``: block(first row, rows in the block, first output, outputs).
// Which thread computes an output never changes its sum.
template <class Block>
inline void for_blocks(int64_t rows, int64_t N, int64_t outputs, int64_t max_rows,
                       int threads, Block block) {
  const int64_t tasks = (N + outputs - 1) / outputs;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t n0 = t * outputs, count = std::min(N, n0 + outputs) - n0;
    for (int64_t m0 = 0; m0 < rows; m0 += max_rows)
      block(m0, std::min(max_rows, rows - m0), n0, count);
  }
}
