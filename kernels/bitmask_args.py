"""The argument checks of a token-bitmask apply, shared by langrt's CPU path
(langrt/constrained/bitmask.py) and the Triton launcher (grammar_bitmask.py).

They live here, below langrt, because the kernels may not import langrt's packages (the layer
diagram in docs/architecture.md)."""

from __future__ import annotations

import torch

LOGITS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_token_bitmask_args(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> None:
    """Raise a ValueError/TypeError naming what is wrong with the arguments of an apply call.

    Checks dtypes, ranks, row counts, strides, devices and (one device sync when `indices` is
    on a GPU) that every index is a row of `logits`. Shared by the CPU path and the Triton
    launcher, which adds its own device rule.
    """
    if not isinstance(logits, torch.Tensor) or logits.dtype not in LOGITS_DTYPES:
        got = logits.dtype if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a float32, float16 or bfloat16 tensor, got {got}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [batch, vocab], got shape {tuple(logits.shape)}")
    if logits.shape[1] > 1 and logits.stride(1) != 1:
        raise ValueError(
            f"logits must be contiguous along the vocab dimension (stride {logits.stride(1)}); they are written in "
            "place, so a .contiguous() copy would not do: produce them contiguous"
        )
    check_bitmask_tensor(bitmask, "bitmask")
    if bitmask.device != logits.device:
        raise ValueError(
            f"bitmask is on {bitmask.device} but logits are on {logits.device}; move the bitmask with .to(logits.device)"
        )
    if indices is None:
        if bitmask.shape[0] != logits.shape[0]:
            raise ValueError(
                f"bitmask has {bitmask.shape[0]} rows but logits have {logits.shape[0]}; without indices they must "
                f"match (pass bitmask[:{logits.shape[0]}] for a larger buffer)"
            )
        return
    _check_indices(indices, logits, bitmask)


def check_bitmask_tensor(bitmask: torch.Tensor, name: str) -> None:
    if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
        got = bitmask.dtype if isinstance(bitmask, torch.Tensor) else type(bitmask).__name__
        raise TypeError(f"{name} must be an int32 tensor (32 tokens per word), got {got}")
    if bitmask.dim() != 2:
        raise ValueError(f"{name} must be 2-D [batch, ceil(vocab/32)], got shape {tuple(bitmask.shape)}")
    if bitmask.shape[1] > 1 and bitmask.stride(1) != 1:
        raise ValueError(
            f"{name} must be contiguous along its word dimension (stride {bitmask.stride(1)}); pass {name}.contiguous()"
        )


def _check_indices(indices: torch.Tensor, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if not isinstance(indices, torch.Tensor) or indices.dtype not in INDEX_DTYPES:
        got = indices.dtype if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise TypeError(f"indices must be an int32 or int64 tensor of logits rows, got {got}")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
    if indices.device != logits.device:
        raise ValueError(
            f"indices are on {indices.device} but logits are on {logits.device}; move them with .to(logits.device)"
        )
    if indices.shape[0] != bitmask.shape[0]:
        raise ValueError(
            f"bitmask has {bitmask.shape[0]} rows but indices has {indices.shape[0]} entries; bitmask row k applies "
            "to logits row indices[k], so they must match"
        )
    if indices.numel():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= logits.shape[0]:
            bad = low if low < 0 else high
            raise ValueError(f"indices must be rows of logits (0 <= i < {logits.shape[0]}), got {bad}")
