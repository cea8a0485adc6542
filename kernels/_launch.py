"""Checks shared by the kernel launchers: where a kernel may run, and tensor arguments.

A `@triton.jit` function decorated while TRITON_INTERPRET=1 was set is an `InterpretedFunction`:
it runs on CPU tensors (numpy underneath), for tests. Otherwise it compiles for the GPU and takes
CUDA tensors only. The launchers check which, so a wrong device fails with a reason instead of a
segfault or an opaque compiler error.
"""

from __future__ import annotations

import torch
from triton.runtime.interpreter import InterpretedFunction

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def interpreted(kernel) -> bool:
    """Whether `kernel` runs in Triton's interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return isinstance(kernel, InterpretedFunction)


def check_device(kernel, launcher: str, cpu_alternative: str, **tensors: torch.Tensor) -> None:
    """All `tensors` on one device, and the one `kernel` runs on (CPU when interpreted, else CUDA)."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first:
            raise ValueError(
                f"{launcher}: {name} is on {device} but {first_name} is on {first}; move them to one device"
            )
    if interpreted(kernel) and first.type != "cpu":
        raise ValueError(
            f"{launcher}: the Triton interpreter (TRITON_INTERPRET=1) runs on CPU tensors, got {first}; "
            "unset TRITON_INTERPRET to run on the GPU"
        )
    if not interpreted(kernel) and first.type != "cuda":
        raise ValueError(
            f"{launcher} needs CUDA tensors, got {first}; use {cpu_alternative} on CPU "
            "(or set TRITON_INTERPRET=1 before importing triton to run the kernel in the interpreter)"
        )


def check_float(launcher: str, name: str, t: torch.Tensor, dims: int, layout: str) -> None:
    """A float32/float16/bfloat16 tensor of `dims` dimensions whose last dimension is contiguous."""
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{launcher}: {name} must be a float32, float16 or bfloat16 tensor, got {t.dtype}")
    check_shape(launcher, name, t, dims, layout)


def check_index(launcher: str, name: str, t: torch.Tensor, dims: int, layout: str, dtypes=INDEX_DTYPES) -> None:
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{launcher}: {name} must be an {allowed} tensor, got {t.dtype}")
    check_shape(launcher, name, t, dims, layout)


def check_shape(launcher: str, name: str, t: torch.Tensor, dims: int, layout: str) -> None:
    if t.dim() != dims:
        raise ValueError(f"{launcher}: {name} must be {dims}-D {layout}, got shape {tuple(t.shape)}")
    if t.numel() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{launcher}: {name} must be contiguous in its last dimension; pass {name}.contiguous()")


def check_same_dtype(launcher: str, **tensors: torch.Tensor) -> None:
    (first_name, first), *rest = tensors.items()
    for name, t in rest:
        if t.dtype != first.dtype:
            raise TypeError(f"{launcher}: {name} is {t.dtype} but {first_name} is {first.dtype}; cast one to match")


def dot_precision(dtype: torch.dtype) -> str | None:
    """tl.dot's input_precision: float32 attention stays float32 ('ieee', not TF32's 10-bit
    mantissa); 16-bit inputs keep the target's default (their native MMA)."""
    return "ieee" if dtype == torch.float32 else None
