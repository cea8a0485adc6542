"""SiLU-and-mul, the SwiGLU activation: [gate | up] -> silu(gate) * up.

torch computes silu in float32 and rounds it to the activation dtype before the product (which
is rounded again); the kernel rounds at the same two points, so a 16-bit model gets the same
values from either path. Program (t, j) handles columns [j * BLOCK, (j + 1) * BLOCK) of token t.

`silu_and_mul_triton` runs the kernel (CUDA tensors, or CPU tensors when triton was imported
with TRITON_INTERPRET=1); `silu_and_mul_reference` is the plain torch definition.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from langrt_kernels._launch import check_device, check_float, interpreted

_LAUNCHER = "silu_and_mul_triton"
_MAX_BLOCK = 2048


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, width, stride_in, stride_out, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_up_ptr + t * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + t * stride_in + width + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + t * stride_out + cols, silu * up, mask=mask)


def silu_and_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] (gate then up; rows may be strided, last dimension contiguous) -> [T, I]."""
    _check_args(gate_up)
    check_device(_silu_and_mul_kernel, _LAUNCHER, "langrt.model.layers.silu_and_mul", gate_up=gate_up)
    tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((tokens, width), dtype=gate_up.dtype, device=gate_up.device)
    if tokens and width:
        block = min(_MAX_BLOCK, triton.next_power_of_2(width))
        _silu_and_mul_kernel[(tokens, triton.cdiv(width, block))](
            gate_up, out, width, gate_up.stride(0), out.stride(0), BLOCK=block, num_warps=4
        )
    return out


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """The definition in torch."""
    _check_args(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def is_interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 at import): CPU tensors."""
    return interpreted(_silu_and_mul_kernel)


def _check_args(gate_up: torch.Tensor) -> None:
    check_float(_LAUNCHER, "gate_up", gate_up, 2, "[tokens, 2 * intermediate]")
    if gate_up.shape[1] % 2:
        raise ValueError(f"{_LAUNCHER}: gate_up's width {gate_up.shape[1]} must be even (gate and up halves)")
