"""The sliding-window layers' own KV pool (mem/window_pool.py) under CacheManager.

A state machine like test_cache_manager's (random admissions, decodes with drafts, shares,
releases, evictions), over a HybridKVPool with a window of 3: each window slot carries the tag
of the token whose window K/V it would hold. After every step: each window slot is free or named
by exactly one full slot; each running request can read the window K/V of its last window
positions (and they are its own tokens'); every cached prefix the cache offers ends with its
window K/V. Dropping window K/V after every pass (eager): a request's private tokens hold at most
`window` window slots between passes. Dropping it only once the window pool is half used (the
default): `window_room` is a floor on what `make_room` finds.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule, run_state_machine_as_test

from langrt.mem.cache_manager import CacheManager
from langrt.mem.pools import ReqToTokenPool
from langrt.mem.window_pool import HybridKVPool, KVSplit
from test_cache_manager import CONTEXT, ROWS, SLOTS, CacheManagerMachine, FakeReq

WINDOW, WINDOW_SLOTS = 3, 11


class WindowReq(FakeReq):
    @property
    def cache_ids(self) -> list[int]:
        """What its cached prefixes are keyed by: its ids (no adapter in front)."""
        return self.all_ids


def hybrid_pool(size: int = SLOTS, window_size: int = WINDOW_SLOTS) -> HybridKVPool:
    # layer 0 slides over WINDOW tokens, layer 1 is full
    return HybridKVPool(size, window_size, (WINDOW, None), 1, 2, torch.float32, "cpu")


class HybridMachine(CacheManagerMachine):
    Req = WindowReq
    eager = True

    def __init__(self):
        super().__init__()
        self.cm = CacheManager(ReqToTokenPool(ROWS, CONTEXT, "cpu"), hybrid_pool(), radix=self.radix,
                               eager_window_drop=self.eager)  # fmt: skip
        self.window_tags: list[tuple | None] = [None] * WINDOW_SLOTS

    @property
    def pool(self) -> HybridKVPool:
        return self.cm._kv

    def _compute(self, req: WindowReq, end: int) -> None:
        for pos, slot in zip(range(req.kv_len, end), self.cm.slots(req, req.kv_len, end).tolist()):
            window_slot = int(self.pool.full_to_window[slot])
            assert window_slot >= 0, "a reserved slot comes with a window slot"
            self.window_tags[window_slot] = tuple(req.all_ids[: pos + 1])
        super()._compute(req, end)

    def _room(self) -> int:
        return min(self.cm.available, self.cm.window_room)

    @rule(n=st.integers(0, SLOTS + 2))
    def make_room(self, n):
        before, window_before = self.cm.available, self.cm.window_room
        made = self.cm.make_room(n)
        if self.eager:
            assert made == (n <= before and n <= window_before)
        else:  # running requests' out-of-window K/V is given back too
            assert made >= (n <= before and n <= window_before)
            assert made == (self.pool.available_size >= n and self.pool.window_available >= n)
        assert self.cm.available == before

    @invariant()
    def every_slot_in_one_place(self):
        free = self.pool.full._free.tolist()
        cached = self.cm._prefixes.tree.all_slots().tolist() if self.radix else []
        private = [s for r in self.running for s in self.cm.slots(r, r.cached_len, r.kv_len).tolist()]
        assert sorted(free + cached + private) == list(range(SLOTS))

    @invariant()
    def every_window_slot_in_one_place(self):
        mapping = self.pool.full_to_window.tolist()
        named = [w for w in mapping if w >= 0]
        assert sorted(named + self.pool.window_pool._free.tolist()) == list(range(WINDOW_SLOTS))
        assert all(mapping[s] == -1 for s in self.pool.full._free.tolist()), "a free slot keeps no window K/V"

    @invariant()
    def running_requests_read_their_window(self):
        for req in self.running:
            low = max(0, req.kv_len - WINDOW + 1)
            for pos, slot in zip(range(low, req.kv_len), self.cm.slots(req, low, req.kv_len).tolist()):
                window_slot = int(self.pool.full_to_window[slot])
                assert window_slot >= 0 and self.window_tags[window_slot] == tuple(req.all_ids[: pos + 1]), pos

    @invariant()
    def private_window_is_bounded(self):
        if not self.eager:
            return
        for req in self.running:
            private = self.cm.slots(req, req.cached_len, req.kv_len)
            assert int((self.pool.full_to_window[private] >= 0).sum()) <= WINDOW

    @invariant()
    def matches_end_with_their_window(self):
        for ids in self.sequences[-6:]:
            match = self.cm.match(ids)
            low = max(0, match.length - WINDOW + 1)
            for pos, slot in zip(range(low, match.length), match.slots[low:].tolist()):
                window_slot = int(self.pool.full_to_window[slot])
                assert window_slot >= 0 and self.window_tags[window_slot] == tuple(ids[: pos + 1])

    def teardown(self):
        super().teardown()
        assert self.pool.window_available == WINDOW_SLOTS and (self.pool.full_to_window == -1).all()


class HybridNoRadixMachine(HybridMachine):
    radix = False


class HybridLazyMachine(HybridMachine):
    eager = False


class HybridLazyNoRadixMachine(HybridLazyMachine):
    radix = False


MACHINES = [HybridMachine, HybridNoRadixMachine, HybridLazyMachine, HybridLazyNoRadixMachine]


@pytest.mark.parametrize("machine", MACHINES, ids=["radix", "no-radix", "lazy-radix", "lazy-no-radix"])
def test_window_pool_keeps_every_slot_in_one_place(machine):
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=30, deadline=None))


def _finish(cm: CacheManager, ids: list[int]) -> None:
    """A request computes `ids` in one pass and finishes."""
    req = WindowReq(list(ids))
    assert cm.open(req, cm.match(ids)) and cm.reserve(req, req.kv_len, len(ids) - req.kv_len)
    req.kv_len = len(ids)
    cm.share(req)
    cm.release(req)


@pytest.mark.parametrize("eager", [False, True])
def test_a_prefix_shared_mid_prompt_is_reused_while_the_window_pool_has_room(eager):
    """Two prompts that part after 12 tokens (4 windows): with room in the window pool the second
    reuses all 12; dropping window K/V after every pass it reuses none (no window K/V at 9..11)."""
    cm = CacheManager(ReqToTokenPool(ROWS, CONTEXT, "cpu"), hybrid_pool(size=64, window_size=64), radix=True,
                      eager_window_drop=eager)  # fmt: skip
    shared = [7, 1, 2, 0, 2, 1, 1, 0, 2, 2, 1, 0]
    _finish(cm, shared + [1, 1, 2])
    assert cm.match(shared + [0, 0]).length == (0 if eager else 12)


def test_a_short_window_pool_drops_out_of_window_kv_and_current_matches():
    """While the window pool is at least half free nothing is dropped; once it is short,
    make_room has running requests give back the window K/V they will not read again (never
    their last window), and a match made before is no longer current."""
    cm = CacheManager(ReqToTokenPool(ROWS, CONTEXT, "cpu"), hybrid_pool(size=64, window_size=16), radix=True)
    a, b = WindowReq([0, 1, 2, 0, 1, 2, 0]), WindowReq([2, 2, 1, 1, 0, 0, 2])
    for req in (a, b):
        assert cm.open(req, cm.match(req.all_ids)) and cm.reserve(req, 0, 7)
        if req is a:
            req.kv_len = 7
            cm.share(req)  # 9 of 16 window slots still free: a keeps all 7
            assert cm._kv.window_available == 9
    stale = cm.match(a.all_ids)
    assert cm.make_room(5) and cm._kv.window_available == 6  # a gave back positions 0..3
    assert (cm._kv.full_to_window[cm.slots(a, 0, 4)] < 0).all()
    assert (cm._kv.full_to_window[cm.slots(a, 4, 7)] >= 0).all()
    assert cm.is_current(cm.match(a.all_ids)) and not cm.is_current(stale)
    assert cm._prefixes.evicted_tokens == 0
    b.kv_len = 7
    for req in (a, b):
        cm.release(req)


def test_prefix_without_its_window_is_cut_to_where_it_has_one():
    """Window K/V dropped inside a cached prefix: the match stops where the next token's window
    is whole, and the rest is computed again."""
    pool = hybrid_pool(size=16, window_size=16)
    slots = pool.alloc(10)
    pool.drop_window(slots[2:6])  # positions 2..5 lost their window K/V; 6..9 keep theirs
    assert pool.window_prefix_len(slots) == 10  # the next token reads 8, 9
    assert pool.window_prefix_len(slots[:7]) == 2  # 7 would read 5, 6: 5 is gone; 2 reads 0, 1
    assert pool.window_prefix_len(slots[:2]) == 2
    assert pool.window_prefix_len(slots[:0]) == 0


def test_alloc_takes_both_pools_or_neither():
    pool = hybrid_pool(size=16, window_size=4)
    assert pool.alloc(5) is None and pool.available_size == 16 and pool.window_available == 4
    slots = pool.alloc(4)
    assert pool.alloc(1) is None and pool.available_size == 12
    pool.drop_window(slots[:3])
    assert pool.window_available == 3 and pool.available_size == 12
    pool.free(slots)
    assert pool.window_available == 4 and pool.available_size == 16


def test_layers_write_their_own_pool():
    pool = hybrid_pool(size=8, window_size=4)
    slots = pool.alloc(2)
    k = torch.arange(4, dtype=torch.float32).view(2, 1, 2)
    pool.write(0, slots, k, -k)  # the window layer: at the window slots
    pool.write(1, slots, 10 + k, -k)  # the full layer: at the full slots
    assert torch.equal(pool.k_buffers[0][pool.full_to_window[slots]], k)
    assert torch.equal(pool.k_buffers[1][slots], 10 + k)
    assert pool.k_buffers[0].shape[0] == 4 and pool.k_buffers[1].shape[0] == 8


def test_kv_split_counts_both_pools():
    """Gemma 3 270M's shape: 18 layers, 3 full; one KV head of 256; bfloat16."""
    windows = tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))
    split = KVSplit.of(windows, 1, 256, torch.bfloat16)
    assert split.full_bytes == 3 * 2 * 256 * 2 + 8 and split.window_bytes == 15 * 2 * 256 * 2
    full = split.full_slots(10**9)
    assert full * split.full_bytes + 0.25 * full * split.window_bytes <= 10**9
    assert split.window_slots(full) == -(-full // 4) and split.window_slots(100) == 100


def test_both_pools_are_prefaulted_in_turn():
    from langrt.mem.window_pool import _BothPrefaulters

    class Part:
        def __init__(self, chunks):
            self.left = chunks

        @property
        def done(self):
            return self.left == 0

        def step(self):
            self.left -= 1

    full, window = Part(2), Part(1)
    both = _BothPrefaulters([full, window])
    both.step()
    assert (full.left, window.left, both.done) == (1, 1, False)
    both.step(), both.step()
    assert both.done
    assert hybrid_pool().prefault is None  # small CPU pools are zeroed instead
