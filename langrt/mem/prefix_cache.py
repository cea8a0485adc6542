"""What happens to a request's KV slots: shared through the radix tree, or private and freed.

The scheduler talks to a `PrefixCache` only; `RadixPrefixCache` shares every computed prefix,
`NoPrefixCache` (for --disable-radix-cache, the baseline of every benchmark) shares nothing and
runs the same code path.

A request's row in `req_to_token` has two regions:
    [0, cached_len)       slots owned by the tree, locked by the request (`req.cache_node`)
    [cached_len, kv_len)  slots private to the request (newly computed, not yet inserted)
Positions from kv_len on have no K/V yet.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch

from langrt.mem.hicache.tiers import KVTiers, NoTiers, scatter_kv
from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.mem.radix_cache import PrefixMatch, RadixCache, TreeNode


class PrefixCache(ABC):
    """Contract shared by both implementations.

    - `match(ids)`: the longest reusable prefix of `ids` (no locks taken).
    - `adopt(req, match)`: at admission, before any allocation: the request's row gets the
      match's slots, its path is locked, `req.kv_len = req.cached_len = match.length`.
    - `cache_unfinished(req)`: after a prefill (or a chunk of one): the computed tokens
      [0, kv_len) become shared; the row is rewritten to the tree's slots; the lock moves down.
    - `cache_finished(req)`: the request gives up its slots (finished, aborted or retracted):
      they go to the tree (or back to the pool), its lock is released. The row itself is the
      caller's to free.
    - `evict(n)`: free at least n slots from unlocked cached prefixes if possible.
    Nothing here allocates slots; every slot it receives is either kept or freed exactly once.
    """

    reuses_prefixes: bool  # False for a cache that never matches (the scheduler then skips
    # work that only pays off with reuse, such as holding back requests to share a prefix)

    @abstractmethod
    def match(self, ids: Sequence[int]) -> PrefixMatch: ...

    @abstractmethod
    def adopt(self, req, match: PrefixMatch) -> None: ...

    def restore(self, match: PrefixMatch) -> PrefixMatch:
        """`match` extended by what the tiers below the cache hold of `match.key` past it
        (mem/hicache), loaded into the pool; the result is current. Default: `match`."""
        return match

    @abstractmethod
    def cache_unfinished(self, req) -> None: ...

    @abstractmethod
    def cache_finished(self, req) -> None: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> int: ...

    @property
    @abstractmethod
    def stamp(self) -> int:
        """Changes whenever a match made before may no longer hold (`PrefixMatch.evictions`)."""

    @abstractmethod
    def invalidate_matches(self) -> None:
        """Matches made so far no longer hold (their window K/V may be gone)."""

    @abstractmethod
    def shared_len(self, req) -> int:
        """How many leading positions of `req`'s cached region other requests lock too."""

    @abstractmethod
    def flush(self) -> bool:
        """Drop every cached prefix; False (and nothing changes) while any is locked."""

    @property
    @abstractmethod
    def evictable_size(self) -> int: ...

    @property
    @abstractmethod
    def cached_size(self) -> int:
        """Slots the cache owns (locked or not)."""

    @property
    @abstractmethod
    def window_evictable_size(self) -> int:
        """Window slots (mem/window_pool.py) that evicting unlocked prefixes would free; with
        no window pool, `evictable_size`."""

    @property
    @abstractmethod
    def evicted_tokens(self) -> int: ...

    @property
    @abstractmethod
    def num_nodes(self) -> int: ...

    def snapshot(self, max_nodes: int, max_depth: int) -> dict:
        """A bounded picture of what is cached (mem/tree_snapshot.py); nothing for a cache that
        keeps nothing."""
        return {"nodes": [], "evictions": [], "evictable_tokens": 0, "locked_tokens": 0, "evicted_tokens": 0}


class RadixPrefixCache(PrefixCache):
    reuses_prefixes = True

    def __init__(self, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool, tiers: KVTiers | None = None):
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.tiers = tiers or NoTiers()
        self.tree = RadixCache(kv_pool.free, on_evict=self.tiers.on_evict)

    def match(self, ids: Sequence[int]) -> PrefixMatch:
        """Cut back, under sliding-window layers, to where the window K/V the next token reads
        is still kept: the part whose window K/V was dropped is computed again (its full-layer
        K/V alone cannot give the window layers' inputs, which depend on every layer below)."""
        match = self.tree.match_prefix(ids)
        usable = self.kv_pool.window_prefix_len(match.slots)
        return match if usable == match.length else self.tree.match_prefix(ids[:usable])

    def restore(self, match: PrefixMatch) -> PrefixMatch:
        """Loaded into fresh slots (evicting unlocked prefixes for room, never `match`'s own) and
        inserted into the tree as an unlocked path below `match.node`."""
        start = match.length
        self.tree.lock(match.node)
        blocks = self.tiers.lookup(match.key, start, self.kv_pool.available_size + self.tree.evictable_size)
        slots = self._load(blocks, start) if blocks else None
        self.tree.unlock(match.node)
        if slots is None:
            return match
        ids = match.key[: start + slots.numel()]
        already = self.tree.insert(ids, torch.cat([match.slots.to(slots.device), slots]))
        assert already == start, "nothing below the locked match can have changed"
        return self.tree.match_prefix(ids)

    def _load(self, blocks: list[torch.Tensor], start: int) -> torch.Tensor:
        """Fresh slots holding `blocks`' K/V from position `start` on (the first block begins at
        start rounded down to a block: the tree holds those positions already)."""
        skip = start % self.tiers.block_tokens
        n = len(blocks) * self.tiers.block_tokens - skip
        if self.kv_pool.available_size < n:
            self.tree.evict(n - self.kv_pool.available_size)
        slots = self.kv_pool.alloc(n)
        assert slots is not None, "lookup stays within free + evictable slots"
        scatter_kv(self.kv_pool, slots, torch.cat(blocks, dim=2)[:, :, skip:])
        return slots

    def adopt(self, req, match: PrefixMatch) -> None:
        self.req_pool.write(req.kv_row, 0, match.slots)
        self.tree.lock(match.node)
        if match.length:
            self.tree.record_hit(match.node)
        req.cache_node = match.node
        req.kv_len = req.cached_len = match.length

    def cache_unfinished(self, req) -> None:
        ids = req.cache_ids[: req.kv_len]
        self._insert(req, ids)
        match = self.tree.match_prefix(ids)
        assert match.length == req.kv_len, "what was just inserted must match"
        self.req_pool.write(req.kv_row, 0, match.slots)
        self.tree.lock(match.node)
        self._unlock(req)
        req.cache_node = match.node
        req.cached_len = req.kv_len

    def cache_finished(self, req) -> None:
        self._insert(req, req.cache_ids[: req.kv_len])
        self._unlock(req)
        req.cached_len = 0

    def _insert(self, req, ids: list[int]) -> None:
        slots = self.req_pool.slots(req.kv_row, req.kv_len)
        already = self.tree.insert(ids, slots)
        # Tokens another request cached meanwhile: the tree keeps its slots, ours are duplicates.
        # Where the tree's copy has dropped its window K/V and ours still has it (this request
        # reads it next), ours moves over before our slots are freed.
        duplicates = slots[req.cached_len : already]
        if duplicates.numel() and self.kv_pool.window is not None:
            self.kv_pool.keep_window(self.tree.match_prefix(ids[:already]).slots[req.cached_len :], duplicates)
        self.kv_pool.free(duplicates)

    def _unlock(self, req) -> None:
        if req.cache_node is not None:
            self.tree.unlock(req.cache_node)
            req.cache_node = None

    def evict(self, num_tokens: int) -> int:
        return self.tree.evict(num_tokens)

    @property
    def stamp(self) -> int:
        return self.tree.stamp

    def invalidate_matches(self) -> None:
        self.tree.invalidations += 1

    def shared_len(self, req) -> int:
        # locks only grow towards the root: up to the first node someone else locks too
        node, end = req.cache_node, req.cached_len
        while node is not None and node is not self.tree.root and node.lock_ref <= 1:
            end -= len(node.key)
            node = node.parent
        return end

    def flush(self) -> bool:
        if self.tree.protected_size:
            return False
        self.kv_pool.free(self.tree.all_slots())
        self.tree.reset()
        return True

    @property
    def evictable_size(self) -> int:
        return self.tree.evictable_size

    @property
    def cached_size(self) -> int:
        return self.tree.total_size

    @property
    def window_evictable_size(self) -> int:
        if self.kv_pool.window is None:
            return self.evictable_size
        slots = self.tree.unlocked_slots()
        return int((self.kv_pool.full_to_window.index_select(0, slots.to(self.kv_pool.device)) >= 0).sum())

    @property
    def evicted_tokens(self) -> int:
        return self.tree.evicted_tokens

    @property
    def num_nodes(self) -> int:
        return self.tree.num_nodes

    def snapshot(self, max_nodes: int, max_depth: int) -> dict:
        from langrt.mem.tree_snapshot import tree_snapshot

        return tree_snapshot(self.tree, max_nodes, max_depth)


class NoPrefixCache(PrefixCache):
    """Never matches, keeps nothing: a finished request's slots go straight back to the pool."""

    _EMPTY = PrefixMatch(torch.empty(0, dtype=torch.int64), None)
    reuses_prefixes = False

    def __init__(self, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool):
        self.req_pool = req_pool
        self.kv_pool = kv_pool

    def match(self, ids: Sequence[int]) -> PrefixMatch:
        return self._EMPTY

    def adopt(self, req, match: PrefixMatch) -> None:
        req.kv_len = req.cached_len = 0
        req.cache_node = None

    def cache_unfinished(self, req) -> None:
        pass  # the slots stay private to the request

    def cache_finished(self, req) -> None:
        self.kv_pool.free(self.req_pool.slots(req.kv_row, req.kv_len))

    def evict(self, num_tokens: int) -> int:
        return 0

    stamp = 0

    def invalidate_matches(self) -> None:
        pass

    def shared_len(self, req) -> int:
        return 0

    def flush(self) -> bool:
        return True

    evictable_size = cached_size = evicted_tokens = num_nodes = window_evictable_size = property(lambda self: 0)


def create_prefix_cache(
    enabled: bool, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool, tiers: KVTiers | None = None
) -> PrefixCache:
    """`tiers` (mem/hicache) keep what the radix cache evicts; the never-matching cache has none."""
    if not enabled:
        return NoPrefixCache(req_pool, kv_pool)
    return RadixPrefixCache(req_pool, kv_pool, tiers)


__all__ = ["PrefixCache", "PrefixMatch", "RadixPrefixCache", "NoPrefixCache", "TreeNode", "create_prefix_cache"]
