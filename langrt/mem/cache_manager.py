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
"""

from __future__ import annotations

from typing import Sequence

import torch

from langrt.mem.pools import ReqToTokenPool, TokenToKVPool
from langrt.mem.prefix_cache import PrefixMatch, create_prefix_cache


class CacheManager:
    def __init__(self, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool, radix: bool):
        self._rows = req_pool
        self._kv = kv_pool
        self._prefixes = create_prefix_cache(radix, req_pool, kv_pool)

    @classmethod
    def for_runner(cls, runner, radix: bool) -> "CacheManager":
        """Over the pools a ModelRunner allocated (its attention reads them)."""
        return cls(runner.req_pool, runner.kv_pool, radix)

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
        return match.evictions == self._prefixes.evicted_tokens

    def slots(self, req, start: int, end: int) -> torch.Tensor:
        """The slots of positions [start, end) of `req` (int64)."""
        return self._rows.slots(req.kv_row, end, start)

    # ---- moving slots ----------------------------------------------------------------

    def open(self, req, match: PrefixMatch) -> bool:
        """A row for `req`, its cached region `match` (locked); False when no row is free."""
        assert self.is_current(match), "a prefix match made before an eviction"
        row = self._rows.alloc()
        if row is None:
            return False
        req.kv_row = row
        self._prefixes.adopt(req, match)
        return True

    def make_room(self, n: int) -> bool:
        """Evict unlocked cached prefixes until `n` slots are free; whether they are."""
        if self._kv.available_size < n:
            self._prefixes.evict(n - self._kv.available_size)
        return self._kv.available_size >= n

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

    def share(self, req) -> None:
        """`req`'s computed tokens [0, kv_len) become cached prefixes (still locked by it)."""
        self._prefixes.cache_unfinished(req)

    def release(self, req) -> None:
        """`req` holds nothing any more: computed tokens to the cache, the rest freed, row too."""
        self._prefixes.cache_finished(req)
        self._rows.free(req.kv_row)
        req.kv_row = None

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
        }
