"""RMSNorm variants beyond Llama's (langrt.model.layers.rms_norm): Gemma's (1 + w) norm, and
norms over each attention head (Qwen3's and Gemma 3's q/k norms)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from langrt.model.layers import RMSNorm, add_rms_norm, rms_norm

NormFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Gemma's numerics: normalize in float32, scale by (1 + w) in float32, then cast back
    (Llama's norm casts first and scales in the activation dtype; in bf16 the two differ)."""
    normed = nn.functional.rms_norm(x.float(), weight.shape, None, eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """The checkpoint's weight w is stored as is; the norm scales by 1 + w."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemma_rms_norm(x, self.weight, self.eps)


def per_head_norm(norm: NormFn, x: torch.Tensor, weight: torch.Tensor, eps: float, head_dim: int) -> torch.Tensor:
    """x [T, n*head_dim] (q or k of n heads) -> each head normalized over its head_dim with the
    one [head_dim] weight all heads share. As rows of a 2-D tensor, so langrt's fused norm
    kernels take them where the width suits them."""
    rows = x.reshape(-1, head_dim)
    return norm(rows, weight, eps).view(x.shape[0], -1)


def input_norm(norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A Llama-style layer's first step -> (its normed input, the residual stream): the residual
    added first where there is one (the first layer's stream is its input)."""
    if residual is None:
        return rms_norm(x, norm.weight, norm.eps), x
    return add_rms_norm(x, residual, norm.weight, norm.eps)
