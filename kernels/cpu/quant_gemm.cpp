// x W^T for passes of many rows (prompts) on the blocks, without a float copy of W: each task
// dequantizes up to 8 panels of 16 weight rows (float32, k-major: a panel holds k x 16 values),
// then runs the activation rows, packed 6 at a time k-major, over them with a 6 x 16 register
// tile of FMAs (12 accumulators, two loads and six broadcasts a step: the classic float GEMM
// micro-kernel), kDepth values of k at a time so that the panels' slices (8 x 32 KB) stay in L2
// while every group of 6 rows passes, and each row's slice (12 KB) stays in L1 across the 8
// panels. The weights' values are exactly the blocks' (dequantize_rows_* give them), so products
// differ from the dequantized reference only in the order of the sums; each output is one FMA
// chain over k in order (a slice's partial sums are stored and taken up again, exactly), so a
// row's result does not depend on the other rows of its pass (a prompt whole or in chunks gives
// the same bits).
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
constexpr int64_t kGroupPanels = 8;  // panels dequantized together (128 weight rows)
constexpr int64_t kDepth = 512;      // values of k per pass over a group (a panel's slice: 32 KB)
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
// Six activation rows, packed k-major (xp[i * 6 + j]: row j's value i), times `depth` values of a
// panel: out[j][0 .. width) for the first `valid` rows, added to what out holds when `resume`
// (the FMA chain taken up where the previous slice of k left it). Both operands are read in order,
// x's six values of a step from one cache line.
LANGRT_AVX2 void panel_tile(const float* xp, const float* panel, int64_t depth, float* out, int64_t ldo, int64_t width,
                            int64_t valid, bool resume) {
  __m256 acc[kRowTile][2];
  for (int j = 0; j < kRowTile; ++j) {
    float row[kPanel] = {};
    if (resume && j < valid) std::memcpy(row, out + j * ldo, width * sizeof(float));
    acc[j][0] = _mm256_loadu_ps(row);
    acc[j][1] = _mm256_loadu_ps(row + 8);
  }
  for (int64_t i = 0; i < depth; ++i) {
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
void panel_tile_scalar(const float* xp, const float* panel, int64_t depth, float* out, int64_t ldo, int64_t width,
                       int64_t valid, bool resume) {
  for (int64_t j = 0; j < valid; ++j) {
    for (int64_t c = 0; c < width; ++c) {
      float acc = resume ? out[j * ldo + c] : 0.0f;
      for (int64_t i = 0; i < depth; ++i) acc += xp[i * kRowTile + j] * panel[i * kPanel + c];
      out[j * ldo + c] = acc;
    }
  }
}

// Every activation row times a group of `count` panels (weight rows n .. n + width_total).
void group_rows(const float* packed, int64_t rows, int64_t k, const float* panels, int64_t count, int64_t width_total,
                float* out, int64_t ldo, bool avx2) {
  for (int64_t c = 0; c < k; c += kDepth) {
    const int64_t depth = std::min(kDepth, k - c);
    for (int64_t m = 0; m < rows; m += kRowTile) {
      const float* xp = packed + m * k + c * kRowTile;  // group m / 6, from value c
      const int64_t valid = std::min<int64_t>(kRowTile, rows - m);
      for (int64_t p = 0; p < count; ++p) {
        const float* panel = panels + p * kPanel * k + c * kPanel;
        float* o = out + m * ldo + p * kPanel;
        const int64_t width = std::min<int64_t>(kPanel, width_total - p * kPanel);
#if defined(__x86_64__)
        if (avx2) {
          panel_tile(xp, panel, depth, o, ldo, width, valid, c > 0);
          continue;
        }
#endif
        panel_tile_scalar(xp, panel, depth, o, ldo, width, valid, c > 0);
      }
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
  std::vector<float> scratch(static_cast<size_t>((kGroupPanels + 1) * kPanel * k));
  float *dequantized = scratch.data(), *panels = scratch.data() + kPanel * k;
  for (int64_t g = n0; g < n1; g += kGroupPanels * kPanel) {
    const int64_t g1 = std::min(n1, g + kGroupPanels * kPanel), count = (g1 - g + kPanel - 1) / kPanel;
    for (int64_t p = 0; p < count; ++p) {
      const int64_t first = g + p * kPanel;
      fill_panel(qtype, w, row_bytes, first, std::min(g1, first + kPanel), k, avx2, dequantized, panels + p * kPanel * k);
    }
    group_rows(packed, rows, k, panels, count, g1 - g, out + g, ldo, avx2);
  }
}

}  // namespace langrt_quant
