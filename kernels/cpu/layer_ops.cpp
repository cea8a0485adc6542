// The elementwise parts of a Llama-family layer on CPU, one pass over each row: residual add +
// RMSNorm, rotary embedding, SiLU-and-mul.
//
// In torch each of these is several ops (RMSNorm alone: add, float copy, pow, mean, add, rsqrt,
// mul, copy back, mul), each a trip through the dispatcher and over memory. For the few rows of a
// decode pass that overhead is most of their cost; here each row is read and written once.
//
// Numerics are the model's torch definition (langrt.model.layers), rounding to the activation
// dtype at the same points: the residual sum; the normalized row before the weight; in rotary,
// each product and each sum; the SiLU before the product. Inside those steps the arithmetic is
// float32. Rotary gives torch's bits exactly; RMSNorm and SiLU can differ from torch in the last
// float32 bit (the order of the sum of squares, exp), so by at most one bf16 ulp after rounding.
// Rows are independent: a row's result does not depend on the other rows of the call. Written
// in vec.h's helpers, so the one source builds for AVX-512F and for AVX2 + FMA.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "layer_ops.h"
#include "vec.h"

namespace {

// Rows per task: a task does at least ~16k elements, so the few rows of a decode pass stay on one
// thread (waking the other costs more than it saves) and prefills spread over all.
int64_t grain(int64_t row_elements) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_elements)); }

// The sum of squares goes into this many accumulators, taken in turn, chunk by chunk: with 4 lanes,
// two, so that each lane sums the elements an 8-lane (AVX2) accumulator would and the total comes
// out in the same order (vreduce_add of their sum), as the same float32.
constexpr int kSquareAccs = kLanes == 4 ? 2 : 1;

inline float sum_accs(const vfloat* acc) { return vreduce_add(kSquareAccs == 2 ? vadd(acc[0], acc[kSquareAccs - 1]) : acc[0]); }

template <typename T>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor* residual,
                   at::Tensor& out, at::Tensor* summed) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  const T* xp = x.data_ptr<T>();
  const T* wp = weight.data_ptr<T>();
  const T* rp = residual ? residual->data_ptr<T>() : nullptr;
  T* op = out.data_ptr<T>();
  T* sp = summed ? summed->data_ptr<T>() : nullptr;
  const int64_t xs = x.stride(0), rs = residual ? residual->stride(0) : 0, os = out.stride(0),
                ss = summed ? summed->stride(0) : 0;
  const float inv_hidden = 1.0f / static_cast<float>(hidden);
  const float epsf = static_cast<float>(eps);
  at::parallel_for(0, rows, grain(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const T* xr = xp + n * xs;
      const T* src = xr;  // the row normalized: x, or x + residual as written to `summed`
      vfloat squares[kSquareAccs];
      for (int a = 0; a < kSquareAccs; ++a) squares[a] = vzero();
      if (rp) {
        T* sr = sp + n * ss;
        for (int64_t i = 0; i < hidden; i += kLanes) {
          const vfloat s = vround<T>(vadd(vload(xr + i), vload(rp + n * rs + i)));
          vstore(sr + i, s);
          vfloat& acc = squares[(i / kLanes) % kSquareAccs];
          acc = vfmadd(s, s, acc);
        }
        src = sr;
      } else {
        for (int64_t i = 0; i < hidden; i += kLanes) {
          const vfloat s = vload(xr + i);
          vfloat& acc = squares[(i / kLanes) % kSquareAccs];
          acc = vfmadd(s, s, acc);
        }
      }
      const float scale = 1.0f / std::sqrt(sum_accs(squares) * inv_hidden + epsf);
      const vfloat scale_v = vset1(scale);
      T* orow = op + n * os;
      for (int64_t i = 0; i < hidden; i += kLanes) {
        const vfloat normed = vround<T>(vmul(vload(src + i), scale_v));
        vstore(orow + i, vmul(vload(wp + i), normed));
      }
    }
  });
}

template <typename T>
void rotary_rows(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), half = x.size(2) / 2;
  T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  const int64_t ts = x.stride(0), hs = x.stride(1), cs = cos.stride(0), sns = sin.stride(0);
  at::parallel_for(0, tokens, grain(heads * 2 * half), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        T* x1 = xp + t * ts + h * hs;
        T* x2 = x1 + half;
        for (int64_t i = 0; i < half; i += kLanes) {
          const vfloat a = vload(x1 + i), b = vload(x2 + i);
          const vfloat c = vload(cp + t * cs + i), s = vload(sp + t * sns + i);
          // x1 * cos - x2 * sin and x2 * cos + x1 * sin, every product and sum rounded as torch does
          const vfloat first = vsub(vround<T>(vmul(a, c)), vround<T>(vmul(b, s)));
          const vfloat second = vadd(vround<T>(vmul(b, c)), vround<T>(vmul(a, s)));
          vstore(x1 + i, first);
          vstore(x2 + i, second);
        }
      }
    }
  });
}

template <typename T>
void silu_and_mul_rows(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t tokens = gate_up.size(0), width = out.size(1);
  const T* gp = gate_up.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t gs = gate_up.stride(0), os = out.stride(0);
  const vfloat one = vset1(1.0f);
  at::parallel_for(0, tokens, grain(3 * width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* gate = gp + t * gs;
      const T* up = gate + width;
      for (int64_t i = 0; i < width; i += kLanes) {
        const vfloat g = vload(gate + i);
        // silu(g) = g / (1 + exp(-g)), rounded, then times up
        const vfloat silu = vround<T>(vdiv(g, vadd(one, vexp(vsub(vzero(), g)))));
        vstore(op + t * os + i, vmul(silu, vload(up + i)));
      }
    }
  });
}

bool is_bf16(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16; }

void check_rows(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.stride(1) == 1, "layer op: ", name,
              " must be a CPU [rows, n] tensor with contiguous rows");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), "layer op: ", name, " must be in the activations' dtype");
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat, "layer op: bfloat16 or float32 only");
}

}  // namespace

namespace LANGRT_CPU_NS {

void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, const c10::optional<at::Tensor>& residual,
              at::Tensor out, c10::optional<at::Tensor> summed) {
  check_rows(x, "x", x);
  check_rows(out, "out", x);
  TORCH_CHECK(x.size(1) % 16 == 0, "rms_norm: hidden size must be a multiple of 16");
  TORCH_CHECK(out.sizes() == x.sizes(), "rms_norm: out must be x's shape");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(1) &&
                  weight.scalar_type() == x.scalar_type(),
              "rms_norm: weight must be contiguous [hidden] in x's dtype");
  TORCH_CHECK(residual.has_value() == summed.has_value(), "rms_norm: residual and summed go together");
  if (residual) {
    check_rows(*residual, "residual", x);
    check_rows(*summed, "summed", x);
    TORCH_CHECK(residual->sizes() == x.sizes() && summed->sizes() == x.sizes(), "rms_norm: residual and summed must be x's shape");
  }
  const at::Tensor* r = residual ? &*residual : nullptr;
  at::Tensor* s = summed ? &*summed : nullptr;
  if (is_bf16(x))
    rms_norm_rows<c10::BFloat16>(x, weight, eps, r, out, s);
  else
    rms_norm_rows<float>(x, weight, eps, r, out, s);
}

void rotary(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.stride(2) == 1, "rotary: x must be CPU [tokens, heads, head_dim], head_dim contiguous");
  TORCH_CHECK(x.size(2) % 32 == 0, "rotary: head_dim must be a multiple of 32");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, "rotary: bfloat16 or float32 only");
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->dim() == 2 && t->stride(1) == 1 && t->size(0) == x.size(0) && t->size(1) == x.size(2) / 2 &&
                    t->scalar_type() == x.scalar_type(),
                "rotary: cos and sin must be [tokens, head_dim / 2] in x's dtype, rows contiguous");
  }
  if (is_bf16(x))
    rotary_rows<c10::BFloat16>(x, cos, sin);
  else
    rotary_rows<float>(x, cos, sin);
}

void silu_and_mul(const at::Tensor& gate_up, at::Tensor out) {
  check_rows(gate_up, "gate_up", gate_up);
  check_rows(out, "out", gate_up);
  TORCH_CHECK(gate_up.size(1) % 32 == 0 && out.size(0) == gate_up.size(0) && out.size(1) == gate_up.size(1) / 2,
              "silu_and_mul: gate_up [T, 2I] with I a multiple of 16, out [T, I]");
  if (is_bf16(gate_up))
    silu_and_mul_rows<c10::BFloat16>(gate_up, out);
  else
    silu_and_mul_rows<float>(gate_up, out);
}

}  // namespace LANGRT_CPU_NS

LANGRT_TORCH_LIBRARY_FRAGMENT(LANGRT_CPU_NS, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor? residual, Tensor(a!) out, Tensor(b!)? summed) -> ()", &LANGRT_CPU_NS::rms_norm);
  m.def("rotary(Tensor(a!) x, Tensor cos, Tensor sin) -> ()", &LANGRT_CPU_NS::rotary);
  m.def("silu_and_mul(Tensor gate_up, Tensor(a!) out) -> ()", &LANGRT_CPU_NS::silu_and_mul);
}
