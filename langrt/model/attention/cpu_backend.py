"""The CPU backend: the torch backend, with the rows of requests adding a few tokens (decodes,
jump-forward drafts) attended by langrt's C++ kernel (`kernels/cpu`) straight from the paged
pool, one call per layer for all of them.

The torch path gathers every such request's K/V into a padded block and runs SDPA on it, per
group of like widths; the kernel reads the pool in place, so a pass costs one call per layer
whatever the mix, and a long shared prefix is not copied once per request. Prompts (many new
tokens) still run torch's SDPA per request, where it is compute-bound and fast. Where the kernel
cannot be used (see `kernels.cpu.unavailable_reason`) this backend is the torch backend.
"""

from __future__ import annotations

import logging

import torch

from langrt.model.attention.base import Attention
from langrt.model.attention.torch_backend import (
    SHORT_EXTEND,
    TorchAttentionBackend,
    _SingleExtend,
    _TorchAttention,
)
from langrt.model.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class CpuAttentionBackend(TorchAttentionBackend):
    def __init__(self, config, kv_pool, req_pool):
        super().__init__(config, kv_pool, req_pool)
        self.kernel = None
        problem = self._shape_problem()
        if problem is not None:
            logger.warning("CPU attention kernel not used: %s; attention runs in plain torch", problem)
            return
        from langrt import kernels_package

        kernels_package()  # refuses a foreign top-level `kernels`
        from kernels.cpu import paged_attention

        self.kernel = paged_attention()

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
    """Rows of requests adding at most SHORT_EXTEND tokens: the kernel, one call per layer; longer
    extends (prompts): torch's SDPA per request, as in the torch backend."""

    def __init__(self, backend: CpuAttentionBackend, batch: ForwardBatch):
        self.b = backend
        self.batch = batch
        window = backend.sliding_window
        rows, reqs, starts, ends = [], [], [], []
        self.extends = []
        for i, n in enumerate(batch.extend_lens):
            start, seq_len = batch.extend_starts[i], batch.seq_lens[i]
            if n > SHORT_EXTEND:
                self.extends.append(_SingleExtend(backend, batch.req_pool_indices[i], start, seq_len, n, batch.input_ids.device))
                continue
            for e in range(n):
                end = seq_len - n + e + 1  # the token sees its request's keys up to itself
                rows.append(start + e)
                reqs.append(batch.req_pool_indices[i])
                starts.append(0 if window is None else max(0, end - window))
                ends.append(end)
        self.rows = torch.tensor(rows, dtype=torch.int64)
        self.reqs = torch.tensor(reqs, dtype=torch.int64)
        self.starts = torch.tensor(starts, dtype=torch.int32)
        self.ends = torch.tensor(ends, dtype=torch.int32)

    def attend(self, layer_id, q, k, v):
        b = self.b
        n = self.batch.num_tokens
        heads, dim = b.num_heads, b.head_dim
        b.write_kv(layer_id, self.batch, k, v)
        out = torch.empty((n, heads * dim), dtype=q.dtype, device=q.device)
        if self.rows.numel():
            b.kernel(
                q.view(n, heads, dim),
                b.kv_pool.k_buffers[layer_id],
                b.kv_pool.v_buffers[layer_id],
                b.req_pool.req_to_token,
                self.rows,
                self.reqs,
                self.starts,
                self.ends,
                out.view(n, heads, dim),
                b.scale,
            )
        for ext in self.extends:
            ext.attend(layer_id, q, out)
        return out
