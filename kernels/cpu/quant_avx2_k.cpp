// Q4_0, Q4_1, Q4_K and Q6_K (the blocks of Q4_0, Q4_1 and Q4_K_M files) on AVX2: the activations'
// int16 quants split into bytes, q = 256 * hi + lo (lo unsigned, hi signed), so that VPMADDUBSW
// multiplies them with the weights' unsigned quants straight from the bytes: no widening to int16,
// and for the 4-bit types two blocks share each multiply's register. The integer sums per block
// (per 16 weights for Q6_K) are exactly quant_avx2.cpp's, scaled in the same float32 products, so
// the results agree with it within float32 rounding; every product takes the same steps whatever
// the tile, so a row's bits do not depend on how many rows its pass has.
//
// Why: quant_avx2.cpp widens each block's quants to int16 and converts and scales every block
// apart, and on a 2-core Zen 3 it reached ~5 GB/s of blocks per core against ~14 GB/s the core
// can read; a decode step of a 1.5B Q4_K_M model was bound by that arithmetic, not by memory.
// A single activation row (a decode's) also streams the weight rows one after another here, which
// the hardware prefetchers follow better than 4 rows read side by side.
//
// Q4_0: w = d * (q - 8); Q4_1: w = d * q + m; Q4_K: w = d * sc * q - dmin * m (q in [0, 15]);
// Q6_K: w = d * sc * (q - 32) (q in [0, 63]); the offsets multiply the activations' sums
// (QuantizedRows::s, ::h) apart. Overflow: the 4-bit types' int16 pair sums are at most
// 2 * 2 * 255 * 15, Q6_K's 2 * 255 * 63.
#include "quant_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#include "quant_avx2.h"

namespace langrt_quant {
namespace {

// 8 bytes of 2-bit quants (byte i: weights i, i + 8, i + 16, i + 24 at bits 0, 2, 4, 6) as 32
// bytes in weight order, times 16 (Q6_K's high pairs): 64-bit lane c shifts the same 8 bytes by 2c.
LANGRT_AVX2 inline __m256i high_pairs(const uint8_t* p) {
  int64_t bits;
  std::memcpy(&bits, p, 8);
  const __m256i spread = _mm256_srlv_epi64(_mm256_set1_epi64x(bits), _mm256_setr_epi64x(0, 2, 4, 6));
  return _mm256_slli_epi16(_mm256_and_si256(spread, _mm256_set1_epi8(3)), 4);
}

// Super-block s's scales as float32 products d * sc (k_scale's): Q4_K's 8 in v[0], Q6_K's 16 in v[0], v[1].
template <int QT>
LANGRT_AVX2 inline void super_scales(const RowLayout& row, int64_t s, __m256* v) {
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(row.d[s]));
  if constexpr (QT == kQ4_K) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.sub + 8 * s));
    v[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)));
  } else {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row.sub + 16 * s));
    v[0] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)));
    v[1] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8))));
  }
}

// Weight bytes fetched this far ahead of a super-block's (into the next rows: prefetches do not
// fault past the end). The hardware prefetchers alone left a decode at 7-9 GB/s of blocks from
// memory on 2 threads of a Zen 3; 8 KB ahead gave 11-14 (2-16 KB measured; 1.5B model's FFN shapes).
constexpr int64_t kFetchAhead = 8192;

LANGRT_AVX2 inline void fetch_ahead(const uint8_t* quants, int64_t bytes) {
  const char* at = reinterpret_cast<const char*>(quants) + kFetchAhead;
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(at + line, _MM_HINT_T0);
}

// Lanes 0-3 of a pair's scales from element a, lanes 4-7 from element a + 1.
LANGRT_AVX2 inline __m256 spread_pair(__m256 v, int a) {
  return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(a, a, a, a, a + 1, a + 1, a + 1, a + 1));
}

// The int32 sums of 32 weight bytes w (unsigned) times 32 activations (bytes lo, hi), summed in pairs of int16.
LANGRT_AVX2 inline __m256i byte_dot(__m256i low_products, __m256i high_products) {
  return _mm256_add_epi32(_mm256_madd_epi16(low_products, _mm256_set1_epi16(1)),
                          _mm256_madd_epi16(high_products, _mm256_set1_epi16(256)));
}

// Blocks b0 .. b0 + 8 of a 4-bit row: their scales (Q4_K: d * sc; Q4_0, Q4_1: d) and offsets
// (Q4_K: -(dmin * m); Q4_1: m; Q4_0: -8 d).
template <int QT>
LANGRT_AVX2 inline void group_scales(const RowLayout& row, int64_t b0, __m256* scales, __m256* offsets) {
  if constexpr (QT == kQ4_K) {  // b0 is a super-block's first block
    super_scales<kQ4_K>(row, b0 / 8, scales);
    const __m128i mins = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.sub_m + b0));
    const __m256 dmin = _mm256_set1_ps(-_cvtsh_ss(row.m[b0 / 8]));
    *offsets = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins)));
  } else {
    *scales = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row.d + b0)));
    if constexpr (QT == kQ4_1) {
      *offsets = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row.m + b0)));
    } else {
      *offsets = _mm256_mul_ps(*scales, _mm256_set1_ps(-8.0f));
    }
  }
}

// Activation rows m0 .. m0 + RM of a pass: where each row's bytes and block scales start.
template <int RM>
struct Activations {
  const uint8_t* lo[RM];
  const int8_t* hi[RM];
  const float* d[RM];
  Activations(const QuantizedRows& x, const ByteRows& xb, int64_t m0) {
    for (int j = 0; j < RM; ++j) {
      lo[j] = xb.lo + (m0 + j) * x.k, hi[j] = xb.hi + (m0 + j) * x.k, d[j] = x.d + (m0 + j) * (x.k / kBlock);
    }
  }
};

// Blocks b, b + 1 against RM activation rows (ws: their weight scales, lanes 0-3 and 4-7): the 32
// bytes of nibbles give weights 0-15 (a) and 16-31 (c) of both blocks, which the activations'
// bytes in pair order meet; int32 lanes 0-3 sum block b, lanes 4-7 block b + 1.
template <int RM>
LANGRT_AVX2 inline void pair(const uint8_t* quants, int64_t b, __m256 ws, const Activations<RM>& xa, __m256* acc) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 16 * b));
  const __m256i a = _mm256_and_si256(raw, low4), c = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  for (int j = 0; j < RM; ++j) {
    const __m256i* l = reinterpret_cast<const __m256i*>(xa.lo[j] + kBlock * b);
    const __m256i* h = reinterpret_cast<const __m256i*>(xa.hi[j] + kBlock * b);
    const __m256i low = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_loadu_si256(l), a),
                                         _mm256_maddubs_epi16(_mm256_loadu_si256(l + 1), c));
    const __m256i high = _mm256_add_epi16(_mm256_maddubs_epi16(a, _mm256_loadu_si256(h)),
                                          _mm256_maddubs_epi16(c, _mm256_loadu_si256(h + 1)));
    const __m128 d2 = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xa.d[j] + b)));
    const __m256 xs = spread_pair(_mm256_castps128_ps256(d2), 0);
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(byte_dot(low, high)), _mm256_mul_ps(ws, xs), acc[j]);
  }
}

// Q4_0, Q4_1, Q4_K: weight row `row` (a whole number of 8 blocks) against activation rows m0 ..
// m0 + RM, 8 blocks at a time;
// sums[j] gathers the offsets times each block's d_x * sum(q).
template <int QT, int RM>
LANGRT_AVX2 void q4_tile(const RowLayout& row, const QuantizedRows& x, const ByteRows& xb, int64_t m0, __m256* acc,
                         __m256* sums) {
  const int64_t blocks = x.k / kBlock;
  const Activations<RM> a(x, xb, m0);
  for (int64_t b0 = 0; b0 < blocks; b0 += 8) {
    __m256 scales, offsets;
    group_scales<QT>(row, b0, &scales, &offsets);
    fetch_ahead(row.quants + 16 * b0, 128);
    for (int j = 0; j < RM; ++j) sums[j] = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(x.s + (m0 + j) * blocks + b0), sums[j]);
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) pair<RM>(row.quants, b0 + 2 * p, spread_pair(scales, 2 * p), a, acc);
  }
}

// Q6_K: one block at a time; int32 lanes 0-3 sum its weights 0-15, lanes 4-7 weights 16-31 (a scale each).
template <int RM>
LANGRT_AVX2 void q6k_tile(const RowLayout& row, const QuantizedRows& x, const ByteRows& xb, int64_t m0, __m256* acc,
                          __m256* sums) {
  const int64_t blocks = x.k / kBlock;
  const Activations<RM> a(x, xb, m0);
  for (int64_t s = 0; s < blocks / 8; ++s) {
    __m256 scales[2];
    super_scales<kQ6_K>(row, s, scales);
    fetch_ahead(row.quants + 192 * s, 192);
    for (int j = 0; j < RM; ++j) {  // the scales times each 16's d_x * sum(q), which -32 multiplies
      const float* h = x.h + 2 * ((m0 + j) * blocks + 8 * s);
      sums[j] = _mm256_fmadd_ps(scales[1], _mm256_loadu_ps(h + 8), _mm256_fmadd_ps(scales[0], _mm256_loadu_ps(h), sums[j]));
    }
#pragma GCC unroll 8
    for (int e = 0; e < 8; ++e) {
      const int64_t b = 8 * s + e;
      const uint8_t* q = row.quants + 24 * b;
      const __m256i w = _mm256_or_si256(nibble_bytes(q), high_pairs(q + 16));
      const __m256 ws = spread_pair(scales[e / 4], 2 * (e % 4));
      for (int j = 0; j < RM; ++j) {
        const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.lo[j] + kBlock * b));
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.hi[j] + kBlock * b));
        const __m256i sum = byte_dot(_mm256_maddubs_epi16(l, w), _mm256_maddubs_epi16(w, h));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(ws, _mm256_broadcast_ss(a.d[j] + b)), acc[j]);
      }
    }
  }
}

template <int QT, int RM>
LANGRT_AVX2 void k_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                        const ByteRows& xb, int64_t m0, const OutRows& out) {
  const int64_t blocks = x.k / kBlock;
  for (int64_t n = n0; n < n1; ++n) {
    const RowLayout row = row_layout(QT, w + n * row_bytes, blocks);
    __m256 acc[RM], sums[RM];
    for (int j = 0; j < RM; ++j) acc[j] = sums[j] = _mm256_setzero_ps();
    if constexpr (QT == kQ6_K) {
      q6k_tile<RM>(row, x, xb, m0, acc, sums);
      for (int j = 0; j < RM; ++j) store_out(out, m0 + j, n, hsum(acc[j]) - 32.0f * hsum(sums[j]));
    } else {
      q4_tile<QT, RM>(row, x, xb, m0, acc, sums);
      for (int j = 0; j < RM; ++j) store_out(out, m0 + j, n, hsum(acc[j]) + hsum(sums[j]));
    }
  }
}

// Activation rows m0 .. m1 in groups of up to 4 (each weight row decoded once per group).
template <int QT>
LANGRT_AVX2 void k_groups(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                          const ByteRows& xb, int64_t m0, int64_t m1, const OutRows& out) {
  for (int64_t m = m0; m < m1; m += 4) {
    switch (m1 - m) {
      case 1: k_rows<QT, 1>(w, row_bytes, n0, n1, x, xb, m, out); break;
      case 2: k_rows<QT, 2>(w, row_bytes, n0, n1, x, xb, m, out); break;
      case 3: k_rows<QT, 3>(w, row_bytes, n0, n1, x, xb, m, out); break;
      default: k_rows<QT, 4>(w, row_bytes, n0, n1, x, xb, m, out); break;
    }
  }
}

}  // namespace

void split_rows_k(int qtype, const int16_t* q, int64_t rows, int64_t k, uint8_t* lo, int8_t* hi) {
  if (qtype == kQ6_K) return split_rows(q, rows * k, lo, hi);
  // 4-bit: within each 64 weights (blocks 2c, 2c + 1; rows hold whole groups of 8 blocks), run t
  // of 16 bytes is block 2c + (t & 1)'s weights 16 (t >> 1) ..
  for (int64_t at = 0; at < rows * k; at += 64) {
    for (int t = 0; t < 4; ++t) split_rows(q + at + (t & 1) * 32 + (t >> 1) * 16, 16, lo + at + 16 * t, hi + at + 16 * t);
  }
}

LANGRT_AVX2 void dot_rows_k_avx2(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                                 const QuantizedRows& x, const ByteRows& bytes, int64_t m0, int64_t m1,
                                 const OutRows& out) {
  if (qtype == kQ4_0) return k_groups<kQ4_0>(w, row_bytes, n0, n1, x, bytes, m0, m1, out);
  if (qtype == kQ4_1) return k_groups<kQ4_1>(w, row_bytes, n0, n1, x, bytes, m0, m1, out);
  if (qtype == kQ4_K) return k_groups<kQ4_K>(w, row_bytes, n0, n1, x, bytes, m0, m1, out);
  if (qtype == kQ6_K) return k_groups<kQ6_K>(w, row_bytes, n0, n1, x, bytes, m0, m1, out);
}

}  // namespace langrt_quant

#endif  // __x86_64__
