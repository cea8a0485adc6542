"""The hierarchical KV cache (mem/hicache) under a real CacheManager over small CPU pools: what
the radix tree evicts comes back, bit for bit, from the host tier and from the disk tier (also
after a "restart": new tiers over the same directory); bad block files are ignored and removed;
a writer killed mid-write leaves nothing that loads.

A "computed" position's K/V is a function of its whole prefix (`expected_kv`), so a slot holding
another prefix's K/V, or a block loaded to the wrong positions, shows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import torch

from langrt.mem.cache_manager import CacheManager
from langrt.mem.hicache.block_file import BlockName, decode_block
from langrt.mem.hicache.disk_tier import DiskTier
from langrt.mem.hicache.host_tier import HostTier
from langrt.mem.hicache.keys import block_key
from langrt.mem.hicache.tiers import HiCache, gather_kv
from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from kv_helpers import make_req

B = 4  # block tokens
LAYERS, HEADS, DIM = 2, 1, 2
NAMESPACE = b"n" * 16


def expected_kv(prefix: list[int]) -> torch.Tensor:
    """[2, LAYERS, HEADS, DIM]: the K/V a position gets, a function of every token up to it."""
    h = 0
    for t in prefix:
        h = (h * 31 + t + 1) % 1009
    base = torch.arange(LAYERS * HEADS * DIM, dtype=torch.float32).view(LAYERS, HEADS, DIM)
    return torch.stack([base + h, -(base + h) - len(prefix)])


def make_cm(slots: int = 32, host_blocks: int = 0, disk_dir=None, disk_bytes: int = 1 << 20):
    kv = TokenToKVPool(slots, LAYERS, HEADS, DIM, torch.float32, "cpu")
    shape = (2, LAYERS, B, HEADS, DIM)
    host = HostTier(host_blocks, shape, torch.float32, pin=False) if host_blocks else None
    disk = DiskTier(disk_dir, disk_bytes) if disk_dir is not None else None
    tiers = HiCache(kv, NAMESPACE, B, host, disk)
    return CacheManager(ReqToTokenPool(4, 128, "cpu"), kv, radix=True, tiers=tiers), kv, tiers


def run(cm: CacheManager, kv: TokenToKVPool, ids: list[int]) -> int:
    """Admit a request for `ids`, "compute" what was not cached, finish it; -> tokens reused."""
    req = make_req("r", ids)
    assert cm.open(req, cm.match(req.all_ids[: req.max_prefix_len]))
    reused = req.kv_len
    assert cm.reserve(req, req.kv_len, req.seq_len - req.kv_len)
    slots = cm.slots(req, req.kv_len, req.seq_len)
    for pos, slot in zip(range(req.kv_len, req.seq_len), slots.tolist()):
        data = expected_kv(ids[: pos + 1])
        for layer in range(LAYERS):
            kv.write(layer, torch.tensor([slot]), data[0, layer][None], data[1, layer][None])
    check_kv(cm, kv, req, ids)
    req.kv_len = req.seq_len
    cm.release(req)
    return reused


def check_kv(cm, kv, req, ids) -> None:
    """Every position the request reads holds its own prefix's K/V."""
    got = gather_kv(kv, cm.slots(req, 0, req.kv_len))
    for pos in range(req.kv_len):
        assert torch.equal(got[:, :, pos], expected_kv(ids[: pos + 1])), f"position {pos}"


PROMPTS = [[p] * 3 + list(range(100 + 20 * p, 100 + 20 * p + 14)) for p in range(6)]  # 17 tokens each


def test_evicted_prefix_returns_from_host_tier():
    cm, kv, tiers = make_cm(slots=32, host_blocks=64)
    for ids in PROMPTS:  # 6 x 17 tokens through a 32-slot pool: the early ones are evicted
        assert run(cm, kv, ids) == 0
    assert tiers.counters.saved_blocks > 0
    # The first prompt is long gone from the pool; its 4 whole blocks come back (16 of 17
    # tokens; at least one position is always computed) and read as computed.
    assert cm.match(PROMPTS[0]).length == 0
    assert run(cm, kv, PROMPTS[0] + [7]) == 16
    assert tiers.counters.host_hit_tokens == 16


def test_mid_block_match_loads_only_the_rest():
    cm, kv, tiers = make_cm(slots=32, host_blocks=64)
    for ids in PROMPTS:
        run(cm, kv, ids)
    run(cm, kv, PROMPTS[0][:6] + [55])  # 6 tokens of prompt 0 back in the tree (one block + 2)
    assert run(cm, kv, PROMPTS[0] + [9]) == 16  # blocks 1..3 loaded from position 6 on (block 1 in part)


def test_without_tiers_nothing_returns():
    kv = TokenToKVPool(32, LAYERS, HEADS, DIM, torch.float32, "cpu")
    cm = CacheManager(ReqToTokenPool(4, 128, "cpu"), kv, radix=True)
    for ids in PROMPTS:
        run(cm, kv, ids)
    assert run(cm, kv, PROMPTS[0] + [7]) == 0


def test_host_tier_is_bounded_lru():
    cm, kv, tiers = make_cm(slots=32, host_blocks=4)
    for ids in PROMPTS:
        run(cm, kv, ids)
    assert len(tiers.host) == 4
    assert run(cm, kv, PROMPTS[0] + [7]) == 0  # its blocks were the least recently saved


def test_restart_finds_prefixes_on_disk(tmp_path):
    cm, kv, tiers = make_cm(slots=32, host_blocks=2, disk_dir=tmp_path)
    for ids in PROMPTS:
        run(cm, kv, ids)
    assert tiers.disk.writes > 0
    cm2, kv2, tiers2 = make_cm(slots=32, host_blocks=2, disk_dir=tmp_path)  # a new server
    assert run(cm2, kv2, PROMPTS[0] + [7]) == 16
    assert tiers2.counters.disk_hit_tokens == 16 and tiers2.counters.host_hit_tokens == 0


def test_disk_only_tier(tmp_path):
    cm, kv, tiers = make_cm(slots=32, disk_dir=tmp_path)
    for ids in PROMPTS:
        run(cm, kv, ids)
    assert run(cm, kv, PROMPTS[1] + [7]) == 16


def test_disk_tier_is_bounded(tmp_path):
    cm, kv, tiers = make_cm(slots=32, disk_dir=tmp_path, disk_bytes=3000)
    for ids in PROMPTS:
        run(cm, kv, ids)
    assert 0 < tiers.disk.used <= 3000 and tiers.disk.writes > len(tiers.disk)
    assert sum(p.stat().st_size for p in tmp_path.glob("*.kv")) == tiers.disk.used


def _first_block_file(tmp_path):
    """Fill the disk tier; -> (the file of PROMPTS[0]'s first block, its BlockName)."""
    cm, kv, tiers = make_cm(slots=32, disk_dir=tmp_path)
    for ids in PROMPTS:
        run(cm, kv, ids)
    name = BlockName(NAMESPACE, NAMESPACE, tuple(PROMPTS[0][:B]), torch.float32, (2, LAYERS, B, HEADS, DIM))
    path = tiers.disk.path(name.key)
    assert path.exists()
    return path, name


def _restart_and_rerun(tmp_path) -> tuple[int, HiCache]:
    cm, kv, tiers = make_cm(slots=32, disk_dir=tmp_path)
    return run(cm, kv, PROMPTS[0] + [7]), tiers


def test_truncated_file_is_ignored_and_removed(tmp_path):
    path, _ = _first_block_file(tmp_path)
    path.write_bytes(path.read_bytes()[:-5])
    reused, tiers = _restart_and_rerun(tmp_path)
    assert reused == 0 and tiers.disk.rejected == 1 and not path.exists()


def test_corrupt_byte_is_ignored_and_removed(tmp_path):
    path, _ = _first_block_file(tmp_path)
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 0xFF
    path.write_bytes(bytes(blob))
    reused, tiers = _restart_and_rerun(tmp_path)
    assert reused == 0 and tiers.disk.rejected == 1 and not path.exists()


def test_file_under_the_wrong_key_is_ignored_and_removed(tmp_path):
    path, name = _first_block_file(tmp_path)
    second = path.with_name(f"{block_key(name.key, tuple(PROMPTS[0][B : 2 * B])).hex()}.kv")
    path.write_bytes(second.read_bytes())  # block 1's file under block 0's name
    reused, tiers = _restart_and_rerun(tmp_path)
    assert reused == 0 and tiers.disk.rejected == 1 and not path.exists() and second.exists()


def test_other_namespace_is_never_read(tmp_path):
    path, name = _first_block_file(tmp_path)
    with open(path, "rb") as f:
        blob = f.read()
    other = BlockName(b"m" * 16, b"m" * 16, name.tokens, name.dtype, name.shape)
    try:
        decode_block(blob, other)
    except Exception as e:
        assert "namespace" in str(e)
    else:
        raise AssertionError("a block of another model decoded")


WRITER = """
import sys, time, torch
from langrt.mem.hicache import disk_tier
from langrt.mem.hicache.block_file import BlockName

real_open = open
class HalfWriter:
    def __init__(self, path, mode):
        self.f = real_open(path, mode)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def write(self, blob):
        self.f.write(blob[: len(blob) // 2])
        self.f.flush()
        print("half", flush=True)
        time.sleep(60)

disk_tier.open = HalfWriter
tier = disk_tier.DiskTier(sys.argv[1], 1 << 30)
name = BlockName(b"n" * 16, b"n" * 16, (1, 2, 3, 4), torch.float32, (2, 2, 4, 1, 2))
tier.put(name, torch.ones(name.shape))
"""


def test_kill_9_mid_write_leaves_nothing_that_loads(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "half"
        assert [p.name for p in tmp_path.iterdir()][0].endswith(f".tmp.{child.pid}")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    tier = DiskTier(tmp_path, 1 << 30)  # the next start
    assert len(tier) == 0 and list(tmp_path.iterdir()) == []  # the dead writer's temp removed
    name = BlockName(b"n" * 16, b"n" * 16, (1, 2, 3, 4), torch.float32, (2, 2, 4, 1, 2))
    assert tier.get(name) is None


def test_namespace_names_the_model_files_and_settings(tmp_path):
    from langrt.mem.hicache.keys import KVIdentity, model_files

    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 100)

    def namespace(dtype="torch.float32"):
        return KVIdentity(model_files(tmp_path), (("quantization", "none"),), 2, 1, 2, dtype, B).namespace

    first = namespace()
    assert namespace() == first
    assert namespace("torch.bfloat16") != first
    weights.write_bytes(b"b" * 100)  # same size, other content
    assert namespace() != first


def test_flags_refused_where_tiers_cannot_work():
    import pytest

    from langrt.server_args import ServerArgs

    with pytest.raises(ValueError, match="--disable-radix-cache"):
        ServerArgs(hicache_size=1.0, disable_radix_cache=True)
    with pytest.raises(ValueError, match="--tp-size 1"):
        ServerArgs(hicache_dir="/tmp/kv", tp_size=2)
    with pytest.raises(ValueError, match="--hicache-size must be >= 0"):
        ServerArgs(hicache_size=-1.0)
    assert ServerArgs(hicache_size=0.5, hicache_dir="/tmp/kv").hicache_disk_size == 16.0
