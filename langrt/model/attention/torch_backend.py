"""Attention in plain torch over the paged pool: the reference backend, and the CPU path where
langrt's C++ kernel cannot run (see cpu_backend).

Requests adding one token (decode) or a few (jump-forward drafts) gather their K/V through
`req_to_token` into one padded [B, L] block and run a single masked SDPA per layer (per-op
overhead, not FLOPs, bounds small CPU batches). Requests adding many tokens (prefill) run one
SDPA each, since prompt lengths are ragged and prefill is compute-bound anyway. One pass may mix
both.
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

    def window_mask(self, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
        """Bool [.., Tq, Tk]: key at or before the query, and inside the sliding window if any."""
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= k_pos > q_pos - window
        return allowed


# Why 16: jump-forward drafts (a few tokens each) ride in the padded block with the decodes;
# the block pads every request to the longest, so long extends (prompts) go one at a time.
SHORT_EXTEND = 16


class _TorchAttention(Attention):
    """Requests adding one token (decode) are attended together in one padded SDPA, those adding
    a few (jump-forward drafts) in another; longer extends one request at a time."""

    def __init__(self, backend: TorchAttentionBackend, batch: ForwardBatch):
        self.b = backend
        self.batch = batch
        device = batch.input_ids.device
        lens = batch.extend_lens
        self.all_short = all(n == 1 for n in lens)
        # One-token requests apart from those with a few (drafts): in one block the decodes
        # would be padded to the drafts' width.
        groups = [[i for i, n in enumerate(lens) if n == 1], [i for i, n in enumerate(lens) if 1 < n <= SHORT_EXTEND]]
        self.padded = [
            _PaddedShortExtends(
                backend,
                [batch.req_pool_indices[i] for i in group],
                [batch.seq_lens[i] for i in group],
                [batch.extend_starts[i] for i in group],
                [lens[i] for i in group],
                device,
            )
            for group in groups
            if group
        ]
        self.extends = [
            _SingleExtend(backend, batch.req_pool_indices[i], batch.extend_starts[i], batch.seq_lens[i], n, device)
            for i, n in enumerate(batch.extend_lens)
            if n > SHORT_EXTEND
        ]

    def attend(self, layer_id, q, k, v):
        b = self.b
        n = self.batch.num_tokens
        heads, dim = b.num_heads, b.head_dim
        b.write_kv(layer_id, self.batch, k, v)
        if self.all_short:  # a plain decode batch: rows are already in order
            return self.padded[0].attend(layer_id, q)
        out = torch.empty((n, heads * dim), dtype=q.dtype, device=q.device)
        for group in self.padded:
            group.attend_into(layer_id, q, out)
        for ext in self.extends:
            ext.attend(layer_id, q, out)
        return out


class _PaddedShortExtends:
    """E_i new tokens (E_i small) for each of B requests: one masked SDPA over K/V gathered into
    [B, L], queries padded to [B, E] with E = max E_i.

    The `group` query heads sharing a KV head are passed to SDPA as `group` x E query positions
    of that KV head (the mask is per query position, repeated for each head of the group), which
    is the same math as GQA but ~3x faster in torch's CPU kernel than its `enable_gqa` path."""

    def __init__(self, backend: TorchAttentionBackend, rows, seq_lens, starts, extend_lens, device):
        self.b = backend
        self.batch_size = len(rows)
        self.max_len = max(seq_lens)
        self.width = max(extend_lens)
        index = backend.req_pool.req_to_token[torch.tensor(rows, device=device), : self.max_len]
        # Entries past a request's length are stale but valid slot ids; the mask hides them.
        self.kv_index = index.to(torch.int64).flatten()
        # window layers' keys: the same positions in the window pool (those it no longer keeps
        # are outside every query's window, hence masked)
        self.window_index = backend.kv_pool.window_slots(self.kv_index) if backend.window_kv else None
        # Query rows of q [T, H*D] in padded [B, E] order (padding repeats a real row; its output
        # is dropped), and the positions of the real ones in that order.
        q_rows, real = [], []
        for i, (start, n) in enumerate(zip(starts, extend_lens)):
            q_rows += list(range(start, start + n)) + [start] * (self.width - n)
            real += range(i * self.width, i * self.width + n)
        self.q_rows = torch.tensor(q_rows, dtype=torch.int64, device=device)
        self.real = torch.tensor(real, dtype=torch.int64, device=device)
        self.out_rows = self.q_rows.index_select(0, self.real)
        # one token each, on consecutive rows (the scheduler puts decodes first): slices will do
        self.span = None
        if self.width == 1 and q_rows == list(range(q_rows[0], q_rows[0] + len(q_rows))):
            self.span = slice(q_rows[0], q_rows[0] + len(q_rows))
        self.masks = {window: self._mask(seq_lens, extend_lens, window, device) for window in backend.windows}

    def _mask(self, seq_lens: list[int], extend_lens: list[int], window: int | None, device) -> torch.Tensor | None:
        """Additive [B, 1, group * E, L] mask (0 or -inf), or None when every position is visible."""
        b, width, max_len = self.b, self.width, self.max_len
        if width == 1 and min(seq_lens) == max_len and (window is None or max_len <= window):
            return None
        lens = torch.tensor(seq_lens, device=device)[:, None, None]
        # query e of request i sits at position len_i - E_i + e (padding rows: clamped, unused)
        q_pos = (
            lens
            - torch.tensor(extend_lens, device=device)[:, None, None]
            + torch.arange(width, device=device)[None, :, None]
        )
        q_pos = torch.minimum(q_pos, lens - 1)
        k_pos = torch.arange(max_len, device=device)[None, None, :]
        visible = b.window_mask(q_pos, k_pos, window) & (k_pos < lens)  # [B, E, L]
        mask = torch.zeros(visible.shape, dtype=b.kv_pool.dtype, device=device).masked_fill_(~visible, float("-inf"))
        group = b.num_heads // b.num_kv_heads
        return mask[:, None].expand(-1, group, -1, -1).reshape(self.batch_size, 1, group * width, max_len)

    def attend(self, layer_id: int, q: torch.Tensor) -> torch.Tensor:
        """q [B*E, H*D] in padded order (K/V already written) -> [B*E, H*D]."""
        b = self.b
        bs, width, kv_heads, dim = self.batch_size, self.width, b.num_kv_heads, b.head_dim
        group = b.num_heads // kv_heads
        shape = (bs, self.max_len, kv_heads, dim)
        index = self.window_index if b.reads_window[layer_id] else self.kv_index
        keys = b.kv_pool.k_buffers[layer_id].index_select(0, index).view(shape).transpose(1, 2)
        values = b.kv_pool.v_buffers[layer_id].index_select(0, index).view(shape).transpose(1, 2)
        # [B, E, Hkv, group, D] -> [B, Hkv, group * E, D]
        q = q.reshape(bs, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(bs, kv_heads, group * width, dim)
        mask = self.masks[b.layer_windows[layer_id]]
        mask = None if mask is None else mask.to(q.dtype)
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=b.scale)
        return (
            out.reshape(bs, kv_heads, group, width, dim).permute(0, 3, 1, 2, 4).reshape(bs * width, b.num_heads * dim)
        )

    def attend_into(self, layer_id: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """Reads these requests' rows of q [T, H*D], writes their rows of out."""
        if self.span is not None:
            out[self.span] = self.attend(layer_id, q[self.span])
            return
        result = self.attend(layer_id, q.index_select(0, self.q_rows))
        out.index_copy_(0, self.out_rows, result.index_select(0, self.real))


class _SingleExtend:
    """Several new tokens of one request, attending causally to its prefix and to each other."""

    def __init__(self, backend: TorchAttentionBackend, row: int, start: int, seq_len: int, extend_len: int, device):
        self.b = backend
        self.start, self.extend_len = start, extend_len
        self.kv_index = backend.req_pool.slots(row, seq_len)
        self.window_index = backend.kv_pool.window_slots(self.kv_index) if backend.window_kv else None
        self.masks = {
            window: self._mask(seq_len - extend_len, extend_len, window, device) for window in backend.windows
        }

    def _mask(self, prefix_len: int, extend_len: int, window: int | None, device) -> torch.Tensor | None:
        """None when SDPA's own (top-left aligned) causal mask is exact: no prefix, no window cut."""
        if prefix_len == 0 and (window is None or extend_len <= window):
            return None
        q_pos = torch.arange(prefix_len, prefix_len + extend_len, device=device)[:, None]
        k_pos = torch.arange(prefix_len + extend_len, device=device)[None, :]
        return self.b.window_mask(q_pos, k_pos, window)

    def attend(self, layer_id: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """Reads this request's rows of q [T, H*D], writes its rows of out."""
        b = self.b
        rows = slice(self.start, self.start + self.extend_len)
        qi = q[rows].reshape(self.extend_len, b.num_heads, b.head_dim).transpose(0, 1)  # [H, E, D]
        index = self.window_index if b.reads_window[layer_id] else self.kv_index
        ki = b.kv_pool.k_buffers[layer_id].index_select(0, index).transpose(0, 1).to(q.dtype)  # [Hkv, S, D]
        vi = b.kv_pool.v_buffers[layer_id].index_select(0, index).transpose(0, 1).to(q.dtype)
        mask = self.masks[b.layer_windows[layer_id]]
        oi = b.sdpa(qi, ki, vi, mask, causal=mask is None)
        out[rows] = oi.transpose(0, 1).reshape(self.extend_len, -1)
