"""Prefill admission: which waiting requests join this step's prefill batch, and how much of each.

Limits, checked per request in policy order:
- rows: a free `req_to_token` row;
- tokens: at most `token_budget` new prompt tokens per step (chunked prefill); a request longer
  than what is left is admitted for a chunk and continues next step (one chunked request at a
  time);
- memory: its uncomputed tokens plus an estimate of its output (`max_new_tokens x ratio`) must fit
  in free + evictable slots, less what running requests are expected to need. Underestimates are
  corrected at decode time by retraction;
- window pool (models with sliding-window layers, mem/window_pool.py): a pass's new tokens each
  take a window slot, so a chunk is cut to the window pool's free + evictable slots.
- sharing: a request whose prompt shares more than `IN_BATCH_SHARE_TOKENS` uncached tokens with a
  request already in this batch waits one step, so the shared part is computed once and reused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from langrt.request import Req
from langrt.mem.cache_manager import CacheManager
from langrt.mem.prefix_cache import PrefixMatch

# Shared uncached tokens above which a request waits for its batch-mate to cache them.
IN_BATCH_SHARE_TOKENS = 32


@dataclass
class PrefillItem:
    """One request's share of a prefill batch: tokens [chunk_start, chunk_start + extend_len)."""

    req: Req
    chunk_start: int
    extend_len: int
    completes_prompt: bool  # the last chunk: the request samples after this pass


def reserved_tokens(req: Req, ratio: float) -> int:
    """Slots `req` is expected to still need for its output."""
    return math.ceil(max(0, req.remaining_new_tokens) * ratio)


class PrefillAdder:
    def __init__(self, cache: CacheManager, token_budget: float, reserved: int, ratio: float):
        self.cache = cache
        self.budget = token_budget
        self.reserved = reserved
        self.ratio = ratio
        self.items: list[PrefillItem] = []
        self.chunked: Req | None = None  # the request left mid-prompt by this batch

    @property
    def available(self) -> int:
        return self.cache.available - self.reserved

    @property
    def exhausted(self) -> bool:
        return self.budget <= 0 or self.chunked is not None or self.cache.free_rows == 0

    def add_continuing(self, req: Req) -> None:
        """The chunked request of the previous step: its room was counted at admission (and is
        part of `reserved`, which the caller computed without it)."""
        self._take(req, req.seq_len - req.kv_len)

    def try_add(self, req: Req, match: PrefixMatch | None) -> bool:
        """Admit `req` (or a first chunk of it). False when it must wait: no room, or sharing."""
        if self.exhausted:
            return False
        if match is None or not self.cache.is_current(match):  # an earlier admission evicted
            match = self.cache.match(req.cache_ids[: req.max_prefix_len])
        if self._should_wait_for_batch_mate(req, match.length) or self.cache.window_room <= 0:
            return False
        opened = self.cache.open(req, match)
        assert opened, "exhausted says whether a row is free"
        need = req.seq_len - req.kv_len + reserved_tokens(req, self.ratio)
        if need > self.available:
            self.cache.release(req)  # nothing computed: just unlocks the match
            req.kv_len = 0
            return False
        self.reserved += reserved_tokens(req, self.ratio)
        self._take(req, req.seq_len - req.kv_len)
        return True

    def _take(self, req: Req, uncomputed: int) -> None:
        """Give `req` slots for as much of its uncomputed part as the budget allows (and, under
        sliding-window layers, the window pool: each token of a pass takes a window slot)."""
        extend = int(min(uncomputed, self.budget, self.cache.window_room))
        if extend <= 0:  # a continuing prompt the window pool has no room for now: next pass
            self.chunked = req
            return
        reserved = self.cache.reserve(req, req.kv_len, extend)
        assert reserved, "admission counted free + evictable slots"
        self.items.append(PrefillItem(req, req.kv_len, extend, completes_prompt=extend == uncomputed))
        self.budget -= extend
        if extend < uncomputed:
            self.chunked = req
            self.reserved += uncomputed - extend  # later chunks

    def _should_wait_for_batch_mate(self, req: Req, matched: int) -> bool:
        if not self.cache.reuses_prefixes or not self.items:
            return False
        ids = req.cache_ids
        shared = max(_common_prefix(ids, item.req.cache_ids) for item in self.items)
        return shared - matched > IN_BATCH_SHARE_TOKENS


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
