"""Attention in plain torch over the paged pool: the reference backend and the CPU path.

Requests adding one token (decode) gather their K/V through `req_to_token` into one padded
[B, L] block and run a single masked SDPA per layer (per-op overhead, not FLOPs, bounds small CPU
batches). Requests adding several tokens (prefill) run one SDPA each, since prompt lengths are
ragged and prefill is compute-bound anyway. One pass may mix both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from langrt.model.attention.base import Attention, AttentionBackend
from langrt.model.forward_batch import ForwardBatch


class TorchAttentionBackend(AttentionBackend):
    def prepare(self, batch: ForwardBatch) -> Attention:
        return _TorchAttention(self, batch)

    def sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool):
        """q [H, Tq, D], k/v [Hkv, Tk, D] -> [H, Tq, D].

        Run as a batch of one in float32. 4-D inputs let torch use its CPU flash kernel (3-D ones
        take the math path: ~4x slower on a 1,100-token prompt with GQA). float32 keeps the math
        path's numerics (it upcasts bf16 on CPU): the flash kernel in bf16 shifts logits enough
        to flip near-tie greedy tokens between a prompt run alone and in a batch."""
        out = F.scaled_dot_product_attention(
            q[None].float(),
            k[None].float(),
            v[None].float(),
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out[0].to(q.dtype)

    def window_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Bool [.., Tq, Tk]: key at or before the query, and inside the sliding window if any."""
        allowed = k_pos <= q_pos
        if self.sliding_window is not None:
            allowed &= k_pos > q_pos - self.sliding_window
        return allowed


class _TorchAttention(Attention):
    """Requests adding one token (decode, or a decode riding along a prefill) are attended
    together in one padded SDPA; longer extends one request at a time."""

    def __init__(self, backend: TorchAttentionBackend, batch: ForwardBatch):
        self.b = backend
        self.batch = batch
        device = batch.input_ids.device
        singles = [i for i, n in enumerate(batch.extend_lens) if n == 1]
        self.single_rows = torch.tensor([batch.extend_starts[i] for i in singles], dtype=torch.int64, device=device)
        self.all_single = len(singles) == batch.batch_size
        self.padded = (
            _PaddedSingleTokens(backend, [batch.req_pool_indices[i] for i in singles], [batch.seq_lens[i] for i in singles], device)
            if singles
            else None
        )
        self.extends = [
            _SingleExtend(backend, batch.req_pool_indices[i], batch.extend_starts[i], batch.seq_lens[i], n, device)
            for i, n in enumerate(batch.extend_lens)
            if n > 1
        ]

    def attend(self, layer_id, q, k, v):
        b = self.b
        n = self.batch.num_tokens
        heads, kv_heads, dim = b.num_heads, b.num_kv_heads, b.head_dim
        b.kv_pool.write(layer_id, self.batch.out_cache_loc, k.view(n, kv_heads, dim), v.view(n, kv_heads, dim))
        if self.all_single:
            return self.padded.attend(layer_id, q)
        out = torch.empty((n, heads * dim), dtype=q.dtype, device=q.device)
        if self.padded is not None:
            out.index_copy_(0, self.single_rows, self.padded.attend(layer_id, q.index_select(0, self.single_rows)))
        for ext in self.extends:
            ext.attend(layer_id, q, out)
        return out


class _PaddedSingleTokens:
    """One new token for each of B requests: one masked SDPA over K/V gathered into [B, L].

    The `group` query heads sharing a KV head are passed to SDPA as `group` query positions of
    that KV head (no causal mask applies to a single new token), which is the same math as GQA
    but ~3x faster in torch's CPU kernel than its `enable_gqa` path."""

    def __init__(self, backend: TorchAttentionBackend, rows: list[int], seq_lens: list[int], device):
        self.b = backend
        self.batch_size = len(rows)
        self.max_len = max(seq_lens)
        index = backend.req_pool.req_to_token[torch.tensor(rows, device=device), : self.max_len]
        # Entries past a request's length are stale but valid slot ids; the mask hides them.
        self.kv_index = index.to(torch.int64).flatten()
        self.mask = self._mask(seq_lens, device)

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

    def attend(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        """q [B, H*D] (K/V already written) -> [B, H*D]."""
        b = self.b
        bs, kv_heads, dim = self.batch_size, b.num_kv_heads, b.head_dim
        shape = (bs, self.max_len, kv_heads, dim)
        keys = b.kv_pool.k_buffers[layer_id].index_select(0, self.kv_index).view(shape).transpose(1, 2)
        values = b.kv_pool.v_buffers[layer_id].index_select(0, self.kv_index).view(shape).transpose(1, 2)
        q = q.reshape(bs, kv_heads, b.num_heads // kv_heads, dim)
        mask = None if self.mask is None else self.mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=b.scale)
        return out.reshape(bs, b.num_heads * dim)


class _SingleExtend:
    """Several new tokens of one request, attending causally to its prefix and to each other."""

    def __init__(self, backend: TorchAttentionBackend, row: int, start: int, seq_len: int, extend_len: int, device):
        self.b = backend
        self.start, self.extend_len = start, extend_len
        self.kv_index = backend.req_pool.slots(row, seq_len)
        self.mask = self._mask(seq_len - extend_len, extend_len, device)

    def _mask(self, prefix_len: int, extend_len: int, device) -> torch.Tensor | None:
        """None when SDPA's own (top-left aligned) causal mask is exact: no prefix, no window cut."""
        window = self.b.sliding_window
        if prefix_len == 0 and (window is None or extend_len <= window):
            return None
        q_pos = torch.arange(prefix_len, prefix_len + extend_len, device=device)[:, None]
        k_pos = torch.arange(prefix_len + extend_len, device=device)[None, :]
        return self.b.window_mask(q_pos, k_pos)

    def attend(self, layer_id: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """Reads this request's rows of q [T, H*D], writes its rows of out."""
        b = self.b
        rows = slice(self.start, self.start + self.extend_len)
        qi = q[rows].reshape(self.extend_len, b.num_heads, b.head_dim).transpose(0, 1)  # [H, E, D]
        ki = b.kv_pool.k_buffers[layer_id].index_select(0, self.kv_index).transpose(0, 1).to(q.dtype)  # [Hkv, S, D]
        vi = b.kv_pool.v_buffers[layer_id].index_select(0, self.kv_index).transpose(0, 1).to(q.dtype)
        oi = b.sdpa(qi, ki, vi, self.mask, causal=self.mask is None)
        out[rows] = oi.transpose(0, 1).reshape(self.extend_len, -1)
