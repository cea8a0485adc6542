"""Tensor parallelism's layout (langrt/parallel/layout.py): which heads, MLP rows and vocabulary
rows each rank holds, and the settings that start ranks."""

from __future__ import annotations

import itertools

import pytest

from langrt.model.config import ModelConfig
from langrt.parallel.layout import ShardLayout, head_split, split
from langrt.router.replicas import replica_flags, replica_threads
from langrt.server_args import ServerArgs


def _config(heads: int, kv_heads: int, intermediate: int = 1536, vocab: int = 49152) -> ModelConfig:
    return ModelConfig(
        "llama", vocab, 576, intermediate, 2, heads, kv_heads, 64, 1e-5, 1e4, None, 2048, True, False, None, 1, (2,)
    )  # fmt: skip


def test_split_is_contiguous_even_and_prefers_whole_blocks():
    assert [split(9, 2, r) for r in range(2)] == [(0, 5), (5, 9)]
    assert [split(1536, 2, r, 32) for r in range(2)] == [(0, 768), (768, 1536)]
    assert [split(96, 2, r, 32) for r in range(2)] == [(0, 64), (64, 96)]  # 3 blocks: 2 + 1
    assert [split(100, 2, r, 32) for r in range(2)] == [(0, 50), (50, 100)]  # not whole blocks: by rows
    with pytest.raises(ValueError):
        split(3, 4, 0)


def test_smollm2_heads_on_two_ranks_split_by_kv_group():
    """9 query heads over 3 KV heads: two KV groups on rank 0, one on rank 1."""
    assert head_split(9, 3, 2, 0) == ((0, 1, 2, 3, 4, 5), (0, 1))
    assert head_split(9, 3, 2, 1) == ((6, 7, 8), (2,))
    config = _config(9, 3)
    zero, one = (ShardLayout.create(config, r, 2) for r in range(2))
    assert zero.local_config(config).num_heads == 6 and one.local_config(config).num_kv_heads == 1
    assert zero.ffn == (0, 768) and one.vocab == (24576, 49152) and zero.vocab_per_rank == (24576, 24576)
    assert zero.kv_heads_in_memory(config, shared_memory=True) == 3
    assert zero.kv_heads_in_memory(config, shared_memory=False) == 2


def test_fewer_kv_heads_than_ranks_replicates_them():
    assert head_split(4, 1, 2, 0) == ((0, 1), (0,)) and head_split(4, 1, 2, 1) == ((2, 3), (0,))
    # 9 heads / 3 KV heads over 4 ranks: rank 2's heads 5 and 6 read KV heads 1 and 2 (one each).
    assert head_split(9, 3, 4, 2) == ((5, 6), (1, 2))


def test_every_layout_covers_each_head_once_and_reads_the_right_kv_head():
    """Up to 12 heads and 8 ranks: each rank's query heads contiguous, and query head i of a
    rank reads local KV head i // (its heads / its KV heads), which is the head's own KV head."""
    for heads, kv_heads, size in itertools.product(range(1, 13), range(1, 13), range(1, 9)):
        if heads % kv_heads or size > heads:
            continue
        group, covered = heads // kv_heads, []
        for rank in range(size):
            q, kv = head_split(heads, kv_heads, size, rank)
            assert q and len(q) % len(kv) == 0 and list(q) == list(range(q[0], q[-1] + 1))
            local_group = len(q) // len(kv)
            assert [kv[i // local_group] for i in range(len(q))] == [h // group for h in q], (heads, kv_heads, size)
            covered += q
        assert covered == list(range(heads))


def test_more_ranks_than_heads_is_refused():
    with pytest.raises(ValueError, match="only 2 attention heads"):
        ShardLayout.create(_config(2, 1), 0, 4)


def test_tp_size_settings():
    with pytest.raises(ValueError, match="tp-size must be positive"):
        ServerArgs(tp_size=0)
    assert ServerArgs(tp_size=2, num_threads=1).resolve().num_threads == 1
    assert ServerArgs(tp_size=64).resolve().num_threads == 1  # the cores shared out, at least one each
    # dp replicas of tp ranks: each replica gets --tp-size, each rank its share of the cores
    assert replica_flags(ServerArgs(dp_size=2, tp_size=2)) == ["--tp-size", "2"]
    assert replica_threads(ServerArgs(dp_size=2, tp_size=64)) == 1


def test_tp_on_cuda_needs_a_gpu_per_rank(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="needs a GPU per rank; torch sees 1"):
        ServerArgs(device="cuda", dtype="float32", tp_size=2).resolve()
    assert ServerArgs(device="cuda", dtype="float32", tp_size=1).resolve().tp_size == 1
