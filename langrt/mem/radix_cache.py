"""RadixAttention's prefix cache: a radix tree of token-id runs whose values are KV slot ids.

Every prefix the runtime has computed stays in the tree until memory is needed. Each edge holds
a run of token ids and the pool slots holding their K/V, so the path from the root to a node
spells a token sequence and lists the slots of its whole prefix.

Ownership: a slot is free (on the pool's free list), owned by the tree, or private to one running
request. `insert` hands slots to the tree; `evict` hands unlocked leaves' slots back to the pool.

Locks: a running request locks the path it reads (`lock(node)` adds one reference to the node
and every ancestor); a node with references is never evicted. `evictable_size` counts the
tokens of unreferenced nodes, `protected_size` the referenced ones; they sum to `total_size`.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import torch


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access", "id", "hits", "last_hit")
    _ids = itertools.count()

    def __init__(self, parent: "TreeNode | None", key: tuple[int, ...], value: torch.Tensor):
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.key = key  # token ids of the edge from parent to this node
        self.value = value  # [len(key)] int64 slot ids
        self.lock_ref = 0
        self.last_access = time.monotonic()
        self.id = next(TreeNode._ids)
        self.hits = 0  # admissions that reused this node's tokens (for the dashboard)
        self.last_hit: float | None = None

    def __lt__(self, other: "TreeNode") -> bool:  # heap order: least recently used first
        return (self.last_access, self.id) < (other.last_access, other.id)

    @property
    def is_leaf(self) -> bool:
        return not self.children


@dataclass(frozen=True)
class Eviction:
    """One evicted leaf, kept for the dashboard (`RadixCache.recent_evictions`)."""

    at: float  # time.monotonic()
    node_id: int
    parent_id: int | None  # None: its parent was the root
    tokens: int
    head: tuple[int, ...]  # its first token ids


EVICTION_LOG = 64  # evictions remembered for the dashboard


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached prefix of a key: its slot ids, and the node where it ends."""

    slots: torch.Tensor  # [length] int64
    node: TreeNode | None  # None only from a cache that never matches
    # the cache's `stamp` when matched: an eviction since may have freed these slots (or a
    # window drop their window K/V)
    evictions: int = 0
    key: Sequence[int] = ()  # what was matched (a longer prefix of it may be in the tiers)

    @property
    def length(self) -> int:
        return int(self.slots.numel())


class RadixCache:
    def __init__(
        self,
        free_slots: Callable[[torch.Tensor], None],
        device: torch.device | str = "cpu",
        on_evict: Callable[[TreeNode], None] | None = None,
    ):
        """`free_slots` returns evicted slots to the KV pool; `on_evict(leaf)` is called just
        before, with the leaf still attached, so its whole prefix's K/V can be copied out
        (mem/hicache)."""
        self.free_slots = free_slots
        self.on_evict = on_evict or _keep_nothing
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Forget everything (without freeing slots: the caller owns that decision)."""
        self.root = TreeNode(None, (), torch.empty(0, dtype=torch.int64))
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_size = 0
        self.protected_size = 0
        self.evicted_tokens = 0
        self.invalidations = 0  # window K/V dropped from cached tokens (CacheManager)
        self.recent_evictions: deque[Eviction] = deque(maxlen=EVICTION_LOG)

    @property
    def stamp(self) -> int:
        """Changes whenever a match made before may no longer hold."""
        return self.evicted_tokens + self.invalidations

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    # ---- lookup and insertion -------------------------------------------------------------

    def match_prefix(self, key: Sequence[int]) -> PrefixMatch:
        """Longest cached prefix of `key`. A match ending inside an edge splits that node, so
        the returned node spells exactly the matched prefix. Touches the path (LRU)."""
        node, values, pos = self.root, [], 0
        now = time.monotonic()
        while pos < len(key) and key[pos] in node.children:
            child = node.children[key[pos]]
            n = _common_length(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            values.append(child.value)
            child.last_access = now
            node, pos = child, pos + n
        slots = torch.cat(values) if values else torch.empty(0, dtype=torch.int64)
        return PrefixMatch(slots, node, self.stamp, key)

    def insert(self, key: Sequence[int], slots: torch.Tensor) -> int:
        """Cache `key` with its slot ids. Returns how many leading tokens were already cached:
        for those the tree keeps its own slots, so the caller's `slots[:returned]` that differ
        from the tree's are duplicates the caller must free. The rest now belong to the tree."""
        assert len(key) == slots.numel(), "one slot per token"
        node, pos = self.root, 0
        now = time.monotonic()
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                leaf = TreeNode(node, tuple(key[pos:]), slots[pos:].clone())
                node.children[key[pos]] = leaf
                self.evictable_size += len(leaf.key)
                return pos
            n = _common_length(child.key, key, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, pos = child, pos + n
        return pos

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child`'s edge after n tokens; returns the new upper node (which keeps the locks)."""
        upper = TreeNode(child.parent, child.key[:n], child.value[:n])
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        upper.hits, upper.last_hit = child.hits, child.last_hit
        child.parent.children[child.key[0]] = upper
        child.key, child.value = child.key[n:], child.value[n:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper

    def record_hit(self, node: TreeNode) -> None:
        """A request reuses the path to `node`: count a hit on each node of it."""
        now = time.monotonic()
        while node is not self.root:
            node.hits += 1
            node.last_hit = now
            node = node.parent

    # ---- locks -------------------------------------------------------------------------------

    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "unlock without lock"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node = node.parent

    # ---- eviction ----------------------------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots if unlocked leaves hold that many, least recently
        used first; returns how many were freed."""
        heap = [n for n in self._nodes() if n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            self.on_evict(leaf)
            self.free_slots(leaf.value)
            self._log_eviction(leaf)
            freed += len(leaf.key)
            self.evictable_size -= len(leaf.key)
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        self.evicted_tokens += freed
        return freed

    def _log_eviction(self, leaf: TreeNode) -> None:
        parent_id = None if leaf.parent is self.root else leaf.parent.id
        self.recent_evictions.append(Eviction(time.monotonic(), leaf.id, parent_id, len(leaf.key), leaf.key[:8]))

    def _nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                yield node
            stack.extend(node.children.values())

    def all_slots(self) -> torch.Tensor:
        """Every slot the tree owns (for accounting checks and for flushing)."""
        values = [n.value for n in self._nodes()]
        return torch.cat(values) if values else torch.empty(0, dtype=torch.int64)

    def unlocked_slots(self) -> torch.Tensor:
        """The slots of unlocked nodes (what eviction could free)."""
        values = [n.value for n in self._nodes() if n.lock_ref == 0]
        return torch.cat(values) if values else torch.empty(0, dtype=torch.int64)

    @property
    def num_nodes(self) -> int:
        return sum(1 for _ in self._nodes())


def _keep_nothing(leaf: TreeNode) -> None:
    pass


def _common_length(edge: tuple[int, ...], key: Sequence[int], pos: int) -> int:
    n = min(len(edge), len(key) - pos)
    i = 0
    while i < n and edge[i] == key[pos + i]:
        i += 1
    return i
