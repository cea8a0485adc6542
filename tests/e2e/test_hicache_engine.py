"""HiCache end to end (--hicache-size, --hicache-dir) on a tiny random Llama: a workload whose
prefixes exceed the KV pool 4x returns to them from the tiers with the outputs it gets without
tiers; a restarted server's first requests load their prefixes from the disk tier."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import langrt

POOL = 512  # KV slots: the 8 prefixes of 256 tokens below are 4x this
SETTINGS = dict(dtype="float32", max_total_tokens=POOL, context_length=400, log_level="warning")


def tokens(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(17, 49152, (n,), generator=gen).tolist()


PREFIXES = [tokens(i, 256) for i in range(8)]


def round_of(suffix_seed: int) -> list[list[int]]:
    return [p + tokens(1000 * suffix_seed + i, 8) for i, p in enumerate(PREFIXES)]


def run(engine, prompts) -> list[list[int]]:
    """One request at a time, as returning users arrive."""
    params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    return [engine.generate(input_ids=p, sampling_params=params)["output_ids"] for p in prompts]


@pytest.fixture(scope="module")
def baseline(tiny_llama_dir):
    with langrt.Engine(str(tiny_llama_dir), **SETTINGS) as engine:
        outputs = run(engine, round_of(1)) + run(engine, round_of(2))
        assert engine.cache_stats()["cached_prompt_tokens"] == 0  # round 2's prefixes were evicted
    return outputs


def test_tiers_serve_returning_prefixes_with_identical_outputs(tiny_llama_dir, tmp_path, baseline):
    tiers = dict(hicache_size=0.01, hicache_dir=str(tmp_path))
    with langrt.Engine(str(tiny_llama_dir), **SETTINGS, **tiers) as engine:
        outputs = run(engine, round_of(1)) + run(engine, round_of(2))
        stats = engine.cache_stats()
    assert outputs == baseline
    # round 2: each prefix's 8 whole blocks (256 tokens) from the host tier
    assert stats["hicache_host_hit_tokens"] == 8 * 256 and stats["hicache_disk_hit_tokens"] == 0
    assert stats["hicache_disk_blocks"] > 0 and stats["hicache_disk_rejected_files"] == 0

    with langrt.Engine(str(tiny_llama_dir), **SETTINGS, **tiers) as restarted:
        first = run(restarted, round_of(2)[:1])
        stats = restarted.cache_stats()
        assert first == baseline[8:9]
        assert stats["hicache_disk_hit_tokens"] == 256 and stats["cached_prompt_tokens"] == 256
        assert run(restarted, round_of(2)[1:]) == baseline[9:]


def test_window_models_are_refused_clearly():
    from langrt.mem.hicache import create_tiers
    from langrt.mem.window_pool import HybridKVPool
    from langrt.server_args import ServerArgs

    pool = HybridKVPool(64, 32, (None, 8), 1, 4, torch.float32, "cpu")
    with pytest.raises(ValueError, match="sliding-window layers"):
        create_tiers(ServerArgs(hicache_size=1.0), SimpleNamespace(kv_pool=pool))
