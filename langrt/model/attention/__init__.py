"""Attention backends over the paged KV pool; `create_attention_backend` picks one."""

from __future__ import annotations

from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.model.attention.base import Attention, AttentionBackend
from langrt.model.config import ModelConfig

ATTENTION_BACKENDS = ("torch", "cpu", "triton")


def create_attention_backend(
    name: str, config: ModelConfig, kv_pool: TokenToKVPool, req_pool: ReqToTokenPool
) -> AttentionBackend:
    if name == "torch":
        from langrt.model.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(config, kv_pool, req_pool)
    if name == "cpu":
        from langrt.model.attention.cpu_backend import CpuAttentionBackend

        return CpuAttentionBackend(config, kv_pool, req_pool)
    if name == "triton":
        from langrt.model.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(config, kv_pool, req_pool)
    raise ValueError(f"unknown attention backend {name!r}; choose from {ATTENTION_BACKENDS}")


__all__ = ["Attention", "AttentionBackend", "create_attention_backend", "ATTENTION_BACKENDS"]
