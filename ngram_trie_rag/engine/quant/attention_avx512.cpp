// Attention for few or many queries over a cache, fp32, on an AVX-512 CPU, with each
// query's output computed in one fixed order from the keys it sees and nothing else:
//
//   s_j = (q . k_j) * scale,  p_j = exp(s_j - max s),  out = (sum_j p_j v_j) / sum_j p_j
//
// over the keys a row may see, taken in increasing key index (a mask's True entries, or
// keys 0 .. i for row i of a causal prompt, as SDPA's ``is_causal`` aligns them). So a
// tree node's row, which sees the prefix and its ancestors, is bitwise the row
// ``generate`` computes for the same position, which sees the same keys contiguously:
// the masked keys between a node's ancestors are skipped, never added as zeros in
// another order. Rows, heads, batch entries and threads never meet.
//
// The orders: a dot product is 16 lanes of fused multiply-adds over the head dimension
// (lane i: d = i, i + 16, ...; a missing tail is +0 * 0), then the lanes added as one
// tree (reduce4); exp is one polynomial per element; the sum of the p_j is 16 lanes by
// the key's place in the row's list, then the tree; the output is p_j v_j added into
// the head dimension's lanes in list order, then multiplied by 1 / the sum.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "lanes.h"

namespace {

// The head dimension as C 16-wide chunks, the last one ``tail`` lanes wide.
template <int C>
struct Head {
  __mmask16 tail;
  inline __m512 load(const float* p, int c) const {
    return c + 1 < C ? _mm512_loadu_ps(p + 16 * c) : _mm512_maskz_loadu_ps(tail, p + 16 * c);
  }
  inline __m512 dot_lanes(const __m512* q, const float* k) const {
    __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc = _mm512_fmadd_ps(q[c], load(k, c), acc);
    return acc;
  }
};

constexpr int64_t KEY_BLOCK = 64;  // keys per block: their rows stay in L1 while rows reuse them
constexpr int64_t MAX_ROWS = 16;   // query rows per task: their scores and sums are scratch

// A task's scratch, kept per thread across calls (grown, never shrunk).
struct Scratch {
  std::vector<int32_t> index;  // rows x S: row r's keys, increasing, at index[r * S]
  std::vector<int64_t> count, cursor;
  std::vector<float> scores;   // rows x HB x (S + 16): scores, then the p_j
  std::vector<float> acc;      // rows x HB x C x 16: the output sums between key blocks
  std::vector<float> inverse;  // rows x HB
  void fit(int64_t rows, int64_t S, int hb, int chunks) {
    const auto grow = [](auto& v, size_t n) { if (v.size() < n) v.resize(n); };
    grow(index, rows * S);
    grow(count, rows);
    grow(cursor, rows);
    grow(scores, rows * hb * (S + 16));
    grow(acc, rows * hb * chunks * 16);
    grow(inverse, rows * hb);
  }
};

// Calls visit(r, begin, end) for each block of KEY_BLOCK keys and each row r, with
// [begin, end) the places in r's key list that fall in the block: the rows take turns
// on a block while its keys are in L1, and each row meets its keys in list order.
template <class Visit>
inline void by_key_blocks(Scratch& sc, int64_t rows, int64_t S, Visit visit) {
  for (int64_t r = 0; r < rows; ++r) sc.cursor[r] = 0;
  for (int64_t j0 = 0; j0 < S; j0 += KEY_BLOCK) {
    const int64_t j1 = std::min(S, j0 + KEY_BLOCK);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t* index = sc.index.data() + r * S;
      int64_t end = sc.cursor[r];
      while (end < sc.count[r] && index[end] < j1) ++end;
      if (end > sc.cursor[r]) visit(r, sc.cursor[r], end);
      sc.cursor[r] = end;
    }
  }
}

// ``rows`` query rows (``q_q`` apart) of HB heads (``q_h`` apart) that share a KV head, over
// the keys each row sees (``sc.index``, ``sc.count``): out rows ``out_q`` apart, heads
// ``out_h`` apart. Keys and values are read in blocks of KEY_BLOCK that every row and
// head then uses while they are in L1; each row-head's numbers are what it would
// compute alone (the dot of a pair does not depend on the pass; the softmax sum and the
// output sum run over the row's own keys in increasing order, the output sum kept in
// memory between blocks, exactly).
template <int C, int HB>
void rows_of_heads(__mmask16 tail, const float* q, int64_t q_q, int64_t q_h, const float* k,
                   int64_t kss, const float* v, int64_t vss, int64_t S, int64_t rows,
                   float scale, Scratch& sc, float* out, int64_t out_q, int64_t out_h) {
  const Head<C> d{tail};
  const int64_t ld = S + 16;
  const __m512 zero = _mm512_setzero_ps();
  float* scores = sc.scores.data();
  // scores, block by block of keys
  by_key_blocks(sc, rows, S, [&](int64_t r, int64_t begin, int64_t end) {
    const int32_t* index = sc.index.data() + r * S;
    __m512 qv[HB][C];
#pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) qv[h][c] = d.load(q + r * q_q + h * q_h, c);
    float* sr = scores + r * HB * ld;
    for (int64_t pos = begin; pos < end; ++pos) {
      const float* kj = k + index[pos] * kss;
      __m512 acc[4] = {zero, zero, zero, zero};  // each key's HB dots in one reduce4
#pragma GCC unroll 16
      for (int h = 0; h < HB; ++h) acc[h] = d.dot_lanes(qv[h], kj);
      float s4[4];
      _mm_storeu_ps(s4, reduce4(acc[0], acc[1], acc[2], acc[3]));
#pragma GCC unroll 16
      for (int h = 0; h < HB; ++h) sr[h * ld + pos] = s4[h] * scale;
    }
  });
  // p_j in place, and their sum by list place, row and head apart
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t count = sc.count[r];
    for (int h = 0; h < HB; ++h) {
      float* sh = scores + (r * HB + h) * ld;
      if (count == 0) {  // a row that sees no key (padding): zeros, not NaN
        sc.inverse[r * HB + h] = 0.0f;
        continue;
      }
      __m512 top16 = _mm512_set1_ps(sh[0]);
      for (int64_t j = 0; j < count; j += 16) {  // a maximum: any order gives the same
        const __mmask16 m = count - j >= 16 ? 0xFFFF : (1u << (count - j)) - 1;
        top16 = _mm512_mask_max_ps(top16, m, top16, _mm512_maskz_loadu_ps(m, sh + j));
      }
      const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top16));
      __m512 total = zero;
      for (int64_t j = 0; j < count; j += 16) {
        const __mmask16 m = count - j >= 16 ? 0xFFFF : (1u << (count - j)) - 1;
        const __m512 p = _mm512_maskz_mov_ps(
            m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sh + j), shift)));
        _mm512_mask_storeu_ps(sh + j, m, p);
        total = _mm512_add_ps(total, p);
      }
      sc.inverse[r * HB + h] = 1.0f / _mm_cvtss_f32(reduce4(total, zero, zero, zero));
    }
  }
  // sum_j p_j v_j in each row's key order, block by block of values
  float* sums = sc.acc.data();  // row r, head h, chunk c at ((r * HB + h) * C + c) * 16
  for (int64_t i = 0; i < rows * HB * C * 16; ++i) sums[i] = 0.0f;
  by_key_blocks(sc, rows, S, [&](int64_t r, int64_t begin, int64_t end) {
    const int32_t* index = sc.index.data() + r * S;
    float* sr = sums + r * HB * C * 16;
    __m512 acc[HB][C];
#pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[h][c] = _mm512_loadu_ps(sr + (h * C + c) * 16);
    const float* pr = scores + r * HB * ld;
    for (int64_t pos = begin; pos < end; ++pos) {
      const float* vj = v + index[pos] * vss;
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        const __m512 vc = d.load(vj, c);
#pragma GCC unroll 16
        for (int h = 0; h < HB; ++h)
          acc[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(pr[h * ld + pos]), vc, acc[h][c]);
      }
    }
#pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(sr + (h * C + c) * 16, acc[h][c]);
  });
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < HB; ++h) {
      const __m512 inverse = _mm512_set1_ps(sc.inverse[r * HB + h]);
      const float* sr = sums + (r * HB + h) * C * 16;
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c)
        _mm512_mask_storeu_ps(out + r * out_q + h * out_h + 16 * c, c + 1 < C ? 0xFFFF : d.tail,
                              _mm512_mul_ps(_mm512_loadu_ps(sr + 16 * c), inverse));
    }
}

using Rows = void (*)(__mmask16, const float*, int64_t, int64_t, const float*, int64_t,
                      const float*, int64_t, int64_t, int64_t, float, Scratch&, float*, int64_t,
                      int64_t);

constexpr int MAX_CHUNKS = 16;  // head dimension up to 256
constexpr int MAX_HEADS = 4;    // heads per pass over the keys (reduce4's lanes)

// The heads per pass for C chunks: as many as keep HB x C accumulators in registers.
constexpr int heads_per_pass(int C) { return C <= 4 ? 4 : (C <= 8 ? 2 : 1); }

template <int C>
constexpr Rows by_heads(int hb) {
  constexpr int most = heads_per_pass(C);
  if (hb >= 4 && most >= 4) return rows_of_heads<C, (most >= 4 ? 4 : 1)>;
  if (hb == 3 && most >= 4) return rows_of_heads<C, (most >= 4 ? 3 : 1)>;
  if (hb >= 2 && most >= 2) return rows_of_heads<C, (most >= 2 ? 2 : 1)>;
  return rows_of_heads<C, 1>;
}

// BY[C - 1][HB - 1]: the function for C chunks and HB heads (HB <= heads_per_pass(C))
template <int C>
constexpr std::array<Rows, MAX_HEADS> heads_of() {
  return {by_heads<C>(1), by_heads<C>(2), by_heads<C>(3), by_heads<C>(4)};
}
constexpr std::array<std::array<Rows, MAX_HEADS>, MAX_CHUNKS> BY = {
    heads_of<1>(),  heads_of<2>(),  heads_of<3>(),  heads_of<4>(),  heads_of<5>(),  heads_of<6>(),
    heads_of<7>(),  heads_of<8>(),  heads_of<9>(),  heads_of<10>(), heads_of<11>(), heads_of<12>(),
    heads_of<13>(), heads_of<14>(), heads_of<15>(), heads_of<16>()};

}  // namespace

// out (B, Q, H, D) contiguous = attention of q (B, H, Q, D) over k, v (B, H_kv, S, D),
// H a multiple of H_kv; the last dimension of each is contiguous, the others strided
// (element strides ``*_b``, ``*_h`` and the row stride). ``allowed`` (B, Q, S) uint8,
// 1 where the row sees the key, or null: then row i sees keys 0 .. i when ``causal``
// (SDPA's ``is_causal``: the prompt from position 0, in a cache of S >= Q), else all S. Returns 0, or -1 when D exceeds 256.
extern "C" int ntr_attention(const float* q, int64_t q_b, int64_t q_h, int64_t q_q,
                             const float* k, int64_t k_b, int64_t k_h, int64_t k_s,
                             const float* v, int64_t v_b, int64_t v_h, int64_t v_s,
                             const uint8_t* allowed, int causal, int64_t B, int64_t H,
                             int64_t H_kv, int64_t Q, int64_t S, int64_t D, float scale,
                             float* out, int threads) {
  if (D > 16 * MAX_CHUNKS || D <= 0) return -1;
  const int chunks = static_cast<int>((D + 15) / 16);
  const __mmask16 tail = static_cast<__mmask16>(D % 16 ? (1u << (D % 16)) - 1 : 0xFFFF);
  // a KV head's query heads in passes of at most heads_per_pass, as even as can be
  const int64_t groups = H / H_kv,
                most = std::min<int64_t>(groups, chunks <= 4 ? 4 : (chunks <= 8 ? 2 : 1));
  const int64_t passes = (groups + most - 1) / most, base = B * H_kv * passes;
  // rows in blocks of at most MAX_ROWS, and enough blocks that every thread has work
  int64_t blocks = std::max<int64_t>((Q + MAX_ROWS - 1) / MAX_ROWS,
                                     std::min<int64_t>(Q, (2 * threads + base - 1) / base));
  const int64_t tasks = base * blocks;
#pragma omp parallel num_threads(threads)
  {
    thread_local Scratch sc;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      // tasks ordered (b, kv head, pass, row block): neighbours share keys
      const int64_t block = t % blocks, pass = t / blocks % passes,
                    kvh = t / (blocks * passes) % H_kv, b = t / (blocks * passes * H_kv);
      const int64_t first = pass * groups / passes, heads = (pass + 1) * groups / passes - first;
      const int64_t h = kvh * groups + first;
      const int64_t i0 = block * Q / blocks, rows = (block + 1) * Q / blocks - i0;
      sc.fit(rows, S, static_cast<int>(heads), chunks);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        int32_t* index = sc.index.data() + r * S;
        int64_t count = 0;
        if (allowed != nullptr) {
          const uint8_t* a = allowed + (b * Q + i) * S;
          for (int64_t s = 0; s < S; ++s) {
            index[count] = static_cast<int32_t>(s);
            count += a[s] != 0;
          }
        } else {
          count = causal ? std::min<int64_t>(S, i + 1) : S;
          for (int64_t s = 0; s < count; ++s) index[s] = static_cast<int32_t>(s);
        }
        sc.count[r] = count;
      }
      BY[chunks - 1][heads - 1](tail, q + b * q_b + h * q_h + i0 * q_q, q_q, q_h,
                                k + b * k_b + kvh * k_h, k_s, v + b * v_b + kvh * v_h, v_s, S,
                                rows, scale, sc, out + ((b * Q + i0) * H + h) * D, H * D, D);
    }
  }
  return 0;
}
