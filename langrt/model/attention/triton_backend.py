"""Attention with langrt's Triton kernels over the paged pool: the GPU path.

A pass where every request adds one token runs the decode kernel (split-K over long
sequences); any other pass runs the extend kernel over all its requests at once (a request
adding one token is an extend of length 1). Both read K/V through `req_to_token`, after this
pass's K/V are written at `out_cache_loc`.

The kernels take CUDA tensors; on CPU they run only in Triton's interpreter (TRITON_INTERPRET=1
set before triton is imported), which is how the tests check this backend against the torch one.
"""

from __future__ import annotations

import importlib

import torch

from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.model.attention.base import Attention, AttentionBackend
from langrt.model.config import ModelConfig
from langrt.model.forward_batch import ForwardBatch


class TritonAttentionBackend(AttentionBackend):
    def __init__(self, config: ModelConfig, kv_pool: TokenToKVPool, req_pool: ReqToTokenPool):
        self.decode_kernels = _kernel_module("decode_attention")
        self.extend_kernels = _kernel_module("extend_attention")
        _check_runs_on(kv_pool.device, self.decode_kernels)
        super().__init__(config, kv_pool, req_pool)

    def prepare(self, batch: ForwardBatch) -> Attention:
        return _TritonAttention(self, batch)

    def prepare_graph_decode(
        self, batch: ForwardBatch, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, num_kv_splits: int
    ) -> Attention:
        """A decode pass that reads its request rows and lengths from these int32 device tensors
        (a CUDA graph's static buffers: each replay reads what they hold then) with a fixed number
        of key ranges (a graph cannot choose it per pass); `batch` gives only its shape and slots."""
        return _TritonAttention(self, batch, static=(req_pool_indices, seq_lens, num_kv_splits))


class _TritonAttention(Attention):
    """The pass's index tensors, built once on the device and shared by every layer."""

    def __init__(self, backend: TritonAttentionBackend, batch: ForwardBatch, static=None):
        self.b = backend
        self.batch = batch
        self._window = None  # (table, rows) of the window layers
        if static is not None:  # see prepare_graph_decode
            self.req_pool_indices, self.seq_lens, self.num_kv_splits = static
            self.is_decode = True
            self.max_seq = None  # a replay's lengths are not known here: the whole row
            return
        device = batch.input_ids.device
        self.req_pool_indices = torch.tensor(batch.req_pool_indices, dtype=torch.int32, device=device)
        self.seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int32, device=device)
        self.is_decode = all(n == 1 for n in batch.extend_lens)
        self.max_seq = max(batch.seq_lens)
        if self.is_decode:
            self.num_kv_splits = backend.decode_kernels.default_num_kv_splits(
                batch.batch_size, backend.num_kv_heads, max(batch.seq_lens), device
            )
        else:
            indptr = [*batch.extend_starts, batch.num_tokens]
            self.qo_indptr = torch.tensor(indptr, dtype=torch.int32, device=device)
            self.max_extend_len = max(batch.extend_lens)

    def attend(self, layer_id, q, k, v):
        b = self.b
        n = self.batch.num_tokens
        heads, dim = b.num_heads, b.head_dim
        b.write_kv(layer_id, self.batch, k, v)
        out = torch.empty((n, heads * dim), dtype=q.dtype, device=q.device)
        table, rows = self._table(layer_id)
        common = (q.view(n, heads, dim), b.kv_pool.k_buffers[layer_id], b.kv_pool.v_buffers[layer_id], table)
        if self.is_decode:
            b.decode_kernels.decode_attention_triton(
                *common,
                rows,
                self.seq_lens,
                scale=b.scale,
                sliding_window=b.layer_windows[layer_id],
                num_kv_splits=self.num_kv_splits,
                out=out.view(n, heads, dim),
            )
        else:
            b.extend_kernels.extend_attention_triton(
                *common,
                rows,
                self.seq_lens,
                self.qo_indptr,
                self.max_extend_len,
                scale=b.scale,
                sliding_window=b.layer_windows[layer_id],
                out=out.view(n, heads, dim),
            )
        return out

    def _table(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(req_to_token-like table, each request's row in it) that layer `layer_id` reads: for a
        window layer under a window pool, the batch's rows in window slots (device ops only, so
        a captured decode graph rebuilds it on each replay)."""
        b = self.b
        if not b.reads_window[layer_id]:
            return b.req_pool.req_to_token, self.req_pool_indices
        # Built again by each pass's first window layer: a graph runs one pass eagerly before
        # capturing the next with this same object, and the capture must record the build.
        if self._window is None or layer_id == b.reads_window.index(True):
            full = b.req_pool.req_to_token.index_select(0, self.req_pool_indices.to(torch.int64))
            table = b.kv_pool.window_table(full if self.max_seq is None else full[:, : self.max_seq])
            rows = torch.arange(table.shape[0], dtype=torch.int32, device=table.device)
            self._window = (table.contiguous(), rows)
        return self._window


def _kernel_module(name: str):
    return importlib.import_module(f"langrt_kernels.{name}")


def _check_runs_on(device: torch.device, kernels) -> None:
    interpreted = kernels.is_interpreted()
    if device.type == "cpu" and not interpreted:
        raise ValueError(
            "--attention-backend triton needs --device cuda; on CPU use --attention-backend torch "
            "(or set TRITON_INTERPRET=1 to run the kernels in Triton's interpreter, for tests)"
        )
    if device.type != "cpu" and interpreted:
        raise ValueError(
            f"TRITON_INTERPRET=1 runs the Triton kernels on CPU only, but the model is on {device}; unset it"
        )
