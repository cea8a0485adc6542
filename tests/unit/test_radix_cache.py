"""RadixCache against a naive model: random insert / match / lock / unlock / evict sequences."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langrt.mem.radix_cache import RadixCache

POOL = 64
keys = st.lists(st.integers(0, 3), min_size=1, max_size=7)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), keys, st.booleans()),
        st.tuples(st.just("match"), keys),
        st.tuples(st.just("lock"), keys),
        st.tuples(st.just("unlock"), st.integers(0, 10)),
        st.tuples(st.just("evict"), st.integers(0, 12)),
    ),
    max_size=60,
)


class Harness:
    """A pool of POOL slots, the cache, and the naive truth: for every prefix inserted, the slot
    its last token got when it last entered the tree, and which prefixes are locked."""

    def __init__(self):
        self.free = list(range(POOL))
        self.freed_log: list[int] = []
        self.cache = RadixCache(self._return_slots)
        self.slot_of: dict[tuple[int, ...], int] = {}
        self.locks: list[tuple[object, tuple[int, ...]]] = []

    def _return_slots(self, slots: torch.Tensor) -> None:
        values = slots.tolist()
        assert not set(values) & set(self.free), "double free"
        self.free += values
        self.freed_log += values

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def contents(self) -> dict[tuple[int, ...], int]:
        """Every prefix the tree holds now, with its last token's slot (walked naively)."""
        out = {}
        stack = [(self.cache.root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in node.children.values():
                path = prefix
                for token, slot in zip(child.key, child.value.tolist()):
                    path = path + (token,)
                    out[path] = slot
                stack.append((child, path))
        return out

    def longest_cached(self, key: list[int]) -> int:
        held = self.contents()
        n = 0
        while n < len(key) and tuple(key[: n + 1]) in held:
            n += 1
        return n

    def insert(self, key: list[int], reuse_match: bool) -> None:
        """A request computed `key`: either on top of its cached prefix, or (reuse_match False)
        from scratch, so part of its slots may duplicate what the tree holds."""
        matched = self.cache.match_prefix(key).slots.tolist() if reuse_match else []
        fresh = self.alloc(len(key) - len(matched))
        if fresh is None:
            return
        slots = torch.tensor(matched + fresh, dtype=torch.int64)
        already = self.cache.insert(key, slots)
        assert already >= len(matched)
        duplicates = fresh[: already - len(matched)]
        self.free += duplicates  # the caller frees what the tree did not take
        for i in range(already, len(key)):
            self.slot_of[tuple(key[: i + 1])] = slots[i].item()  # new to the tree

    def check(self) -> None:
        held = self.contents()
        for prefix, slot in held.items():
            assert self.slot_of[prefix] == slot, "a cached prefix changed its slot"
            assert prefix[:-1] in held or len(prefix) == 1, "cached prefixes are prefix-closed"
        tree_slots = list(held.values())
        assert len(set(tree_slots)) == len(tree_slots), "a slot is cached twice"
        assert sorted(tree_slots + self.free) == list(range(POOL)), "free + cached != pool"
        locked = {key[:n] for _, key in self.locks for n in range(1, len(key) + 1)}
        assert locked <= set(held), "a locked prefix was evicted"
        assert self.cache.protected_size == len(locked)
        assert self.cache.evictable_size == len(held) - len(locked)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_radix_cache_matches_naive_model(sequence):
    h = Harness()
    for op in sequence:
        kind = op[0]
        if kind == "insert":
            h.insert(op[1], op[2])
        elif kind == "match":
            expected = h.longest_cached(op[1])
            match = h.cache.match_prefix(op[1])
            assert match.length == expected
            assert match.slots.tolist() == [h.slot_of[tuple(op[1][: i + 1])] for i in range(expected)]
        elif kind == "lock":
            match = h.cache.match_prefix(op[1])
            if match.length:
                h.cache.lock(match.node)
                h.locks.append((match.node, tuple(op[1][: match.length])))
        elif kind == "unlock" and h.locks:
            node, _ = h.locks.pop(op[1] % len(h.locks))
            h.cache.unlock(node)
        elif kind == "evict":
            evictable = h.cache.evictable_size
            before = len(h.freed_log)
            freed = h.cache.evict(op[1])
            assert freed == len(h.freed_log) - before
            assert freed >= min(op[1], evictable), "evict frees what was asked when it can"
        h.check()


def test_eviction_is_least_recently_used():
    h = Harness()
    h.insert([1, 1, 1], True)
    h.insert([2, 2, 2], True)
    h.insert([3, 3, 3], True)
    h.cache.match_prefix([1, 1, 1])  # touch: now [2,2,2] is the oldest
    assert h.cache.evict(3) == 3
    assert h.longest_cached([2, 2, 2]) == 0
    assert h.longest_cached([1, 1, 1]) == 3 and h.longest_cached([3, 3, 3]) == 3


def test_split_keeps_locks_and_sizes():
    h = Harness()
    h.insert([1, 2, 3, 4], True)
    node = h.cache.match_prefix([1, 2, 3, 4]).node
    h.cache.lock(node)
    h.locks.append((node, (1, 2, 3, 4)))
    h.insert([1, 2, 9], True)  # splits the locked edge after [1, 2]
    h.check()
    assert h.cache.evict(10) == 1  # only the unlocked [9] can go
    h.cache.unlock(node)
    h.locks.clear()
    assert h.cache.evict(10) == 4
    h.check()
    assert h.cache.total_size == 0
