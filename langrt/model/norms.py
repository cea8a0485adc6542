"""RMSNorm variants beyond Llama's (langrt.model.layers.rms_norm): Gemma's (1 + w) norm, and
norms over each attention head (Qwen3's and Gemma 3's q/k norms)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

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
