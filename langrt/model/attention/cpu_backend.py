"""The CPU backend: the torch backend, with the rows of the pass attended by langrt's C++ kernel
(`kernels/cpu`) straight from the paged pool, one call per layer for all of them: decodes,
jump-forward drafts and prompts (up to KERNEL_MAX_EXTEND tokens on the kernel's AVX2 and plain C++
builds; all of them on its AVX-512 build).

The torch path gathers every request's K/V (into a padded block for decodes and drafts, per
request for prompts) and runs SDPA on it; the kernel reads the pool in place, so a pass costs
one call per layer whatever the mix, and a long shared prefix is not copied once per request.
Longer prompts on those builds run torch's SDPA per request, where its flash kernel is as fast.
Where the kernel cannot be used (see `kernels.cpu.unavailable_reason`) this backend is the torch
backend.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from langrt.model.attention.base import Attention
from langrt.model.attention.torch_backend import (
    TorchAttentionBackend,
    _SingleExtend,
    _TorchAttention,
)
from langrt.model.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# The most new tokens of one request the kernel attends, per build of it (kernels.cpu.isa(); None:
# no limit); longer extends run torch's SDPA. Measured on SmolLM2 (9 heads, 3 KV heads, head_dim
# 64, 2-core Zen 4), one prompt's whole forward pass, kernel vs SDPA:
# - AVX-512, bf16 (2026-11-26, the kernel with its transposed key blocks and segments, the pass
#   in one fused_layers call): 1,500 tokens 0.66 vs 0.99 s, 2,000 1.01 vs 1.54, 4,000 3.05 vs
#   4.72, 8,000 10.6 vs 16.0; float32 1,200 1.49 vs 1.74, 2,000 2.78 vs 3.14.
# - AVX2 build, float32 (torch capped at AVX2): 1,200 tokens 1.74 vs 1.77 s, 2,000 3.33 vs 3.18.
# - earlier (the kernel before its transposed blocks, bf16): 300 tokens 101 vs 116 ms, 1,200 540
#   vs 570, 1,536 864 vs 841, 2,000 1,250 vs 1,140; 4 x 64 tokens after a cached 1,236 220 vs 258.
KERNEL_MAX_EXTEND: dict[str, int | None] = {"avx512": None, "avx2": 1024, "scalar": 1024}


@dataclass(frozen=True)
class PagedPoolArgs:
    """What a caller running the layers itself (langrt.model.fused_layers) needs to attend as
    `attend` does, every row through the kernel (the fields are the paged kernel's arguments)."""

    k_buffers: list[torch.Tensor]
    v_buffers: list[torch.Tensor]
    slots: torch.Tensor  # where the pass's new K/V go
    req_to_token: torch.Tensor  # each request's positions -> slots
    rows: torch.Tensor
    reqs: torch.Tensor  # each row's request in req_to_token
    starts: torch.Tensor
    ends: torch.Tensor
    heads: int
    kv_heads: int
    scale: float

    def op_args(self) -> list:
        """The fused C++ op's pool arguments, from `k_buffers` to `scale` (heads and kv_heads go
        with the layer sizes)."""
        return [
            self.k_buffers,
            self.v_buffers,
            self.slots,
            self.req_to_token,
            self.rows,
            self.reqs,
            self.starts,
            self.ends,
            self.scale,
        ]


class CpuAttentionBackend(TorchAttentionBackend):
    def __init__(self, config, kv_pool, req_pool):
        super().__init__(config, kv_pool, req_pool)
        self.kernel = None
        problem = self._shape_problem()
        if problem is not None:
            logger.warning("CPU attention kernel not used: %s; attention runs in plain torch", problem)
            return
        from langrt_kernels.cpu import isa, paged_attention

        self.kernel = paged_attention()
        self.kernel_isa = isa()

    def _shape_problem(self) -> str | None:
        if self.kv_pool.device.type != "cpu":
            return f"the KV pool is on {self.kv_pool.device}"
        if self.kv_pool.dtype not in (torch.bfloat16, torch.float32):
            return f"it takes bfloat16 or float32, not {self.kv_pool.dtype}"
        if self.head_dim % 16 or self.head_dim > 256:
            return f"head_dim {self.head_dim} is not a multiple of 16 up to 256"
        if self.num_heads // self.num_kv_heads > 16:
            return f"{self.num_heads // self.num_kv_heads} query heads per KV head (at most 16)"
        return None

    def prepare(self, batch: ForwardBatch) -> Attention:
        if self.kernel is None:
            return _TorchAttention(self, batch)
        return _KernelAttention(self, batch)


class _KernelAttention(Attention):
    """Rows of requests adding at most KERNEL_MAX_EXTEND[build] tokens (any number on AVX-512):
    the kernel, one call per layer; longer extends: torch's SDPA per request, as in the torch
    backend."""

    def __init__(self, backend: CpuAttentionBackend, batch: ForwardBatch):
        self.b = backend
        self.batch = batch
        rows, reqs, ends, local = [], [], [], []
        self.extends = []
        limit = KERNEL_MAX_EXTEND[backend.kernel_isa]
        for i, n in enumerate(batch.extend_lens):
            start, seq_len = batch.extend_starts[i], batch.seq_lens[i]
            if limit is not None and n > limit:
                self.extends.append(
                    _SingleExtend(backend, batch.req_pool_indices[i], start, seq_len, n, batch.input_ids.device)
                )
                continue
            row_ends = range(seq_len - n + 1, seq_len + 1)  # each token sees its request's keys up to itself
            rows += range(start, start + n)
            reqs += [batch.req_pool_indices[i]] * n
            local += [i] * n
            ends += row_ends
        self.rows = torch.tensor(rows, dtype=torch.int64)
        self.reqs = torch.tensor(reqs, dtype=torch.int64)
        self.ends = torch.tensor(ends, dtype=torch.int32)
        # Each row's first visible key, per distinct window (full-attention layers: 0).
        self.starts = {
            w: self.ends.new_zeros(len(ends)) if w is None else (self.ends - w).clamp_(min=0) for w in backend.windows
        }
        self.window_table, self.window_reqs = self._window_table(local) if backend.window_kv else (None, None)

    def _window_table(self, local: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's rows of req_to_token in window slots, [B, longest], and each kernel row's
        request in it: what window layers read (the kernel reads only in-window positions)."""
        b, batch = self.b, self.batch
        rows = torch.tensor(batch.req_pool_indices, dtype=torch.int64)
        table = b.kv_pool.window_table(b.req_pool.req_to_token.index_select(0, rows)[:, : max(batch.seq_lens)])
        return table, torch.tensor(local, dtype=torch.int64)

    def _table(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(req_to_token-like table, each row's request in it) that layer `layer_id` reads."""
        if self.b.reads_window[layer_id]:
            return self.window_table, self.window_reqs
        return self.b.req_pool.req_to_token, self.reqs

    def pool_args(self) -> PagedPoolArgs | None:
        """What a caller running the layers itself (langrt.model.fused_layers) needs to do what
        `attend` does, every row through the kernel; None where some rows take SDPA, or the
        layers' windows differ (the C++ op takes one `starts` for every layer). Where every layer
        slides and keeps its K/V in a window pool, slots and table are window slots."""
        if self.extends or not self.rows.numel() or len(self.b.windows) > 1:
            return None
        b = self.b
        slots = self.batch.out_cache_loc
        if b.window_kv:  # one window for all layers: every layer reads the window pool
            slots = b.kv_pool.window_slots(slots)
        table, reqs = self._table(0)
        return PagedPoolArgs(
            b.kv_pool.k_buffers,
            b.kv_pool.v_buffers,
            slots,
            table,
            self.rows,
            reqs,
            self.starts[b.windows[0]],
            self.ends,
            b.num_heads,
            b.num_kv_heads,
            b.scale,
        )

    def attend(self, layer_id, q, k, v):
        b = self.b
        n = self.batch.num_tokens
        heads, dim = b.num_heads, b.head_dim
        b.write_kv(layer_id, self.batch, k, v)
        out = torch.empty((n, heads * dim), dtype=q.dtype, device=q.device)
        if self.rows.numel():
            table, reqs = self._table(layer_id)
            b.kernel(
                q.view(n, heads, dim),
                b.kv_pool.k_buffers[layer_id],
                b.kv_pool.v_buffers[layer_id],
                table,
                self.rows,
                reqs,
                self.starts[b.layer_windows[layer_id]],
                self.ends,
                out.view(n, heads, dim),
                b.scale,
            )
        for ext in self.extends:
            ext.attend(layer_id, q, out)
        return out
