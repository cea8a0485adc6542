"""Rotary position embedding, in place on q and k, in langrt's (HF Llama's) convention.

Rotate-half ("neox") layout: each head's D values are two halves x1 = x[:D/2], x2 = x[D/2:],
and with the token's cos, sin (each D/2 wide, already in the activation dtype, as
`RotaryEmbedding.cos_sin` gives them)

    x1' = x1 * cos - x2 * sin        x2' = x2 * cos + x1 * sin

`langrt.model.layers.apply_rotary` computes this in the activation dtype, rounding each product
and each sum; the kernel computes in float32 and rounds at the same points, so a 16-bit model
gets the same values from either path. One program rotates all q and k heads of one token.

`rotary_embedding_triton` runs the kernel (CUDA tensors, or CPU tensors when triton was imported
with TRITON_INTERPRET=1); `rotary_embedding_reference` is the plain torch definition.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from langrt_kernels._launch import check_device, check_float, check_same_dtype, interpreted

_LAUNCHER = "rotary_embedding_triton"


@triton.jit
def _rotate_heads(
    ptr, stride_t, stride_h, t, n_heads, c, s, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr
):
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    mask = (h < n_heads)[:, None] & (i < HALF)[None, :]
    p1 = ptr + t * stride_t + h[:, None] * stride_h + i[None, :]
    dtype = ptr.dtype.element_ty
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    # Each product rounded to the activation dtype (a no-op in float32), as the torch path does.
    x1c = (x1 * c[None, :]).to(dtype).to(tl.float32)
    x2s = (x2 * s[None, :]).to(dtype).to(tl.float32)
    x2c = (x2 * c[None, :]).to(dtype).to(tl.float32)
    x1s = (x1 * s[None, :]).to(dtype).to(tl.float32)
    out1 = x1c - x2s
    out2 = x2c + x1s
    tl.store(p1, out1, mask=mask)
    tl.store(p1 + HALF, out2, mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    n_q_heads,
    n_k_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ct,
    stride_st,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    c = tl.load(cos_ptr + t * stride_ct + i, mask=i < HALF, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_st + i, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_qt, stride_qh, t, n_q_heads, c, s, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k_ptr, stride_kt, stride_kh, t, n_k_heads, c, s, HALF, BLOCK_HK, BLOCK_HALF)


def rotary_embedding_triton(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place by cos, sin [T, D/2] (q's dtype; one row per
    token, gathered for its position). Token and head strides are free (q and k may be column
    slices of one fused qkv tensor); last dimensions contiguous. k=None rotates q alone (e.g. q
    and k passed together as one [T, Hq + Hk, D] view)."""
    _check_args(q, k, cos, sin)
    tensors = {"q": q, "cos": cos, "sin": sin, **({} if k is None else {"k": k})}
    check_device(_rotary_kernel, _LAUNCHER, "langrt.model.layers.apply_rotary", **tensors)
    tokens, q_heads, head_dim = q.shape
    if tokens == 0:
        return
    half = head_dim // 2
    k_heads = 0 if k is None else k.shape[1]
    k = q if k is None else k  # with no k heads, never read
    block_hq, block_hk = triton.next_power_of_2(q_heads), triton.next_power_of_2(max(1, k_heads))
    _rotary_kernel[(tokens,)](
        q,
        k,
        cos,
        sin,
        q_heads,
        k_heads,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        sin.stride(0),
        HALF=half,
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=4 if block_hq * half >= 1024 else 1,
    )


def rotary_embedding_reference(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The definition in torch, in place, in the activation dtype (as the model computes it)."""
    _check_args(q, k, cos, sin)
    c, s = cos[:, None, :], sin[:, None, :]
    for x in (q,) if k is None else (q, k):
        x1, x2 = x.chunk(2, dim=-1)
        rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
        x.copy_(rotated)


def is_interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 at import): CPU tensors."""
    return interpreted(_rotary_kernel)


def _check_args(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_float(_LAUNCHER, "q", q, 3, "[tokens, q_heads, head_dim]")
    check_float(_LAUNCHER, "cos", cos, 2, "[tokens, head_dim / 2]")
    check_float(_LAUNCHER, "sin", sin, 2, "[tokens, head_dim / 2]")
    check_same_dtype(_LAUNCHER, q=q, cos=cos, sin=sin)
    tokens, _, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"{_LAUNCHER}: head_dim must be even (rotate-half pairs its halves), got {head_dim}")
    if k is not None:
        check_float(_LAUNCHER, "k", k, 3, "[tokens, k_heads, head_dim]")
        check_same_dtype(_LAUNCHER, q=q, k=k)
        if k.shape[0] != tokens or k.shape[2] != head_dim:
            raise ValueError(f"{_LAUNCHER}: k {tuple(k.shape)} must have q's tokens and head_dim {tuple(q.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (tokens, head_dim // 2):
            raise ValueError(
                f"{_LAUNCHER}: {name} must be [tokens, head_dim / 2] = {(tokens, head_dim // 2)}, got {tuple(t.shape)}; "
                "gather the table rows for the tokens' positions first"
            )
