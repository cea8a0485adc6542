"""Attention in plain torch over the paged pool: the reference backend and the CPU path.

Decode batches gather every request's K/V through `req_to_token` into one padded [B, L] block
and run a single masked SDPA per layer (per-op overhead, not FLOPs, bounds small CPU batches).
Extend batches run one SDPA per request, since prompt lengths are ragged and prefill is
compute-bound anyway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.model.attention.base import Attention, AttentionBackend
from langrt.model.config import ModelConfig
from langrt.model.forward_batch import ForwardBatch, ForwardMode


class TorchAttentionBackend(AttentionBackend):
    def __init__(self, config: ModelConfig, kv_pool: TokenToKVPool, req_pool: ReqToTokenPool):
        self.kv_pool = kv_pool
        self.req_pool = req_pool
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.sliding_window = config.sliding_window

    def prepare(self, batch: ForwardBatch) -> Attention:
        if batch.mode is ForwardMode.DECODE:
            return _DecodeAttention(self, batch)
        return _ExtendAttention(self, batch)

    def sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool):
        """q [..., H, Tq, D], k/v [..., Hkv, Tk, D] -> [..., H, Tq, D]."""
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )

    def window_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Bool [.., Tq, Tk]: key at or before the query, and inside the sliding window if any."""
        allowed = k_pos <= q_pos
        if self.sliding_window is not None:
            allowed &= k_pos > q_pos - self.sliding_window
        return allowed


class _DecodeAttention(Attention):
    """One masked SDPA per layer over K/V gathered into a padded [B, L] block.

    The `group` query heads sharing a KV head are passed to SDPA as `group` query positions of
    that KV head (no causal mask applies to a single new token), which is the same math as GQA
    but ~3x faster in torch's CPU kernel than its `enable_gqa` path."""

    def __init__(self, backend: TorchAttentionBackend, batch: ForwardBatch):
        self.b = backend
        self.batch = batch
        device = batch.input_ids.device
        self.max_len = max(batch.seq_lens)
        rows = torch.tensor(batch.req_pool_indices, device=device)
        # Entries past a request's length are stale but valid slot ids; the mask hides them.
        self.kv_index = backend.req_pool.req_to_token[rows, : self.max_len].to(torch.int64).flatten()
        self.mask = self._mask(batch.seq_lens, device)

    def _mask(self, seq_lens: list[int], device) -> torch.Tensor | None:
        """Additive [B, 1, 1, L] mask (0 or -inf), or None when every position is visible."""
        window = self.b.sliding_window
        max_len = self.max_len
        if min(seq_lens) == max_len and (window is None or max_len <= window):
            return None
        lens = torch.tensor(seq_lens, device=device)[:, None]
        k_pos = torch.arange(max_len, device=device)[None, :]
        visible = self.b.window_mask(lens - 1, k_pos) & (k_pos < lens)
        mask = torch.zeros(visible.shape, dtype=self.b.kv_pool.dtype, device=device)
        return mask.masked_fill_(~visible, float("-inf"))[:, None, None, :]

    def attend(self, layer_id, q, k, v):
        b = self.b
        bs = self.batch.batch_size
        kv_heads, dim = b.num_kv_heads, b.head_dim
        b.kv_pool.write(layer_id, self.batch.out_cache_loc, k.view(bs, kv_heads, dim), v.view(bs, kv_heads, dim))
        shape = (bs, self.max_len, kv_heads, dim)
        keys = b.kv_pool.k_buffers[layer_id].index_select(0, self.kv_index).view(shape).transpose(1, 2)
        values = b.kv_pool.v_buffers[layer_id].index_select(0, self.kv_index).view(shape).transpose(1, 2)
        group = b.num_heads // kv_heads
        q = q.reshape(bs, kv_heads, group, dim)
        mask = None if self.mask is None else self.mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=b.scale)
        return out.reshape(bs, b.num_heads * dim)


class _ExtendAttention(Attention):
    def __init__(self, backend: TorchAttentionBackend, batch: ForwardBatch):
        self.b = backend
        self.batch = batch
        self.kv_index = [
            backend.req_pool.slots(row, seq_len) for row, seq_len in zip(batch.req_pool_indices, batch.seq_lens)
        ]
        self.masks = [
            self._mask(prefix, ext, batch.input_ids.device)
            for prefix, ext in zip(batch.prefix_lens, batch.extend_lens)
        ]

    def _mask(self, prefix_len: int, extend_len: int, device) -> torch.Tensor | None:
        """None when SDPA's own (top-left aligned) causal mask is exact: no prefix, no window cut."""
        window = self.b.sliding_window
        if prefix_len == 0 and (window is None or extend_len <= window):
            return None
        q_pos = torch.arange(prefix_len, prefix_len + extend_len, device=device)[:, None]
        k_pos = torch.arange(prefix_len + extend_len, device=device)[None, :]
        return self.b.window_mask(q_pos, k_pos)

    def attend(self, layer_id, q, k, v):
        b = self.b
        batch = self.batch
        n = batch.num_tokens
        b.kv_pool.write(
            layer_id,
            batch.out_cache_loc,
            k.view(n, b.num_kv_heads, b.head_dim),
            v.view(n, b.num_kv_heads, b.head_dim),
        )
        q = q.view(n, b.num_heads, b.head_dim)
        out = torch.empty_like(q)
        k_buf, v_buf = b.kv_pool.k_buffers[layer_id], b.kv_pool.v_buffers[layer_id]
        for start, length, index, mask in zip(batch.extend_starts, batch.extend_lens, self.kv_index, self.masks):
            qi = q[start : start + length].transpose(0, 1)  # [H, E, D]
            ki = k_buf.index_select(0, index).transpose(0, 1).to(q.dtype)  # [Hkv, S, D]
            vi = v_buf.index_select(0, index).transpose(0, 1).to(q.dtype)
            oi = b.sdpa(qi, ki, vi, mask, causal=mask is None)
            out[start : start + length] = oi.transpose(0, 1)
        return out.view(n, b.num_heads * b.head_dim)
