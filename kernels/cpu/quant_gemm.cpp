// x W^T for passes of many rows (prompts) on the blocks, without a float copy of W: each task
// dequantizes 16 weight rows at a time into a small float32 panel (k x 16, written transposed, at
// most 16 * k * 4 bytes: 96 KB at k = 1,536, in L2), then runs every activation row over it with
// a 6 x 16 register tile of FMAs (12 accumulators, two loads and six broadcasts a step), the
// classic float GEMM micro-kernel. The weights' values are exactly the blocks' (dequantize_rows_*
// give them), so the products differ from the dequantized reference only in the order of the sums;
// each output is one accumulator over k in order, so a row's result does not depend on which other
// rows share its pass (a prompt computed whole and in chunks gives the same bits).
#include "quant_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define LANGRT_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace langrt_quant {
namespace {

constexpr int kPanel = 16;  // weight rows per panel: two 8-float vectors
constexpr int kRowTile = kGemmRows;  // activation rows per register tile (6 x 2 accumulators of the 16)

// rows [n0, n1) of W (at most kPanel) -> panel[k][kPanel] float32, zero past n1 - n0.
void fill_panel(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, int64_t k, bool avx2,
                float* rows, float* panel) {
#if defined(__x86_64__)
  if (avx2) {
    dequantize_rows_avx2(qtype, w, row_bytes, n0, n1, k, rows, k);
  } else
#endif
  {
    const OutRows o{rows, k, false};
    dequantize_rows_scalar(qtype, w + n0 * row_bytes, row_bytes, 0, n1 - n0, k, o);
  }
  const int64_t count = n1 - n0;
  for (int64_t i = 0; i < k; ++i) {
    float* dst = panel + i * kPanel;
    for (int64_t r = 0; r < count; ++r) dst[r] = rows[r * k + i];
    for (int64_t r = count; r < kPanel; ++r) dst[r] = 0.0f;
  }
}

#if defined(__x86_64__)
// Six activation rows, packed k-major (xp[i * 6 + j]: row j's value i), times the panel:
// out[j][0 .. width) for the first `valid` rows. Both operands are read in order, x's six values
// of a step from one cache line.
LANGRT_AVX2 void panel_tile(const float* xp, const float* panel, int64_t k, float* out, int64_t ldo, int64_t width,
                            int64_t valid) {
  __m256 acc[kRowTile][2];
  for (int j = 0; j < kRowTile; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m256 w0 = _mm256_loadu_ps(panel + i * kPanel), w1 = _mm256_loadu_ps(panel + i * kPanel + 8);
    for (int j = 0; j < kRowTile; ++j) {
      const __m256 xb = _mm256_broadcast_ss(xp + i * kRowTile + j);
      acc[j][0] = _mm256_fmadd_ps(xb, w0, acc[j][0]);
      acc[j][1] = _mm256_fmadd_ps(xb, w1, acc[j][1]);
    }
  }
  for (int j = 0; j < valid; ++j) {
    float row[kPanel];
    _mm256_storeu_ps(row, acc[j][0]);
    _mm256_storeu_ps(row + 8, acc[j][1]);
    std::memcpy(out + j * ldo, row, width * sizeof(float));
  }
}
#endif

// The plain C++ loop: the same sums, one per output, in order over k.
void panel_tile_scalar(const float* xp, const float* panel, int64_t k, float* out, int64_t ldo, int64_t width,
                       int64_t valid) {
  for (int64_t j = 0; j < valid; ++j) {
    for (int64_t c = 0; c < width; ++c) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) acc += xp[i * kRowTile + j] * panel[i * kPanel + c];
      out[j * ldo + c] = acc;
    }
  }
}

}  // namespace

void pack_rows(const float* x, int64_t rows, int64_t k, int64_t g0, int64_t g1, float* packed) {
  for (int64_t g = g0; g < g1; ++g) {
    float* dst = packed + g * kRowTile * k;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < kRowTile; ++j) {
        const int64_t m = g * kRowTile + j;
        dst[i * kRowTile + j] = m < rows ? x[m * k + i] : 0.0f;
      }
    }
  }
}

void panel_gemm(int qtype, const uint8_t* w, int64_t row_bytes, int64_t n0, int64_t n1, const float* packed,
                int64_t rows, int64_t k, float* out, int64_t ldo, bool avx2) {
  std::vector<float> scratch(static_cast<size_t>(2 * kPanel * k));
  float *dequantized = scratch.data(), *panel = scratch.data() + kPanel * k;
  for (int64_t n = n0; n < n1; n += kPanel) {
    const int64_t width = std::min<int64_t>(kPanel, n1 - n);
    fill_panel(qtype, w, row_bytes, n, n + width, k, avx2, dequantized, panel);
    for (int64_t m = 0; m < rows; m += kRowTile) {
      const float* xp = packed + m * k;  // group m / 6
      const int64_t valid = std::min<int64_t>(kRowTile, rows - m);
#if defined(__x86_64__)
      if (avx2) {
        panel_tile(xp, panel, k, out + m * ldo + n, ldo, width, valid);
        continue;
      }
#endif
      panel_tile_scalar(xp, panel, k, out + m * ldo + n, ldo, width, valid);
    }
  }
}

}  // namespace langrt_quant
