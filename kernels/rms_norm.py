"""RMSNorm, optionally fused with the residual add before it, with HF Llama's numerics.

  without residual:  out = weight * to_dtype(x * rsqrt(mean(x^2) + eps))       (x in float32)
  with residual:     s = to_dtype(x + residual); out = the above on s; also returns s

The float32 result is rounded to the activation dtype before the weight multiplies it, and the
residual sum is rounded before it is normalized, exactly as `langrt.model.layers` (and HF) do in
torch, so a 16-bit model gets the same values from either path. One program normalizes one row.

`rms_norm_triton` runs the kernel (CUDA tensors, or CPU tensors when triton was imported with
TRITON_INTERPRET=1); `rms_norm_reference` is the plain torch definition.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from langrt_kernels._launch import check_device, check_float, check_same_dtype, interpreted

_LAUNCHER = "rms_norm_triton"
# One row is one tile in registers; wider rows would spill (no Llama-family model comes close).
_MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    sum_ptr,
    hidden,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(sum_ptr.dtype.element_ty)  # rounded, as torch's x + residual
        tl.store(sum_ptr + row * stride_s + cols, s, mask=mask)
        x = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    normed = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, w * normed, mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [N, hidden], weight [hidden] of x's dtype -> norm(x); with residual [N, hidden]:
    (norm(x + residual), x + residual). Rows may be strided; last dimensions contiguous."""
    _check_args(x, weight, residual)
    check_device(
        _rms_norm_kernel,
        _LAUNCHER,
        "langrt.model.layers.rms_norm",
        x=x,
        weight=weight,
        **({} if residual is None else {"residual": residual}),
    )
    rows, hidden = x.shape
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    summed = out if residual is None else torch.empty_like(out)
    if rows and hidden:
        block = triton.next_power_of_2(hidden)
        r = x if residual is None else residual
        _rms_norm_kernel[(rows,)](
            x,
            r,
            weight,
            out,
            summed,
            hidden,
            eps,
            x.stride(0),
            r.stride(0),
            out.stride(0),
            summed.stride(0),
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(16, max(1, block // 512)),
        )
    return out if residual is None else (out, summed)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The definition in torch (HF Llama's RMSNorm, after the residual add when given)."""
    _check_args(x, weight, residual)
    summed = x if residual is None else x + residual
    s = summed.float()
    normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * normed.to(x.dtype)
    return out if residual is None else (out, summed)


def is_interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 at import): CPU tensors."""
    return interpreted(_rms_norm_kernel)


def _check_args(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    check_float(_LAUNCHER, "x", x, 2, "[tokens, hidden]")
    check_float(_LAUNCHER, "weight", weight, 1, "[hidden]")
    check_same_dtype(_LAUNCHER, x=x, weight=weight, **({} if residual is None else {"residual": residual}))
    if weight.shape[0] != x.shape[1]:
        raise ValueError(f"{_LAUNCHER}: weight has {weight.shape[0]} entries but x rows have {x.shape[1]}")
    if residual is not None:
        check_float(_LAUNCHER, "residual", residual, 2, "[tokens, hidden]")
        if residual.shape != x.shape:
            raise ValueError(f"{_LAUNCHER}: residual {tuple(residual.shape)} must have x's shape {tuple(x.shape)}")
    if x.shape[1] > _MAX_HIDDEN:
        raise ValueError(f"{_LAUNCHER}: rows of {x.shape[1]} exceed the kernel's {_MAX_HIDDEN}; use the torch path")
