// Sixteen float32 vectors summed at once, each to one lane (AVX-512F): shared by the attention
// kernel (paged_attention.cpp, built with -mavx512f) and the bf16 tile products (quant_bf16.cpp,
// built without -m flags: hence the target attribute). x86-64 only; include it where AVX-512F code is.
#pragma once

#include <immintrin.h>

namespace langrt_lanes {

// Lane i of the result: the sum of the 16 lanes of v[i]: per 128-bit lane L, q_L = (e0 + e2) +
// (e1 + e3) of its four elements, then (q0 + q1) + (q2 + q3). Each lane's tree depends on its own
// vector alone, so a sum is the same bits whatever the other vectors hold.
__attribute__((target("avx512f"))) inline __m512 sum_each(const __m512* v) {
  __m512 y[4];
  for (int b = 0; b < 4; ++b) {
    const __m512 x01 = _mm512_add_ps(_mm512_unpacklo_ps(v[4 * b], v[4 * b + 1]), _mm512_unpackhi_ps(v[4 * b], v[4 * b + 1]));
    const __m512 x23 =
        _mm512_add_ps(_mm512_unpacklo_ps(v[4 * b + 2], v[4 * b + 3]), _mm512_unpackhi_ps(v[4 * b + 2], v[4 * b + 3]));
    y[b] = _mm512_add_ps(
        _mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  const __m512 s01 = _mm512_add_ps(
      _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s23 = _mm512_add_ps(
      _mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(y[2], y[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(
      _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace langrt_lanes
