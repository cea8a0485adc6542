"""langrt's paged attention as a transformers attention function (AttentionInterface).

A model loaded with `attn_implementation=ATTN_IMPLEMENTATION` calls `paged_attention` in each
layer in place of SDPA. The pass's langrt `Attention` (built by the attention backend for this
ForwardBatch) reaches it as the forward kwarg `langrt_pass`, which transformers hands down from
the base model's forward to every attention call; nothing is kept between passes. transformers
builds no attention mask for an implementation without a mask function, and none is needed: the
backend knows each token's request and position.

Registering is a name -> function entry in transformers' table (the same for every model and
pass), done once when this module is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface

from langrt.errors import ModelLoadError
from langrt.model.attention import Attention

ATTN_IMPLEMENTATION = "langrt_paged"
PASS_KWARG = "langrt_pass"


@dataclass(frozen=True)
class PagedPass:
    """One forward pass's attention, and the shape every layer's call must have."""

    attention: Attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float  # the softmax scale the backend applies (ModelConfig.softmax_scale)
    layer_windows: tuple[int | None, ...]  # the sliding window it applies to each layer (None: full)


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, Hkv, T, D] (rotary applied) -> ([1, T, H, D], None)."""
    step: PagedPass | None = kwargs.get(PASS_KWARG)
    if step is None:
        raise RuntimeError(
            f"attn_implementation {ATTN_IMPLEMENTATION!r} was called without langrt's per-pass attention "
            f"(the {PASS_KWARG!r} forward kwarg); only langrt.model.hf_fallback runs models with it"
        )
    _check_call(module, query, key, step, kwargs)
    tokens = query.shape[2]
    if scaling is not None and scaling != step.scale:
        # softmax(s' q.k) = softmax(s (s'/s) q.k): the backend's fixed scale, q rescaled.
        query = query * (scaling / step.scale)
    out = step.attention.attend(module.layer_idx, _rows(query), _rows(key), _rows(value))
    return out.view(1, tokens, step.num_heads, step.head_dim), None


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[1, heads, T, D] -> [T, heads*D], the backend's layout."""
    return x[0].transpose(0, 1).reshape(x.shape[2], -1)


def _check_call(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, step: PagedPass, kwargs) -> None:
    """Refuse what langrt's backends do not compute: the first (probe) pass at load meets these."""
    name = type(module).__name__
    if not isinstance(getattr(module, "layer_idx", None), int):
        raise ModelLoadError(f"{name} has no layer_idx: langrt cannot tell which layer's KV it is")
    if not getattr(module, "is_causal", True):
        raise ModelLoadError(f"{name} is not causal attention; langrt serves decoder (causal) models only")
    for feature in ("softcap", "s_aux"):
        if kwargs.get(feature) is not None:
            raise ModelLoadError(f"{name} uses attention {feature}, which langrt's attention backends do not compute")
    if not 0 <= module.layer_idx < len(step.layer_windows):
        raise ModelLoadError(
            f"{name} has layer_idx {module.layer_idx}; the KV pool holds {len(step.layer_windows)} layers"
        )
    window = step.layer_windows[module.layer_idx]
    if kwargs.get("sliding_window") != window:
        raise ModelLoadError(
            f"{name} (layer {module.layer_idx}) attends with sliding window {kwargs.get('sliding_window')}, where "
            f"its config gives langrt's backend {window}"
        )
    expected_q, expected_k = (1, step.num_heads, None, step.head_dim), (1, step.num_kv_heads, None, step.head_dim)
    if not _matches(query.shape, expected_q) or not _matches(key.shape, expected_k):
        raise ModelLoadError(
            f"{name}: query {tuple(query.shape)} and key {tuple(key.shape)} do not have langrt's layout "
            f"[1, heads, tokens, head_dim] with {step.num_heads} / {step.num_kv_heads} heads of {step.head_dim}"
        )


def _matches(shape: torch.Size, expected: tuple) -> bool:
    return len(shape) == 4 and all(e is None or s == e for s, e in zip(shape, expected))


AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
