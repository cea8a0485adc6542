// Every layer of a forward pass in one call: the loop langrt.model.llama runs per layer (norm, qkv
// projection, rotary, K/V write, paged attention, output projection, norm, MLP), moved out of
// Python. At batch 1 on the built-in model the products take ~5 ms of a ~10 ms step and the rest
// was dispatching ~10 small ops per layer from Python.
//
// Each step calls what the Python path calls, in its order and with its arguments (the layer
// kernels, the quantized products and oneDNN's packed GEMM through torch's dispatcher, at::mv and
// at::linear for plain weights, chosen by langrt.model.layers.linear's rules), so the results are
// the same bits; tests/numerics/test_fused_layers.py holds it to that.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "layer_ops.h"

namespace {

using at::Tensor;

Tensor quant_linear(const Tensor& x, const Tensor& blocks, int64_t qtype, int64_t isa) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("langrt_quant::quant_linear", "")
                             .typed<Tensor(const Tensor&, const Tensor&, int64_t, int64_t)>();
  return op.call(x, blocks, qtype, isa);
}

Tensor dense_linear(const Tensor& x, const Tensor& blocks, int64_t qtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("langrt_quant::dense_linear", "")
                             .typed<Tensor(const Tensor&, const Tensor&, int64_t)>();
  return op.call(x, blocks, qtype);
}

Tensor tile_linear(const Tensor& x, const Tensor& blocks, int64_t qtype, int64_t isa) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("langrt_quant::tile_linear", "")
                             .typed<Tensor(const Tensor&, const Tensor&, int64_t, int64_t)>();
  return op.call(x, blocks, qtype, isa >= 1 ? 1 : 0);
}

// oneDNN's GEMM on a packed weight (torch.ops.mkldnn._linear_pointwise), called boxed: its C++
// signature is torch's business.
Tensor packed_linear(const Tensor& x, const Tensor& packed, const c10::optional<Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack{x, packed, bias, c10::string_view("none"), c10::List<c10::optional<c10::Scalar>>(),
                          c10::optional<c10::string_view>(c10::string_view(""))};
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// How langrt.model.layers.linear multiplies (and langrt.model.quant.QuantizedWeight.matmul).
constexpr int64_t kQ8_0 = 8;  // GGML's type number

// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K: quant.VNNI_TYPES
bool vnni_block(int64_t qtype) { return qtype == 2 || qtype == 3 || qtype == 6 || qtype == 7 || qtype == 12 || qtype == 13; }
// Q4_0, Q4_1, Q8_0, Q4_K: quant.FLY_TYPES (dense_linear's vector dequantization)
bool fly_block(int64_t qtype) { return qtype == 2 || qtype == 3 || qtype == 8 || qtype == 12; }

struct LinearRules {
  bool decode_pass;         // the runner's pass is a decoding pass, no prompt rows (quant.set_pass)
  int64_t packed_max_rows;  // layers.PACKED_MAX_ROWS
  int64_t isa;              // the quantized kernels' ISA flag (kernels/cpu/quant.py's op_isa)
  int64_t fly_max_rows;     // quant.fly_max_rows(): bf16 passes of 2 to this many rows dequantize tiles
  int64_t fly_max_rows_q8;  // quant.fly_max_rows(Q8_0): the same for Q8_0 blocks
  int64_t vnni_max_rows;    // quant.vnni_max_rows(): bf16 passes of 2 to this many rows, 4- and 5-bit blocks' VNNI kernel
  int64_t tile_min_rows;    // quant.prompt_tile_min_rows(): prompt passes of this many rows (> 0) on dequantized panels
};

// A matrix: a plain weight (one part, type 0) or GGUF blocks, in one part or in row ranges of
// different types (StackedQuantizedWeight: Q4_K_M's Q4_K q and k beside a Q6_K v) whose outputs
// sit side by side.
struct Matrix {
  const Tensor* parts;
  const int64_t* types;
  int64_t count;
  const c10::optional<Tensor>& packed;
};

// Each part's result (a product, or its values), joined along the outputs (dim -1 or 0).
template <typename Product>
Tensor by_parts(const Matrix& m, const Product& product, int64_t dim = -1) {
  if (m.count == 1) return product(m.parts[0], m.types[0]);
  std::vector<Tensor> outs;
  for (int64_t i = 0; i < m.count; ++i) outs.push_back(product(m.parts[i], m.types[i]));
  return at::cat(outs, dim);
}

// x W^T (+ b). GGUF blocks: a decode pass's single row by the quantized kernels, a decoding pass's
// 2 to vnni_max_rows bf16 rows by their AVX512-VNNI kernel (4- and 5-bit blocks), else 2 to fly_max_rows
// by dense_linear, a prompt pass of tile_min_rows or more by tile_linear's dequantized panels
// (bfloat16 ones only without a packed copy), other passes in bfloat16 by the packed copy where
// there is one. Plain: a single row by
// a matrix-vector product, up to packed_max_rows by the packed copy, else at::linear.
Tensor linear(const Tensor& x_in, const Matrix& m, const c10::optional<Tensor>& bias, const LinearRules& r) {
  const int64_t rows = x_in.size(0);
  if (m.types[0] > 0) {
    const Tensor x = x_in.stride(-1) == 1 ? x_in : x_in.contiguous();
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    Tensor y;
    int64_t fly_rows = r.fly_max_rows, vnni_rows = r.vnni_max_rows;  // every part's limits
    for (int64_t i = 0; i < m.count; ++i) {
      fly_rows = std::min(fly_rows, m.types[i] == kQ8_0 ? r.fly_max_rows_q8 : r.fly_max_rows);
      if (!fly_block(m.types[i])) fly_rows = 0;
      if (!vnni_block(m.types[i])) vnni_rows = 0;
    }
    if (bf16 && rows >= 2 && rows <= vnni_rows) {
      y = by_parts(m, [&](const Tensor& w, int64_t t) { return quant_linear(x, w, t, r.isa); });
    } else if (bf16 && rows >= 2 && rows <= fly_rows) {
      y = by_parts(m, [&](const Tensor& w, int64_t t) { return dense_linear(x, w, t); });
    } else if (r.tile_min_rows > 0 && rows >= r.tile_min_rows && (!bf16 || !m.packed.has_value())) {
      y = by_parts(m, [&](const Tensor& w, int64_t t) { return tile_linear(x, w, t, r.isa); });
    } else if (m.packed.has_value() && !(r.decode_pass && rows == 1) && bf16) {
      y = packed_linear(x_in, *m.packed, c10::nullopt);
    } else {
      y = by_parts(m, [&](const Tensor& w, int64_t t) { return quant_linear(x, w, t, r.isa); });
    }
    return bias.has_value() ? y + *bias : y;
  }
  const Tensor& w = m.parts[0];
  if (rows == 1) {
    Tensor y = at::mv(w, x_in[0]).unsqueeze(0);
    return bias.has_value() ? y + *bias : y;
  }
  if (m.packed.has_value() && x_in.numel() <= r.packed_max_rows * x_in.size(-1)) return packed_linear(x_in, *m.packed, bias);
  return at::linear(x_in, w, bias);
}

struct Attention {
  at::TensorList k_buffers, v_buffers;
  const Tensor &slots, &req_to_token, &rows, &reqs, &starts, &ends;
  int64_t heads, kv_heads, head_dim;
  double scale;
};

// One layer's attention: writes k, v into the pool at `slots`, then attends q over the pool.
Tensor attend(const Attention& a, int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t n = q.size(0);
  const Tensor& kbuf = a.k_buffers[layer];
  const Tensor& vbuf = a.v_buffers[layer];
  kbuf.index_copy_(0, a.slots, k.view({n, a.kv_heads, a.head_dim}).to(kbuf.scalar_type()));
  vbuf.index_copy_(0, a.slots, v.view({n, a.kv_heads, a.head_dim}).to(vbuf.scalar_type()));
  Tensor out = at::empty({n, a.heads * a.head_dim}, q.options());
  LANGRT_CPU_NS::paged_attention(q.view({n, a.heads, a.head_dim}), kbuf, vbuf, a.req_to_token, a.rows, a.reqs, a.starts,
                                 a.ends, out.view({n, a.heads, a.head_dim}), a.scale);
  return out;
}

std::vector<Tensor> fused_layers(const Tensor& x_in, at::TensorList weights, at::IntArrayRef qtypes,
                                  at::IntArrayRef parts, const c10::List<c10::optional<Tensor>>& packed,
                                  const c10::List<c10::optional<Tensor>>& qkv_biases, at::TensorList norms, double eps,
                                  const Tensor& cos, const Tensor& sin, at::IntArrayRef sizes, at::TensorList k_buffers,
                                  at::TensorList v_buffers,
                                  const Tensor& slots, const Tensor& req_to_token, const Tensor& rows, const Tensor& reqs,
                                  const Tensor& starts, const Tensor& ends, double scale, bool decode_pass,
                                  int64_t packed_max_rows, int64_t isa, int64_t fly_max_rows, int64_t fly_max_rows_q8,
                                  int64_t vnni_max_rows, int64_t tile_min_rows) {
  const int64_t layers = static_cast<int64_t>(norms.size()) / 2;
  TORCH_CHECK(x_in.dim() == 2, "fused_layers: x must be [tokens, hidden]");
  TORCH_CHECK(sizes.size() == 5, "fused_layers: sizes are q_size, kv_size, head_dim, heads, kv_heads");
  int64_t total_parts = 0;
  for (const int64_t count : parts) total_parts += count;
  TORCH_CHECK(static_cast<int64_t>(parts.size()) == 4 * layers && static_cast<int64_t>(weights.size()) == total_parts &&
                  static_cast<int64_t>(qtypes.size()) == total_parts && static_cast<int64_t>(packed.size()) == 4 * layers &&
                  static_cast<int64_t>(qkv_biases.size()) == layers && static_cast<int64_t>(k_buffers.size()) == layers &&
                  static_cast<int64_t>(v_buffers.size()) == layers,
              "fused_layers: per layer 4 matrices (qkv, o, gate_up, down: their parts' weights and types, the number of "
              "parts, packed copies or None), 2 norms, a qkv bias or None and K/V buffers");
  const int64_t q_size = sizes[0], kv_size = sizes[1], head_dim = sizes[2];
  const Attention a{k_buffers, v_buffers, slots, req_to_token, rows, reqs, starts, ends, sizes[3], sizes[4], head_dim, scale};
  const int64_t n = x_in.size(0);
  const Tensor cos2 = cos.view({n, -1}), sin2 = sin.view({n, -1});
  const LinearRules rules{decode_pass, packed_max_rows, isa, fly_max_rows, fly_max_rows_q8, vnni_max_rows, tile_min_rows};
  const c10::optional<Tensor> none;
  std::vector<int64_t> first_part(4 * layers + 1, 0);
  for (int64_t i = 0; i < 4 * layers; ++i) first_part[i + 1] = first_part[i] + parts[i];
  std::vector<c10::optional<Tensor>> copies(packed.begin(), packed.end());
  auto matrix = [&](int64_t i) {
    return Matrix{weights.data() + first_part[i], qtypes.data() + first_part[i], parts[i], copies[i]};
  };
  Tensor x = x_in, residual;
  for (int64_t l = 0; l < layers; ++l) {
    Tensor normed = at::empty(x.sizes(), x.options());
    if (l == 0) {
      residual = x;
      LANGRT_CPU_NS::rms_norm(x, norms[2 * l], eps, none, normed, none);
    } else {
      Tensor summed = at::empty(x.sizes(), x.options());
      LANGRT_CPU_NS::rms_norm(x, norms[2 * l], eps, residual, normed, summed);
      residual = summed;
    }
    const Tensor qkv = linear(normed, matrix(4 * l), qkv_biases.get(l), rules);
    const Tensor qk = qkv.slice(1, 0, q_size + kv_size);
    LANGRT_CPU_NS::rotary(qk.view({n, -1, head_dim}), cos2, sin2);  // q and k side by side: one rotation
    const Tensor o = attend(a, l, qkv.slice(1, 0, q_size), qkv.slice(1, q_size, q_size + kv_size),
                            qkv.slice(1, q_size + kv_size, q_size + 2 * kv_size));
    const Tensor projected = linear(o, matrix(4 * l + 1), none, rules);
    Tensor post = at::empty(x.sizes(), x.options()), summed = at::empty(x.sizes(), x.options());
    LANGRT_CPU_NS::rms_norm(projected, norms[2 * l + 1], eps, residual, post, summed);
    residual = summed;
    const Tensor gate_up = linear(post, matrix(4 * l + 2), none, rules);
    Tensor act = at::empty({n, gate_up.size(1) / 2}, x.options());
    LANGRT_CPU_NS::silu_and_mul(gate_up, act);
    x = linear(act, matrix(4 * l + 3), none, rules);
  }
  return {x, residual};
}

}  // namespace

LANGRT_TORCH_LIBRARY_FRAGMENT(LANGRT_CPU_NS, m) {
  m.def(
      "fused_layers(Tensor x, Tensor[] weights, int[] qtypes, int[] parts, Tensor?[] packed, Tensor?[] qkv_biases, Tensor[] norms, "
      "float eps, Tensor cos, Tensor sin, int[] sizes, Tensor[] k_buffers, Tensor[] v_buffers, Tensor slots, "
      "Tensor req_to_token, Tensor rows, Tensor reqs, Tensor starts, Tensor ends, float scale, bool decode_pass, "
      "int packed_max_rows, int isa, int fly_max_rows, int fly_max_rows_q8, int vnni_max_rows, int tile_min_rows) -> Tensor[]",
      &fused_layers);
}
