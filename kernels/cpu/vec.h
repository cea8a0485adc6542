// The vector helpers langrt's layer kernels (paged_attention.cpp, layer_ops.cpp) are written in,
// for the instruction set the library is compiled for: AVX-512F (kLanes = 16 floats), AVX2 + FMA
// (kLanes = 8), or neither (LANGRT_CPU_SCALAR: plain C++ on 4-float GCC vectors, which the
// compiler turns into NEON on ARM and SSE2 on older x86; kLanes = 4). kernels/cpu builds the same sources once per ISA, each library under its own
// namespace (LANGRT_CPU_NS, layer_ops.h), and loads the one the CPU runs.
//
// Everything here is in an anonymous namespace: the two libraries may sit in one process, and no
// helper of one may be bound to the other's.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstring>
#include <type_traits>

#if !defined(LANGRT_CPU_SCALAR)
#include <immintrin.h>
#endif

namespace {

#if defined(LANGRT_CPU_SCALAR)

constexpr int kLanes = 4;  // 128 bits: a NEON (or SSE) register
typedef float vfloat __attribute__((vector_size(16)));

// Lane-wise f(a[i], ...) for every lane: loops the compiler vectorizes.
template <typename F>
inline vfloat lanes(F f) {
  vfloat r;
  for (int i = 0; i < kLanes; ++i) r[i] = f(i);
  return r;
}

inline vfloat vset1(float x) { return lanes([&](int) { return x; }); }
inline vfloat vzero() { return vset1(0.0f); }
inline vfloat vadd(vfloat a, vfloat b) { return a + b; }
inline vfloat vsub(vfloat a, vfloat b) { return a - b; }
inline vfloat vmul(vfloat a, vfloat b) { return a * b; }
inline vfloat vdiv(vfloat a, vfloat b) { return a / b; }
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
inline vfloat vfmadd(vfloat a, vfloat b, vfloat c) { return lanes([&](int i) { return __builtin_fmaf(a[i], b[i], c[i]); }); }
#else  // no FMA in hardware (fmaf would be a library call, ~50x slower): the product exact in
// double, one rounding to double for the sum, one to float; that differs from a fused
// multiply-add only where the two roundings of the sum land differently
inline vfloat vfmadd(vfloat a, vfloat b, vfloat c) {
  return lanes([&](int i) { return static_cast<float>(static_cast<double>(a[i]) * b[i] + c[i]); });
}
#endif
inline vfloat vmax(vfloat a, vfloat b) { return lanes([&](int i) { return a[i] > b[i] ? a[i] : b[i]; }); }

inline float vreduce_add(vfloat x) { return (x[0] + x[2]) + (x[1] + x[3]); }

inline float vreduce_max(vfloat x) {
  float m = x[0];
  for (int i = 1; i < kLanes; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

inline vfloat vload(const float* p) {
  vfloat r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

inline void vstore(float* p, vfloat x) { std::memcpy(p, &x, sizeof(x)); }

inline float bf16_bits_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint32_t rounded_bf16_bits(float f) {  // round to nearest even (finite f)
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
}

inline vfloat vload(const c10::BFloat16* p) { return lanes([&](int i) { return bf16_bits_to_float(p[i].x); }); }

inline void vstore(c10::BFloat16* p, vfloat x) {
  for (int i = 0; i < kLanes; ++i) p[i].x = static_cast<uint16_t>(rounded_bf16_bits(x[i]));
}

inline vfloat vround_bf16(vfloat x) {
  return lanes([&](int i) { return bf16_bits_to_float(static_cast<uint16_t>(rounded_bf16_bits(x[i]))); });
}

inline vfloat vfirst(int count, vfloat x, vfloat fill) { return lanes([&](int i) { return i < count ? x[i] : fill[i]; }); }

inline vfloat vzero_where_neg_inf(vfloat s, vfloat x) {
  return lanes([&](int i) { return s[i] != -__builtin_inff() ? x[i] : 0.0f; });
}

// to the nearest integer, ties to even, for |x| < 2^22 (vexp's range): adding 1.5 * 2^23 leaves no
// fraction bits, and the float addition rounds as asked (no library call, which SSE2 would need)
inline vfloat vround_nearest(vfloat x) {
  const vfloat magic = vset1(12582912.0f);
  return (x + magic) - magic;
}

// p * 2^n for integral n >= -126 (exact where 2^n is a float, as scalef; inf from n = 128 on)
inline vfloat vscale2(vfloat p, vfloat n) {
  return lanes([&](int i) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n[i] < 128.0f ? n[i] : 128.0f) + 127) << 23;
    float two_n;
    std::memcpy(&two_n, &bits, 4);
    return p[i] * two_n;
  });
}

#elif defined(__AVX512F__)

constexpr int kLanes = 16;
using vfloat = __m512;

inline vfloat vset1(float x) { return _mm512_set1_ps(x); }
inline vfloat vzero() { return _mm512_setzero_ps(); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm512_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm512_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
inline vfloat vdiv(vfloat a, vfloat b) { return _mm512_div_ps(a, b); }
inline vfloat vfmadd(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm512_max_ps(a, b); }
inline float vreduce_add(vfloat x) { return _mm512_reduce_add_ps(x); }
inline float vreduce_max(vfloat x) { return _mm512_reduce_max_ps(x); }
inline vfloat vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vfloat x) { _mm512_storeu_ps(p, x); }

inline vfloat vload(const c10::BFloat16* p) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16));
}

// bfloat16 bits of x, rounded to nearest even (finite x), in the low 16 bits of each lane
inline __m512i bf16_rounded(vfloat x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
}

inline void vstore(c10::BFloat16* p, vfloat x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_rounded(x)));
}

inline vfloat vround_bf16(vfloat x) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_rounded(x), 16)); }

// lanes below `count` from x, the rest from fill
inline vfloat vfirst(int count, vfloat x, vfloat fill) {
  return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << count) - 1), fill, x);
}

// x where s is not -inf, else 0
inline vfloat vzero_where_neg_inf(vfloat s, vfloat x) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, vset1(-__builtin_inff()), _CMP_NEQ_OQ), x);
}

inline vfloat vround_nearest(vfloat x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vfloat vscale2(vfloat p, vfloat n) { return _mm512_scalef_ps(p, n); }  // p * 2^n

#elif defined(__AVX2__) && defined(__FMA__)

constexpr int kLanes = 8;
using vfloat = __m256;

inline vfloat vset1(float x) { return _mm256_set1_ps(x); }
inline vfloat vzero() { return _mm256_setzero_ps(); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm256_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm256_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm256_mul_ps(a, b); }
inline vfloat vdiv(vfloat a, vfloat b) { return _mm256_div_ps(a, b); }
inline vfloat vfmadd(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm256_max_ps(a, b); }

inline float vreduce_add(vfloat x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float vreduce_max(vfloat x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

inline vfloat vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vfloat x) { _mm256_storeu_ps(p, x); }

inline vfloat vload(const c10::BFloat16* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
}

inline __m256i bf16_rounded(vfloat x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
}

inline void vstore(c10::BFloat16* p, vfloat x) {
  // packus works within 128-bit lanes: the permute puts lanes 0-3 and 4-7 in the low half
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_rounded(x), _mm256_setzero_si256()), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

inline vfloat vround_bf16(vfloat x) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_rounded(x), 16)); }

inline vfloat vfirst(int count, vfloat x, vfloat fill) {
  const vfloat lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_blendv_ps(fill, x, _mm256_cmp_ps(lane, vset1(static_cast<float>(count)), _CMP_LT_OQ));
}

inline vfloat vzero_where_neg_inf(vfloat s, vfloat x) {
  return _mm256_and_ps(_mm256_cmp_ps(s, vset1(-__builtin_inff()), _CMP_NEQ_OQ), x);
}

inline vfloat vround_nearest(vfloat x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// p * 2^n for integral n >= -126 (exact where 2^n is a float, as scalef; inf from n = 128 on)
inline vfloat vscale2(vfloat p, vfloat n) {
  n = _mm256_min_ps(n, vset1(128.0f));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

#else
#error "langrt's layer kernels are built for AVX-512F, AVX2 + FMA, or plain C++ (LANGRT_CPU_SCALAR)"
#endif

// exp(x) for x <= 88 (inf above; below -87, exp(-87)); x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its Taylor polynomial of degree 6.
inline vfloat vexp(vfloat x) {
  x = vmax(x, vset1(-87.0f));
  const vfloat n = vround_nearest(vmul(x, vset1(1.44269504088896341f)));
  vfloat r = vfmadd(n, vset1(-0.693359375f), x);  // ln2 in two parts
  r = vfmadd(n, vset1(2.12194440e-4f), r);
  vfloat p = vset1(1.0f / 720);
  p = vfmadd(p, r, vset1(1.0f / 120));
  p = vfmadd(p, r, vset1(1.0f / 24));
  p = vfmadd(p, r, vset1(1.0f / 6));
  p = vfmadd(p, r, vset1(0.5f));
  p = vfmadd(p, r, vset1(1.0f));
  p = vfmadd(p, r, vset1(1.0f));
  return vscale2(p, n);
}

// x rounded to T's precision and widened back: bfloat16 to nearest-even (finite x), float as is.
template <typename T>
inline vfloat vround(vfloat x) {
  if constexpr (std::is_same<T, float>::value) {
    return x;
  } else {
    return vround_bf16(x);
  }
}

}  // namespace
