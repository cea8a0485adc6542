"""Decode attention over the paged KV pool: one new query token per request.

Request b's keys and values for positions [0, seq_lens[b]) live in the pool slots
`req_to_token[req_pool_indices[b], :seq_lens[b]]` (page size 1; the new token's K/V already
written). Query head h reads KV head h // (H / Hkv) (grouped-query attention).

Two passes (split-K, "flash decoding"): with few requests the grid of (request, KV head) pairs
is too small to fill a GPU, so each request's sequence is cut into `num_kv_splits` ranges.
Pass 1 runs one program per (request, KV head, range); it serves all query heads of the group
at once (each K/V tile is read once per group) and writes the range's normalized output and its
log-sum-exp. Pass 2 merges a request's ranges, weighting each by exp(lse - max lse). With one
range, pass 1 writes the final output directly and pass 2 is skipped.

`decode_attention_triton` runs the kernels (CUDA tensors, or CPU tensors when triton was imported
with TRITON_INTERPRET=1); `decode_attention_reference` is the plain torch definition.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from langrt_kernels._launch import check_device, check_float, check_index, check_same_dtype, dot_precision, interpreted

_LAUNCHER = "decode_attention_triton"
_LOG2E = 1.4426950408889634
# A range shorter than this reads too little to pay for its share of pass 2.
_MIN_KEYS_PER_SPLIT = 256
_MAX_SPLITS = 16
_NO_WINDOW = 2**30  # a window longer than any sequence: every key visible


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    req_to_token_ptr,
    req_idx_ptr,
    seq_lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    scale_log2,
    window,
    num_splits,
    stride_qb,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_rt,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_F32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # Program (b, g, s): request b, KV head g (query heads g*GROUP ..), key range s.
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(req_idx_ptr + b).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    kv_lo = tl.maximum(seq_len - window, 0)  # window is _NO_WINDOW without a sliding window
    split_len = tl.cdiv(seq_len - kv_lo, num_splits)
    start = kv_lo + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    h = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + h
    d = tl.arange(0, BLOCK_D)
    h_mask = h < GROUP
    d_mask = d < HEAD_DIM
    q_mask = h_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of scores (log2 units)
    l = tl.zeros([BLOCK_H], tl.float32)  # running sum of exp2(score - m)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        p_mask = pos < end
        slot = tl.load(req_to_token_ptr + row * stride_rt + pos, mask=p_mask, other=0).to(tl.int64)
        k_mask = p_mask[None, :] & d_mask[:, None]
        k = tl.load(
            k_ptr + slot[None, :] * stride_kn + kv_head * stride_kh + d[:, None], mask=k_mask, other=0.0
        )  # [D, N]
        if DOT_F32:
            k = k.to(tl.float32)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2
        scores = tl.where(p_mask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v_mask = p_mask[:, None] & d_mask[None, :]
        v = tl.load(v_ptr + slot[:, None] * stride_vn + kv_head * stride_vh + d[None, :], mask=v_mask, other=0.0)
        p = p.to(v.dtype)  # 16-bit P for the 16-bit MMA, as flash attention does
        if DOT_F32:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m = m_new

    lse_ptrs = mid_lse_ptr + b * stride_lb + heads * stride_lh + split
    if end > start:
        o_ptrs = mid_o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
        tl.store(o_ptrs, acc / l[:, None], mask=q_mask)
        tl.store(lse_ptrs, m + tl.log2(l), mask=h_mask)
    else:  # an empty range (a sequence shorter than num_splits): weight zero in pass 2
        tl.store(lse_ptrs, tl.full([BLOCK_H], float("-inf"), tl.float32), mask=h_mask)


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    num_splits,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_outb,
    stride_outh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Program (b, h): merge request b's ranges for query head h.
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s in range(num_splits):
        lse = tl.load(mid_lse_ptr + b * stride_lb + h * stride_lh + s)
        if lse > float("-inf"):
            o = tl.load(mid_o_ptr + b * stride_ob + h * stride_oh + s * stride_os + d, mask=d_mask, other=0.0)
            m_new = tl.maximum(m, lse)
            alpha = tl.exp2(m - m_new)
            w = tl.exp2(lse - m_new)
            acc = acc * alpha + w * o
            l = l * alpha + w
            m = m_new
    out = tl.where(l > 0, acc / l, 0.0)  # l == 0 only for an empty sequence
    tl.store(out_ptr + b * stride_outb + h * stride_outh + d, out, mask=d_mask)


def decode_attention_triton(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
    num_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of each request's one new token over its whole sequence -> [B, H, D].

    q: [B, H, D]; k_buffer, v_buffer: the pool's [slots, Hkv, D] of one layer, q's dtype, H a
    multiple of Hkv; req_to_token: int32 [rows, context]; req_pool_indices, seq_lens: int32/int64
    [B] (each length >= 1 and within the row; not checked, that would sync). Last dimensions
    contiguous. scale defaults to D ** -0.5; sliding_window (if set) keeps the last that many
    keys. num_kv_splits defaults to `default_num_kv_splits` (one device sync for the max length;
    pass it to avoid that). out, if given, is written in place ([B, H, D], q's dtype).
    """
    _check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sliding_window, out)
    if num_kv_splits is not None and num_kv_splits < 1:
        raise ValueError(f"{_LAUNCHER}: num_kv_splits must be >= 1, got {num_kv_splits}")
    check_device(
        _decode_split_kernel,
        _LAUNCHER,
        "decode_attention_reference",
        q=q,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        **({} if out is None else {"out": out}),
    )
    batch, heads, head_dim = q.shape
    kv_heads = k_buffer.shape[1]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    if num_kv_splits is None:
        num_kv_splits = default_num_kv_splits(batch, kv_heads, int(seq_lens.max()), q.device)
    group = heads // kv_heads
    in_interpreter = is_interpreted()
    block_d = max(16, triton.next_power_of_2(head_dim))
    # tl.dot needs >= 16 rows: a group smaller than that is padded with masked heads.
    block_h = max(16, triton.next_power_of_2(group))
    block_n = 16 if in_interpreter else 64
    lse = torch.empty((batch, heads, num_kv_splits), dtype=torch.float32, device=q.device)
    if num_kv_splits == 1:  # pass 1's normalized output is final: write it straight to `out`
        mid, mid_strides = out, (out.stride(0), out.stride(1), 0)
    else:
        mid = torch.empty((batch, heads, num_kv_splits, head_dim), dtype=torch.float32, device=q.device)
        mid_strides = (mid.stride(0), mid.stride(1), mid.stride(2))
    scale = head_dim**-0.5 if scale is None else scale
    _decode_split_kernel[(batch, kv_heads, num_kv_splits)](
        q,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        seq_lens,
        mid,
        lse,
        scale * _LOG2E,
        sliding_window or _NO_WINDOW,
        num_kv_splits,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        req_to_token.stride(0),
        *mid_strides,
        lse.stride(0),
        lse.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        # The interpreter multiplies bfloat16 tiles as their raw bits: give tl.dot float32 there.
        DOT_F32=in_interpreter,
        DOT_PRECISION=dot_precision(q.dtype),
        **({} if in_interpreter else {"num_warps": 4, "num_stages": 2}),
    )
    if num_kv_splits > 1:
        _decode_merge_kernel[(batch, heads)](
            mid,
            lse,
            out,
            num_kv_splits,
            mid.stride(0),
            mid.stride(1),
            mid.stride(2),
            lse.stride(0),
            lse.stride(1),
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
        )
    return out


def default_num_kv_splits(batch: int, kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Ranges per sequence: enough (request, KV head, range) programs for ~2 waves over the GPU's
    SMs, but no range shorter than _MIN_KEYS_PER_SPLIT keys and at most _MAX_SPLITS."""
    if device.type != "cuda":
        return max(1, min(4, triton.cdiv(max_seq_len, 16)))  # the interpreter: small, but split
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = triton.cdiv(2 * sms, batch * kv_heads)
    return max(1, min(wanted, _MAX_SPLITS, triton.cdiv(max_seq_len, _MIN_KEYS_PER_SPLIT)))


def decode_attention_reference(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The definition, one request at a time in float32: softmax(q K^T * scale) V -> [B, H, D]."""
    _check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sliding_window, None)
    heads, head_dim = q.shape[1:]
    group = heads // k_buffer.shape[1]
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    for b, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        lo = max(0, seq_len - sliding_window) if sliding_window else 0
        slots = req_to_token[row, lo:seq_len].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        p = torch.softmax(torch.einsum("hd,lhd->hl", q[b].float(), k) * scale, dim=-1)
        out[b] = torch.einsum("hl,lhd->hd", p, v).to(q.dtype)
    return out


def is_interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 at import): CPU tensors."""
    return interpreted(_decode_split_kernel)


def _check_args(q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, sliding_window, out) -> None:
    check_float(_LAUNCHER, "q", q, 3, "[batch, heads, head_dim]")
    check_float(_LAUNCHER, "k_buffer", k_buffer, 3, "[slots, kv_heads, head_dim]")
    check_float(_LAUNCHER, "v_buffer", v_buffer, 3, "[slots, kv_heads, head_dim]")
    check_same_dtype(_LAUNCHER, q=q, k_buffer=k_buffer, v_buffer=v_buffer)
    check_index(_LAUNCHER, "req_to_token", req_to_token, 2, "[rows, context]", dtypes=(torch.int32,))
    check_index(_LAUNCHER, "req_pool_indices", req_pool_indices, 1, "[batch]")
    check_index(_LAUNCHER, "seq_lens", seq_lens, 1, "[batch]")
    batch, heads, head_dim = q.shape
    if k_buffer.shape != v_buffer.shape:
        raise ValueError(
            f"{_LAUNCHER}: k_buffer {tuple(k_buffer.shape)} and v_buffer {tuple(v_buffer.shape)} differ in shape"
        )
    if k_buffer.shape[2] != head_dim:
        raise ValueError(f"{_LAUNCHER}: q has head_dim {head_dim} but the KV buffers {k_buffer.shape[2]}")
    kv_heads = k_buffer.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"{_LAUNCHER}: q's {heads} heads are not a multiple of the KV buffers' {kv_heads} heads")
    if req_pool_indices.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(
            f"{_LAUNCHER}: q has {batch} rows but req_pool_indices has {req_pool_indices.shape[0]} "
            f"and seq_lens {seq_lens.shape[0]}; pass one entry per request"
        )
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"{_LAUNCHER}: sliding_window must be >= 1 or None, got {sliding_window}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(
            f"{_LAUNCHER}: out must be {tuple(q.shape)} {q.dtype} contiguous in its last dimension, "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    if head_dim == 0:
        raise ValueError(f"{_LAUNCHER}: head_dim must be >= 1")
