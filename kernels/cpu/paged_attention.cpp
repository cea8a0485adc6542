// Attention for the short rows of a forward pass (decode tokens, jump-forward drafts), reading
// K/V straight from the paged pool through the request's slot table.
//
// One call per layer covers every such row of the pass, however many new tokens each request
// has: no K/V gather into a padded block, no padding, no scatter back. The arithmetic for a row
// depends only on that row's query and keys, so its output is the same bits whatever else is in
// the batch.
//
// Work is split by (run, KV head), a run being the consecutive rows of one request over keys from
// one start (a decode is a run of one; a request with jump-forward drafts, a run of several): its
// rows take their turns on one thread while that head's keys and values are still in L1, instead
// of each row fetching them again. Items are taken one at a time by whichever thread is free,
// longest runs first, so runs (compute-bound, keys in cache) and decodes (waiting on memory)
// balance across threads.
//
// Numerics: scores, softmax and the weighted sum in float32 (bf16 inputs are widened exactly);
// exp by a degree-6 polynomial after range reduction (about 1 ulp); the output rounded to the
// input dtype to nearest-even, as torch's .to() does. Needs AVX-512F.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "vec.h"

namespace {

using langrt_cpu::exp16;
using langrt_cpu::load16;
using langrt_cpu::store16;

constexpr int kMaxGroup = 16;   // query heads per KV head
constexpr int kMaxChunks = 16;  // head_dim / 16

// Lane i of the result: the sum of the 16 lanes of v[i].
inline __m512 sum_lanes16(const __m512* v) {
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

// One row, one KV head: the query heads of that KV head over keys slots[0, count).
template <typename T, int chunks>
inline void attend_row(const T* q, int64_t q_head_stride, const T* k, const T* v, int64_t kv_stride,
                       const int32_t* slots, int64_t count, int64_t group, int64_t num_slots, float scale,
                       float* scores, T* out, int64_t out_head_stride) {
  const int64_t padded = (count + 15) / 16 * 16;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 qv[kMaxGroup][chunks];
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < chunks; ++c) qv[g][c] = _mm512_mul_ps(load16(q + g * q_head_stride + 16 * c), scale_v);

  // scores, 16 keys at a time
  __m512 running_max[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) running_max[g] = neg_inf;
  for (int64_t j0 = 0; j0 < count; j0 += 16) {
    const int valid = static_cast<int>(std::min<int64_t>(16, count - j0));
    __m512 key[16][chunks];
    for (int t = 0; t < 16; ++t) {
      if (t < valid) {
        const int64_t slot = slots[j0 + t];
        TORCH_CHECK(slot >= 0 && slot < num_slots, "paged_attention: slot ", slot, " outside the pool");
        const T* src = k + slot * kv_stride;
        for (int c = 0; c < chunks; ++c) key[t][c] = load16(src + 16 * c);
      } else {
        for (int c = 0; c < chunks; ++c) key[t][c] = _mm512_setzero_ps();
      }
    }
    const __mmask16 live = static_cast<__mmask16>((1u << valid) - 1);
    for (int64_t g = 0; g < group; ++g) {
      __m512 dots[16];
      for (int t = 0; t < 16; ++t) {
        __m512 acc = _mm512_mul_ps(qv[g][0], key[t][0]);
        for (int c = 1; c < chunks; ++c) acc = _mm512_fmadd_ps(qv[g][c], key[t][c], acc);
        dots[t] = acc;
      }
      const __m512 s = _mm512_mask_blend_ps(live, neg_inf, sum_lanes16(dots));
      _mm512_storeu_ps(scores + g * padded + j0, s);
      running_max[g] = _mm512_max_ps(running_max[g], s);
    }
  }

  // softmax weights (unnormalized) and their sums
  float inv_sum[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(running_max[g]));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < padded; j0 += 16) {
      const __m512 s = _mm512_loadu_ps(scores + g * padded + j0);
      const __m512 e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, neg_inf, _CMP_NEQ_OQ), exp16(_mm512_sub_ps(s, m)));
      _mm512_storeu_ps(scores + g * padded + j0, e);
      sum = _mm512_add_ps(sum, e);
    }
    inv_sum[g] = 1.0f / _mm512_reduce_add_ps(sum);
  }

  // weighted sum of the values
  __m512 acc[kMaxGroup][chunks];
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < chunks; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < count; ++j) {
    const T* src = v + static_cast<int64_t>(slots[j]) * kv_stride;
    __m512 value[chunks];
    for (int c = 0; c < chunks; ++c) value[c] = load16(src + 16 * c);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * padded + j]);
      for (int c = 0; c < chunks; ++c) acc[g][c] = _mm512_fmadd_ps(p, value[c], acc[g][c]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const __m512 norm = _mm512_set1_ps(inv_sum[g]);
    for (int c = 0; c < chunks; ++c) store16(out + g * out_head_stride + 16 * c, _mm512_mul_ps(acc[g][c], norm));
  }
}

template <typename T, int chunks>  // chunks = head_dim / 16, a constant so the loops unroll
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

  std::vector<int64_t> run_first;  // run r is rows [run_first[r], run_first[r + 1])
  int64_t longest = 0;
  for (int64_t n = 0; n < num_rows; ++n) {
    longest = std::max<int64_t>(longest, end_of[n] - start_of[n]);
    if (n == 0 || req_of[n] != req_of[n - 1] || start_of[n] != start_of[n - 1]) run_first.push_back(n);
  }
  const int64_t num_runs = static_cast<int64_t>(run_first.size());
  run_first.push_back(num_rows);
  std::vector<int64_t> order(num_runs);
  for (int64_t r = 0; r < num_runs; ++r) order[r] = r;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return run_first[a + 1] - run_first[a] > run_first[b + 1] - run_first[b];
  });
  const int64_t padded_longest = (longest + 15) / 16 * 16;
  const int64_t num_items = num_runs * kv_heads;
  std::atomic<int64_t> next_item{0};

  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), num_items), 1, [&](int64_t, int64_t) {
    std::vector<float> scores(group * padded_longest);
    for (int64_t item; (item = next_item.fetch_add(1)) < num_items;) {
      const int64_t r = order[item / kv_heads], h = item % kv_heads;
      for (int64_t n = run_first[r]; n < run_first[r + 1]; ++n) {
        attend_row<T, chunks>(qp + row_of[n] * q_row_stride + h * group * q_head_stride, q_head_stride,
                              kp + h * dim, vp + h * dim, kv_heads * dim,
                              table + req_of[n] * table_width + start_of[n], end_of[n] - start_of[n], group,
                              num_slots, scale, scores.data(),
                              op + row_of[n] * out_row_stride + h * group * out_head_stride, out_head_stride);
      }
    }
  });
}

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
  TORCH_CHECK(q.size(2) == k.size(2) && q.size(2) % 16 == 0 && q.size(2) <= 16 * kMaxChunks,
              "paged_attention: head_dim must match and be a multiple of 16, at most ", 16 * kMaxChunks);
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
      attend_rows<c10::BFloat16, C>(q, k, v, req_to_token, rows, reqs, starts, ends, out, s);      \
    else                                                                                            \
      attend_rows<float, C>(q, k, v, req_to_token, rows, reqs, starts, ends, out, s);              \
    break;
  switch (q.size(2) / 16) {
    LANGRT_CASE(1) LANGRT_CASE(2) LANGRT_CASE(3) LANGRT_CASE(4) LANGRT_CASE(5) LANGRT_CASE(6) LANGRT_CASE(7)
    LANGRT_CASE(8) LANGRT_CASE(9) LANGRT_CASE(10) LANGRT_CASE(11) LANGRT_CASE(12) LANGRT_CASE(13) LANGRT_CASE(14)
    LANGRT_CASE(15) LANGRT_CASE(16)
  }
#undef LANGRT_CASE
}

}  // namespace

TORCH_LIBRARY(langrt_cpu, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k, Tensor v, Tensor req_to_token, Tensor rows, Tensor reqs, Tensor starts, "
      "Tensor ends, Tensor(a!) out, float scale) -> ()",
      &paged_attention);
}
