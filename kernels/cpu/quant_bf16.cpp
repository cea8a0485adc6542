// A few bfloat16 rows times quantized weights, on AVX512-BF16 CPUs (AMD Zen 4 and later, Intel
// Cooper Lake / Sapphire Rapids): each tile of weight rows is dequantized once into a small buffer
// (the values QuantizedWeight.dequantize(torch.bfloat16) gives, bit for bit) and every activation
// row takes its dot products from it with vdpbf16ps, 32 products per instruction.
//
// Why: a decode pass of several rows (a batch of a few requests, or one request with its drafts)
// used the packed bfloat16 copy of the weights, reading 2 bytes per weight where the blocks are
// 0.6; and the int16 block kernel (quant_avx2.cpp), exact but ~5 instructions per 32 products per
// row, grows by a whole step's compute with each row. Here the dequantization is paid once per
// tile and shared by the rows, so a pass of up to ~16 rows costs little more than reading the
// blocks. The values are the bfloat16 copy's, so these passes round as they did on the copy.
//
// Like quant_avx2.cpp, the functions carry their instruction set as a target attribute and are
// called only where the CPU reports it (kernels/cpu/quant.py).
#include "quant_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "lane_sums.h"

#define LANGRT_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c")))

namespace langrt_quant {
namespace {

constexpr int kTileRows = 4;  // weight rows dequantized together
constexpr int kTileCols = 4;  // activation rows per pass over the tile (16 accumulators)
static_assert(kTileRows * kTileCols == 16, "dot_tile sums its 16 accumulators at once (sum_each)");

// Block b of a row as 32 bfloat16: w = d * q + m, rounded once from float32 (as the scalar
// dequantize: product, then sum, then round to nearest even). A 4-bit block has 16 values: they
// are computed once and its nibbles look them up (vpermw).
template <int QT>
LANGRT_BF16 inline __m512i dequantize_block(const RowLayout& row, int64_t b) {
  const uint8_t* quants = row.quants + b * quant_bytes(QT);
  if constexpr (QT == kQ8_0) {
    const __m512 d0 = _mm512_set1_ps(_cvtsh_ss(row.d[b])), d1 = d0;
    const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants))));
    const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants + 16))));
    const __m512 zero = _mm512_setzero_ps();  // + 0, as the scalar path adds m = 0
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_add_ps(_mm512_mul_ps(d1, q1), zero),
                                                         _mm512_add_ps(_mm512_mul_ps(d0, q0), zero)));
  } else {
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 d, m, q = levels;
    if constexpr (QT == kQ4_K) {
      d = _mm512_set1_ps(k_scale(QT, row, b));
      m = _mm512_set1_ps(k_offset(QT, row, b));
    } else {
      d = _mm512_set1_ps(_cvtsh_ss(row.d[b]));
      m = QT == kQ4_1 ? _mm512_set1_ps(_cvtsh_ss(row.m[b])) : _mm512_setzero_ps();
      if constexpr (QT == kQ4_0) q = _mm512_sub_ps(levels, _mm512_set1_ps(8.0f));
    }
    const __m256bh values = _mm512_cvtneps_pbh(_mm512_add_ps(_mm512_mul_ps(d, q), m));
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), _mm_and_si128(packed, mask));
    return _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(nibbles), _mm512_castsi256_si512(reinterpret_cast<__m256i>(values)));
  }
}

// A block's fp16 scale (or minimum), broadcast, then widened.
LANGRT_BF16 inline __m512 widened(const uint16_t* half) {
  return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(*half)));
}

// A Q4_0 / Q4_1 row's blocks as bfloat16 into dst, two blocks at a time: their 16 values each
// (d * q + m: d * q is exact in float32, so one fused rounding equals the scalar path's product
// then sum) in one 32-entry table, looked up by both blocks' nibbles (vpermw). Same values as
// dequantize_block.
template <int QT>
LANGRT_BF16 void dequantize_row_4bit(const RowLayout& row, int64_t blocks, uint16_t* dst) {
  const __m512 levels = QT == kQ4_0 ? _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                                    : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m512i second = _mm512_set1_epi16(16);  // the second block's values: words 16-31 of the table
  for (int64_t i = 0; i < blocks; i += 2) {
    const int64_t j = std::min(i + 1, blocks - 1);  // an odd last block: its own table twice
    const __m512 m_first = QT == kQ4_1 ? widened(row.m + i) : _mm512_setzero_ps();
    const __m512 m_next = QT == kQ4_1 ? widened(row.m + j) : _mm512_setzero_ps();
    const __m512 first = _mm512_fmadd_ps(widened(row.d + i), levels, m_first);
    const __m512 next = _mm512_fmadd_ps(widened(row.d + j), levels, m_next);
    const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(next, first));
    // the two blocks' 32 bytes: low nibbles are weights 0-15, high nibbles 16-31
    const uint8_t* quants = row.quants + i * 16;
    const __m256i packed = j > i ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants))
                                 : _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants)));
    const __m256i lo = _mm256_and_si256(packed, low4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    const __m512i a = _mm512_cvtepu8_epi16(_mm256_permute2x128_si256(lo, hi, 0x20));
    _mm512_storeu_si512(dst + i * kBlock, _mm512_permutexvar_epi16(a, table));
    if (j > i) {
      const __m512i b = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_permute2x128_si256(lo, hi, 0x31)), second);
      _mm512_storeu_si512(dst + j * kBlock, _mm512_permutexvar_epi16(b, table));
    }
  }
}

// RM activation rows (x's first, x_stride apart) against the `rows` dequantized weight rows in
// `tile` (k each); the first `stored` of them (all by default) go to out's rows m0 ...
template <int RM>
LANGRT_BF16 void dot_tile(const uint16_t* tile, int rows, int64_t k, const uint16_t* x, int64_t x_stride, int64_t m0,
                          int64_t n0, const OutRows& out, int stored = RM) {
  __m512 acc[kTileRows][RM];
  for (int i = 0; i < kTileRows; ++i) {
    for (int j = 0; j < RM; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < k; c += kBlock) {
    __m512bh w[kTileRows];
    for (int i = 0; i < kTileRows; ++i) w[i] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(tile + i * k + c));
    for (int j = 0; j < RM; ++j) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + j * x_stride + c));
      for (int i = 0; i < kTileRows; ++i) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, w[i]);
    }
  }
  __m512 all[kTileRows * kTileCols];  // acc[i][j] at i * kTileCols + j, the others zero
  for (int i = 0; i < kTileRows; ++i) {
    for (int j = 0; j < kTileCols; ++j) all[i * kTileCols + j] = j < RM ? acc[i][j] : _mm512_setzero_ps();
  }
  alignas(64) float sums[kTileRows * kTileCols];
  _mm512_store_ps(sums, langrt_lanes::sum_each(all));  // each row's sums independent of the others
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < stored; ++j) store_out(out, m0 + j, n0 + i, sums[i * kTileCols + j]);
  }
}

// The types dequantize_block (or dequantize_row_4bit) takes; the others (Q5_0, Q5_1, Q2_K, Q3_K,
// Q5_K, Q6_K) are dequantized by the plain C++ loop, the same values more slowly than reading the
// bfloat16 copy, so langrt.model.quant.FLY_TYPES sends their passes elsewhere.
constexpr bool vector_dequantized(int qtype) {
  return qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ8_0 || qtype == kQ4_K;
}

template <int QT>
LANGRT_BF16 void dense_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const uint16_t* x,
                            int64_t x_stride, int64_t k, int64_t m0, int64_t m1, const OutRows& out) {
  const int64_t blocks = k / kBlock;
  std::vector<uint16_t> tile(kTileRows * k, 0);  // a last, short tile's other rows are computed, not stored
  // Three rows left over go through the 4-row kernel beside a row of zeros (each row's sums are
  // independent of the others): measured, dot_tile<3> took ~1.5x dot_tile<4>'s time.
  const int64_t full = m0 + (m1 - m0) / kTileCols * kTileCols;
  std::vector<uint16_t> padded(m1 - full == 3 ? kTileCols * k : 0, 0);
  for (int64_t j = 0; !padded.empty() && j < 3; ++j) std::copy_n(x + (full + j) * x_stride, k, padded.data() + j * k);
  for (int64_t n = n0; n < n1; n += kTileRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, n1 - n));
    for (int i = 0; i < rows; ++i) {
      const RowLayout row = row_layout(QT, w + (n + i) * row_bytes, blocks);
      if constexpr (QT == kQ4_0 || QT == kQ4_1) {
        dequantize_row_4bit<QT>(row, blocks, tile.data() + i * k);
      } else if constexpr (!vector_dequantized(QT)) {  // the scalar dequantization's values, bit for bit
        dequantize_rows_scalar(QT, w + (n + i) * row_bytes, row_bytes, 0, 1, k, OutRows{tile.data() + i * k, k, true});
      } else {
        for (int64_t b = 0; b < blocks; ++b) _mm512_storeu_si512(tile.data() + i * k + b * kBlock, dequantize_block<QT>(row, b));
      }
    }
    // the next tile's blocks, fetched while this one's products are taken
    const uint8_t* next = w + (n + kTileRows) * row_bytes;
    const int64_t ahead = n + kTileRows < n1 ? std::min<int64_t>(kTileRows, n1 - n - kTileRows) * row_bytes : 0;
    for (int64_t b = 0; b < ahead; b += 64) _mm_prefetch(reinterpret_cast<const char*>(next + b), _MM_HINT_T0);
    int64_t m = m0;
    for (; m + kTileCols <= m1; m += kTileCols) dot_tile<kTileCols>(tile.data(), rows, k, x + m * x_stride, x_stride, m, n, out);
    switch (m1 - m) {
      case 3: dot_tile<kTileCols>(tile.data(), rows, k, padded.data(), k, m, n, out, 3); break;
      case 2: dot_tile<2>(tile.data(), rows, k, x + m * x_stride, x_stride, m, n, out); break;
      case 1: dot_tile<1>(tile.data(), rows, k, x + m * x_stride, x_stride, m, n, out); break;
      default: break;
    }
  }
}

}  // namespace

LANGRT_BF16 void dense_rows_bf16(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                                 const uint16_t* x, int64_t x_stride, int64_t k, int64_t m0, int64_t m1,
                                 const OutRows& out) {
  switch (qtype) {
    case kQ4_0: return dense_rows<kQ4_0>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ4_1: return dense_rows<kQ4_1>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ8_0: return dense_rows<kQ8_0>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ4_K: return dense_rows<kQ4_K>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ6_K: return dense_rows<kQ6_K>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ5_0: return dense_rows<kQ5_0>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ5_1: return dense_rows<kQ5_1>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ5_K: return dense_rows<kQ5_K>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ3_K: return dense_rows<kQ3_K>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    case kQ2_K: return dense_rows<kQ2_K>(w, row_bytes, n0, n1, x, x_stride, k, m0, m1, out);
    default: return;
  }
}

}  // namespace langrt_quant

#endif  // __x86_64__
