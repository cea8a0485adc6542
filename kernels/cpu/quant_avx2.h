// Helpers shared by the AVX2 kernels (quant_avx2.cpp, quant_avx2_k.cpp). Everything carries its
// instruction set as a target attribute and sits in an anonymous namespace, as those files' own
// helpers do.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#define LANGRT_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace langrt_quant {
namespace {

LANGRT_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bytes of nibbles (low: weights 0-15, high: 16-31) as 32 bytes in weight order: the bytes
// loaded into both lanes, the high lane shifted by 4 (3 instructions, where shifting, masking and
// inserting the halves took 5).
LANGRT_AVX2 inline __m256i nibble_bytes(const uint8_t* quants) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quants)));
  return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

}  // namespace
}  // namespace langrt_quant

#endif  // __x86_64__
