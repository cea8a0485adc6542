"""CacheManager with HiCache tiers under test_cache_manager's state machine: random admissions,
decodes, drafts, shares, releases, evictions and flushes, where admissions also load evicted
prefixes back from a small host tier and a disk tier.

A slot's tag (the prefix whose last K/V it holds) lives in the K/V pool itself here, so a block
loaded back carries its tags: every slot still sits in exactly one place, every row and every
match reads back its own prefix, whether its K/V was computed or loaded.
"""

from __future__ import annotations

import tempfile

import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from langrt.mem.cache_manager import CacheManager
from langrt.mem.hicache.disk_tier import DiskTier
from langrt.mem.hicache.host_tier import HostTier
from langrt.mem.hicache.tiers import HiCache
from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from test_cache_manager import CONTEXT, ROWS, SLOTS, CacheManagerMachine

BLOCK = 2


class PoolTags:
    """tags[slot] stored as a number in the slot's K (layer 0), named in a registry."""

    def __init__(self, kv: TokenToKVPool):
        self.kv = kv
        self.names: list[tuple | None] = [None]  # 0: a slot never computed
        self.ids: dict[tuple, int] = {}

    def __getitem__(self, slot: int):
        return self.names[int(self.kv.k_buffers[0][slot, 0, 0])]

    def __setitem__(self, slot: int, tag: tuple) -> None:
        if tag not in self.ids:
            self.ids[tag] = len(self.names)
            self.names.append(tag)
        value = torch.full((1, 1, 2), float(self.ids[tag]))
        self.kv.write(0, torch.tensor([slot]), value, -value)


class TieredMachine(CacheManagerMachine):
    host_blocks = 3
    disk = True

    def __init__(self):
        super().__init__()
        kv = TokenToKVPool(SLOTS, 1, 1, 2, torch.float32, "cpu")
        self._dir = tempfile.TemporaryDirectory()
        host = HostTier(self.host_blocks, (2, 1, BLOCK, 1, 2), torch.float32, pin=False) if self.host_blocks else None
        disk = DiskTier(self._dir.name, 1 << 20) if self.disk else None
        tiers = HiCache(kv, b"t" * 16, BLOCK, host, disk)
        self.cm = CacheManager(ReqToTokenPool(ROWS, CONTEXT, "cpu"), kv, radix=True, tiers=tiers)
        self.tags = PoolTags(kv)

    def teardown(self):
        c = self.cm._tiers.counters
        LOADED[type(self)] = LOADED.get(type(self), 0) + c.host_hit_tokens + c.disk_hit_tokens
        super().teardown()
        self._dir.cleanup()


class HostOnlyMachine(TieredMachine):
    host_blocks, disk = 64, False  # holds every block: any prefix found is served from memory


class DiskOnlyMachine(TieredMachine):
    host_blocks, disk = 0, True


LOADED: dict[type, int] = {}  # per machine, over all its runs: the tiers did serve admissions
RUNS = settings(max_examples=100, stateful_step_count=40, deadline=None, derandomize=True)


@pytest.mark.parametrize(
    "machine", [TieredMachine, HostOnlyMachine, DiskOnlyMachine], ids=["host+disk", "host", "disk"]
)
def test_tiered_cache_manager_keeps_every_slot_in_one_place(machine):
    run_state_machine_as_test(machine, settings=RUNS)
    assert LOADED.get(machine, 0) > 0, "no admission loaded a block from the tiers"
