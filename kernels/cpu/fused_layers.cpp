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
struct LinearRules {
  bool decode_pass;         // the runner's pass is a decode pass (quant.set_pass)
  int64_t packed_max_rows;  // layers.PACKED_MAX_ROWS
  int64_t isa;              // the quantized kernels' ISA flag
  int64_t fly_max_rows;     // quant.fly_max_rows(): bf16 passes of 2 to this many rows dequantize tiles
};

// x W^T (+ b). GGUF blocks (qtype > 0): a decode pass's single row by the quantized kernels, a
// decoding pass's 2 to fly_max_rows bf16 rows by dense_linear, other passes in bfloat16 by the
// packed copy where there is one. Plain: a single row by a
// matrix-vector product, up to packed_max_rows by the packed copy, else at::linear.
Tensor linear(const Tensor& x, const Tensor& w, int64_t qtype, const c10::optional<Tensor>& packed,
              const c10::optional<Tensor>& bias, const LinearRules& r) {
  const int64_t rows = x.size(0);
  if (qtype > 0) {
    if (x.scalar_type() == at::kBFloat16 && rows >= 2 && rows <= r.fly_max_rows) {
      Tensor y = dense_linear(x.stride(-1) == 1 ? x : x.contiguous(), w, qtype);
      return bias.has_value() ? y + *bias : y;
    }
    const bool single_decode_row = r.decode_pass && rows == 1;
    Tensor y = packed.has_value() && !single_decode_row && x.scalar_type() == at::kBFloat16
                   ? packed_linear(x, *packed, c10::nullopt)
                   : quant_linear(x.stride(-1) == 1 ? x : x.contiguous(), w, qtype, r.isa);
    return bias.has_value() ? y + *bias : y;
  }
  if (rows == 1) {
    Tensor y = at::mv(w, x[0]).unsqueeze(0);
    return bias.has_value() ? y + *bias : y;
  }
  if (packed.has_value() && x.numel() <= r.packed_max_rows * x.size(-1)) return packed_linear(x, *packed, bias);
  return at::linear(x, w, bias);
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
                                  const c10::List<c10::optional<Tensor>>& packed,
                                  const c10::List<c10::optional<Tensor>>& qkv_biases, at::TensorList norms, double eps,
                                  const Tensor& cos, const Tensor& sin, at::IntArrayRef sizes, at::TensorList k_buffers,
                                  at::TensorList v_buffers,
                                  const Tensor& slots, const Tensor& req_to_token, const Tensor& rows, const Tensor& reqs,
                                  const Tensor& starts, const Tensor& ends, double scale, bool decode_pass,
                                  int64_t packed_max_rows, int64_t isa, int64_t fly_max_rows) {
  const int64_t layers = static_cast<int64_t>(norms.size()) / 2;
  TORCH_CHECK(x_in.dim() == 2, "fused_layers: x must be [tokens, hidden]");
  TORCH_CHECK(sizes.size() == 5, "fused_layers: sizes are q_size, kv_size, head_dim, heads, kv_heads");
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 4 * layers && static_cast<int64_t>(qtypes.size()) == 4 * layers &&
                  static_cast<int64_t>(packed.size()) == 4 * layers &&
                  static_cast<int64_t>(qkv_biases.size()) == layers && static_cast<int64_t>(k_buffers.size()) == layers &&
                  static_cast<int64_t>(v_buffers.size()) == layers,
              "fused_layers: per layer 4 weights (qkv, o, gate_up, down) with their packed copies or None, 2 norms, "
              "a qkv bias or None and K/V buffers");
  const int64_t q_size = sizes[0], kv_size = sizes[1], head_dim = sizes[2];
  const Attention a{k_buffers, v_buffers, slots, req_to_token, rows, reqs, starts, ends, sizes[3], sizes[4], head_dim, scale};
  const int64_t n = x_in.size(0);
  const Tensor cos2 = cos.view({n, -1}), sin2 = sin.view({n, -1});
  const LinearRules rules{decode_pass, packed_max_rows, isa, fly_max_rows};
  const c10::optional<Tensor> none;
  Tensor x = x_in, residual;
  for (int64_t l = 0; l < layers; ++l) {
    const Tensor* w = weights.data() + 4 * l;
    const int64_t* t = qtypes.data() + 4 * l;
    Tensor normed = at::empty(x.sizes(), x.options());
    if (l == 0) {
      residual = x;
      LANGRT_CPU_NS::rms_norm(x, norms[2 * l], eps, none, normed, none);
    } else {
      Tensor summed = at::empty(x.sizes(), x.options());
      LANGRT_CPU_NS::rms_norm(x, norms[2 * l], eps, residual, normed, summed);
      residual = summed;
    }
    const Tensor qkv = linear(normed, w[0], t[0], packed.get(4 * l), qkv_biases.get(l), rules);
    const Tensor qk = qkv.slice(1, 0, q_size + kv_size);
    LANGRT_CPU_NS::rotary(qk.view({n, -1, head_dim}), cos2, sin2);  // q and k side by side: one rotation
    const Tensor o = attend(a, l, qkv.slice(1, 0, q_size), qkv.slice(1, q_size, q_size + kv_size),
                            qkv.slice(1, q_size + kv_size, q_size + 2 * kv_size));
    const Tensor projected = linear(o, w[1], t[1], packed.get(4 * l + 1), none, rules);
    Tensor post = at::empty(x.sizes(), x.options()), summed = at::empty(x.sizes(), x.options());
    LANGRT_CPU_NS::rms_norm(projected, norms[2 * l + 1], eps, residual, post, summed);
    residual = summed;
    const Tensor gate_up = linear(post, w[2], t[2], packed.get(4 * l + 2), none, rules);
    Tensor act = at::empty({n, gate_up.size(1) / 2}, x.options());
    LANGRT_CPU_NS::silu_and_mul(gate_up, act);
    x = linear(act, w[3], t[3], packed.get(4 * l + 3), none, rules);
  }
  return {x, residual};
}

}  // namespace

LANGRT_TORCH_LIBRARY_FRAGMENT(LANGRT_CPU_NS, m) {
  m.def(
      "fused_layers(Tensor x, Tensor[] weights, int[] qtypes, Tensor?[] packed, Tensor?[] qkv_biases, Tensor[] norms, "
      "float eps, Tensor cos, Tensor sin, int[] sizes, Tensor[] k_buffers, Tensor[] v_buffers, Tensor slots, "
      "Tensor req_to_token, Tensor rows, Tensor reqs, Tensor starts, Tensor ends, float scale, bool decode_pass, "
      "int packed_max_rows, int isa, int fly_max_rows) -> Tensor[]",
      &fused_layers);
}
