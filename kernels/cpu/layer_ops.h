// The layer kernels' entry points (layer_ops.cpp, paged_attention.cpp), for the ops that chain them
// (fused_layers.cpp). Each build of the library names them under its own namespace, LANGRT_CPU_NS
// (langrt_cpu for AVX-512, langrt_cpu_avx2), which is also its torch op namespace: two builds in one
// process never share a symbol.
#pragma once

#include <ATen/core/Tensor.h>

#ifndef LANGRT_CPU_NS
#define LANGRT_CPU_NS langrt_cpu
#endif
// TORCH_LIBRARY pastes its namespace argument as written; one more level expands LANGRT_CPU_NS first.
#define LANGRT_TORCH_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define LANGRT_TORCH_LIBRARY_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)

namespace LANGRT_CPU_NS {

// norm(x) into out, or with residual norm(x + residual) into out and x + residual into summed.
void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, const c10::optional<at::Tensor>& residual,
              at::Tensor out, c10::optional<at::Tensor> summed);
// x [tokens, heads, head_dim] rotated in place by cos, sin [tokens, head_dim / 2].
void rotary(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin);
// silu(gate) * up for gate_up [T, 2I] into out [T, I].
void silu_and_mul(const at::Tensor& gate_up, at::Tensor out);
// See kernels/cpu/__init__.py: paged_attention().
void paged_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& req_to_token,
                     const at::Tensor& rows, const at::Tensor& reqs, const at::Tensor& starts, const at::Tensor& ends,
                     at::Tensor out, double scale);

}  // namespace LANGRT_CPU_NS
