// quant_kernels.h on AVX2 + FMA + F16C, which every x86-64 CPU since 2013-2015 has (Intel
// Haswell, AMD Zen): a block's 32 weights widened to int16 multiply 32 int16 activations in two
// madds, and one FMA per block applies its scales. Every function carries its instruction set as a target attribute, so the rest of the
// library is built for the baseline and runs anywhere; quant_linear.cpp calls these only where
// the CPU reports AVX2, FMA and F16C.
#include "quant_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "quant_avx2.h"

namespace langrt_quant {
namespace {

LANGRT_AVX2 inline __m256 load8(const void* x, bool bf16, int64_t i) {
  if (!bf16) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

LANGRT_AVX2 inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

LANGRT_AVX2 inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Block b's quants (langrt's row layout) as 32 int16: w0 holds weights 0..15, w1 16..31 (for
// Q4, GGML puts them in the low and the high nibbles of the 16 bytes).
struct Quants {
  __m256i w0, w1;
};

// 32 bytes: byte i is 0xFF where bit i of the 4 bytes at p is set, else 0 (each 128-bit lane's
// shuffle spreads the same 4 bytes; the OR leaves all ones only where the byte's own bit was set).
LANGRT_AVX2 inline __m256i bit_bytes(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE)), _mm256_set1_epi64x(-1));
}

// 8 bytes of 2-bit quants (byte i: weights i, i + 8, i + 16, i + 24) as 32 bytes in weight order.
LANGRT_AVX2 inline __m256i crumb_bytes(const uint8_t* quants) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(quants));
  const __m128i mask = _mm_set1_epi8(3);
  const __m128i low = _mm_unpacklo_epi64(b, _mm_srli_epi16(b, 2)), high = _mm_unpacklo_epi64(_mm_srli_epi16(b, 4), _mm_srli_epi16(b, 6));
  return _mm256_set_m128i(_mm_and_si128(high, mask), _mm_and_si128(low, mask));
}

LANGRT_AVX2 inline Quants widen(__m256i bytes, bool is_signed) {
  const __m128i lo = _mm256_castsi256_si128(bytes), hi = _mm256_extracti128_si256(bytes, 1);
  if (is_signed) return {_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi)};
  return {_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)};
}

template <int QT>
LANGRT_AVX2 inline Quants decode(const uint8_t* quants) {
  Quants q;
  if constexpr (QT == kQ8_0) {
    q.w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants)));
    q.w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants + 16)));
  } else if constexpr (QT == kQ6_K) {  // nibble + 16 * high pair - 32, in [-32, 31]
    const __m256i high = _mm256_slli_epi16(crumb_bytes(quants + 16), 4);  // pairs <= 3: no carry past a byte
    q = widen(_mm256_sub_epi8(_mm256_or_si256(nibble_bytes(quants), high), _mm256_set1_epi8(32)), true);
  } else if constexpr (QT == kQ5_0 || QT == kQ5_1 || QT == kQ5_K) {  // nibble + 16 * high bit, in [0, 31]
    const __m256i high = _mm256_and_si256(bit_bytes(quants), _mm256_set1_epi8(16));
    q = widen(_mm256_or_si256(nibble_bytes(quants + 4), high), false);
  } else if constexpr (QT == kQ3_K) {  // low + 4 * high bit - 4, in [-4, 3]
    const __m256i high = _mm256_and_si256(bit_bytes(quants), _mm256_set1_epi8(4));
    q = widen(_mm256_sub_epi8(_mm256_or_si256(crumb_bytes(quants + 4), high), _mm256_set1_epi8(4)), true);
  } else if constexpr (QT == kQ2_K) {
    q = widen(crumb_bytes(quants), false);
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
    const __m128i mask = _mm_set1_epi8(0x0F);
    q.w0 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, mask));
    q.w1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), mask));
  }
  return q;
}

// sum of w[i] * x[i] over a block, as 8 int32 partial sums (each at most 32 * 128 * 32767 < 2^31).
LANGRT_AVX2 inline __m256i dot32(const Quants& w, const int16_t* x) {
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  return _mm256_add_epi32(_mm256_madd_epi16(w.w0, x0), _mm256_madd_epi16(w.w1, x1));
}

// The sums of w[i] * x[i] over weights 0-15 and 16-31 of a block, as 8 int32 partial sums each.
LANGRT_AVX2 inline void dot16x2(const Quants& w, const int16_t* x, __m256i* low, __m256i* high) {
  *low = _mm256_madd_epi16(w.w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
  *high = _mm256_madd_epi16(w.w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16)));
}

// Scales i .. i + 7 of a K-quant row (k_scale / k_offset, the same float32 products): Q4_K's and
// Q6_K's integer scales times their super-block's d (i + 7 within one super-block: i is a multiple
// of 8 for Q4_K, of 8 scales = 4 blocks for Q6_K, whose super-blocks hold 16).
template <int QT>
LANGRT_AVX2 inline __m256 scales8(const RowLayout& row, int64_t i) {
  if constexpr (QT == kQ4_K || QT == kQ6_K) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.sub + i));
    const __m256i ints = QT == kQ4_K ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(row.d[i / (QT == kQ4_K ? 8 : 16)])), _mm256_cvtepi32_ps(ints));
  } else {
    return _mm256_loadu_ps(row.df + i);
  }
}

template <int QT>
LANGRT_AVX2 inline __m256 offsets8(const RowLayout& row, int64_t i) {
  if constexpr (QT == kQ4_K) {
    const __m256i ints = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.sub_m + i)));
    const __m256 product = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(row.m[i / 8])), _mm256_cvtepi32_ps(ints));
    return _mm256_xor_ps(product, _mm256_set1_ps(-0.0f));  // -(dmin * min), as kquants negated it
  } else {
    return _mm256_loadu_ps(row.mf + i);
  }
}

// prepare_rows (below) for the K-quants' float32 scales, one activation row: Q4_K and Q5_K as
// Q4_1; Q6_K's, Q3_K's and Q2_K's two scales per block, scales[2b + h] = d_w[2b + h] * d_x[b],
// and Q2_K's minimums times the activations' sums over 16 (xs: QuantizedRows::h), summed.
template <int QT>
LANGRT_AVX2 float prepare_k(const RowLayout& row, const float* xd, const float* xs, int64_t blocks, float* scales) {
  int64_t b = 0;
  if constexpr (scales_per_block(QT) == 2) {
    const __m256i pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    __m256 extra = _mm256_setzero_ps();
    for (; b + 4 <= blocks; b += 4) {
      const __m256 x = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(xd + b)), pairs);
      _mm256_storeu_ps(scales + 2 * b, _mm256_mul_ps(scales8<QT>(row, 2 * b), x));
      if constexpr (QT == kQ2_K) extra = _mm256_fmadd_ps(offsets8<QT>(row, 2 * b), _mm256_loadu_ps(xs + 2 * b), extra);
    }
    float tail = 0.0f;
    for (; b < blocks; ++b) {
      scales[2 * b] = k_scale(QT, row, 2 * b) * xd[b];
      scales[2 * b + 1] = k_scale(QT, row, 2 * b + 1) * xd[b];
      if constexpr (QT == kQ2_K) tail += row.mf[2 * b] * xs[2 * b] + row.mf[2 * b + 1] * xs[2 * b + 1];
    }
    return hsum(extra) + tail;
  } else {
    __m256 extra = _mm256_setzero_ps();
    for (; b + 8 <= blocks; b += 8) {
      _mm256_storeu_ps(scales + b, _mm256_mul_ps(scales8<QT>(row, b), _mm256_loadu_ps(xd + b)));
      extra = _mm256_fmadd_ps(offsets8<QT>(row, b), _mm256_loadu_ps(xs + b), extra);
    }
    float tail = 0.0f;
    for (; b < blocks; ++b) {
      scales[b] = k_scale(QT, row, b) * xd[b];
      tail += k_offset(QT, row, b) * xs[b];
    }
    return hsum(extra) + tail;
  }
}

// One weight row against RM activation rows (rows j of xd, xs and scales `blocks` apart), ahead of
// the dot products, for the types with float16 scales (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): scales[j][b] = d_w[b] *
// d_x[j][b] for every block, and extra_out[j] = sum_b offset_w[b] * s_x[j][b] (offset: Q4_1's and
// Q5_1's m, Q4_0's -8 d, Q5_0's -16 d), 8 blocks a lane-wise FMA, the lanes summed, then the blocks past a multiple of 8
// added one by one. The weight row's scales are widened once for all RM rows; each pair's values
// are those of the pair taken alone.
template <int QT, int RM>
LANGRT_AVX2 void prepare_rows(const RowLayout& row, const float* xd, const float* xs, int64_t blocks, float* scales,
                              float* extra_out) {
  constexpr float kZero = QT == kQ5_0 ? 16.0f : 8.0f;  // Q4_0's and Q5_0's quants are unsigned, offset by this
  __m256 extra[RM];
  for (int j = 0; j < RM; ++j) extra[j] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row.d + b)));
    __m256 offset = _mm256_setzero_ps();
    if constexpr (has_min(QT)) offset = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row.m + b)));
    if constexpr (QT == kQ4_0 || QT == kQ5_0) offset = _mm256_mul_ps(d, _mm256_set1_ps(-kZero));
    for (int j = 0; j < RM; ++j) {
      _mm256_storeu_ps(scales + j * blocks + b, _mm256_mul_ps(d, _mm256_loadu_ps(xd + j * blocks + b)));
      if constexpr (QT != kQ8_0)
        extra[j] = _mm256_fmadd_ps(offset, _mm256_loadu_ps(xs + j * blocks + b), extra[j]);
    }
  }
  float tail[RM] = {};
  for (; b < blocks; ++b) {
    const float d = _cvtsh_ss(row.d[b]);
    for (int j = 0; j < RM; ++j) {
      scales[j * blocks + b] = d * xd[j * blocks + b];
      if constexpr (has_min(QT)) tail[j] += _cvtsh_ss(row.m[b]) * xs[j * blocks + b];
      if constexpr (QT == kQ4_0 || QT == kQ5_0) tail[j] += -kZero * d * xs[j * blocks + b];
    }
  }
  for (int j = 0; j < RM; ++j) extra_out[j] = hsum(extra[j]) + tail[j];
}

// RN weight rows (n0 ..) against RM activation rows (m0 ..): RN * RM independent sums, so the
// FMAs of one block do not wait on each other, and each decoded weight block and loaded
// activation block serves several products. `scales` has room for RN * RM * blocks * S floats.
template <int QT, int RN, int RM>
LANGRT_AVX2 void dot_tile(const uint8_t* w, int64_t row_bytes, int64_t n0, const QuantizedRows& x, int64_t m0,
                          const OutRows& out, float* scales) {
  constexpr int S = scales_per_block(QT);
  const int64_t blocks = x.k / kBlock, quants = quant_bytes(QT);
  RowLayout rows[RN];
  __m256 acc[RN][RM];
  float extra[RN][RM];
  for (int i = 0; i < RN; ++i) {
    rows[i] = row_layout(QT, w + (n0 + i) * row_bytes, blocks);
    for (int j = 0; j < RM; ++j) acc[i][j] = _mm256_setzero_ps();
    if constexpr (k_quant(QT)) {
      for (int j = 0; j < RM; ++j) {
        const int64_t first = (m0 + j) * blocks;
        const float* xs = QT == kQ2_K ? x.h + 2 * first : x.s + first;
        extra[i][j] = prepare_k<QT>(rows[i], x.d + first, xs, blocks, scales + (i * RM + j) * blocks * S);
      }
    } else {
      prepare_rows<QT, RM>(rows[i], x.d + m0 * blocks, x.s + m0 * blocks, blocks, scales + i * RM * blocks, extra[i]);
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    Quants wq[RN];
    for (int i = 0; i < RN; ++i) wq[i] = decode<QT>(rows[i].quants + b * quants);
    for (int j = 0; j < RM; ++j) {
      const int16_t* xb = x.q + (m0 + j) * x.k + b * kBlock;
      for (int i = 0; i < RN; ++i) {
        const float* scale = scales + ((i * RM + j) * blocks + b) * S;
        if constexpr (S == 2) {
          __m256i low, high;
          dot16x2(wq[i], xb, &low, &high);
          acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale), _mm256_cvtepi32_ps(low), acc[i][j]);
          acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale + 1), _mm256_cvtepi32_ps(high), acc[i][j]);
        } else {
          acc[i][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(scale), _mm256_cvtepi32_ps(dot32(wq[i], xb)), acc[i][j]);
        }
      }
    }
  }
  for (int i = 0; i < RN; ++i) {
    for (int j = 0; j < RM; ++j) store_out(out, m0 + j, n0 + i, hsum(acc[i][j]) + extra[i][j]);
  }
}

// Weight rows fetched ahead of the tiles: a tile's rows come from memory, and one tile ahead left
// the single-row tiles waiting on their scales (2-row tiles: 2 x kAhead rows ahead). SmolLM2's
// 120 Q4_1 matrices at 1 row, 2-core Zen 4 capped at AVX2: 2.8-3.4 ms at 1 tile ahead, 2.5-2.6 at
// 4, 2.5-2.9 at 6.
constexpr int64_t kAhead = 4;

// Weight rows n .. n + count, fetched into L1 while earlier tiles compute.
LANGRT_AVX2 inline void fetch_rows(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t count) {
  const char* first = reinterpret_cast<const char*>(w + n * row_bytes);
  for (int64_t byte = 0; byte < count * row_bytes; byte += 64) _mm_prefetch(first + byte, _MM_HINT_T0);
}

// RM activation rows (m ..) against weight rows n0 .. n1 in tiles of 2 weight rows, then 1;
// `fetch`: the rows come from memory (the first group of activation rows over them), so fetch ahead.
template <int QT, int RM>
LANGRT_AVX2 void dot_pairs(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                           int64_t m, const OutRows& out, float* scales, bool fetch) {
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    if (fetch && n + 2 * (kAhead + 1) <= n1) fetch_rows(w, row_bytes, n + 2 * kAhead, 2);
    dot_tile<QT, 2, RM>(w, row_bytes, n, x, m, out, scales);
  }
  for (; n < n1; ++n) dot_tile<QT, 1, RM>(w, row_bytes, n, x, m, out, scales);
}

// Tiles of 2 weight rows x 4 activation rows while more than 5 rows are left (or exactly 4), then
// 2 x 5, 2 x 3 or 2 x 2 for what is left: a token and its drafts go through the weights once, not
// once a row. A single row (a decode's) takes 4 x 1 tiles, then 1 x 1.
template <int QT>
LANGRT_AVX2 void dot_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                          int64_t m0, int64_t m1, const OutRows& out) {
  std::vector<float> scales(20 * (x.k / kBlock));  // the largest tile (10 products) at 2 scales a block
  float* s = scales.data();
  int64_t m = m0;
  for (; m1 - m >= 4 && m1 - m != 5; m += 4) dot_pairs<QT, 4>(w, row_bytes, n0, n1, x, m, out, s, m == m0);
  switch (m1 - m) {
    case 5: return dot_pairs<QT, 5>(w, row_bytes, n0, n1, x, m, out, s, m == m0);
    case 3: return dot_pairs<QT, 3>(w, row_bytes, n0, n1, x, m, out, s, m == m0);
    case 2: return dot_pairs<QT, 2>(w, row_bytes, n0, n1, x, m, out, s, m == m0);
    case 1: break;
    default: return;
  }
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    if (n + 4 * (kAhead + 1) <= n1) fetch_rows(w, row_bytes, n + 4 * kAhead, 4);
    dot_tile<QT, 4, 1>(w, row_bytes, n, x, m, out, s);
  }
  for (; n < n1; ++n) dot_tile<QT, 1, 1>(w, row_bytes, n, x, m, out, s);
}

// One weight row's values, as dequantize_rows_scalar gives them bit for bit: each 16 weights'
// quants (less Q4_0's and Q5_0's zero point) times their scale, then plus their offset, in two
// roundings as the scalar loop (built with -ffp-contract=off) takes them.
template <int QT>
LANGRT_AVX2 void dequantize_row(const uint8_t* w, int64_t blocks, float* out) {
  constexpr int S = scales_per_block(QT);
  const RowLayout row = row_layout(QT, w, blocks);
  const __m256i zero = _mm256_set1_epi16(QT == kQ4_0 ? 8 : QT == kQ5_0 ? 16 : 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const Quants q = decode<QT>(row.quants + b * quant_bytes(QT));
    const __m256i halves[2] = {_mm256_sub_epi16(q.w0, zero), _mm256_sub_epi16(q.w1, zero)};
    for (int h = 0; h < 2; ++h) {
      float d, m;
      if constexpr (k_quant(QT)) {
        d = k_scale(QT, row, S * b + (S == 2 ? h : 0));
        m = k_offset(QT, row, S * b + (S == 2 ? h : 0));
      } else {
        d = _cvtsh_ss(row.d[b]);
        m = row.m ? _cvtsh_ss(row.m[b]) : 0.0f;
      }
      const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
      const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(halves[h]));
      const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(halves[h], 1));
      float* dst = out + b * kBlock + 16 * h;
      _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lo), dv), mv));
      _mm256_storeu_ps(dst + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(hi), dv), mv));
    }
  }
}

template <int QT>
LANGRT_AVX2 void dequantize_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k, float* out,
                                 int64_t out_stride) {
  for (int64_t n = n0; n < n1; ++n) dequantize_row<QT>(w + n * row_bytes, k / kBlock, out + (n - n0) * out_stride);
}

}  // namespace

LANGRT_AVX2 void quantize_rows_avx2(const void* x, bool x_bf16, int64_t x_stride, int64_t rows, int64_t k, int16_t* q,
                                    float* d, float* s) {
  const int64_t blocks = k / kBlock;
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      __m256 v[4];
      __m256 amax = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = load8(x, x_bf16, r * x_stride + b * kBlock + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, v[i]));
      }
      const float top = hmax(amax);
      const __m256 inverse = _mm256_set1_ps(top > 0.0f ? kQMax / top : 0.0f);
      __m256i ints[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 scaled = _mm256_round_ps(_mm256_mul_ps(v[i], inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        ints[i] = _mm256_cvtps_epi32(scaled);
      }
      const int32_t sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(ints[0], ints[1]), _mm256_add_epi32(ints[2], ints[3])));
      // packs works within 128-bit lanes: the permute puts the four groups of 4 back in order.
      int16_t* out = q + r * k + b * kBlock;
      for (int half = 0; half < 2; ++half) {
        const __m256i packed = _mm256_packs_epi32(ints[2 * half], ints[2 * half + 1]);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * half), _mm256_permute4x64_epi64(packed, 0xD8));
      }
      const float scale = top / kQMax;
      d[r * blocks + b] = scale;
      s[r * blocks + b] = scale * static_cast<float>(sum);
    }
  }
}

LANGRT_AVX2 void dot_rows_avx2(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                               const QuantizedRows& x, int64_t m0, int64_t m1, const OutRows& out) {
  switch (qtype) {
    case kQ4_0: return dot_rows<kQ4_0>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ4_1: return dot_rows<kQ4_1>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ8_0: return dot_rows<kQ8_0>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ4_K: return dot_rows<kQ4_K>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ6_K: return dot_rows<kQ6_K>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ5_0: return dot_rows<kQ5_0>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ5_1: return dot_rows<kQ5_1>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ5_K: return dot_rows<kQ5_K>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ3_K: return dot_rows<kQ3_K>(w, row_bytes, n0, n1, x, m0, m1, out);
    case kQ2_K: return dot_rows<kQ2_K>(w, row_bytes, n0, n1, x, m0, m1, out);
    default: return;
  }
}

LANGRT_AVX2 void dequantize_rows_avx2(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k,
                                     float* out, int64_t out_stride) {
  switch (qtype) {
    case kQ4_0: return dequantize_rows<kQ4_0>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ4_1: return dequantize_rows<kQ4_1>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ8_0: return dequantize_rows<kQ8_0>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ4_K: return dequantize_rows<kQ4_K>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ6_K: return dequantize_rows<kQ6_K>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ5_0: return dequantize_rows<kQ5_0>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ5_1: return dequantize_rows<kQ5_1>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ5_K: return dequantize_rows<kQ5_K>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ3_K: return dequantize_rows<kQ3_K>(w, row_bytes, n0, n1, k, out, out_stride);
    case kQ2_K: return dequantize_rows<kQ2_K>(w, row_bytes, n0, n1, k, out, out_stride);
    default: return;
  }
}

}  // namespace langrt_quant

#endif  // __x86_64__
