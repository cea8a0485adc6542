"""Extend attention over the paged KV pool: several new tokens per request (prefill, possibly on
top of a cached prefix).

Request b's new tokens are rows [qo_indptr[b], qo_indptr[b+1]) of q and sit at positions
[prefix, seq_len) of its sequence, where prefix = seq_len - extend_len. Keys and values of all
positions [0, seq_len) -- the cached prefix and the new tokens, already written -- live in the pool
slots `req_to_token[req_pool_indices[b], :seq_len]`. The new token at position p attends to keys
at positions <= p (so to the whole prefix, and causally to the new tokens), and with a sliding
window only to those > p - window. Query head h reads KV head h // (H / Hkv).

One program per (request, query head, block of BLOCK_M new tokens) runs flash attention over
the keys that block can see: from the window's start up to its last token's position.

`extend_attention_triton` runs the kernel (CUDA tensors, or CPU tensors when triton was imported
with TRITON_INTERPRET=1); `extend_attention_reference` is the plain torch definition.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from langrt_kernels._launch import check_device, check_float, check_index, check_same_dtype, dot_precision, interpreted

_LAUNCHER = "extend_attention_triton"
_LOG2E = 1.4426950408889634
_NO_WINDOW = 2**30  # a window longer than any sequence: every earlier key visible


@triton.jit
def _extend_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    req_to_token_ptr,
    req_idx_ptr,
    seq_lens_ptr,
    qo_indptr_ptr,
    scale_log2,
    window,
    stride_qt,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_rt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # Program (b, h, j): request b, query head h, new tokens [j * BLOCK_M, (j + 1) * BLOCK_M).
    b = tl.program_id(0)
    head = tl.program_id(1)
    m0 = tl.program_id(2) * BLOCK_M
    kv_head = head // GROUP
    row = tl.load(req_idx_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    q_start = tl.load(qo_indptr_ptr + b).to(tl.int32)
    extend_len = tl.load(qo_indptr_ptr + b + 1).to(tl.int32) - q_start
    prefix_len = seq_len - extend_len

    offs_m = m0 + tl.arange(0, BLOCK_M)
    m_mask = offs_m < extend_len
    q_pos = prefix_len + offs_m
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_rows = (q_start + offs_m).to(tl.int64)
    q_mask = m_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + d[None, :], mask=q_mask, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)

    # Keys this block can see: from its first token's window start to its last token's position.
    lo = tl.maximum(prefix_len + m0 - window + 1, 0)
    hi = tl.minimum(prefix_len + m0 + BLOCK_M, seq_len)
    if m0 >= extend_len:  # a block past this request's new tokens (grid sized for the longest)
        hi = lo
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        k_pos = n0 + tl.arange(0, BLOCK_N)
        n_mask = k_pos < hi
        slot = tl.load(req_to_token_ptr + row * stride_rt + k_pos, mask=n_mask, other=0).to(tl.int64)
        k_mask = n_mask[None, :] & d_mask[:, None]
        k = tl.load(
            k_ptr + slot[None, :] * stride_kn + kv_head * stride_kh + d[:, None], mask=k_mask, other=0.0
        )  # [D, N]
        if DOT_F32:
            k = k.to(tl.float32)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2
        causal = k_pos[None, :] <= q_pos[:, None]
        visible = n_mask[None, :] & causal & (k_pos[None, :] > q_pos[:, None] - window)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        # A row that has seen no visible key yet (window start past this tile) keeps m = -inf;
        # shift by 0 there so exp2 gives 0 rather than NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(scores - m_safe[:, None])
        l = l * alpha + tl.sum(p, 1)
        v_mask = n_mask[:, None] & d_mask[None, :]
        v = tl.load(v_ptr + slot[:, None] * stride_vn + kv_head * stride_vh + d[None, :], mask=v_mask, other=0.0)
        p = p.to(v.dtype)  # 16-bit P for the 16-bit MMA, as flash attention does
        if DOT_F32:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m = m_new

    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + d[None, :], out, mask=q_mask)


def extend_attention_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    max_extend_len: int,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of every new token over its request's prefix and the new tokens up to itself -> [T, H, D].

    q: [T, H, D], the new tokens of all requests, request-major; k_buffer, v_buffer: the pool's
    [slots, Hkv, D] of one layer (new tokens' K/V already written), q's dtype, H a multiple of
    Hkv; req_to_token: int32 [rows, context]; req_pool_indices, seq_lens: int32/int64 [B];
    qo_indptr: int32/int64 [B + 1], request b's rows of q are qo_indptr[b]:qo_indptr[b+1]
    (qo_indptr[B] == T, every extend length in 1..seq_len; values are not checked, that would
    sync); max_extend_len: the longest extend length (sizes the grid). Last dimensions
    contiguous. scale defaults to D ** -0.5. out, if given, is written in place.
    """
    _check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, qo_indptr, sliding_window, out)
    check_device(
        _extend_attention_kernel,
        _LAUNCHER,
        "extend_attention_reference",
        q=q,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        qo_indptr=qo_indptr,
        **({} if out is None else {"out": out}),
    )
    tokens, heads, head_dim = q.shape
    batch, kv_heads = seq_lens.shape[0], k_buffer.shape[1]
    if max_extend_len < 1 and tokens > 0:
        raise ValueError(f"{_LAUNCHER}: max_extend_len must be the longest extend length (>= 1), got {max_extend_len}")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if tokens == 0 or batch == 0:
        return out
    in_interpreter = is_interpreted()
    block_d = max(16, triton.next_power_of_2(head_dim))
    if in_interpreter:  # small tiles: small test shapes still cross tile boundaries
        block_m, block_n, launch = 16, 16, {}
    else:
        block_m, block_n = (64, 64) if block_d <= 64 else (64, 32) if block_d <= 128 else (32, 32)
        launch = {"num_warps": 4, "num_stages": 2}
    scale = head_dim**-0.5 if scale is None else scale
    _extend_attention_kernel[(batch, heads, triton.cdiv(max_extend_len, block_m))](
        q,
        k_buffer,
        v_buffer,
        out,
        req_to_token,
        req_pool_indices,
        seq_lens,
        qo_indptr,
        scale * _LOG2E,
        sliding_window or _NO_WINDOW,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        out.stride(0),
        out.stride(1),
        req_to_token.stride(0),
        GROUP=heads // kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        # The interpreter multiplies bfloat16 tiles as their raw bits: give tl.dot float32 there.
        DOT_F32=in_interpreter,
        DOT_PRECISION=dot_precision(q.dtype),
        **launch,
    )
    return out


def extend_attention_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    max_extend_len: int | None = None,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The definition, one request at a time in float32, with an explicit position mask -> [T, H, D]."""
    _check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, qo_indptr, sliding_window, None)
    heads, head_dim = q.shape[1:]
    group = heads // k_buffer.shape[1]
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.zeros_like(q)
    bounds = qo_indptr.tolist()
    for b, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        start, end = bounds[b], bounds[b + 1]
        slots = req_to_token[row, :seq_len].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [S, H, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        q_pos = torch.arange(seq_len - (end - start), seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if sliding_window:
            visible &= k_pos > q_pos - sliding_window
        scores = torch.einsum("thd,shd->hts", q[start:end].float(), k) * scale
        p = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[start:end] = torch.einsum("hts,shd->thd", p, v).to(q.dtype)
    return out


def is_interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 at import): CPU tensors."""
    return interpreted(_extend_attention_kernel)


def _check_args(
    q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, qo_indptr, sliding_window, out
) -> None:
    check_float(_LAUNCHER, "q", q, 3, "[tokens, heads, head_dim]")
    check_float(_LAUNCHER, "k_buffer", k_buffer, 3, "[slots, kv_heads, head_dim]")
    check_float(_LAUNCHER, "v_buffer", v_buffer, 3, "[slots, kv_heads, head_dim]")
    check_same_dtype(_LAUNCHER, q=q, k_buffer=k_buffer, v_buffer=v_buffer)
    check_index(_LAUNCHER, "req_to_token", req_to_token, 2, "[rows, context]", dtypes=(torch.int32,))
    check_index(_LAUNCHER, "req_pool_indices", req_pool_indices, 1, "[batch]")
    check_index(_LAUNCHER, "seq_lens", seq_lens, 1, "[batch]")
    check_index(_LAUNCHER, "qo_indptr", qo_indptr, 1, "[batch + 1]")
    heads, head_dim = q.shape[1:]
    if k_buffer.shape != v_buffer.shape:
        raise ValueError(
            f"{_LAUNCHER}: k_buffer {tuple(k_buffer.shape)} and v_buffer {tuple(v_buffer.shape)} differ in shape"
        )
    if k_buffer.shape[2] != head_dim or head_dim == 0:
        raise ValueError(f"{_LAUNCHER}: q has head_dim {head_dim} but the KV buffers {k_buffer.shape[2]}")
    kv_heads = k_buffer.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{_LAUNCHER}: q's {heads} heads are not a multiple of the KV buffers' {kv_heads} heads")
    batch = seq_lens.shape[0]
    if req_pool_indices.shape[0] != batch or qo_indptr.shape[0] != batch + 1:
        raise ValueError(
            f"{_LAUNCHER}: seq_lens has {batch} entries, so req_pool_indices needs {batch} and qo_indptr "
            f"{batch + 1}; got {req_pool_indices.shape[0]} and {qo_indptr.shape[0]}"
        )
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"{_LAUNCHER}: sliding_window must be >= 1 or None, got {sliding_window}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(
            f"{_LAUNCHER}: out must be {tuple(q.shape)} {q.dtype} contiguous in its last dimension, "
            f"got {tuple(out.shape)} {out.dtype}"
        )
