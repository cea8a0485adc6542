// torch ops over quant_kernels.h: GGUF rows into langrt's row layout (langrt_quant::repack), y =
// x W^T on that layout (langrt_quant::quant_linear), and W's values (langrt_quant::dequantize).
// The caller (kernels/cpu/quant.py) says which implementation runs: 2 = AVX512-VNNI for 4- and 5-bit
// blocks (AVX2 for the others), 1 = AVX2 + FMA + F16C, 0 = plain C++. The work is split over
// torch's threads by weight rows; long inputs go through in chunks of rows, so that a chunk's quantized
// activations stay in cache while every weight row of a task passes over them.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "quant_kernels.h"

namespace {

using langrt_quant::kBlock;

constexpr int64_t kRowChunk = 64;
// Weight rows a task takes at a time (about this many bytes of blocks) past one group of
// activation rows: each group of 4 rows passes over a chunk while it is in cache, where a task's
// whole run of weight rows (half the LM head's: 15 MB) would come from memory once per group
// (64 KB: within any L2 beside the activation rows; 32-512 KB measured the same on Zen 4).
constexpr int64_t kWeightChunkBytes = 64 * 1024;

void check(const at::Tensor& x, const at::Tensor& w, int64_t qtype) {
  TORCH_CHECK(langrt_quant::row_bytes_of(qtype, 8) > 0, "quant_linear: unsupported GGML type ", qtype);
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "quant_linear: x must be 2-D with contiguous rows");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "quant_linear: x must be float32 or bfloat16");
  TORCH_CHECK(x.size(1) % kBlock == 0, "quant_linear: the input width must be a multiple of 32");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous(), "quant_linear: w must be contiguous uint8 [N, row bytes]");
  TORCH_CHECK(w.size(1) == langrt_quant::row_bytes_of(qtype, x.size(1) / kBlock), "quant_linear: w's rows do not hold ",
              x.size(1), " weights of type ", qtype);
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& w, int64_t qtype, int64_t isa) {
  check(x, w, qtype);
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0), blocks = k / kBlock;
  const bool bf16 = x.scalar_type() == at::kBFloat16, avx2 = isa >= 1;
  at::Tensor out = at::empty({rows, n}, x.options());
  std::vector<int16_t> q(rows * k);
  std::vector<float> d(rows * blocks), s(rows * blocks);
  const void* xp = x.data_ptr();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / k), [&](int64_t r0, int64_t r1) {
    const int64_t offset = r0 * x.stride(0) * static_cast<int64_t>(x.element_size());
    const void* first = static_cast<const char*>(xp) + offset;
#if defined(__x86_64__)
    auto quantize = avx2 ? langrt_quant::quantize_rows_avx2 : langrt_quant::quantize_rows_scalar;
#else
    auto quantize = langrt_quant::quantize_rows_scalar;
#endif
    quantize(first, bf16, x.stride(0), r1 - r0, k, q.data() + r0 * k, d.data() + r0 * blocks, s.data() + r0 * blocks);
  });
  // Q4_0, Q4_1, Q4_K and Q6_K on AVX2: the activations as bytes (quant_avx2_k.cpp), where VNNI does
  // not take them; Q4_0 and Q4_1 in rows of whole groups of 8 blocks (SmolLM2-135M's rows of 18
  // blocks ran 10-50% slower there than in quant_avx2.cpp, its rows of 48 as fast).
#if defined(__x86_64__)
  const bool bytes = avx2 && langrt_quant::byte_type(static_cast<int>(qtype)) && blocks % 8 == 0 &&
                     !(isa == 2 && langrt_quant::vnni_type(static_cast<int>(qtype)));
#else
  const bool bytes = false;
#endif
  // Q2_K's minimums (one per 16 weights) and Q6_K's -32 (on bytes) multiply the activations' sums over each 16.
  std::vector<float> h(qtype == langrt_quant::kQ2_K || (bytes && qtype == langrt_quant::kQ6_K) ? rows * blocks * 2 : 0);
  if (!h.empty()) langrt_quant::half_sums(q.data(), d.data(), rows * blocks, h.data());
  const langrt_quant::QuantizedRows xq{q.data(), d.data(), s.data(), k, h.empty() ? nullptr : h.data()};
  const langrt_quant::OutRows o{out.data_ptr(), out.stride(0), bf16};
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const int64_t row_bytes = w.size(1);
#if defined(__x86_64__)
  const bool vnni = isa == 2 && langrt_quant::vnni_type(static_cast<int>(qtype));
#else
  const bool vnni = false;
#endif
  // Both take x's quants as bytes (q = 256 * hi + lo): VNNI in order, the AVX2 byte kernel in its own.
  std::vector<uint8_t> lo(vnni || bytes ? rows * k : 0);
  std::vector<int8_t> hi(lo.size());
#if defined(__x86_64__)
  if (vnni) langrt_quant::split_rows(q.data(), rows * k, lo.data(), hi.data());
  if (bytes) langrt_quant::split_rows_k(static_cast<int>(qtype), q.data(), rows, k, lo.data(), hi.data());
  if (vnni) {
    // tasks of whole tiles of 16 weight rows
    at::parallel_for(0, (n + 15) / 16, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t m0 = 0; m0 < rows; m0 += kRowChunk) {
        langrt_quant::dot_rows_vnni(static_cast<int>(qtype), wp, row_bytes, 16 * t0, std::min(n, 16 * t1), xq, lo.data(),
                                    hi.data(), m0, std::min(rows, m0 + kRowChunk), o);
      }
    });
    return out;
  }
#endif
  const langrt_quant::ByteRows xb{lo.data(), hi.data()};
  // A task is at least ~2k block products: a decode's small layers stay on one thread. Up to 4
  // rows (one group) a task's weight rows are read once anyway and go through whole; each
  // output's sum is the same whatever the chunks (the tiles keep one accumulator per product).
  const int64_t grain = std::max<int64_t>(1, 2048 / (blocks * std::min(rows, kRowChunk)));
  const int64_t chunk = rows <= 4 ? n : std::max<int64_t>(4, kWeightChunkBytes / row_bytes / 4 * 4);
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
      const int64_t c1 = std::min(n1, c0 + chunk);
      for (int64_t m0 = 0; m0 < rows; m0 += kRowChunk) {
        const int64_t m1 = std::min(rows, m0 + kRowChunk);
#if defined(__x86_64__)
        if (bytes) {
          langrt_quant::dot_rows_k_avx2(qtype, wp, row_bytes, c0, c1, xq, xb, m0, m1, o);
          continue;
        }
        if (avx2) {
          langrt_quant::dot_rows_avx2(qtype, wp, row_bytes, c0, c1, xq, m0, m1, o);
          continue;
        }
#endif
        langrt_quant::dot_rows_scalar(qtype, wp, row_bytes, c0, c1, xq, m0, m1, o);
      }
    }
  });
  return out;
}

// x W^T for a few bfloat16 rows on AVX512-BF16 CPUs: W's values rounded to bfloat16 (the packed
// copy's values), dequantized tile by tile and shared by the rows (quant_bf16.cpp).
at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w, int64_t qtype) {
  check(x, w, qtype);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "dense_linear: x must be bfloat16");
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0);
  at::Tensor out = at::empty({rows, n}, x.options());
#if defined(__x86_64__)
  const langrt_quant::OutRows o{out.data_ptr(), out.stride(0), true};
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  // Tasks of whole tiles of 4 rows, at least ~32k products each.
  const int64_t grain = std::max<int64_t>(4, (32768 / (k * rows) + 3) / 4 * 4);
  at::parallel_for(0, (n + 3) / 4, std::max<int64_t>(1, grain / 4), [&](int64_t t0, int64_t t1) {
    langrt_quant::dense_rows_bf16(static_cast<int>(qtype), wp, w.size(1), 4 * t0, std::min(n, 4 * t1), xp, x.stride(0), k, 0,
                                  rows, o);
  });
#else
  TORCH_CHECK(false, "dense_linear: x86-64 only");
#endif
  return out;
}

// x W^T for passes of many rows (prompts): W's rows dequantized 16 at a time into float32 panels
// and multiplied there (quant_gemm.cpp), the panels split over torch's threads; no float copy of
// W is made, and the values are the blocks' exact values (those `dequantize` gives).
at::Tensor tile_linear(const at::Tensor& x, const at::Tensor& w, int64_t qtype, int64_t isa) {
  check(x, w, qtype);
  const int64_t rows = x.size(0), k = x.size(1), n = w.size(0), row_bytes = w.size(1);
  const at::Tensor xf = (x.scalar_type() == at::kFloat ? x : x.to(at::kFloat)).contiguous();
  at::Tensor out = at::empty({rows, n}, xf.options());
  const int64_t groups = (rows + langrt_quant::kGemmRows - 1) / langrt_quant::kGemmRows;
  at::Tensor packed = at::empty({groups * langrt_quant::kGemmRows, k}, xf.options());
  const float* xp = xf.data_ptr<float>();
  float *pp = packed.data_ptr<float>(), *op = out.data_ptr<float>();
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) { langrt_quant::pack_rows(xp, rows, k, g0, g1, pp); });
  const uint8_t* wp = w.data_ptr<uint8_t>();
  at::parallel_for(0, (n + 15) / 16, 1, [&](int64_t t0, int64_t t1) {
    langrt_quant::panel_gemm(static_cast<int>(qtype), wp, row_bytes, 16 * t0, std::min(n, 16 * t1), pp, rows, k, op, n,
                             isa >= 1);
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

at::Tensor dequantize(const at::Tensor& w, int64_t qtype, int64_t k, at::ScalarType dtype) {
  TORCH_CHECK(langrt_quant::row_bytes_of(qtype, 8) > 0, "dequantize: unsupported GGML type ", qtype);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous(), "dequantize: w must be contiguous uint8");
  TORCH_CHECK(k % kBlock == 0 && w.size(1) == langrt_quant::row_bytes_of(qtype, k / kBlock), "dequantize: bad row width");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dequantize: float32 or bfloat16 out");
  at::Tensor out = at::empty({w.size(0), k}, w.options().dtype(dtype));
  const langrt_quant::OutRows o{out.data_ptr(), k, dtype == at::kBFloat16};
  const uint8_t* wp = w.data_ptr<uint8_t>();
  at::parallel_for(0, w.size(0), 64, [&](int64_t n0, int64_t n1) {
    langrt_quant::dequantize_rows_scalar(static_cast<int>(qtype), wp, w.size(1), n0, n1, k, o);
  });
  return out;
}

// GGUF's Q4_K / Q6_K rows -> langrt's layout of their super-blocks, rows split over the threads.
at::Tensor repack_k(const at::Tensor& w, int64_t qtype) {
  const int64_t in_bytes = qtype == langrt_quant::kQ4_K ? 144 : 210;
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(1) % in_bytes == 0,
              "repack: w must be contiguous uint8 [N, whole super-blocks of ", in_bytes, " bytes]");
  const int64_t supers = w.size(1) / in_bytes, out_row = supers * langrt_quant::super_bytes(static_cast<int>(qtype));
  at::Tensor out = at::empty({w.size(0), out_row}, w.options());
  const uint8_t* src = w.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, w.size(0), 64, [&](int64_t r0, int64_t r1) {
    langrt_quant::repack_k_rows(static_cast<int>(qtype), src + r0 * w.size(1), dst + r0 * out_row, r1 - r0, supers);
  });
  return out;
}

at::Tensor repack(const at::Tensor& w, int64_t qtype) {
  if (langrt_quant::packed_k(static_cast<int>(qtype))) return repack_k(w, qtype);
  const int64_t bytes = langrt_quant::block_bytes(qtype);
  TORCH_CHECK(bytes > 0 && langrt_quant::gguf_sized(static_cast<int>(qtype)), "repack: GGML type ", qtype,
              " is not one repacked here (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K; Q2_K, Q3_K and Q5_K are unpacked in langrt.model.kquants)");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2 && w.is_contiguous() && w.size(1) % bytes == 0,
              "repack: w must be contiguous uint8 [N, whole blocks]");
  at::Tensor out = at::empty_like(w);
  langrt_quant::repack_rows(static_cast<int>(qtype), w.data_ptr<uint8_t>(), out.data_ptr<uint8_t>(), w.size(0), w.size(1) / bytes);
  return out;
}

}  // namespace

TORCH_LIBRARY(langrt_quant, m) {
  m.def("quant_linear(Tensor x, Tensor w, int qtype, int isa) -> Tensor");
  m.def("dense_linear(Tensor x, Tensor w, int qtype) -> Tensor");
  m.def("tile_linear(Tensor x, Tensor w, int qtype, int isa) -> Tensor");
  m.def("dequantize(Tensor w, int qtype, int k, ScalarType dtype) -> Tensor");
  m.def("repack(Tensor w, int qtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(langrt_quant, CPU, m) {
  m.impl("quant_linear", quant_linear);
  m.impl("dense_linear", dense_linear);
  m.impl("tile_linear", tile_linear);
  m.impl("dequantize", dequantize);
  m.impl("repack", repack);
}
