"""The attention backend interface.

A backend is built once per ModelRunner over the two pools. For every forward pass the runner
calls `prepare(batch)` once; the returned `Attention` object carries that pass's metadata (index
tables, masks) and is handed explicitly through the model's layers, so nothing is stored on the
backend between passes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.model.config import ModelConfig
from langrt.model.forward_batch import ForwardBatch


class Attention(ABC):
    """Attention for one forward pass."""

    @abstractmethod
    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H*D], k/v [T, Hkv*D] of the batch's new tokens (rotary already applied).

        Writes k/v into the KV pool at the batch's `out_cache_loc`, then returns [T, H*D]: each
        new token attends causally to its request's whole sequence read through `req_to_token`
        (cached prefix, earlier tokens, and the new tokens up to itself).
        """


class AttentionBackend(ABC):
    """Built over the two pools; holds the model's attention shape (what every backend reads)."""

    def __init__(self, config: ModelConfig, kv_pool: TokenToKVPool, req_pool: ReqToTokenPool):
        self.kv_pool = kv_pool
        self.req_pool = req_pool
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.softmax_scale
        # Per layer: its sliding window (None: full); `windows` lists the distinct ones, so a pass
        # builds each window's masks or key ranges once and every layer picks its own.
        self.layer_windows = tuple(config.window_of(i) for i in range(config.num_layers))
        self.windows = tuple(dict.fromkeys(self.layer_windows))
        # Under a HybridKVPool (mem/window_pool.py) the window layers' K/V sit in their own pool:
        # those layers read keys through window slots (`kv_pool.window_slots` of the full ones).
        self.window_kv = kv_pool.window is not None
        self.reads_window = tuple(self.window_kv and w is not None for w in self.layer_windows)
        assert not self.window_kv or self.reads_window == kv_pool.sliding, "the pool's window layers are the model's"

    def write_kv(self, layer_id: int, batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        """The pass's new K/V ([T, Hkv*D] each) into the pool at the batch's `out_cache_loc`."""
        shape = (batch.num_tokens, self.num_kv_heads, self.head_dim)
        self.kv_pool.write(layer_id, batch.out_cache_loc, k.view(shape), v.view(shape))

    @abstractmethod
    def prepare(self, batch: ForwardBatch) -> Attention:
        """Build the per-pass metadata. Must not change the pools."""
