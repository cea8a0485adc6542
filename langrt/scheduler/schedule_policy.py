"""Which waiting request to admit first (`--schedule-policy`).

- `lpm` (default): longest cached prefix first, so what is in the cache is used before eviction.
- `dfs-weight`: walk the radix tree depth-first, heaviest subtree first, so requests sharing a
  prefix run back to back and the shared part is computed once.
- `fcfs`: arrival order. `random`: a seeded shuffle.

Cache-aware orders need a prefix match per waiting request each step; past
`MAX_QUEUE_FOR_MATCHING` waiting requests that costs more than it saves, and the order falls
back to fcfs (matches are then computed only for the requests being admitted).
"""

from __future__ import annotations

import random
from collections import defaultdict

from langrt.request import Req
from langrt.mem.cache_manager import CacheManager
from langrt.mem.prefix_cache import PrefixMatch
from langrt.server_args import SCHEDULE_POLICIES

MAX_QUEUE_FOR_MATCHING = 128


class SchedulePolicy:
    def __init__(self, name: str, cache: CacheManager, seed: int = 0):
        if name not in SCHEDULE_POLICIES:
            raise ValueError(f"unknown schedule policy {name!r}; choose from {SCHEDULE_POLICIES}")
        self.name = name
        self.cache = cache
        self.rng = random.Random(seed)

    def order(self, waiting: list[Req]) -> tuple[list[Req], dict[int, PrefixMatch]]:
        """The waiting requests in admission order, and the prefix matches computed on the way
        (keyed by id(req))."""
        if self.name == "fcfs" or (self.name != "random" and len(waiting) > MAX_QUEUE_FOR_MATCHING):
            return list(waiting), {}
        if self.name == "random":
            shuffled = list(waiting)
            self.rng.shuffle(shuffled)
            return shuffled, {}
        matches = {id(r): self.cache.match(r.cache_ids[: r.max_prefix_len]) for r in waiting}
        if self.name == "lpm":
            # Stable sort: equal matches keep arrival order.
            return sorted(waiting, key=lambda r: -matches[id(r)].length), matches
        return _dfs_weight_order(waiting, matches), matches


def _dfs_weight_order(waiting: list[Req], matches: dict[int, PrefixMatch]) -> list[Req]:
    """Requests grouped by the tree node their match ends at, visited depth-first with the
    subtree holding the most waiting requests first."""
    at_node: dict[int, list[Req]] = defaultdict(list)
    weight: dict[int, int] = defaultdict(int)
    root = None
    for req in waiting:
        node = matches[id(req)].node
        if node is None:  # a cache that never matches: arrival order
            return list(waiting)
        at_node[id(node)].append(req)
        while node is not None:
            weight[id(node)] += 1
            root = node
            node = node.parent
    order: list[Req] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order += at_node.get(id(node), [])
        children = [c for c in node.children.values() if id(c) in weight]
        # Pushed lightest first so the heaviest is popped first.
        stack += sorted(children, key=lambda c: weight[id(c)])
    return order
