"""CacheManager against a plain list of slots: random admissions, decodes, drafts, shares,
releases and flushes, with and without the radix cache.

The model: every slot carries a tag, the token prefix whose last K/V it would hold (written when
a request "computes" a position). After each step every slot is in exactly one place (free,
cached, or one request's private region), each request's row reads back its own prefix's tags,
and what the cache matches carries the matched prefix's tags: a slot given to two holders, or
freed while still read, breaks one of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from langrt.mem.cache_manager import CacheManager
from langrt.mem.pools import ReqToTokenPool, TokenToKVPool

SLOTS, ROWS, CONTEXT = 24, 3, 64
ids_strategy = st.lists(st.integers(0, 2), min_size=1, max_size=8)


@dataclass
class FakeReq:
    all_ids: list[int]
    kv_len: int = 0
    cached_len: int = 0
    cache_node: object = None
    kv_row: int | None = None
    reserved_end: int = 0  # positions [kv_len, reserved_end) have slots, not yet computed
    seen: list = field(default_factory=list)

    @property
    def cache_ids(self) -> list[int]:
        """What the prefix cache keys it by: its ids (no LoRA adapter)."""
        return self.all_ids


class CacheManagerMachine(RuleBasedStateMachine):
    radix = True
    Req = FakeReq

    def __init__(self):
        super().__init__()
        kv = TokenToKVPool(SLOTS, 1, 1, 2, torch.float32, "cpu")
        self.cm = CacheManager(ReqToTokenPool(ROWS, CONTEXT, "cpu"), kv, radix=self.radix)
        self.tags: list[tuple | None] = [None] * SLOTS
        self.running: list[FakeReq] = []
        self.sequences: list[list[int]] = []  # every sequence ever computed, to probe the cache

    def _compute(self, req: FakeReq, end: int) -> None:
        """The forward pass: positions [kv_len, end) get their K/V (tags)."""
        slots = self.cm.slots(req, req.kv_len, end).tolist()
        for pos, slot in zip(range(req.kv_len, end), slots):
            self.tags[slot] = tuple(req.all_ids[: pos + 1])
        req.kv_len = end
        self.sequences.append(list(req.all_ids[:end]))

    def _room(self) -> int:
        """Tokens a request may still reserve."""
        return self.cm.available

    @rule(ids=ids_strategy)
    def admit(self, ids):
        if self.cm.free_rows == 0:
            return
        req = self.Req(list(ids))
        assert self.cm.open(req, self.cm.match(ids[:-1]))
        need = len(ids) - req.kv_len
        if need > self._room():
            self.cm.release(req)
            return
        assert self.cm.reserve(req, req.kv_len, need)
        self._compute(req, len(ids))
        self.cm.share(req)
        self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, ROWS - 1), token=st.integers(0, 2), drafts=st.lists(st.integers(0, 2), max_size=3),
          keep=st.integers(0, 3))  # fmt: skip
    def decode(self, pick, token, drafts, keep):
        """One token plus drafts computed; those after the first rejected one are trimmed."""
        req = self.running[pick % len(self.running)]
        n = 1 + len(drafts)
        room = self._room()
        if not self.cm.reserve(req, req.kv_len, n):
            assert room < n
            return
        start = req.kv_len
        req.all_ids += [token] + drafts
        self._compute(req, start + n)
        kept = min(keep, len(drafts))
        req.kv_len = start + 1 + kept
        del req.all_ids[req.kv_len :]
        self.cm.trim(req, start + n)

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, ROWS - 1))
    def share(self, pick):
        self.cm.share(self.running[pick % len(self.running)])

    @precondition(lambda self: self.running)
    @rule(pick=st.integers(0, ROWS - 1))
    def release(self, pick):
        """Finished, aborted or retracted: the same release."""
        self.cm.release(self.running.pop(pick % len(self.running)))

    @rule(n=st.integers(0, SLOTS + 2))
    def make_room(self, n):
        before = self.cm.available
        assert self.cm.make_room(n) == (min(n, before) == n)
        assert self.cm.available == before  # eviction moves slots from cached to free only

    @rule()
    def flush(self):
        flushed = self.cm.flush()
        if not self.running:
            assert flushed
        if flushed:
            assert self.cm.stats()["kv_cached_tokens"] == 0

    @invariant()
    def every_slot_in_one_place(self):
        free = self.cm._kv._free.tolist()
        cached = self.cm._prefixes.tree.all_slots().tolist() if self.radix else []
        private = [s for r in self.running for s in self.cm.slots(r, r.cached_len, r.kv_len).tolist()]
        assert sorted(free + cached + private) == list(range(SLOTS))
        assert self.cm.free_slots == len(free)
        assert self.cm.stats()["kv_cached_tokens"] == len(cached)

    @invariant()
    def rows_read_back_their_prefixes(self):
        for req in self.running:
            for pos, slot in enumerate(self.cm.slots(req, 0, req.kv_len).tolist()):
                assert self.tags[slot] == tuple(req.all_ids[: pos + 1]), (pos, slot)

    @invariant()
    def matches_carry_their_prefixes(self):
        for ids in self.sequences[-6:]:
            match = self.cm.match(ids)
            assert match.length <= len(ids)
            for pos, slot in enumerate(match.slots.tolist()):
                assert self.tags[slot] == tuple(ids[: pos + 1])

    def teardown(self):
        for req in self.running:
            self.cm.release(req)
        assert self.cm.free_rows == ROWS
        if self.radix:
            assert self.cm.flush() and self.cm.free_slots == SLOTS


class NoRadixMachine(CacheManagerMachine):
    radix = False


RUNS = settings(max_examples=150, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("machine", [CacheManagerMachine, NoRadixMachine], ids=["radix", "no-radix"])
def test_cache_manager_keeps_every_slot_in_one_place(machine):
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(machine, settings=RUNS)
