// Attention for the rows of a forward pass (decode tokens, jump-forward drafts, prompts), reading
// K/V straight from the paged pool through the request's slot table.
//
// One call per layer covers every row of the pass, however many new tokens each request has: no
// K/V gather into a padded block, no padding, no scatter back. The arithmetic for a row depends
// only on that row's query and keys, so its output is the same bits whatever else is in the batch.
//
// Work is split by (chunk, KV head), a chunk being up to 32 consecutive rows of one run, and a run
// the rows of one request over keys from one start (a decode is a run of one; a request with
// jump-forward drafts, or a prompt, a run of several). A chunk's rows take their turns on one
// thread while that head's keys and values are still in cache; from 3 rows on, each block of
// kLanes keys is transposed once and its dot products taken for kLanes keys at a time, in the
// same order of operations as one row alone (run_scores). Items are taken one at a time by whichever thread is
// free, costliest first, so chunks (compute-bound, keys in cache) and decodes (waiting on memory)
// balance across threads.
//
// A row over more than kSegmentKeys keys takes them in segments: each segment's softmax and
// weighted values on their own, then the segments merged, each rescaled by exp(its maximum - the
// row's). A decode's segments are work items of their own, so one long sequence keeps every
// thread reading (at batch 1 it made only as many items as KV heads: 3 for SmolLM2, on 2 threads
// one idled a third of the time); in a chunk of several rows, a row's segments run in turn. The
// segments depend only on the row's key count, so a row still gives the same bits whatever else
// is in the pass (a decode and the same token among drafts or in a prompt agree).
//
// Numerics: scores, softmax and the weighted sum in float32 (bf16 inputs are widened exactly);
// exp by a degree-6 polynomial after range reduction (about 1 ulp); the output rounded to the
// input dtype to nearest-even, as torch's .to() does. Written in vec.h's helpers (kLanes floats a
// vector: 16 on AVX-512F, 8 on AVX2), so the one source builds for both.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "layer_ops.h"
#include "vec.h"

namespace {

constexpr int kMaxGroup = 16;   // query heads per KV head
constexpr int kMaxDim = 256;    // head_dim
constexpr int64_t kChunkRows = 32;  // rows of one run per work item, at most
constexpr int64_t kScoreBytes = 1 << 20;  // a work item's scores, at most (they stay in L2)
constexpr int64_t kTransposeRows = 3;  // runs this long share each key block's transposition
// A row attending to more keys than this takes them in segments of this many (a multiple of every
// build's kLanes), each softmaxed on its own and the segments' sums then merged: a decode's
// segments are work items of their own, so that one long sequence keeps every thread reading.
constexpr int64_t kSegmentKeys = 512;

#if defined(__AVX512F__) && !defined(LANGRT_CPU_SCALAR)

#include "lane_sums.h"

// Lane i of the result: the sum of the 16 lanes of v[i] (lane_sums.h).
inline vfloat sum_lanes(const vfloat* v) { return langrt_lanes::sum_each(v); }

// sum_lanes's last additions, on the per-128-bit-lane sums q[L] of 16 rows at once
inline vfloat sum_quads(const vfloat* q) { return vadd(vadd(q[0], q[1]), vadd(q[2], q[3])); }

// The 16 vectors r[0..15] as the rows of a 16 x 16 matrix; out[j] = its column j.
inline void transpose(const vfloat* r, vfloat* out) {
  __m512 a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // b[4i + k], 128-bit lane L: rows 4i..4i+3 of column 4L + k
  for (int i = 0; i < 4; ++i) {
    const __m512d lo = _mm512_castps_pd(a[4 * i]), lo2 = _mm512_castps_pd(a[4 * i + 2]);
    const __m512d hi = _mm512_castps_pd(a[4 * i + 1]), hi2 = _mm512_castps_pd(a[4 * i + 3]);
    b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, lo2));
    b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, lo2));
    b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi, hi2));
    b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi, hi2));
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 c = _mm512_shuffle_f32x4(b[k], b[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 d = _mm512_shuffle_f32x4(b[k], b[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 e = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 f = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
    out[k] = _mm512_shuffle_f32x4(c, e, _MM_SHUFFLE(2, 0, 2, 0));
    out[8 + k] = _mm512_shuffle_f32x4(c, e, _MM_SHUFFLE(3, 1, 3, 1));
    out[4 + k] = _mm512_shuffle_f32x4(d, f, _MM_SHUFFLE(2, 0, 2, 0));
    out[12 + k] = _mm512_shuffle_f32x4(d, f, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

#else  // AVX2 (8 lanes, two 128-bit lanes of 4) or plain C++ (4 lanes)

#if defined(LANGRT_CPU_SCALAR)  // 4 lanes: one group of four

// Lane i of the result: the sum of the 4 lanes of v[i], as (e0 + e2) + (e1 + e3).
inline vfloat sum_lanes(const vfloat* v) {
  return lanes([&](int i) { return (v[i][0] + v[i][2]) + (v[i][1] + v[i][3]); });
}

inline vfloat sum_quads(const vfloat* q) { return q[0]; }

inline void transpose(const vfloat* r, vfloat* out) {
  for (int j = 0; j < kLanes; ++j) out[j] = lanes([&](int t) { return r[t][j]; });
}

#else

// Lane i of the result: the sum of the 8 lanes of v[i]: q_L = (e0 + e2) + (e1 + e3) per 128-bit
// lane L, then q0 + q1.
inline vfloat sum_lanes(const vfloat* v) {
  __m256 y[2];
  for (int b = 0; b < 2; ++b) {
    const __m256 x01 = _mm256_add_ps(_mm256_unpacklo_ps(v[4 * b], v[4 * b + 1]), _mm256_unpackhi_ps(v[4 * b], v[4 * b + 1]));
    const __m256 x23 =
        _mm256_add_ps(_mm256_unpacklo_ps(v[4 * b + 2], v[4 * b + 3]), _mm256_unpackhi_ps(v[4 * b + 2], v[4 * b + 3]));
    y[b] = _mm256_add_ps(
        _mm256_shuffle_ps(x01, x23, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(x01, x23, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(y[0], y[1], 0x20), _mm256_permute2f128_ps(y[0], y[1], 0x31));
}

inline vfloat sum_quads(const vfloat* q) { return vadd(q[0], q[1]); }

// The 8 vectors r[0..7] as the rows of an 8 x 8 matrix; out[j] = its column j.
inline void transpose(const vfloat* r, vfloat* out) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4h + k], 128-bit lane L: rows 4h..4h+3 of column 4L + k
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    out[4 + k] = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}

#endif  // LANGRT_CPU_SCALAR
#endif

// The key (one head's) in pool slot `slot`, which must lie in the pool.
template <typename T>
inline const T* key_row(const T* k, int64_t kv_stride, int64_t slot, int64_t num_slots) {
  TORCH_CHECK(slot >= 0 && slot < num_slots, "paged_attention: slot ", slot, " outside the pool");
  return k + slot * kv_stride;
}

// The scaled query heads of one row and one KV head, as float32: qs[g * kLanes * chunks + d].
template <typename T, int chunks>
inline void scaled_query(const T* q, int64_t q_head_stride, int64_t group, float scale, float* qs) {
  const vfloat scale_v = vset1(scale);
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < chunks; ++c)
      vstore(qs + (g * chunks + c) * kLanes, vmul(vload(q + g * q_head_stride + kLanes * c), scale_v));
}

// Scores of one row: scores[g * stride + j] for keys j < count (padded to kLanes with -inf), and
// each query head's running maximum. Each key's dot product: lane l accumulates
// q[l + kLanes c] * key[l + kLanes c] over c, then the lanes are summed by sum_lanes.
template <typename T, int chunks>
inline void row_scores(const T* q, int64_t q_head_stride, float scale, const T* k, int64_t kv_stride,
                       const int32_t* slots, int64_t count, int64_t group, int64_t num_slots, float* scores,
                       int64_t stride, vfloat* max_out) {
  const vfloat neg_inf = vset1(-std::numeric_limits<float>::infinity());
  const vfloat scale_v = vset1(scale);
  vfloat qv[kMaxGroup][chunks], running_max[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    running_max[g] = neg_inf;
    for (int c = 0; c < chunks; ++c) qv[g][c] = vmul(vload(q + g * q_head_stride + kLanes * c), scale_v);
  }
  for (int64_t j0 = 0; j0 < count; j0 += kLanes) {
    const int valid = static_cast<int>(std::min<int64_t>(kLanes, count - j0));
    vfloat key[kLanes][chunks];
    for (int t = 0; t < kLanes; ++t) {
      if (t < valid) {
        const T* src = key_row(k, kv_stride, slots[j0 + t], num_slots);
        for (int c = 0; c < chunks; ++c) key[t][c] = vload(src + kLanes * c);
      } else {
        for (int c = 0; c < chunks; ++c) key[t][c] = vzero();
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      vfloat dots[kLanes];
      for (int t = 0; t < kLanes; ++t) {
        vfloat acc = vmul(qv[g][0], key[t][0]);
        for (int c = 1; c < chunks; ++c) acc = vfmadd(qv[g][c], key[t][c], acc);
        dots[t] = acc;
      }
      const vfloat s = vfirst(valid, sum_lanes(dots), neg_inf);
      vstore(scores + g * stride + j0, s);
      running_max[g] = vmax(running_max[g], s);
    }
  }
  for (int64_t g = 0; g < group; ++g) max_out[g] = running_max[g];
}

// Scores of several rows of one run (the same keys from slots[0]; row i sees counts[i] of them),
// as row_scores gives them, bit for bit, with each block of kLanes keys loaded and transposed once
// for all the rows: transposed, lane t of vector l is key t's element l, so accumulating
// q[l + kLanes c] * key[l + kLanes c] over c in vector l is the per-key lane sum of row_scores for
// kLanes keys at once, and adding the vectors in sum_lanes's tree ((l, l+2), (l+1, l+3) within
// each group of four, then sum_quads) repeats its additions in its order. scores and running_max
// are per row: row i's start at i * group * stride and i * group.
template <typename T, int chunks>
inline void run_scores(const float* qs, int64_t rows, const int64_t* counts, const T* k, int64_t kv_stride,
                       const int32_t* slots, int64_t group, int64_t num_slots, float* scores, int64_t stride,
                       vfloat* running_max) {
  constexpr int dim = kLanes * chunks;
  const vfloat neg_inf = vset1(-std::numeric_limits<float>::infinity());
  int64_t longest = 0;
  for (int64_t i = 0; i < rows; ++i) longest = std::max(longest, counts[i]);
  for (int64_t i = 0; i < rows * group; ++i) running_max[i] = neg_inf;
  for (int64_t j0 = 0; j0 < longest; j0 += kLanes) {
    const int valid = static_cast<int>(std::min<int64_t>(kLanes, longest - j0));
    vfloat kt[dim];  // kt[l]: element l of the block's keys
    for (int c = 0; c < chunks; ++c) {
      vfloat key[kLanes];
      for (int t = 0; t < kLanes; ++t)
        key[t] = t < valid ? vload(key_row(k, kv_stride, slots[j0 + t], num_slots) + kLanes * c) : vzero();
      transpose(key, kt + kLanes * c);
    }
    for (int64_t i = 0; i < rows; ++i) {
      if (counts[i] <= j0) continue;
      const int row_valid = static_cast<int>(std::min<int64_t>(kLanes, counts[i] - j0));
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = qs + (i * group + g) * dim;
        vfloat p[kLanes];
        for (int l = 0; l < kLanes; ++l) p[l] = vmul(vset1(qg[l]), kt[l]);
        for (int c = 1; c < chunks; ++c)
          for (int l = 0; l < kLanes; ++l) p[l] = vfmadd(vset1(qg[kLanes * c + l]), kt[kLanes * c + l], p[l]);
        vfloat quad[kLanes / 4];
        for (int j = 0; j < kLanes / 4; ++j) quad[j] = vadd(vadd(p[4 * j], p[4 * j + 2]), vadd(p[4 * j + 1], p[4 * j + 3]));
        const vfloat s = vfirst(row_valid, sum_quads(quad), neg_inf);
        vstore(scores + (i * group + g) * stride + j0, s);
        running_max[i * group + g] = vmax(running_max[i * group + g], s);
      }
    }
  }
}

// Query heads taken together in the weighted sum of values: their accumulators (B x chunks
// vectors) stay in registers, each value row is widened once for all of them.
template <int chunks>
constexpr int kGroupBlock = std::max(1, std::min(4, 16 / chunks));

// out[g] = inv_sum[g] * sum_j scores[g][j] * v[slots[j]] for the B heads g of a block, the sum
// taken over j in order (the same bits however the heads are blocked).
template <typename T, typename O, int chunks, int B>
inline void weighted_values(const float* scores, int64_t stride, const float* inv_sum, const T* v, int64_t kv_stride,
                            const int32_t* slots, int64_t count, O* out, int64_t out_head_stride) {
  vfloat acc[B][chunks];
  for (int g = 0; g < B; ++g)
    for (int c = 0; c < chunks; ++c) acc[g][c] = vzero();
  for (int64_t j = 0; j < count; ++j) {
    const T* src = v + static_cast<int64_t>(slots[j]) * kv_stride;
    vfloat value[chunks];
    for (int c = 0; c < chunks; ++c) value[c] = vload(src + kLanes * c);
    for (int g = 0; g < B; ++g) {
      const vfloat p = vset1(scores[g * stride + j]);
      for (int c = 0; c < chunks; ++c) acc[g][c] = vfmadd(p, value[c], acc[g][c]);
    }
  }
  for (int g = 0; g < B; ++g) {
    const vfloat norm = vset1(inv_sum[g]);
    for (int c = 0; c < chunks; ++c) vstore(out + g * out_head_stride + kLanes * c, vmul(acc[g][c], norm));
  }
}

// Softmax weights (unnormalized, in place of the scores) of one row's keys j < count for each
// query head g, from the heads' maxima `top`; -> each head's sum of them in sums[g].
inline void softmax_weights(float* scores, int64_t stride, int64_t count, int64_t group, const float* top, float* sums) {
  const int64_t padded = (count + kLanes - 1) / kLanes * kLanes;
  for (int64_t g = 0; g < group; ++g) {
    const vfloat m = vset1(top[g]);
    vfloat sum = vzero();
    for (int64_t j0 = 0; j0 < padded; j0 += kLanes) {
      const vfloat s = vload(scores + g * stride + j0);
      const vfloat e = vzero_where_neg_inf(s, vexp(vsub(s, m)));
      vstore(scores + g * stride + j0, e);
      sum = vadd(sum, e);
    }
    sums[g] = vreduce_add(sum);
  }
}

// out[g] = inv_sum[g] * sum_j weights[g][j] * v[slots[j]], heads blocked as registers allow.
template <typename T, typename O, int chunks>
inline void weighted_sums(const float* weights, int64_t stride, const float* inv_sum, const T* v, int64_t kv_stride,
                          const int32_t* slots, int64_t count, int64_t group, O* out, int64_t out_head_stride) {
  for (int64_t g0 = 0; g0 < group; g0 += kGroupBlock<chunks>) {
    switch (std::min<int64_t>(kGroupBlock<chunks>, group - g0)) {
#define LANGRT_BLOCK(B)                                                                                          \
  case B:                                                                                                        \
    if constexpr (B <= kGroupBlock<chunks>)                                                                      \
      weighted_values<T, O, chunks, B>(weights + g0 * stride, stride, inv_sum + g0, v, kv_stride, slots, count, \
                                       out + g0 * out_head_stride, out_head_stride);                            \
    break;
      LANGRT_BLOCK(1) LANGRT_BLOCK(2) LANGRT_BLOCK(3) LANGRT_BLOCK(4)
#undef LANGRT_BLOCK
    }
  }
}

// A segment's partial result, per query head g: part[g * (dim + 2)] its scores' maximum m,
// [+ 1] the sum of exp(score - m), [+ 2 ..] the values weighted by those exponentials (float32).
template <int chunks>
constexpr int64_t kPartFloats = kLanes * chunks + 2;

// The partial result of one segment from its scores (keys j < count, padded with -inf), which
// become its softmax weights. The same operations whether the segment's scores were taken alone
// (a decode's segment, a work item) or as part of the row's (a row among drafts or a prompt).
template <typename T, int chunks>
inline void segment_part(float* scores, int64_t stride, const T* v, int64_t kv_stride, const int32_t* slots,
                         int64_t count, int64_t group, float* part) {
  const int64_t padded = (count + kLanes - 1) / kLanes * kLanes;
  float top[kMaxGroup], sums[kMaxGroup], ones[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    vfloat m = vset1(-std::numeric_limits<float>::infinity());
    for (int64_t j0 = 0; j0 < padded; j0 += kLanes) m = vmax(m, vload(scores + g * stride + j0));
    top[g] = vreduce_max(m);
    ones[g] = 1.0f;
  }
  softmax_weights(scores, stride, count, group, top, sums);
  for (int64_t g = 0; g < group; ++g) {
    part[g * kPartFloats<chunks>] = top[g];
    part[g * kPartFloats<chunks> + 1] = sums[g];
  }
  weighted_sums<T, float, chunks>(scores, stride, ones, v, kv_stride, slots, count, group, part + 2, kPartFloats<chunks>);
}

// A row's output from its segments' partial results (`segments` of them, group * kPartFloats
// floats each), merged in order: each rescaled by exp(its maximum - the largest).
template <typename T, int chunks>
inline void merge_segments(const float* parts, int64_t segments, int64_t group, T* out, int64_t out_head_stride) {
  const int64_t part_size = group * kPartFloats<chunks>;
  for (int64_t g = 0; g < group; ++g) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < segments; ++s) top = std::max(top, parts[s * part_size + g * kPartFloats<chunks>]);
    vfloat acc[chunks];
    for (int c = 0; c < chunks; ++c) acc[c] = vzero();
    float total = 0.0f;
    for (int64_t s = 0; s < segments; ++s) {
      const float* p = parts + s * part_size + g * kPartFloats<chunks>;
      const float w = std::exp(p[0] - top);
      total += w * p[1];
      for (int c = 0; c < chunks; ++c) acc[c] = vfmadd(vset1(w), vload(p + 2 + kLanes * c), acc[c]);
    }
    const vfloat norm = vset1(1.0f / total);
    for (int c = 0; c < chunks; ++c) vstore(out + g * out_head_stride + kLanes * c, vmul(acc[c], norm));
  }
}

template <typename V>
inline void grow(std::vector<V>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(size);
}

// LANGRT_CPU_ATTENTION_SEGMENTS=0 takes every row's keys whole, as before segments (for
// comparisons: benchmarks/bench_long_context.py); read once, when the library loads.
const bool kSegmenting = [] {
  const char* value = std::getenv("LANGRT_CPU_ATTENTION_SEGMENTS");
  return value == nullptr || std::string(value) != "0";
}();

inline int64_t segments_of(int64_t count) {
  return kSegmenting && count > kSegmentKeys ? (count + kSegmentKeys - 1) / kSegmentKeys : 1;
}

// One row's output from its scores over all its keys (see row_scores): softmax, then the weighted
// sum of the values; past kSegmentKeys keys, segment by segment, then merged.
template <typename T, int chunks>
inline void row_output(float* scores, int64_t stride, const vfloat* running_max, const T* v, int64_t kv_stride,
                       const int32_t* slots, int64_t count, int64_t group, T* out, int64_t out_head_stride) {
  const int64_t segments = segments_of(count);
  if (segments > 1) {
    thread_local std::vector<float> parts;
    grow(parts, segments * group * kPartFloats<chunks>);
    for (int64_t s = 0; s < segments; ++s) {
      const int64_t first = s * kSegmentKeys;
      segment_part<T, chunks>(scores + first, stride, v, kv_stride, slots + first, std::min(kSegmentKeys, count - first),
                              group, parts.data() + s * group * kPartFloats<chunks>);
    }
    merge_segments<T, chunks>(parts.data(), segments, group, out, out_head_stride);
    return;
  }
  float top[kMaxGroup], inv_sum[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) top[g] = vreduce_max(running_max[g]);
  softmax_weights(scores, stride, count, group, top, inv_sum);
  for (int64_t g = 0; g < group; ++g) inv_sum[g] = 1.0f / inv_sum[g];
  weighted_sums<T, T, chunks>(scores, stride, inv_sum, v, kv_stride, slots, count, group, out, out_head_stride);
}

template <typename T, int chunks>  // chunks = head_dim / kLanes, a constant so the loops unroll
void attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& req_to_token,
                 const at::Tensor& rows, const at::Tensor& reqs, const at::Tensor& starts, const at::Tensor& ends,
                 at::Tensor& out, float scale) {
  const int64_t num_rows = rows.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k.size(1), group = heads / kv_heads;
  const int64_t num_slots = k.size(0), table_width = req_to_token.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int32_t* table = req_to_token.data_ptr<int32_t>();
  const int64_t* row_of = rows.data_ptr<int64_t>();
  const int64_t* req_of = reqs.data_ptr<int64_t>();
  const int32_t* start_of = starts.data_ptr<int32_t>();
  const int32_t* end_of = ends.data_ptr<int32_t>();
  const int64_t q_row_stride = q.stride(0), q_head_stride = q.stride(1);
  const int64_t out_row_stride = out.stride(0), out_head_stride = out.stride(1);

  int64_t longest = 0;
  for (int64_t n = 0; n < num_rows; ++n) longest = std::max<int64_t>(longest, end_of[n] - start_of[n]);
  const int64_t padded_longest = (longest + kLanes - 1) / kLanes * kLanes;
  // Work items: (chunk, KV head), a chunk being consecutive rows of one run, as many as keep their
  // scores within kScoreBytes (up to kChunkRows: a prompt's rows are split so that the threads
  // share it).
  int64_t chunk_rows =
      std::clamp<int64_t>(kScoreBytes / (group * padded_longest * static_cast<int64_t>(sizeof(float))), 1, kChunkRows);
  std::vector<int64_t> chunk_first;  // chunk c is rows [chunk_first[c], chunk_first[c + 1])
  auto split = [&] {
    chunk_first.clear();
    for (int64_t n = 0; n < num_rows; ++n) {
      const bool new_run = n == 0 || req_of[n] != req_of[n - 1] || start_of[n] != start_of[n - 1];
      if (new_run || n - chunk_first.back() == chunk_rows) chunk_first.push_back(n);
    }
  };
  split();
  // Too few items to keep the threads busy (one request's drafts: 9 rows, 3 KV heads, 2 threads):
  // smaller chunks. A row's bits do not depend on its chunk.
  const int64_t threads = at::get_num_threads();
  if (static_cast<int64_t>(chunk_first.size()) * kv_heads < 2 * threads && num_rows > kTransposeRows) {
    const int64_t per_run = (2 * threads + kv_heads - 1) / kv_heads;
    chunk_rows = std::max<int64_t>(kTransposeRows, std::min(chunk_rows, (num_rows + per_run - 1) / per_run));
    split();
  }
  const int64_t num_chunks = static_cast<int64_t>(chunk_first.size());
  chunk_first.push_back(num_rows);
  // Work items: (chunk, KV head) for a chunk's rows whole, or (chunk, KV head, segment) for a lone
  // row past kSegmentKeys keys (a decode), whose segments' partial results the last of them to
  // finish merges. Chunks costliest first (an item's keys times rows), so that the last items to
  // start are short ones.
  struct Item {
    int64_t chunk, head, segment;  // segment -1: the chunk whole
  };
  std::vector<int64_t> cost(num_chunks), segments(num_chunks), order(num_chunks), part_of(num_chunks, -1);
  int64_t num_parts = 0, num_items = 0;  // part_of[c]: a segmented chunk's first part (kv_heads x its segments)
  for (int64_t c = 0; c < num_chunks; ++c) {
    const int64_t first = chunk_first[c], count = end_of[first] - start_of[first];
    order[c] = c;
    segments[c] = chunk_first[c + 1] - first == 1 ? segments_of(count) : 1;
    for (int64_t n = first; n < chunk_first[c + 1]; ++n)
      cost[c] += (segments[c] > 1 ? kSegmentKeys : end_of[n] - start_of[n]) + 16;
    if (segments[c] > 1) {
      part_of[c] = num_parts;
      num_parts += kv_heads * segments[c];
    }
    num_items += kv_heads * segments[c];
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  std::vector<Item> items;
  items.reserve(num_items);
  for (const int64_t c : order)
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t s = 0; s < segments[c]; ++s) items.push_back({c, h, segments[c] > 1 ? s : -1});
  const int64_t part_size = group * kPartFloats<chunks>;
  thread_local std::vector<float> parts_buffer;  // the calling thread's (a thread_local named in the
  grow(parts_buffer, num_parts * part_size);      // lambda would be each worker's own): hence the pointer
  float* const parts = parts_buffer.data();
  struct alignas(64) Counter {  // one cache line each: threads finishing neighbours' segments do not contend
    std::atomic<int64_t> n{0};
  };
  std::unique_ptr<Counter[]> finished(num_parts > 0 ? new Counter[num_chunks * kv_heads] : nullptr);
  std::atomic<int64_t> next_item{0};

  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_items), 1, [&](int64_t, int64_t) {
    // per-thread scratch, kept from call to call (grown as needed)
    thread_local std::vector<float> qs, scores;
    thread_local std::vector<vfloat> running_max;
    thread_local std::vector<int64_t> counts;
    grow(qs, chunk_rows * group * dim);
    grow(scores, chunk_rows * group * padded_longest);
    grow(running_max, chunk_rows * group);
    grow(counts, chunk_rows);
    for (int64_t next; (next = next_item.fetch_add(1)) < num_items;) {
      const Item& item = items[next];
      const int64_t c = item.chunk, h = item.head;
      const int64_t first = chunk_first[c], rows_here = chunk_first[c + 1] - first;
      const int32_t* slots = table + req_of[first] * table_width + start_of[first];  // the run's keys
      const T* k_head = kp + h * dim;
      const T* v_head = vp + h * dim;
      if (item.segment >= 0) {
        const T* q_first = qp + row_of[first] * q_row_stride + h * group * q_head_stride;
        T* out_first = op + row_of[first] * out_row_stride + h * group * out_head_stride;
        const int64_t count = end_of[first] - start_of[first];
        const int64_t key0 = item.segment * kSegmentKeys, keys = std::min(kSegmentKeys, count - key0);
        row_scores<T, chunks>(q_first, q_head_stride, scale, k_head, kv_heads * dim, slots + key0, keys, group, num_slots,
                              scores.data(), kSegmentKeys, running_max.data());
        float* row_parts = parts + (part_of[c] + h * segments[c]) * part_size;
        segment_part<T, chunks>(scores.data(), kSegmentKeys, v_head, kv_heads * dim, slots + key0, keys, group,
                                row_parts + item.segment * part_size);
        if (finished[c * kv_heads + h].n.fetch_add(1, std::memory_order_acq_rel) == segments[c] - 1)
          merge_segments<T, chunks>(row_parts, segments[c], group, out_first, out_head_stride);
        continue;
      }
      for (int64_t i = 0; i < rows_here; ++i) counts[i] = end_of[first + i] - start_of[first + i];
      if (rows_here >= kTransposeRows) {
        for (int64_t i = 0; i < rows_here; ++i)
          scaled_query<T, chunks>(qp + row_of[first + i] * q_row_stride + h * group * q_head_stride, q_head_stride,
                                  group, scale, qs.data() + i * group * dim);
        run_scores<T, chunks>(qs.data(), rows_here, counts.data(), k_head, kv_heads * dim, slots, group, num_slots,
                              scores.data(), padded_longest, running_max.data());
      } else {
        for (int64_t i = 0; i < rows_here; ++i)
          row_scores<T, chunks>(qp + row_of[first + i] * q_row_stride + h * group * q_head_stride, q_head_stride, scale,
                                k_head, kv_heads * dim, slots, counts[i], group, num_slots,
                                scores.data() + i * group * padded_longest, padded_longest, running_max.data() + i * group);
      }
      for (int64_t i = 0; i < rows_here; ++i) {
        const int64_t n = first + i;
        row_output<T, chunks>(scores.data() + i * group * padded_longest, padded_longest, running_max.data() + i * group,
                              v_head, kv_heads * dim, slots, counts[i], group,
                              op + row_of[n] * out_row_stride + h * group * out_head_stride, out_head_stride);
      }
    }
  });
}

}  // namespace

namespace LANGRT_CPU_NS {

void paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& req_to_token,
                     const at::Tensor& rows, const at::Tensor& reqs, const at::Tensor& starts, const at::Tensor& ends,
                     at::Tensor out, double scale) {
  TORCH_CHECK(q.device().is_cpu(), "paged_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), "paged_attention: q and out must be [tokens, heads, head_dim]");
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.is_contiguous() && v.is_contiguous(),
              "paged_attention: k and v must be contiguous [slots, kv_heads, head_dim]");
  TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1, "paged_attention: head_dim must be contiguous in q and out");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
              "paged_attention: q, k, v and out must share a dtype");
  TORCH_CHECK(q.size(2) == k.size(2) && q.size(2) % 16 == 0 && q.size(2) <= kMaxDim,
              "paged_attention: head_dim must match and be a multiple of 16, at most ", kMaxDim);
  TORCH_CHECK(q.size(1) % k.size(1) == 0 && q.size(1) / k.size(1) <= kMaxGroup,
              "paged_attention: heads must be a multiple of kv_heads, at most ", kMaxGroup, " per KV head");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.is_contiguous() && req_to_token.scalar_type() == at::kInt,
              "paged_attention: req_to_token must be a contiguous int32 table");
  TORCH_CHECK(rows.scalar_type() == at::kLong && reqs.scalar_type() == at::kLong && starts.scalar_type() == at::kInt &&
                  ends.scalar_type() == at::kInt,
              "paged_attention: rows and reqs int64, starts and ends int32");
  const int64_t n = rows.numel();
  TORCH_CHECK(rows.is_contiguous() && reqs.is_contiguous() && starts.is_contiguous() && ends.is_contiguous() &&
                  reqs.numel() == n && starts.numel() == n && ends.numel() == n,
              "paged_attention: rows, reqs, starts and ends must be contiguous and of one length");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows.data_ptr<int64_t>()[i], req = reqs.data_ptr<int64_t>()[i];
    const int32_t first = starts.data_ptr<int32_t>()[i], last = ends.data_ptr<int32_t>()[i];
    TORCH_CHECK(row >= 0 && row < q.size(0), "paged_attention: row ", row, " outside q");
    TORCH_CHECK(req >= 0 && req < req_to_token.size(0), "paged_attention: request row ", req, " outside req_to_token");
    TORCH_CHECK(first >= 0 && first < last && last <= req_to_token.size(1),
                "paged_attention: key range [", first, ", ", last, ") is empty or outside req_to_token");
  }
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kFloat, "paged_attention: bfloat16 or float32 only");
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  const float s = static_cast<float>(scale);
#define LANGRT_CASE(C)                                                                              \
  case C:                                                                                           \
    if (bf16)                                                                                       \
      attend_rows<c10::BFloat16, C * 16 / kLanes>(q, k, v, req_to_token, rows, reqs, starts, ends, out, s);      \
    else                                                                                            \
      attend_rows<float, C * 16 / kLanes>(q, k, v, req_to_token, rows, reqs, starts, ends, out, s);              \
    break;
  switch (q.size(2) / 16) {
    LANGRT_CASE(1) LANGRT_CASE(2) LANGRT_CASE(3) LANGRT_CASE(4) LANGRT_CASE(5) LANGRT_CASE(6) LANGRT_CASE(7)
    LANGRT_CASE(8) LANGRT_CASE(9) LANGRT_CASE(10) LANGRT_CASE(11) LANGRT_CASE(12) LANGRT_CASE(13) LANGRT_CASE(14)
    LANGRT_CASE(15) LANGRT_CASE(16)
  }
#undef LANGRT_CASE
}

}  // namespace LANGRT_CPU_NS

LANGRT_TORCH_LIBRARY(LANGRT_CPU_NS, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k, Tensor v, Tensor req_to_token, Tensor rows, Tensor reqs, Tensor starts, "
      "Tensor ends, Tensor(a!) out, float scale) -> ()",
      &LANGRT_CPU_NS::paged_attention);
}
