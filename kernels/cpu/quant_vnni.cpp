// 4- and 5-bit blocks (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K) times int16 activations on AVX512-VNNI CPUs (AMD Zen 4 and
// later, Intel Ice Lake / Sapphire Rapids and later), 16 weight rows at a time, one per int32 lane.
//
// Why: quant_avx2.cpp spreads a block's 32 products over 8 lanes and pays a conversion and an FMA
// per block and row to scale them (its scale differs per block), so each activation row costs
// about as much as the weights' decoding, and a decoding pass of 2-9 rows (a request and its
// drafts) went to the bf16 tiles (quant_bf16.cpp) instead. Here lane j holds weight row j: a
// block's products for 16 rows sum in one register with no shuffles, and the scale is applied
// once per block for all 16. Each row's 16 quant bytes are moved into the lanes once (a 16 x 4
// dword transpose) and serve every activation row. A single row is faster here too, so on these
// CPUs every pass of 4-bit blocks through quant_linear runs here, and a row's bits do not depend
// on how many rows its pass has.
//
// The products are VPDPBUSD's (unsigned bytes times signed bytes, 4 per lane): an activation's
// int16 q = 256 * hi + lo (lo in [0, 255], hi in [-128, 127]) multiplies the weight's nibble w in
// [0, 15] as lo * w (lo unsigned, w signed) plus 256 * (w * hi) (w unsigned, hi signed), so the
// integer sums are exactly quant_avx2.cpp's. Every lane computes the same operations in the same
// order whatever the number of activation rows, so a row's result does not depend on the others.
//
// Like quant_avx2.cpp, the functions carry their instruction set as a target attribute and are
// called only where the CPU reports it (kernels/cpu/quant.py).
#include "quant_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <vector>

#define LANGRT_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c")))

namespace langrt_quant {
namespace {

constexpr int kLanes = 16;  // weight rows per tile
constexpr int kRows = 4;    // activation rows whose sums stay in registers (8 measured slower: they spill)

// Weight rows `rows` (16 pointers), the 16 bytes of nibbles at `offset`: T[t] lane j = bytes 4t ..
// 4t + 3 of row j's.
LANGRT_VNNI inline void gather(const uint8_t* const* rows, int64_t offset, __m512i T[4]) {
  __m512i z[4];  // z[a]: rows 4a .. 4a + 3, one per 128-bit lane
  for (int a = 0; a < 4; ++a) {
    const uint8_t* const* r = rows + 4 * a;
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r[0] + offset)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[1] + offset)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[2] + offset)), 2);
    z[a] = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r[3] + offset)), 3);
  }
  // dword t of rows 0-7 then dword t + 1 of rows 0-7, from two registers of 4 rows
  const __m512i even = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(2));
  const __m512i p01 = _mm512_permutex2var_epi32(z[0], even, z[1]), p23 = _mm512_permutex2var_epi32(z[0], odd, z[1]);
  const __m512i q01 = _mm512_permutex2var_epi32(z[2], even, z[3]), q23 = _mm512_permutex2var_epi32(z[2], odd, z[3]);
  T[0] = _mm512_shuffle_i64x2(p01, q01, _MM_SHUFFLE(1, 0, 1, 0));
  T[1] = _mm512_shuffle_i64x2(p01, q01, _MM_SHUFFLE(3, 2, 3, 2));
  T[2] = _mm512_shuffle_i64x2(p23, q23, _MM_SHUFFLE(1, 0, 1, 0));
  T[3] = _mm512_shuffle_i64x2(p23, q23, _MM_SHUFFLE(3, 2, 3, 2));
}

LANGRT_VNNI inline __m512i bcast4(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Round to bfloat16, nearest even (finite values), as float_to_bf16_bits.
LANGRT_VNNI inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

// Halves from 16 rows, lane-major: dst[c * 16 + j] = float(src[j][c]) for the first `count` (<= 16)
// columns c. Each row's 16 halves are 8 dwords: a 16 x 8 dword transpose puts dword p of every
// row in one register, whose low and high halves are columns 2p and 2p + 1.
LANGRT_VNNI inline void halves_by_lane(const uint16_t* const* src, int count, float* dst) {
  const __mmask16 take = static_cast<__mmask16>((1u << count) - 1);
  __m512i z[8];  // z[a]: rows 2a and 2a + 1, 8 dwords each
  for (int a = 0; a < 8; ++a) {
    const __m256i first = _mm256_maskz_loadu_epi16(take, src[2 * a]);
    z[a] = _mm512_inserti64x4(_mm512_castsi256_si512(first), _mm256_maskz_loadu_epi16(take, src[2 * a + 1]), 1);
  }
  // rows 4a .. 4a + 3: dwords 0-3 (lo) and 4-7 (hi), 4 rows per dword
  const __m512i lo_idx = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
  const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(4));
  __m512i four[8];  // four[2a]: rows 4a.., dwords 0-3; four[2a + 1]: dwords 4-7
  for (int a = 0; a < 4; ++a) {
    four[2 * a] = _mm512_permutex2var_epi32(z[2 * a], lo_idx, z[2 * a + 1]);
    four[2 * a + 1] = _mm512_permutex2var_epi32(z[2 * a], hi_idx, z[2 * a + 1]);
  }
  // rows 8h .. 8h + 7: dword pairs (0, 1), (2, 3) from dwords 0-3; (4, 5), (6, 7) from 4-7
  const __m512i first_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second_idx = _mm512_add_epi32(first_idx, _mm512_set1_epi32(8));
  __m512i eight[8];  // eight[4h + q]: rows 8h .. 8h + 7, dwords 2q and 2q + 1
  for (int h = 0; h < 2; ++h) {
    for (int half = 0; half < 2; ++half) {
      const __m512i a = four[4 * h + half], b = four[4 * h + 2 + half];
      eight[4 * h + 2 * half] = _mm512_permutex2var_epi32(a, first_idx, b);
      eight[4 * h + 2 * half + 1] = _mm512_permutex2var_epi32(a, second_idx, b);
    }
  }
  for (int q = 0; q < 4; ++q) {
    for (int e = 0; e < 2; ++e) {  // dword 2q + e of all 16 rows
      const int p = 2 * q + e;
      if (2 * p >= count) return;
      const __m512i all = e == 0 ? _mm512_shuffle_i64x2(eight[q], eight[4 + q], _MM_SHUFFLE(1, 0, 1, 0))
                                 : _mm512_shuffle_i64x2(eight[q], eight[4 + q], _MM_SHUFFLE(3, 2, 3, 2));
      _mm512_storeu_ps(dst + 2 * p * kLanes, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(all)));
      if (2 * p + 1 < count) {
        const __m512i high = _mm512_srli_epi32(all, 16);
        _mm512_storeu_ps(dst + (2 * p + 1) * kLanes, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(high)));
      }
    }
  }
}

// The tile's per-block scales and offsets, lane-major: d[b * 16 + j], m[b * 16 + j] for row j
// (Q4_0: m = -8 d, Q5_0: -16 d, their offsets as quant_avx2.cpp's prepare computes them).
template <int QT>
LANGRT_VNNI void tile_scales(const uint8_t* const* rows, int64_t blocks, float* d, float* m) {
  RowLayout layout[kLanes];
  for (int j = 0; j < kLanes; ++j) layout[j] = row_layout(QT, rows[j], blocks);
  if constexpr (k_quant(QT)) {
    for (int j = 0; j < kLanes; ++j) {
      for (int64_t b = 0; b < blocks; ++b) {
        d[b * kLanes + j] = k_scale(QT, layout[j], b);
        m[b * kLanes + j] = k_offset(QT, layout[j], b);
      }
    }
  } else {
    for (int64_t b = 0; b < blocks; b += 16) {
      const int count = static_cast<int>(std::min<int64_t>(16, blocks - b));
      const uint16_t* src[kLanes];
      for (int j = 0; j < kLanes; ++j) src[j] = layout[j].d + b;
      halves_by_lane(src, count, d + b * kLanes);
      if constexpr (has_min(QT)) {
        for (int j = 0; j < kLanes; ++j) src[j] = layout[j].m + b;
        halves_by_lane(src, count, m + b * kLanes);
      } else {
        for (int64_t i = b * kLanes; i < (b + count) * kLanes; i += kLanes) {
          _mm512_storeu_ps(m + i, _mm512_mul_ps(_mm512_loadu_ps(d + i), _mm512_set1_ps(QT == kQ5_0 ? -16.0f : -8.0f)));
        }
      }
    }
  }
}

struct SplitRows {
  const uint8_t* lo;  // [rows, k]
  const int8_t* hi;   // [rows, k]
  const float* d;     // [rows, k / 32]
  const float* s;     // [rows, k / 32]
  int64_t k;
};

constexpr int64_t kAheadTiles = 2;

// Bytes to fetch ahead, spread over a tile's blocks.
struct Prefetch {
  const char* start;
  int64_t bytes;
  int64_t blocks;

  LANGRT_VNNI void at(int64_t b) const {
    const int64_t per_block = (bytes + blocks - 1) / blocks;
    for (int64_t byte = b * per_block; byte < std::min(bytes, (b + 1) * per_block); byte += 64) {
      _mm_prefetch(start + byte, _MM_HINT_T1);
    }
  }
};

// A tile's block b: its 16 rows' weights (lo[t]: weights 4t .. 4t + 3 of each lane's row, hi[t]:
// 16 + 4t .. 16 + 4t + 3), scales and offsets.
struct Unpacked {
  __m512i lo[4], hi[4];
  __m512 d, m;
};

// Every byte of dword i of each 128-bit lane: byte c of that dword (a vpshufb index).
LANGRT_VNNI inline __m512i byte_of_dword(int c) {
  return _mm512_add_epi8(_mm512_set1_epi8(static_cast<char>(c)), _mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0));
}

// 5-bit blocks: 16 added to the weights whose fifth bit is set. Lane j's dword of `bits` is row
// j's 32 fifth bits (bit i: weight i); byte e of lo[t] is weight 4t + e, whose bit is in byte t / 2
// at 4 (t % 2) + e, and of hi[t] weight 16 + 4t + e, in byte 2 + t / 2 at the same place.
LANGRT_VNNI inline void add_fifth_bits(__m512i bits, Unpacked& w) {
  const __m512i sixteen = _mm512_set1_epi8(16);
  for (int t = 0; t < 4; ++t) {
    const __m512i place = _mm512_set1_epi32(t % 2 ? static_cast<int>(0x80402010u) : 0x08040201);
    const __mmask64 low = _mm512_test_epi8_mask(_mm512_shuffle_epi8(bits, byte_of_dword(t / 2)), place);
    const __mmask64 high = _mm512_test_epi8_mask(_mm512_shuffle_epi8(bits, byte_of_dword(2 + t / 2)), place);
    w.lo[t] = _mm512_mask_add_epi8(w.lo[t], low, w.lo[t], sixteen);
    w.hi[t] = _mm512_mask_add_epi8(w.hi[t], high, w.hi[t], sixteen);
  }
}

// kFive: 5-bit blocks (Q5_0, Q5_1, Q5_K: 4 bytes of fifth bits, then the nibbles), else 4-bit.
template <bool kFive>
LANGRT_VNNI inline Unpacked unpack(const uint8_t* const* rows, const float* d, const float* m, int64_t b) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  constexpr int64_t kQuantBytes = kFive ? 20 : 16;
  __m512i T[4];
  gather(rows, kQuantBytes * b + (kFive ? 4 : 0), T);
  Unpacked w;
  for (int t = 0; t < 4; ++t) {
    w.lo[t] = _mm512_and_si512(T[t], low4);
    w.hi[t] = _mm512_and_si512(_mm512_srli_epi16(T[t], 4), low4);
  }
  if constexpr (kFive) {
    alignas(64) int32_t bits[kLanes];
    for (int j = 0; j < kLanes; ++j) __builtin_memcpy(bits + j, rows[j] + kQuantBytes * b, 4);
    add_fifth_bits(_mm512_load_si512(bits), w);
  }
  w.d = _mm512_loadu_ps(d + b * kLanes);
  w.m = _mm512_loadu_ps(m + b * kLanes);
  return w;
}

// Activation row `row`, block b, against the tile's 16 rows: into its sums and offsets.
LANGRT_VNNI inline void row_block(const Unpacked& w, const SplitRows& x, int64_t row, int64_t b, __m512& acc,
                                  __m512& offsets) {
  const int64_t at = row * x.k + b * kBlock;
  __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
  for (int t = 0; t < 4; ++t) {
    lo = _mm512_dpbusd_epi32(lo, bcast4(x.lo + at + 4 * t), w.lo[t]);
    lo = _mm512_dpbusd_epi32(lo, bcast4(x.lo + at + 16 + 4 * t), w.hi[t]);
    hi = _mm512_dpbusd_epi32(hi, w.lo[t], bcast4(x.hi + at + 4 * t));
    hi = _mm512_dpbusd_epi32(hi, w.hi[t], bcast4(x.hi + at + 16 + 4 * t));
  }
  const __m512i sum = _mm512_add_epi32(lo, _mm512_slli_epi32(hi, 8));
  const int64_t xb = row * (x.k / kBlock) + b;
  const __m512 scale = _mm512_mul_ps(w.d, _mm512_set1_ps(x.d[xb]));
  acc = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), acc);
  offsets = _mm512_fmadd_ps(w.m, _mm512_set1_ps(x.s[xb]), offsets);
}

LANGRT_VNNI inline void store_row(const OutRows& out, int64_t row, int64_t n0, int valid, __m512 acc, __m512 offsets) {
  const __mmask16 keep = static_cast<__mmask16>((1u << valid) - 1);
  const __m512 v = _mm512_add_ps(acc, offsets);
  if (out.bf16) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out.data) + row * out.stride + n0, keep, to_bf16(v));
  } else {
    _mm512_mask_storeu_ps(static_cast<float*>(out.data) + row * out.stride + n0, keep, v);
  }
}

// RM activation rows (m0 ..) against the tile's 16 weight rows (n0 ..; the first `valid` stored),
// their sums in registers.
template <bool kFive, int RM>
LANGRT_VNNI void dot_tile(const uint8_t* const* rows, const float* d, const float* m, const SplitRows& x, int64_t m0,
                          int64_t n0, int valid, const OutRows& out, const Prefetch& ahead) {
  __m512 acc[RM], offsets[RM];
  for (int r = 0; r < RM; ++r) acc[r] = offsets[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.k / kBlock; ++b) {
    ahead.at(b);
    const Unpacked w = unpack<kFive>(rows, d, m, b);
    for (int r = 0; r < RM; ++r) row_block(w, x, m0 + r, b, acc[r], offsets[r]);
  }
  for (int r = 0; r < RM; ++r) store_row(out, m0 + r, n0, valid, acc[r], offsets[r]);
}

// More than kRows rows (up to kMaxRows): the same operations, the sums kept in memory, so each
// block is unpacked once for all the rows (passes over kRows rows at a time unpacked it per pass).
constexpr int64_t kMaxRows = 64;  // quant_linear.cpp's row chunk

template <bool kFive>
LANGRT_VNNI void dot_tile_rows(const uint8_t* const* rows, const float* d, const float* m, const SplitRows& x,
                               int64_t m0, int64_t m1, int64_t n0, int valid, const OutRows& out,
                               const Prefetch& ahead) {
  __m512 acc[kMaxRows], offsets[kMaxRows];
  for (int64_t r = m0; r < m1; ++r) acc[r - m0] = offsets[r - m0] = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.k / kBlock; ++b) {
    ahead.at(b);
    const Unpacked w = unpack<kFive>(rows, d, m, b);
    for (int64_t r = m0; r < m1; ++r) row_block(w, x, r, b, acc[r - m0], offsets[r - m0]);
  }
  for (int64_t r = m0; r < m1; ++r) store_row(out, r, n0, valid, acc[r - m0], offsets[r - m0]);
}

template <int QT>
LANGRT_VNNI void dot_rows(const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const SplitRows& x, int64_t m0,
                          int64_t m1, const OutRows& out) {
  constexpr bool kFive = quant_bytes(QT) == 20;
  const int64_t blocks = x.k / kBlock;
  std::vector<float> d(blocks * kLanes), m(blocks * kLanes);
  for (int64_t n = n0; n < n1; n += kLanes) {
    const int valid = static_cast<int>(std::min<int64_t>(kLanes, n1 - n));
    const uint8_t* rows[kLanes];
    // a short tile repeats its last row
    for (int j = 0; j < kLanes; ++j) rows[j] = w + (n + std::min(j, valid - 1)) * row_bytes;
    // the tile after next, fetched a part per block while this one computes (a decode's weights
    // come from memory, and the 16 rows' blocks are read across the rows, which the CPU's own
    // prefetchers follow poorly)
    const int64_t far = n + kAheadTiles * kLanes;
    const Prefetch ahead{reinterpret_cast<const char*>(w + far * row_bytes),
                         far < n1 ? std::min<int64_t>(kLanes, n1 - far) * row_bytes : 0, blocks};
    tile_scales<QT>(rows, blocks, d.data(), m.data());
    if (m1 - m0 > kRows) {
      for (int64_t r = m0; r < m1; r += kMaxRows) {
        dot_tile_rows<kFive>(rows, d.data(), m.data(), x, r, std::min(m1, r + kMaxRows), n, valid, out, ahead);
      }
      continue;
    }
    switch (m1 - m0) {
      case 4: dot_tile<kFive, 4>(rows, d.data(), m.data(), x, m0, n, valid, out, ahead); break;
      case 3: dot_tile<kFive, 3>(rows, d.data(), m.data(), x, m0, n, valid, out, ahead); break;
      case 2: dot_tile<kFive, 2>(rows, d.data(), m.data(), x, m0, n, valid, out, ahead); break;
      case 1: dot_tile<kFive, 1>(rows, d.data(), m.data(), x, m0, n, valid, out, ahead); break;
      default: break;
    }
  }
}

}  // namespace

bool vnni_type(int qtype) {
  return qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ4_K || qtype == kQ5_0 || qtype == kQ5_1 || qtype == kQ5_K;
}

void split_rows(const int16_t* q, int64_t count, uint8_t* lo, int8_t* hi) {
  for (int64_t i = 0; i < count; ++i) {
    lo[i] = static_cast<uint8_t>(q[i] & 0xFF);
    hi[i] = static_cast<int8_t>(q[i] >> 8);
  }
}

LANGRT_VNNI void dot_rows_vnni(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1,
                               const QuantizedRows& x, const uint8_t* lo, const int8_t* hi, int64_t m0, int64_t m1,
                               const OutRows& out) {
  const SplitRows split{lo, hi, x.d, x.s, x.k};
  switch (qtype) {
    case kQ4_0: return dot_rows<kQ4_0>(w, row_bytes, n0, n1, split, m0, m1, out);
    case kQ4_1: return dot_rows<kQ4_1>(w, row_bytes, n0, n1, split, m0, m1, out);
    case kQ4_K: return dot_rows<kQ4_K>(w, row_bytes, n0, n1, split, m0, m1, out);
    case kQ5_0: return dot_rows<kQ5_0>(w, row_bytes, n0, n1, split, m0, m1, out);
    case kQ5_1: return dot_rows<kQ5_1>(w, row_bytes, n0, n1, split, m0, m1, out);
    case kQ5_K: return dot_rows<kQ5_K>(w, row_bytes, n0, n1, split, m0, m1, out);
    default: return;
  }
}

}  // namespace langrt_quant

#endif  // __x86_64__
