// Matrix products on GGUF's quantized weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) without dequantizing
// them: each block's integers multiply the activations in integers, and the sum is scaled once.
//
// The activations are quantized to int16 per block of 32 (scale d = max|x| / 32767, and d * the
// sum of the block's values, which Q4_0's offset and Q4_1's minimum multiply). llama.cpp rounds
// them to int8 instead; that costs ~0.5% relative error per product, enough to flip the built-in
// model's first answer token where two are within 0.1 logit. With int16 the products stay within
// ~1e-4 of the dequantized weights' (the reference the tests hold them to), at one more multiply
// per 16 weights.
//
// The per-ISA code (quant_avx2.cpp, AVX2 + FMA + F16C; quant_scalar.cpp, plain C++) includes no
// torch header: its functions carry their instruction set as a target attribute, so the library
// is built without -m flags and loads on any x86-64 (or other) CPU; quant_linear.cpp picks the
// best implementation the CPU has at run time.
#pragma once

#include <cstdint>

namespace langrt_quant {

// GGML's type numbers.
enum QType : int {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14
};
constexpr int64_t kBlock = 32;  // weights per block, all types (K-quants: their 32-weight sub-blocks)

// Bytes per block of 32 weights in langrt's row layout (below). Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0
// take as many as GGUF. Q4_K and Q6_K (the bulk of Q4_K_M files) are repacked by repack_rows into
// rows near GGUF's size (super_bytes: Q4_K 148 bytes per 256 weights where GGUF takes 144, Q6_K
// 210 as GGUF), their sub-block scales kept as integers beside each super-block's fp16 d (and
// dmin) and multiplied out 8 at a time ahead of the dot products (packed_d / packed_m), so a decode
// step reads about the file's bytes. Q2_K, Q3_K and Q5_K are unpacked at load
// (langrt.model.kquants) into blocks of 32 with float32 scales; bytes per weight, GGUF -> here:
// Q5_K 0.69 -> 0.88, Q3_K 0.43 -> 0.63, Q2_K 0.33 -> 0.75 (its scale and minimum per 16 weights).
// All values are exactly GGUF's.
//
// 5-bit quants (Q5_0, Q5_1, Q5_K): 4 bytes of high bits (bit i: weight i's fifth bit), then 16
// bytes of nibbles as Q4's. Q3_K: 4 bytes of high bits, then 8 bytes of 2-bit lows (byte i holds
// weights i, i + 8, i + 16, i + 24 at bits 0, 2, 4, 6), q = low + 4 * high - 4. Q2_K: the 8
// bytes of 2-bit quants alone.
constexpr int64_t block_bytes(int qtype) {
  switch (qtype) {
    case kQ4_0: return 18;  // fp16 d, 16 bytes of nibbles: w = d * (q - 8)
    case kQ4_1: return 20;  // fp16 d, fp16 m, 16 bytes of nibbles: w = d * q + m
    case kQ5_0: return 22;  // fp16 d, 5-bit quants: w = d * (q - 16)
    case kQ5_1: return 24;  // fp16 d, fp16 m, 5-bit quants: w = d * q + m
    case kQ8_0: return 34;  // fp16 d, 32 int8: w = d * q
    case kQ2_K: return 24;  // 2-bit quants, two float d, two float m (weights 0-15, 16-31): w = d * q + m
    case kQ3_K: return 20;  // 3-bit quants, two float d (weights 0-15, 16-31): w = d * q
    case kQ5_K: return 28;  // float d, float m, 5-bit quants: w = d * q + m
    default: return 0;  // Q4_K, Q6_K: whole super-blocks (super_bytes)
  }
}

// Types stored as in GGUF, repacked by repack_rows (the K-quants are unpacked in Python).
constexpr bool gguf_sized(int qtype) {
  return qtype == kQ4_0 || qtype == kQ4_1 || qtype == kQ5_0 || qtype == kQ5_1 || qtype == kQ8_0;
}

// Q4_K and Q6_K: kept in super-blocks of 256 (langrt's layout of them, below), repacked by repack_rows.
constexpr bool packed_k(int qtype) { return qtype == kQ4_K || qtype == kQ6_K; }
constexpr int64_t kSuper = 256;
// Bytes per super-block of 256 weights in langrt's layout of Q4_K (8 blocks of 16 bytes of nibbles,
// fp16 d and dmin, 8 scales and 8 minimums of 6 bits in a byte each) and Q6_K (8 blocks of 24 bytes:
// 16 of low nibbles, 8 of high 2-bit pairs; fp16 d; 16 int8 scales).
constexpr int64_t super_bytes(int qtype) { return qtype == kQ4_K ? 148 : qtype == kQ6_K ? 210 : 0; }

// Bytes of a row of `blocks` blocks of 32 (a whole number of super-blocks for Q4_K and Q6_K); 0: unknown type.
constexpr int64_t row_bytes_of(int qtype, int64_t blocks) {
  return packed_k(qtype) ? (blocks % 8 == 0 ? blocks / 8 * super_bytes(qtype) : 0) : blocks * block_bytes(qtype);
}

constexpr bool k_quant(int qtype) { return qtype >= kQ2_K && qtype <= kQ6_K; }

// Types with a minimum (offset) per block, or (Q2_K) per 16 weights.
constexpr bool has_min(int qtype) {
  return qtype == kQ4_1 || qtype == kQ5_1 || qtype == kQ2_K || qtype == kQ4_K || qtype == kQ5_K;
}

// langrt's layout of a quantized weight row (repack_rows makes it from GGUF's blocks): the quants
// of all the row's blocks first (quant_bytes per block), then the blocks' scales d, then (the
// types with minimums) their minimums m; fp16 as in GGUF, float32 for the K-quants (Q6_K, Q3_K,
// Q2_K: two per block, one per 16 weights). The scales sit together, so the kernels convert and
// multiply them 8 at a time ahead of the dot products.
constexpr int64_t quant_bytes(int qtype) {
  switch (qtype) {
    case kQ8_0: return 32;
    case kQ6_K: return 24;
    case kQ5_0: case kQ5_1: case kQ5_K: return 20;
    case kQ3_K: return 12;
    case kQ2_K: return 8;
    default: return 16;
  }
}

// Scales per block: Q6_K's, Q3_K's and Q2_K's sub-blocks are 16 weights.
constexpr int64_t scales_per_block(int qtype) { return qtype == kQ6_K || qtype == kQ3_K || qtype == kQ2_K ? 2 : 1; }

struct RowLayout {
  const uint8_t* quants;
  const uint16_t* d;  // fp16 types; Q4_K, Q6_K: fp16 d per super-block
  const uint16_t* m;  // Q4_1, Q5_1; Q4_K: fp16 dmin per super-block
  const float* df;    // K-quants unpacked (Q2_K, Q3_K, Q5_K)
  const float* mf;    // Q5_K, Q2_K
  const uint8_t* sub = nullptr;    // Q4_K: 6-bit scale per block; Q6_K: int8 scale per 16 weights
  const uint8_t* sub_m = nullptr;  // Q4_K: 6-bit minimum per block
};

// langrt's rows of Q4_K: quants (16 bytes a block), d [supers], dmin [supers] (fp16), scales
// [blocks], minimums [blocks]; of Q6_K: quants (24 bytes a block), d [supers] (fp16), scales [2 blocks].
inline RowLayout packed_layout(int qtype, const uint8_t* row, int64_t blocks) {
  RowLayout r{};
  const int64_t supers = blocks / 8;
  r.quants = row;
  r.d = reinterpret_cast<const uint16_t*>(row + blocks * quant_bytes(qtype));
  r.m = qtype == kQ4_K ? r.d + supers : nullptr;
  r.sub = reinterpret_cast<const uint8_t*>(r.d + (qtype == kQ4_K ? 2 : 1) * supers);
  r.sub_m = qtype == kQ4_K ? r.sub + blocks : nullptr;
  return r;
}

inline RowLayout row_layout(int qtype, const uint8_t* row, int64_t blocks) {
  if (packed_k(qtype)) return packed_layout(qtype, row, blocks);
  RowLayout r{};
  const uint8_t* scales = row + blocks * quant_bytes(qtype);
  r.quants = row;
  r.d = reinterpret_cast<const uint16_t*>(scales);
  const bool k = k_quant(qtype), min = has_min(qtype);
  r.m = min && !k ? r.d + blocks : nullptr;
  r.df = reinterpret_cast<const float*>(scales);
  r.mf = min && k ? r.df + scales_per_block(qtype) * blocks : nullptr;
  return r;
}

// GGUF rows [rows, blocks * block_bytes] -> langrt's row layout, same size.
void repack_rows(int qtype, const uint8_t* gguf, uint8_t* out, int64_t rows, int64_t blocks);

// Activation rows quantized per block of 32: q = round(x / d) in [-32767, 32767],
// d = max|x| / 32767, s = d * sum(q) (what Q4_0's offset and Q4_1's minimum multiply).
constexpr float kQMax = 32767.0f;
struct QuantizedRows {
  const int16_t* q;  // [rows, k]
  const float* d;   // [rows, k / 32]
  const float* s;   // [rows, k / 32]
  int64_t k;
  const float* h = nullptr;  // Q2_K and (dot_rows_k_avx2) Q6_K: d * the sum of q over each 16, [rows, k / 16]
};

// h[2b + i] = d[b] * (the sum of q[32b + 16i ..][0 .. 16)), for `blocks` blocks of 32 (QuantizedRows::h).
void half_sums(const int16_t* q, const float* d, int64_t blocks, float* h);

// Output rows: out[m * stride + n], float32 or bfloat16 (rounded to nearest even).
struct OutRows {
  void* data;
  int64_t stride;
  bool bf16;
};

// x [rows, k] float32 (or bfloat16 bits when x_bf16), rows x_stride elements apart.
void quantize_rows_avx2(const void* x, bool x_bf16, int64_t x_stride, int64_t rows, int64_t k, int16_t* q, float* d,
                        float* s);
void quantize_rows_scalar(const void* x, bool x_bf16, int64_t x_stride, int64_t rows, int64_t k, int16_t* q, float* d,
                          float* s);

// out[m, n] = sum over k of W[n, k] x[m, k] for n in [n0, n1) and m in [m0, m1); W's rows are
// row_bytes apart, each k / 32 blocks of `qtype`.
void dot_rows_avx2(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                   int64_t m0, int64_t m1, const OutRows& out);
void dot_rows_scalar(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                     int64_t m0, int64_t m1, const OutRows& out);

// Q4_0, Q4_1, Q4_K and Q6_K on AVX2 (quant_avx2_k.cpp): x's int16 quants as bytes, q = 256 * hi +
// lo (lo unsigned, hi signed), made by split_rows_k: for the 4-bit types in the order their kernel
// meets them (within each 64 weights: weights 0-15 of the first block, of the second, then 16-31
// of each), for Q6_K as they are; rows of whole groups of 8 blocks. Q6_K also needs x.h
// (half_sums). The same integer sums as dot_rows_avx2.
constexpr bool byte_type(int qtype) { return qtype == kQ4_0 || qtype == kQ4_1 || packed_k(qtype); }
struct ByteRows {
  const uint8_t* lo;
  const int8_t* hi;
};
void split_rows_k(int qtype, const int16_t* q, int64_t rows, int64_t k, uint8_t* lo, int8_t* hi);
void dot_rows_k_avx2(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                     const ByteRows& bytes, int64_t m0, int64_t m1, const OutRows& out);

// dot_rows_avx2 for 4- and 5-bit blocks (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K: vnni_type) on AVX512-VNNI CPUs, 16 weight rows
// at a time (quant_vnni.cpp); x's int16 quants split by split_rows into lo (unsigned) and hi
// (signed) bytes, q = 256 * hi + lo. Same integer sums as dot_rows_avx2.
bool vnni_type(int qtype);
void split_rows(const int16_t* q, int64_t count, uint8_t* lo, int8_t* hi);
void dot_rows_vnni(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                   const uint8_t* lo, const int8_t* hi, int64_t m0, int64_t m1, const OutRows& out);

// out[m, n] = sum over k of bf16(W[n, k]) x[m, k], x bfloat16 bits [rows, k] x_stride apart: W's
// rows dequantized to bfloat16 once per tile of rows, the products by AVX512-BF16 (quant_bf16.cpp).
void dense_rows_bf16(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const uint16_t* x,
                     int64_t x_stride, int64_t k, int64_t m0, int64_t m1, const OutRows& out);

// W's rows [n0, n1) as float32 or bfloat16 values into out (k per row, out_stride apart).
void dequantize_rows_scalar(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k,
                            const OutRows& out);

// W's rows [n0, n1) as float32 values, row n at out + (n - n0) * out_stride: the scalar loop's
// values bit for bit, with AVX2 (the tiles of quant_linear.cpp's tile_linear).
void dequantize_rows_avx2(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k, float* out,
                          int64_t out_stride);

// Activation rows for panel_gemm: x [rows, k] float32 contiguous -> groups g0 .. g1 of 6 rows,
// k-major (packed[g * 6k + 6i + j] = x[6g + j, i], zero past the last row).
constexpr int64_t kGemmRows = 6;
void pack_rows(const float* x, int64_t rows, int64_t k, int64_t g0, int64_t g1, float* packed);

// out[m, n] = sum over k of W[n, k] x[m, k], float32, for n in [n0, n1) and every m < rows
// (`packed`: pack_rows' groups; out: ldo apart), W dequantized 16 rows at a time (quant_gemm.cpp).
void panel_gemm(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* packed,
                int64_t rows, int64_t k, float* out, int64_t ldo, bool avx2);

// Shared by both paths: exact conversions.
inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu, bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {  // round to nearest even (finite f)
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Scale i of a K-quant row (i: the block, or for Q6_K, Q3_K and Q2_K the 16 weights) and its
// offset: Q4_K's d * scale and -(dmin * min), Q6_K's d * scale, as float32 products, the values
// langrt.model.kquants gave when it unpacked them (exact GGUF values).
inline float k_scale(int qtype, const RowLayout& r, int64_t i) {
  if (qtype == kQ4_K) return half_bits_to_float(r.d[i / 8]) * static_cast<float>(r.sub[i]);
  if (qtype == kQ6_K) return half_bits_to_float(r.d[i / 16]) * static_cast<float>(static_cast<int8_t>(r.sub[i]));
  return r.df[i];
}

inline float k_offset(int qtype, const RowLayout& r, int64_t i) {
  if (qtype == kQ4_K) return -(half_bits_to_float(r.m[i / 8]) * static_cast<float>(r.sub_m[i]));
  return r.mf ? r.mf[i] : 0.0f;
}

// GGUF's Q4_K / Q6_K rows [rows, supers * GGUF's super-block bytes] -> langrt's (super_bytes each).
void repack_k_rows(int qtype, const uint8_t* gguf, uint8_t* out, int64_t rows, int64_t supers);

inline void store_out(const OutRows& out, int64_t m, int64_t n, float v) {
  if (out.bf16) {
    static_cast<uint16_t*>(out.data)[m * out.stride + n] = float_to_bf16_bits(v);
  } else {
    static_cast<float*>(out.data)[m * out.stride + n] = v;
  }
}

}  // namespace langrt_quant
