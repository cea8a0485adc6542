"""The KV slots of running requests: one owner for both pools and the prefix cache.

The scheduler asks a `CacheManager` for room and gives slots back through it; it never touches
a pool. A request holds a row of `req_to_token` (`req.kv_row`) while it runs, in three regions:

    [0, cached_len)       slots owned by the prefix cache, locked by the request
    [cached_len, end)     slots private to the request: computed tokens (up to kv_len) and
                          slots reserved for the tokens the next pass computes
    [end, ...)            nothing yet

Contract (tests/unit/test_cache_manager.py checks it against a plain list of slots):
- Every slot is in exactly one place: the free list, the prefix cache, or one request's private
  region. `reserve` takes slots from the free list (evicting unlocked cached prefixes first when
  it must), `trim` and `release` give them back (to the cache or the free list); nothing else
  moves a slot.
- `open(req, match)` gives `req` a row whose cached region is `match` (locked until `release`);
  `share(req)` moves its computed tokens [0, kv_len) into the cache and keeps them locked.
- `release(req)` ends the request's hold (finished, aborted or retracted), with nothing
  reserved past kv_len: its computed tokens stay cached (a retracted request re-matches them;
  with --disable-radix-cache they are freed), its row is freed.
- A failed `reserve` or `open` changes nothing.
- A match holds until the next eviction (`is_current`): an eviction may free its slots and give
  them to another request, so `open` refuses a match made before one.

Sliding-window layers (a `HybridKVPool`, mem/window_pool.py): every reserved slot also takes a
window slot. A token's window K/V is kept while the window pool has room, so any cached prefix
can be continued (a prefix can only be continued where its last `window` tokens keep their
window K/V: PrefixCache.match). Once the window pool is less than half free, after each pass
(`trim`, `share`, `release`) a request gives back the window slots of all but its last `window`
positions (the next token reads only the last window - 1; one more is kept so that a prefix
ending one token short, as a repeated prompt matches, can continue): of its private tokens, and
of the tokens it cached itself (earlier prompt chunks) that no other request locks, short of the
last `window` of its cached prefix, which stay with the prefix cache. So under pressure a request
holds at most 2 x window window slots of its own between passes. `make_room` has every running
request give them back first when the window pool is short, then evicts until both pools have
the room. With `eager_window_drop` they are given back after every pass, whatever the room.
"""

from __future__ import annotations

from typing import Sequence

import torch

from langrt.mem.hicache.tiers import KVTiers, NoTiers
from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.mem.prefix_cache import PrefixMatch, create_prefix_cache


class CacheManager:
    def __init__(
        self,
        req_pool: ReqToTokenPool,
        kv_pool: TokenToKVPool,
        radix: bool,
        eager_window_drop: bool = False,
        tiers: KVTiers | None = None,
    ):
        self._rows = req_pool
        self._kv = kv_pool
        self._tiers = tiers or NoTiers()  # where evicted prefixes go (mem/hicache)
        self._prefixes = create_prefix_cache(radix, req_pool, kv_pool, self._tiers)
        # per row: positions below these are done with (window K/V dropped, or not ours to
        # drop): [in the prefix cache, private]
        self._window_floor: dict[int, list[int]] = {}
        self._running: dict[int, object] = {}  # row -> the request holding it
        # free window slots below which passes drop out-of-window K/V (see the module doc)
        self._window_low = 0 if kv_pool.window is None else kv_pool.window_pool.size // 2
        if eager_window_drop and kv_pool.window is not None:
            self._window_low = kv_pool.window_pool.size + 1

    @classmethod
    def for_runner(
        cls, runner, radix: bool, eager_window_drop: bool = False, tiers: KVTiers | None = None
    ) -> "CacheManager":
        """Over the pools a ModelRunner allocated (its attention reads them)."""
        return cls(runner.req_pool, runner.kv_pool, radix, eager_window_drop, tiers)

    # ---- what there is ---------------------------------------------------------------

    @property
    def size(self) -> int:
        """KV slots in all."""
        return self._kv.size

    @property
    def free_slots(self) -> int:
        return self._kv.available_size

    @property
    def available(self) -> int:
        """Slots a request could get now: free ones and those eviction would free."""
        return self._kv.available_size + self._prefixes.evictable_size

    @property
    def window_room(self) -> int:
        """Tokens one pass could add as far as the window pool goes: its free slots and those
        eviction would free (without a window pool: `available`)."""
        return self._kv.window_available + self._prefixes.window_evictable_size

    @property
    def free_rows(self) -> int:
        return self._rows.available_size

    @property
    def reuses_prefixes(self) -> bool:
        return self._prefixes.reuses_prefixes

    @property
    def prefault(self):
        """The KV buffer's page prefaulter for idle moments (None where not needed)."""
        return self._kv.prefault

    def match(self, ids: Sequence[int]) -> PrefixMatch:
        """The longest cached prefix of `ids` (nothing locked)."""
        return self._prefixes.match(ids)

    def is_current(self, match: PrefixMatch) -> bool:
        """Whether `match` still holds: no cached prefix was evicted since it was made."""
        return match.evictions == self._prefixes.stamp

    def slots(self, req, start: int, end: int) -> torch.Tensor:
        """The slots of positions [start, end) of `req` (int64)."""
        return self._rows.slots(req.kv_row, end, start)

    # ---- moving slots ----------------------------------------------------------------

    def open(self, req, match: PrefixMatch) -> bool:
        """A row for `req`, its cached region `match` (locked) extended by what the tiers below
        the prefix cache hold of `match.key` (loaded back into the pool, which may evict); False
        (nothing changes) when no row is free."""
        assert self.is_current(match), "a prefix match made before an eviction"
        row = self._rows.alloc()
        if row is None:
            return False
        match = self._prefixes.restore(match)
        req.kv_row = row
        self._window_floor[row] = [match.length, 0]  # what it matched is others' prefix: kept
        self._running[row] = req
        self._prefixes.adopt(req, match)
        return True

    def make_room(self, n: int) -> bool:
        """Evict unlocked cached prefixes until `n` slots (and, with a window pool, `n` window
        slots) are free; whether they are."""
        if self._kv.available_size < n:
            self._prefixes.evict(n - self._kv.available_size)
        if self._kv.window is not None and self._kv.window_available < n:
            self._slide_all()
        # An evicted token frees at most one window slot: asking for the shortfall never
        # evicts more than one leaf too many.
        while self._kv.window_available < n and self._prefixes.evict(n - self._kv.window_available):
            pass
        return self._kv.available_size >= n and self._kv.window_available >= n

    def reserve(self, req, start: int, n: int) -> bool:
        """Slots for positions [start, start + n) of `req`, evicting if needed; False (and
        nothing changes) when there are not that many."""
        if not self.make_room(n):
            return False
        self._rows.write(req.kv_row, start, self._kv.alloc(n))
        return True

    def trim(self, req, end: int) -> None:
        """Give back the slots of positions [req.kv_len, end): reserved but not kept (drafts
        after the first rejected one)."""
        if end > req.kv_len:
            self._kv.free(self._rows.slots(req.kv_row, end, req.kv_len))
        self._slide(req)

    def share(self, req) -> None:
        """`req`'s computed tokens [0, kv_len) become cached prefixes (still locked by it)."""
        self._slide(req)
        self._prefixes.cache_unfinished(req)

    def release(self, req) -> None:
        """`req` holds nothing any more: computed tokens to the cache, the rest freed, row too."""
        self._slide(req)
        self._prefixes.cache_finished(req)
        self._rows.free(req.kv_row)
        del self._window_floor[req.kv_row], self._running[req.kv_row]
        req.kv_row = None

    def _slide_all(self) -> None:
        """Every running request gives back the window K/V it will not read again. Matches made
        before may have lost theirs: they are no longer current."""
        for req in self._running.values():
            self._slide(req, force=True)
        self._prefixes.invalidate_matches()

    def _slide(self, req, force: bool = False) -> None:
        """Drop the window K/V of all but the last `window` positions of `req`'s cached prefix and
        of its private tokens, where no one else may read it, once the window pool runs low (or
        when `force`d): see the module doc."""
        window = self._kv.window
        if window is None or (not force and self._kv.window_available >= self._window_low):
            return
        floor = self._window_floor[req.kv_row]
        cached_cut = req.cached_len - window  # the cached prefix keeps its last window
        if cached_cut > floor[0]:
            self._drop(req, max(floor[0], self._prefixes.shared_len(req)), cached_cut)
            floor[0] = cached_cut
        start = max(floor[1], req.cached_len)
        if self._drop(req, start, req.kv_len - window):
            floor[1] = req.kv_len - window

    def _drop(self, req, start: int, end: int) -> bool:
        if end <= start:
            return False
        self._kv.drop_window(self._rows.slots(req.kv_row, end, start))
        return True

    def flush(self) -> bool:
        """Drop every cached prefix; False (nothing changes) while any is locked."""
        return self._prefixes.flush()

    def snapshot(self, max_nodes: int, max_depth: int) -> dict:
        """The prefix cache's bounded picture (mem/tree_snapshot.py)."""
        return self._prefixes.snapshot(max_nodes, max_depth)

    def stats(self) -> dict:
        return {
            "kv_total_tokens": self._kv.size,
            "kv_free_tokens": self._kv.available_size,
            "kv_available_tokens": self.available,
            "kv_cached_tokens": self._prefixes.cached_size,
            "cache_nodes": self._prefixes.num_nodes,
            "evicted_tokens": self._prefixes.evicted_tokens,
            **self._window_stats(),
            **self._tiers.stats(),
        }

    def _window_stats(self) -> dict:
        if self._kv.window is None:
            return {}
        return {"kv_window_total_tokens": self._kv.window_pool.size, "kv_window_free_tokens": self._kv.window_available}
