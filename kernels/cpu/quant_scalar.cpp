// Plain C++ reference of quant_kernels.h: what runs where the CPU has no AVX2 (and what the AVX2
// path is tested against). Same quantization of the activations, bit for bit; the dot products
// differ from the AVX2 path only in the order of float sums.
#include <cmath>
#include <cstring>

#include "quant_kernels.h"

namespace langrt_quant {
namespace {

float load_x(const void* x, bool bf16, int64_t i) {
  return bf16 ? bf16_bits_to_float(static_cast<const uint16_t*>(x)[i]) : static_cast<const float*>(x)[i];
}

// Block b of a weight row (langrt's layout) as 32 integers, its scales d and offsets m (d[0], m[0]
// for weights 0-15, d[1], m[1] for 16-31: the same but in Q6_K, Q3_K and Q2_K): w[i] = d[i / 16]
// * q[i] + m[i / 16].
void unpack_block(int qtype, const RowLayout& row, int64_t b, int32_t* q, float* d, float* m) {
  const int64_t s = scales_per_block(qtype);
  if (k_quant(qtype)) {
    d[0] = k_scale(qtype, row, s * b);
    d[1] = k_scale(qtype, row, s * b + s - 1);
    m[0] = k_offset(qtype, row, s * b);
    m[1] = k_offset(qtype, row, s * b + s - 1);
  } else {
    d[0] = d[1] = half_bits_to_float(row.d[b]);
    m[0] = m[1] = row.m ? half_bits_to_float(row.m[b]) : 0.0f;
  }
  const uint8_t* quants = row.quants + b * quant_bytes(qtype);
  if (qtype == kQ6_K) {  // low nibbles as Q4's, then 2-bit highs as Q2_K's crumbs; q - 32
    for (int i = 0; i < kBlock; ++i) {
      const int32_t low = i < 16 ? quants[i] & 0x0F : quants[i - 16] >> 4;
      q[i] = (low | (((quants[16 + i % 8] >> (2 * (i / 8))) & 3) << 4)) - 32;
    }
    return;
  }
  if (qtype == kQ8_0) {
    for (int i = 0; i < kBlock; ++i) q[i] = static_cast<int8_t>(quants[i]);
    return;
  }
  if (qtype == kQ2_K || qtype == kQ3_K) {  // 2-bit lows (after Q3_K's 4 bytes of high bits)
    const uint8_t* lows = quants + (qtype == kQ3_K ? 4 : 0);
    for (int i = 0; i < kBlock; ++i) {
      const int32_t low = (lows[i % 8] >> (2 * (i / 8))) & 3;
      q[i] = qtype == kQ2_K ? low : low + 4 * ((quants[i / 8] >> (i % 8)) & 1) - 4;
    }
    return;
  }
  const bool five = qtype == kQ5_0 || qtype == kQ5_1 || qtype == kQ5_K;
  const uint8_t* nibbles = quants + (five ? 4 : 0);
  const int32_t offset = qtype == kQ4_0 ? 8 : qtype == kQ5_0 ? 16 : 0;
  for (int i = 0; i < 16; ++i) {
    const int32_t high = five ? 16 * ((quants[i / 8] >> (i % 8)) & 1) : 0;
    const int32_t high2 = five ? 16 * ((quants[2 + i / 8] >> (i % 8)) & 1) : 0;
    q[i] = (nibbles[i] & 0x0F) + high - offset;
    q[i + 16] = (nibbles[i] >> 4) + high2 - offset;
  }
}

}  // namespace

void quantize_rows_scalar(const void* x, bool x_bf16, int64_t x_stride, int64_t rows, int64_t k, int16_t* q, float* d,
                          float* s) {
  const int64_t blocks = k / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = r * x_stride + b * kBlock;
      float amax = 0.0f;
      for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(load_x(x, x_bf16, first + i)));
      const float scale = amax / kQMax, inverse = amax > 0.0f ? kQMax / amax : 0.0f;
      int32_t sum = 0;
      for (int i = 0; i < kBlock; ++i) {
        const int32_t v = static_cast<int32_t>(std::nearbyint(load_x(x, x_bf16, first + i) * inverse));
        q[r * k + b * kBlock + i] = static_cast<int16_t>(v);
        sum += v;
      }
      d[r * blocks + b] = scale;
      s[r * blocks + b] = scale * static_cast<float>(sum);
    }
  }
}

void half_sums(const int16_t* q, const float* d, int64_t blocks, float* h) {
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t half = 0; half < 2; ++half) {
      int32_t sum = 0;
      for (int64_t i = 0; i < 16; ++i) sum += q[b * kBlock + 16 * half + i];
      h[2 * b + half] = d[b] * static_cast<float>(sum);
    }
  }
}

void dot_rows_scalar(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const QuantizedRows& x,
                     int64_t m0, int64_t m1, const OutRows& out) {
  const int64_t blocks = x.k / kBlock;
  int32_t q[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = m0; m < m1; ++m) {
      float acc = 0.0f;
      const RowLayout row = row_layout(qtype, w + n * row_bytes, blocks);
      for (int64_t b = 0; b < blocks; ++b) {
        float dw[2], mw[2];
        unpack_block(qtype, row, b, q, dw, mw);
        const int16_t* xb = x.q + m * x.k + b * kBlock;
        const float xd = x.d[m * blocks + b];
        if (scales_per_block(qtype) == 2) {  // a scale (and Q2_K: a minimum) per 16 weights
          int32_t dot[2] = {0, 0};
          for (int i = 0; i < kBlock; ++i) dot[i / 16] += q[i] * xb[i];
          acc += dw[0] * xd * static_cast<float>(dot[0]) + dw[1] * xd * static_cast<float>(dot[1]);
          if (qtype == kQ2_K) acc += mw[0] * x.h[2 * (m * blocks + b)] + mw[1] * x.h[2 * (m * blocks + b) + 1];
          continue;
        }
        int32_t dot = 0;
        for (int i = 0; i < kBlock; ++i) dot += q[i] * xb[i];
        acc += dw[0] * xd * static_cast<float>(dot) + mw[0] * x.s[m * blocks + b];
      }
      store_out(out, m, n, acc);
    }
  }
}

void dequantize_rows_scalar(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k,
                            const OutRows& out) {
  int32_t q[kBlock];
  for (int64_t n = n0; n < n1; ++n) {
    const RowLayout row = row_layout(qtype, w + n * row_bytes, k / kBlock);
    for (int64_t b = 0; b < k / kBlock; ++b) {
      float d[2], m[2];
      unpack_block(qtype, row, b, q, d, m);
      for (int i = 0; i < kBlock; ++i) store_out(out, n, b * kBlock + i, d[i / 16] * static_cast<float>(q[i]) + m[i / 16]);
    }
  }
}

void repack_rows(int qtype, const uint8_t* gguf, uint8_t* out, int64_t rows, int64_t blocks) {
  const int64_t bytes = block_bytes(qtype), quants = quant_bytes(qtype), row_bytes = blocks * bytes;
  const int64_t header = bytes - quants;  // d (and m) ahead of each GGUF block's quants
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = gguf + r * row_bytes;
    uint8_t* dst = out + r * row_bytes;
    uint8_t* d = dst + blocks * quants;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = src + b * bytes;
      std::memcpy(dst + b * quants, block + header, quants);
      std::memcpy(d + 2 * b, block, 2);
      if (has_min(qtype)) std::memcpy(d + 2 * blocks + 2 * b, block + 2, 2);  // Q4_1, Q5_1
    }
  }
}

namespace {

// Q4_K's 12 bytes of scales -> 8 scales and 8 minimums of 6 bits (as langrt.model.kquants reads them).
void q4_k_scales(const uint8_t* p, uint8_t* scale, uint8_t* minimum) {
  for (int j = 0; j < 4; ++j) {
    scale[j] = p[j] & 0x3F;
    minimum[j] = p[4 + j] & 0x3F;
    scale[4 + j] = (p[8 + j] & 0x0F) | ((p[j] >> 2) & 0x30);
    minimum[4 + j] = (p[8 + j] >> 4) | ((p[4 + j] >> 2) & 0x30);
  }
}

// One GGUF Q4_K super-block (fp16 d, dmin, 12 bytes of scales, 128 of nibbles: 4 x 64 weights,
// low nibbles the first 32) -> its 8 blocks of nibbles in Q4_1's order (byte i: weights i, i + 16).
void repack_q4_k(const uint8_t* src, int64_t s, int64_t supers, uint8_t* row) {
  const int64_t blocks = 8 * supers;
  const uint8_t* qs = src + 16;
  for (int c = 0; c < 4; ++c) {
    uint8_t* lo = row + (8 * s + 2 * c) * 16;
    for (int i = 0; i < 16; ++i) {
      lo[i] = (qs[32 * c + i] & 0x0F) | ((qs[32 * c + 16 + i] & 0x0F) << 4);
      lo[16 + i] = (qs[32 * c + i] >> 4) | (qs[32 * c + 16 + i] & 0xF0);
    }
  }
  uint8_t* d = row + blocks * 16;
  std::memcpy(d + 2 * s, src, 2);
  std::memcpy(d + 2 * supers + 2 * s, src + 2, 2);
  uint8_t* sub = d + 4 * supers;
  q4_k_scales(src + 4, sub + 8 * s, sub + blocks + 8 * s);
}

// One GGUF Q6_K super-block (128 bytes of low nibbles, 64 of high pairs, 16 int8 scales, fp16 d;
// weight 128h + r: low nibble of byte 64h + r % 64 (high nibble past 64), high pair at bits
// 2 (r / 32) of byte 128 + 32h + r % 32) -> 8 blocks of 16 nibble bytes and 8 crumb bytes.
void repack_q6_k(const uint8_t* src, int64_t s, int64_t supers, uint8_t* row) {
  const int64_t blocks = 8 * supers;
  for (int b = 0; b < 8; ++b) {  // weights 32b .. 32b + 31: h = b / 4, r = 32 (b % 4) + i
    const int h = b / 4, c = b % 4;
    const uint8_t* ql = src + 64 * h + 32 * (c & 1);  // r % 64 = 32 (c & 1) + i
    const uint8_t* qh = src + 128 + 32 * h;           // r % 32 = i
    const int low_shift = 4 * (c >> 1), high_shift = 2 * c;
    uint8_t* q = row + (8 * s + b) * 24;
    for (int i = 0; i < 16; ++i) {
      q[i] = ((ql[i] >> low_shift) & 0x0F) | (((ql[16 + i] >> low_shift) & 0x0F) << 4);
    }
    for (int i = 0; i < 8; ++i) {
      q[16 + i] = ((qh[i] >> high_shift) & 3) | (((qh[8 + i] >> high_shift) & 3) << 2) |
                  (((qh[16 + i] >> high_shift) & 3) << 4) | (((qh[24 + i] >> high_shift) & 3) << 6);
    }
  }
  uint8_t* d = row + blocks * 24;
  std::memcpy(d + 2 * s, src + 208, 2);
  std::memcpy(d + 2 * supers + 16 * s, src + 192, 16);
}

}  // namespace

void repack_k_rows(int qtype, const uint8_t* gguf, uint8_t* out, int64_t rows, int64_t supers) {
  const int64_t in_bytes = qtype == kQ4_K ? 144 : 210, out_bytes = super_bytes(qtype);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < supers; ++s) {
      const uint8_t* src = gguf + (r * supers + s) * in_bytes;
      if (qtype == kQ4_K) {
        repack_q4_k(src, s, supers, out + r * supers * out_bytes);
      } else {
        repack_q6_k(src, s, supers, out + r * supers * out_bytes);
      }
    }
  }
}

}  // namespace langrt_quant
