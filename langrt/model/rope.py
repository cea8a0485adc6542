"""Rotary embedding tables for each rope scaling langrt serves, and rotation of part of a head.

`rotary_tables` gives the float32 cos/sin of every position (HF's numerics: frequencies in
float32, the table cast to the activation dtype when used). The scalings are HF's:
- "linear": frequencies divided by `factor`;
- "llama3": Llama 3.1's frequency-dependent blend;
- "longrope" (Phi-3 / Phi-4-mini; "su" in older configs): frequencies divided by `short_factor`
  per dimension, or by `long_factor`, and cos/sin scaled by the attention factor.

LongRoPE in transformers picks the long factors for a whole forward pass once its last position
reaches `original_max_position_embeddings`. langrt picks them per position instead (position >=
original max: long), so a token's keys do not depend on which pass or batch computed them: a
prefix cached by one request is what every other request sharing it would have computed. That is
transformers' own result when it generates token by token with its cache; a prompt longer than the
original max prefilled in one pass differs from transformers' single forward in its first
original-max positions (which transformers then rotates by the long factors).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from langrt.errors import ModelLoadError
from langrt.model.config import SUPPORTED_ROPE_TYPES


def rotary_tables(
    dim: int, max_position: int, base: float, scaling: Mapping[str, Any] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_position, dim / 2] float32 for a rotation over `dim` dimensions of a head."""
    base_pow = base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    inv_freq = 1.0 / base_pow
    kind = "default" if scaling is None else scaling["rope_type"]
    positions = torch.arange(max_position, dtype=torch.float32)
    if kind == "longrope":
        return _longrope_tables(base_pow, positions, {"max_position_embeddings": max_position, **scaling})
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif kind != "default":
        raise ModelLoadError(f"unsupported rope scaling {kind!r}; supported: {SUPPORTED_ROPE_TYPES}")
    freqs = torch.outer(positions, inv_freq)
    return freqs.cos(), freqs.sin()


def _llama3_inv_freq(inv_freq: torch.Tensor, s: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling: long wavelengths divided by `factor`, short ones
    kept, and a smooth blend between `low_freq_factor` and `high_freq_factor`."""
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


def _longrope_tables(
    base_pow: torch.Tensor, positions: torch.Tensor, s: Mapping[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows before `original_max_position_embeddings` rotate by the short factors, the rest by
    the long ones (see the module docstring); all scaled by the attention factor. `base_pow` is
    base ** (2i / dim): the frequencies are 1 / (factor_i * base_pow_i), in HF's order."""
    if "original_max_position_embeddings" not in s:
        raise ModelLoadError("longrope scaling needs original_max_position_embeddings (in rope_scaling or the config)")
    original = s["original_max_position_embeddings"]
    short, long = (torch.tensor(s[key], dtype=torch.float32) for key in ("short_factor", "long_factor"))
    if short.numel() != base_pow.numel() or long.numel() != base_pow.numel():
        raise ModelLoadError(
            f"longrope short_factor/long_factor have {short.numel()}/{long.numel()} entries; the rotary "
            f"dimension needs {base_pow.numel()} (half the rotated width)"
        )
    freqs = torch.where(
        positions[:, None] < original,
        torch.outer(positions, 1.0 / (short * base_pow)),
        torch.outer(positions, 1.0 / (long * base_pow)),
    )
    scale = longrope_attention_factor(s)
    return freqs.cos() * scale, freqs.sin() * scale


def longrope_attention_factor(s: Mapping[str, Any]) -> float:
    """`attention_factor` if given, else sqrt(1 + ln(factor) / ln(original max)) (1 when the
    context is not extended), factor being max_position_embeddings / original's by default."""
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor = s.get("factor") or s["max_position_embeddings"] / s["original_max_position_embeddings"]
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(s["original_max_position_embeddings"]))


def rotary_dim(head_dim: int, partial_rotary_factor: float) -> int:
    """How many leading dimensions of each head rotate (HF: int(head_dim * factor))."""
    dim = int(head_dim * partial_rotary_factor)
    if dim % 2 or not 0 < dim <= head_dim:
        raise ModelLoadError(
            f"partial_rotary_factor {partial_rotary_factor} gives {dim} of {head_dim} dimensions; need an even number"
        )
    return dim
