"""Building blocks of Llama-family models: RMSNorm, rotary embedding, SiLU-and-mul.

Numerics follow HF transformers (norms in float32, rotary cos/sin computed in float32 and cast to
the activation dtype) so logits match it to fp32 rounding.

RMSNorm (with its residual add), rotary and SiLU-and-mul run fused kernels that round where these
torch ops round: langrt's Triton kernels (`kernels/`) on CUDA, its C++ ones (`kernels/cpu`) on
CPU for bf16 and float32 rows of widths they take. CPU tensors never import triton; inside
torch.compile the torch ops stay (the compiler fuses them itself); where the C++ library cannot
be built (see kernels.cpu) the torch ops run.
"""

from __future__ import annotations

import functools
import importlib.util
from types import SimpleNamespace
from typing import Any, Mapping

import torch
from torch import nn

from langrt.cpu_features import bf16_gemm_packing
from langrt.errors import ModelLoadError
from langrt.model.quant import QuantizedWeight, stack_parts
from langrt.model.rope import rotary_tables


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual)."""
        if residual is not None:
            return add_rms_norm(x, residual, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), the sum rounded to x's dtype before the norm."""
    fused = _fused_kernels(x)
    if fused is not None and _fusable_norm(x, weight, residual):
        return fused.rms_norm(x, weight, eps, residual)
    x = x + residual
    return rms_norm(x, weight, eps), x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's numerics: normalize in float32, cast back, then scale. torch's rms_norm on the float32
    copy gives the same values in fewer ops; on a bf16 input it would not, and its bf16 result
    for a row would depend on how many rows run together."""
    fused = _fused_kernels(x)
    if fused is not None and _fusable_norm(x, weight):
        return fused.rms_norm(x, weight, eps)
    normed = nn.functional.rms_norm(x.float(), weight.shape, None, eps)
    return weight * normed.to(x.dtype)


class Linear(nn.Module):
    """y = x W^T (+ b).

    On CPU in bfloat16, `pack_for_cpu()` adds a copy of W reordered once into oneDNN's blocked
    layout: torch's bf16 GEMM otherwise reorders W on every call, and with the packed copy
    SmolLM2's 120 layer GEMMs take 13 ms instead of 20 at 16 rows, 15-18 instead of 27 at 40.
    Products are the same bits as without it (see PACKED_MAX_ROWS). The plain W stays for
    single rows and long prefills (see `linear`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | QuantizedWeight | None = None
        self._parts: dict[int, QuantizedWeight] | None = None  # quantized rows by offset, while loading

    @property
    def weights(self) -> tuple[torch.Tensor, torch.Tensor | QuantizedWeight | None]:
        """What `linear` takes: (plain weight, packed copy, quantized weight or None)."""
        return self.weight, self.packed

    @property
    def quantized(self) -> bool:
        return isinstance(self.packed, QuantizedWeight)

    def pack_for_cpu(self, dense_copy: bool = True) -> None:
        """Call once the weights are loaded. A quantized layer adds its packed values only with
        `dense_copy` (QuantizedWeight.add_dense_copy)."""
        if not self.quantized:
            self.packed = pack_weight(self.weight)
        elif dense_copy:
            self.packed.add_dense_copy()

    def fill_quantized(self, offset: int, part: QuantizedWeight) -> None:
        """Rows offset.. of W from quantized blocks. The first part turns this layer quantized
        (its plain weight is dropped); once the parts cover W it is served (stack_parts)."""
        if self._parts is None:
            self._parts, self._shape = {}, tuple(self.weight.shape)
            self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype), requires_grad=False)
        out_features, in_features = self._shape
        if part.in_features != in_features or offset + part.out_features > out_features or offset in self._parts:
            raise ModelLoadError(
                f"quantized rows {offset}+{part.shape} do not fit a [{out_features}, {in_features}] layer"
            )
        self._parts[offset] = part
        if sum(p.out_features for p in self._parts.values()) == out_features:
            self.packed = stack_parts([self._parts[k] for k in sorted(self._parts)])
            self._parts = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


def can_pack(weight: torch.Tensor) -> bool:
    """Packing pays off for bf16 on CPU where oneDNN has a bf16 path (AVX-512BW; without it the
    reorder fails); float32 keeps MKL's GEMM (the numerics the golden tests were measured with)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and bf16_gemm_packing()


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] plain weight -> an opaque oneDNN tensor holding the same values, blocked."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


class Embedding(nn.Module):
    """Token embeddings; like Linear, created uninitialized (the loader fills every weight).

    A GGUF file's table may stay in its blocks (`fill_quantized`): the rows a pass looks up are
    dequantized then, the same values a table dequantized at load holds, so the table takes the
    file's bytes instead of 4 (or 2) per value (Qwen2.5-1.5B's 151,936 x 1,536 would be 0.93 GB
    as float32)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        self.quantized: QuantizedWeight | None = None

    def fill_quantized(self, weight: QuantizedWeight) -> None:
        """Keep `weight`'s blocks as the table; `self.weight` becomes empty (its dtype stays the
        rows' dtype)."""
        if weight.out_features != self.weight.shape[0] or weight.in_features != self.weight.shape[1]:
            raise ModelLoadError(
                f"embedding blocks of shape {(weight.out_features, weight.in_features)} "
                f"for a table of {tuple(self.weight.shape)}"
            )
        self.quantized = weight
        self.weight = nn.Parameter(self.weight.new_empty(0, self.weight.shape[1]), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is None:
            return nn.functional.embedding(ids, self.weight)
        rows = self.quantized.rows(ids.reshape(-1)).dequantize(self.weight.dtype)
        return rows.view(*ids.shape, rows.shape[-1])


# Up to this many rows the packed GEMM gives torch's own bits (measured: every row count from 2 to
# 256 on SmolLM2's shapes); above, oneDNN picks another blocking for some shapes (576x576 at 300
# rows), so long prefills keep torch's GEMM, whose reorder they amortize anyway.
PACKED_MAX_ROWS = 256


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: torch.Tensor | None = None
) -> torch.Tensor:
    """x [.., in] @ weight^T (+ bias); `packed`, if given, is `pack_weight(weight)`.

    A single row is a matrix-vector product on the plain weight: on CPU, torch's GEMV reads
    weights ~1.8x faster than its bf16 GEMM does at M=1 (and as fast as the packed GEMM), and
    its rounding is the one a request decoding alone has always had. A QuantizedWeight as
    `packed` multiplies its blocks (the plain weight is then empty)."""
    if isinstance(packed, QuantizedWeight):
        y = packed.matmul(x)
        return y if bias is None else y + bias
    if x.shape[0] == 1 and x.dim() == 2 and x.device.type == "cpu":
        y = torch.mv(weight, x[0]).unsqueeze(0)
        return y if bias is None else y + bias
    if packed is not None and x.numel() <= PACKED_MAX_ROWS * x.shape[-1]:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return nn.functional.linear(x, weight, bias)


class RotaryEmbedding(nn.Module):
    """Rotate-half ("neox") rotary embedding, HF Llama's layout.

    `cos_sin(positions)` is computed once per forward pass and shared by every layer."""

    def __init__(self, head_dim: int, max_position: int, base: float, scaling: Mapping[str, Any] | None):
        super().__init__()
        self.head_dim = head_dim  # the rotated width: a head's leading dimensions under partial rotary
        cos, sin = rotary_tables(head_dim, max_position, base, scaling)
        # Not parameters, and not persistent: rebuilt from the config, never loaded.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions -> cos, sin of shape [T, 1, D/2] in `dtype` (float32 math, as HF)."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    """x [T, n*D] (any number of heads, e.g. q and k side by side) -> rotated x.

    On CUDA the kernel rotates x in place and returns it (one pass over q and k, no copy); on
    CPU the result is a new tensor. Either way, callers must not use the unrotated x again."""
    fused = _fused_kernels(x)
    if (
        fused is not None
        and x.dim() == 2
        and x.stride(-1) == 1
        and cos.dtype == x.dtype
        and (x.is_cuda or head_dim % 32 == 0)
    ):
        heads = x.view(x.shape[0], -1, head_dim)
        fused.rotary(heads, None, cos.view(x.shape[0], -1), sin.view(x.shape[0], -1))
        return x
    shape = x.shape
    x = x.reshape(shape[0], -1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(shape)


def apply_partial_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int
) -> torch.Tensor:
    """x [T, n*head_dim] -> x with the first `rotary_dim` dimensions of each head rotated (cos,
    sin [T, 1, rotary_dim / 2]) and the rest passed through (Phi-3's partial_rotary_factor)."""
    if rotary_dim == head_dim:
        return apply_rotary(x, cos, sin, head_dim)
    heads = x.reshape(x.shape[0], -1, head_dim)
    rotated = apply_rotary(heads[..., :rotary_dim].reshape(x.shape[0], -1), cos, sin, rotary_dim)
    return torch.cat((rotated.view(x.shape[0], -1, rotary_dim), heads[..., rotary_dim:]), dim=-1).view(x.shape[0], -1)


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[.., 2I] gate and up side by side -> gelu_tanh(gate) * up (Gemma's MLP, HF's
    gelu_pytorch_tanh)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return nn.functional.gelu(gate, approximate="tanh") * up


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    fused = _fused_kernels(gate_up)
    if fused is not None and gate_up.dim() == 2 and gate_up.stride(-1) == 1:
        return fused.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return nn.functional.silu(gate) * up


def _fused_kernels(x: torch.Tensor) -> SimpleNamespace | None:
    """Outside torch.compile tracing: the Triton layer kernels for a CUDA tensor; the C++ ones
    for a CPU tensor in bf16 or float32 whose rows are a multiple of 32 wide (the vector width
    they take). Else None."""
    if torch.compiler.is_compiling():
        return None
    if x.is_cuda:
        return _load_fused_kernels()
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float32) and x.shape[-1] % 32 == 0:
        return _load_cpu_kernels()
    return None


@functools.cache
def _load_cpu_kernels() -> SimpleNamespace | None:
    """None where the C++ library cannot be used (kernels.cpu logs why, once)."""
    from langrt_kernels.cpu import layer_ops

    return layer_ops()


@functools.cache
def _load_fused_kernels() -> SimpleNamespace | None:
    """None when triton is not installed (a CUDA build of torch normally ships it)."""
    if importlib.util.find_spec("triton") is None:
        return None
    rms = importlib.import_module("langrt_kernels.rms_norm")
    rotary = importlib.import_module("langrt_kernels.rotary")
    act = importlib.import_module("langrt_kernels.silu_and_mul")
    return SimpleNamespace(
        rms_norm=rms.rms_norm_triton, rotary=rotary.rotary_embedding_triton, silu_and_mul=act.silu_and_mul_triton
    )


def _fusable_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
    """The kernel's cases: 2-D rows, weight (and residual) in x's dtype; others keep torch's promotion."""
    rows_ok = x.dim() == 2 and x.stride(-1) == 1 and weight.dtype == x.dtype
    if residual is None:
        return rows_ok
    return rows_ok and residual.dtype == x.dtype and residual.shape == x.shape and residual.stride(-1) == 1
