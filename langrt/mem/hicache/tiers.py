"""The tiers below the radix tree: where evicted K/V goes, and where a request's prefix that the
tree no longer holds is found again.

`KVTiers` is what the prefix cache talks to. Contract:
- `on_evict(leaf)`: called by the tree just before it frees an unlocked leaf's slots; the path
  root..leaf is still intact, so every slot of the prefix still holds its K/V. The tiers copy
  out what they keep; they never change the tree or the pool.
- `lookup(ids, start, room)`: the K/V of positions [b0 * B, end) of `ids`, as staged copies
  (one [2, layers, B, kv_heads, head_dim] tensor per block, on the pool's device, owned by the
  caller), for the longest run of consecutive whole blocks from b0 = start // B that the tiers
  hold, with end - start <= room. Nothing is locked or allocated: the caller moves the part
  from `start` into slots it allocates.
`NoTiers` (the default) keeps nothing; `HiCache` keeps whole blocks of `block_tokens` aligned
positions (keys.py) in a host tier and/or a disk tier (write-through: a block saved to the host
tier is written to disk at once, so what a server evicted survives it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch

from langrt.mem.hicache.block_file import BlockName
from langrt.mem.hicache.disk_tier import DiskTier
from langrt.mem.hicache.host_tier import HostTier
from langrt.mem.hicache.keys import chain_keys

# Token ids at or above this are in a LoRA adapter's key space (lora/adapter.py), which is
# numbered afresh by each server process: such K/V is never written to disk.
ADAPTER_KEY_SPACE = 1 << 32


class KVTiers(ABC):
    block_tokens: int = 1

    @abstractmethod
    def on_evict(self, leaf) -> None: ...

    @abstractmethod
    def lookup(self, ids: Sequence[int], start: int, room: int) -> list[torch.Tensor]: ...

    def stats(self) -> dict:
        return {}


class NoTiers(KVTiers):
    """Evicted K/V is gone; nothing is ever found."""

    def on_evict(self, leaf) -> None:
        pass

    def lookup(self, ids: Sequence[int], start: int, room: int) -> list[torch.Tensor]:
        return []


@dataclass
class TierCounters:
    saved_blocks: int = 0  # blocks copied out of the pool at eviction
    host_hit_tokens: int = 0  # tokens loaded back from the host tier
    disk_hit_tokens: int = 0  # ... from the disk tier
    lookups: int = 0  # lookups past a radix match that had at least one whole block to ask for
    missed_lookups: int = 0  # of those, ones that found nothing


class HiCache(KVTiers):
    def __init__(self, kv_pool, namespace: bytes, block_tokens: int, host: HostTier | None, disk: DiskTier | None):
        assert host is not None or disk is not None, "HiCache needs a host tier, a disk tier or both"
        self.pool = kv_pool
        self.namespace = namespace
        self.block_tokens = block_tokens
        self.host = host
        self.disk = disk
        self.counters = TierCounters()

    @property
    def block_shape(self) -> tuple[int, ...]:
        return block_shape(self.pool, self.block_tokens)

    # ---- eviction: pool -> tiers -------------------------------------------------------

    def on_evict(self, leaf) -> None:
        """Save every whole block that ends inside the leaf (its earlier positions may belong
        to ancestors, still in the pool); a partial last block is not kept."""
        ids, slots = _path(leaf)
        B, end = self.block_tokens, len(ids)
        first, last = (end - len(leaf.key)) // B, end // B
        if first >= last:
            return
        keys = chain_keys(self.namespace, ids, last, B)
        for b in range(first, last):
            self._save(self._name(keys, ids, b), keys[b], slots[b * B : (b + 1) * B])

    def _save(self, name: BlockName, key: bytes, slots: torch.Tensor) -> None:
        to_host = self.host is not None and key not in self.host
        to_disk = self.disk is not None and key not in self.disk and max(name.tokens) < ADAPTER_KEY_SPACE
        if not (to_host or to_disk):
            return
        data = gather_kv(self.pool, slots)
        if to_host:
            self.host.put(key, data)
            data = self.host.get(key)  # the host copy: what the disk write reads on a GPU
        if to_disk:
            self.disk.put(name, data)
        self.counters.saved_blocks += 1

    # ---- lookup: tiers -> caller ---------------------------------------------------------

    def lookup(self, ids: Sequence[int], start: int, room: int) -> list[torch.Tensor]:
        B = self.block_tokens
        first, last = start // B, min(len(ids), start + room) // B
        if last <= first or self._empty:
            return []
        keys = chain_keys(self.namespace, ids, last, B)
        found = []
        for b in range(first, last):
            data = self._fetch(self._name(keys, ids, b), keys[b])
            if data is None:
                break
            found.append(data)
        self.counters.lookups += 1
        self.counters.missed_lookups += not found
        return found

    @property
    def _empty(self) -> bool:
        return not (self.host is not None and len(self.host)) and not (self.disk is not None and len(self.disk))

    def _fetch(self, name: BlockName, key: bytes) -> torch.Tensor | None:
        """A staged copy of one block on the pool's device (host first, then disk)."""
        data = self.host.get(key) if self.host is not None else None
        if data is not None:
            self.counters.host_hit_tokens += self.block_tokens
            return data.to(self.pool.device, copy=True)
        data = self.disk.get(name) if self.disk is not None else None
        if data is None:
            return None
        self.counters.disk_hit_tokens += self.block_tokens
        if self.host is not None:
            self.host.put(key, data)  # the next return of this prefix reads memory, not disk
        return data.to(self.pool.device)

    def _name(self, keys: list[bytes], ids: Sequence[int], b: int) -> BlockName:
        B = self.block_tokens
        parent = keys[b - 1] if b else self.namespace
        return BlockName(self.namespace, parent, tuple(ids[b * B : (b + 1) * B]), self.pool.dtype, self.block_shape)

    def stats(self) -> dict:
        c = self.counters
        out = {
            "hicache_saved_blocks": c.saved_blocks,
            "hicache_host_hit_tokens": c.host_hit_tokens,
            "hicache_disk_hit_tokens": c.disk_hit_tokens,
            "hicache_lookups": c.lookups,
            "hicache_missed_lookups": c.missed_lookups,
        }
        if self.host is not None:
            out["hicache_host_blocks"] = len(self.host)
        if self.disk is not None:
            out.update(
                hicache_disk_blocks=len(self.disk),
                hicache_disk_bytes=self.disk.used,
                hicache_disk_rejected_files=self.disk.rejected,
            )
        return out


def block_shape(kv_pool, block_tokens: int) -> tuple[int, ...]:
    """[2 (K, V), layers, block_tokens, kv_heads, head_dim]."""
    return (2, len(kv_pool.k_buffers), block_tokens, *kv_pool.k_buffers[0].shape[1:])


def gather_kv(kv_pool, slots: torch.Tensor) -> torch.Tensor:
    """Every layer's K and V of `slots`: [2, layers, len(slots), kv_heads, head_dim] (a copy)."""
    index = slots.to(kv_pool.device)
    keys = torch.stack([k.index_select(0, index) for k in kv_pool.k_buffers])
    values = torch.stack([v.index_select(0, index) for v in kv_pool.v_buffers])
    return torch.stack([keys, values])


def scatter_kv(kv_pool, slots: torch.Tensor, data: torch.Tensor) -> None:
    """Write `data` ([2, layers, len(slots), ...], as gather_kv returns) into `slots`."""
    index = slots.to(kv_pool.device)
    for layer, (k, v) in enumerate(zip(kv_pool.k_buffers, kv_pool.v_buffers)):
        k.index_copy_(0, index, data[0, layer])
        v.index_copy_(0, index, data[1, layer])


def _path(leaf) -> tuple[list[int], torch.Tensor]:
    """The token ids and slots of the whole prefix root..leaf."""
    keys, values, node = [], [], leaf
    while node.parent is not None:
        keys.append(node.key)
        values.append(node.value)
        node = node.parent
    ids = [t for key in reversed(keys) for t in key]
    return ids, torch.cat(values[::-1])
