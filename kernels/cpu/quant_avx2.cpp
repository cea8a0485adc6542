// quant_kernels.h on AVX2 + FMA + F16C, which every x86-64 CPU since 2013-2015 has (Intel
// Haswell, AMD Zen): a block's 32 weights widened to int16 multiply 32 int16 activations in two
// madds, and one FMA per block applies its scales. Every function carries its instruction set as a target attribute, so the rest of the
// library is built for the baseline and runs anywhere; quant_linear.cpp calls these only where
// the CPU reports AVX2, FMA and F16C.
#include "quant_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#define LANGRT_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace langrt_quant {
namespace {

LANGRT_AVX2 inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

LANGRT_AVX2 inline __m256 load8(const void* x, bool bf16, int64_t i) {
  if (!bf16) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

LANGRT_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
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

// One weight block as 32 int16: w0 holds weights 0..15, w1 16..31 (for Q4, GGML puts them in
// the low and the high nibbles of the 16 bytes); its scale d, and the per-block term that
// multiplies the activation block's s (Q4_0: -8 d, Q4_1: m, Q8_0: none).
struct Block {
  __m256i w0, w1;
  float d, offset;
};

template <int QT>
LANGRT_AVX2 inline Block decode(const uint8_t* blk) {
  Block b;
  b.d = half_at(blk);
  if constexpr (QT == kQ8_0) {
    b.w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    b.w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
    b.offset = 0.0f;
  } else {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (QT == kQ4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    b.w0 = _mm256_cvtepu8_epi16(_mm_and_si128(q, mask));
    b.w1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(q, 4), mask));
    b.offset = QT == kQ4_1 ? half_at(blk + 2) : -8.0f * b.d;
  }
  return b;
}

// sum of w[i] * x[i] over a block, as 8 int32 partial sums (each at most 32 * 128 * 32767 < 2^31).
LANGRT_AVX2 inline __m256i dot32(const Block& w, const int16_t* x) {
  const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16));
  return _mm256_add_epi32(_mm256_madd_epi16(w.w0, x0), _mm256_madd_epi16(w.w1, x1));
}

// RN weight rows (n0 ..) against RM activation rows (m0 ..): RN * RM independent sums, so the
// FMAs of one block do not wait on each other, and each decoded weight block and loaded
// activation block serves several products.
template <int QT, int RN, int RM>
LANGRT_AVX2 void dot_tile(const uint8_t* w, int64_t row_bytes, int64_t n0, const QuantizedRows& x, int64_t m0,
                          const OutRows& out) {
  const int64_t blocks = x.k / kBlock, bytes = block_bytes(QT);
  __m256 acc[RN][RM];
  float extra[RN][RM];
  for (int i = 0; i < RN; ++i) {
    for (int j = 0; j < RM; ++j) {
      acc[i][j] = _mm256_setzero_ps();
      extra[i][j] = 0.0f;
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    Block wb[RN];
    for (int i = 0; i < RN; ++i) wb[i] = decode<QT>(w + (n0 + i) * row_bytes + b * bytes);
    for (int j = 0; j < RM; ++j) {
      const int64_t row = (m0 + j) * blocks + b;
      const int16_t* xb = x.q + (m0 + j) * x.k + b * kBlock;
      for (int i = 0; i < RN; ++i) {
        const __m256 dot = _mm256_cvtepi32_ps(dot32(wb[i], xb));
        acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(wb[i].d * x.d[row]), dot, acc[i][j]);
        if constexpr (QT != kQ8_0) extra[i][j] += wb[i].offset * x.s[row];
      }
    }
  }
  for (int i = 0; i < RN; ++i) {
    for (int j = 0; j < RM; ++j) store_out(out, m0 + j, n0 + i, hsum(acc[i][j]) + extra[i][j]);
  }
}

// Tiles of 2 weight rows x 4 activation rows while 4 rows are left, then 4 x 1 (a decode's
// single row), then 1 x 1.
template <int QT>
LANGRT_AVX2 void dot_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                          int64_t m0, int64_t m1, const OutRows& out) {
  int64_t m = m0;
  for (; m + 4 <= m1; m += 4) {
    int64_t n = n0;
    for (; n + 2 <= n1; n += 2) dot_tile<QT, 2, 4>(w, row_bytes, n, x, m, out);
    for (; n < n1; ++n) dot_tile<QT, 1, 4>(w, row_bytes, n, x, m, out);
  }
  for (; m < m1; ++m) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) dot_tile<QT, 4, 1>(w, row_bytes, n, x, m, out);
    for (; n < n1; ++n) dot_tile<QT, 1, 1>(w, row_bytes, n, x, m, out);
  }
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
    default: return;
  }
}

}  // namespace langrt_quant

#endif  // __x86_64__
