"""PrefillAdder on its own: a real CacheManager over small CPU pools and real Reqs, no model.

The helpers mimic what the Scheduler does around the adder (`_admit`, `_process`, `_settle`):
a forward pass "computes" an item's tokens (kv_len moves to the chunk's end), then `share`
makes them cached prefixes; a finished request is `release`d.
"""

from __future__ import annotations

import math

import pytest

from kv_helpers import cache_prefix, make_cache, make_req
from langrt.mem.cache_manager import CacheManager
from langrt.scheduler.prefill_adder import IN_BATCH_SHARE_TOKENS, PrefillAdder, reserved_tokens
from langrt.request import Req
from langrt.scheduler.schedule_policy import SchedulePolicy

INF = float("inf")


def compute(cm: CacheManager, adder: PrefillAdder) -> None:
    """The forward pass over the adder's items, then `_settle`'s share."""
    for item in adder.items:
        item.req.kv_len = item.chunk_start + item.extend_len
        cm.share(item.req)


def row_slots(cm: CacheManager, req: Req, end: int) -> list[int]:
    return cm.slots(req, 0, end).tolist()


def snapshot(cm: CacheManager) -> tuple:
    s = cm.stats()
    return (cm.free_slots, cm.free_rows, cm.available, s["kv_cached_tokens"], s["cache_nodes"])


def assert_untouched(req: Req) -> None:
    assert req.kv_row is None
    assert req.kv_len == 0
    assert req.cached_len == 0
    assert req.cache_node is None


def assert_slot_accounting(cm: CacheManager, held: list[tuple[Req, int]]) -> None:
    """Every slot is free, cached, or in one request's private region [cached_len, end); the
    private regions of different requests never share a slot."""
    private = [s for req, end in held for s in cm.slots(req, req.cached_len, end).tolist()]
    assert len(private) == len(set(private))
    assert cm.free_slots + cm.stats()["kv_cached_tokens"] + len(private) == cm.size


# ---- (a) admitted whole ----------------------------------------------------------------


@pytest.mark.parametrize("radix", [True, False])
def test_request_within_budget_is_admitted_whole(radix):
    cm = make_cache(slots=64, radix=radix)
    req = make_req("a", range(100, 110), max_new=4)
    adder = PrefillAdder(cm, token_budget=25, reserved=3, ratio=0.5)

    assert adder.try_add(req, None)

    assert len(adder.items) == 1
    item = adder.items[0]
    assert item.req is req
    assert (item.chunk_start, item.extend_len, item.completes_prompt) == (0, 10, True)
    assert adder.chunked is None
    assert adder.budget == 15
    assert adder.reserved == 3 + math.ceil(4 * 0.5)
    assert not adder.exhausted
    assert cm.free_slots == 64 - 10
    assert cm.free_rows == 3
    assert req.kv_row is not None
    assert len(set(row_slots(cm, req, 10))) == 10
    assert_slot_accounting(cm, [(req, 10)])


def test_budget_is_shared_by_the_requests_of_one_batch():
    cm = make_cache(slots=64)
    a, b, c = make_req("a", range(100, 110)), make_req("b", range(200, 212)), make_req("c", range(300, 305))
    adder = PrefillAdder(cm, token_budget=25, reserved=0, ratio=0.0)

    assert adder.try_add(a, None) and adder.try_add(b, None)
    assert adder.budget == 3
    assert [(i.req, i.extend_len, i.completes_prompt) for i in adder.items] == [(a, 10, True), (b, 12, True)]
    # The third gets what is left of the budget: a chunk.
    assert adder.try_add(c, None)
    assert (adder.items[2].chunk_start, adder.items[2].extend_len, adder.items[2].completes_prompt) == (0, 3, False)
    assert adder.chunked is c and adder.exhausted
    assert cm.free_slots == 64 - 10 - 12 - 3
    rows = [set(row_slots(cm, r, n)) for r, n in ((a, 10), (b, 12), (c, 3))]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])


def test_infinite_budget_admits_long_prompts_whole():
    cm = make_cache(slots=600, context=600)
    req = make_req("long", range(500))
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(req, None)
    assert (adder.items[0].extend_len, adder.items[0].completes_prompt) == (500, True)
    assert adder.chunked is None and not adder.exhausted


# ---- (b) chunked prefill ---------------------------------------------------------------


def test_prompt_longer_than_budget_is_chunked_and_continues():
    cm = make_cache(slots=64)
    req = make_req("long", range(100, 110), max_new=2)
    other = make_req("other", [7, 8, 9])

    # Step 1: the first 4 tokens; the batch is then closed.
    adder = PrefillAdder(cm, token_budget=4, reserved=0, ratio=1.0)
    assert adder.try_add(req, None)
    item = adder.items[0]
    assert (item.chunk_start, item.extend_len, item.completes_prompt) == (0, 4, False)
    assert adder.chunked is req
    assert adder.exhausted
    assert cm.free_slots == 64 - 4  # slots for this chunk only
    assert adder.reserved == 2 + (10 - 4)  # its output estimate and its later chunks
    assert not adder.try_add(other, None)
    assert len(adder.items) == 1
    assert_untouched(other)
    compute(cm, adder)
    assert req.kv_len == 4

    # Step 2: the next chunk, from where the first ended.
    adder = PrefillAdder(cm, token_budget=4, reserved=reserved_tokens(req, 1.0), ratio=1.0)
    adder.add_continuing(req)
    item = adder.items[0]
    assert (item.req, item.chunk_start, item.extend_len, item.completes_prompt) == (req, 4, 4, False)
    assert adder.chunked is req and adder.exhausted
    compute(cm, adder)

    # Step 3: the last 2 tokens complete the prompt, and the rest of the budget admits another.
    adder = PrefillAdder(cm, token_budget=4, reserved=reserved_tokens(req, 1.0), ratio=1.0)
    adder.add_continuing(req)
    item = adder.items[0]
    assert (item.chunk_start, item.extend_len, item.completes_prompt) == (8, 2, True)
    assert adder.chunked is None
    assert adder.reserved == 2  # add_continuing adds nothing: the caller counted its output
    assert adder.budget == 2 and not adder.exhausted
    assert adder.try_add(other, None)
    assert (adder.items[1].extend_len, adder.items[1].completes_prompt) == (2, False)
    assert adder.chunked is other
    assert cm.free_slots == 64 - 10 - 2
    compute(cm, adder)
    assert req.kv_len == 10
    assert len(set(row_slots(cm, req, 10))) == 10
    # The chunks were shared as they were computed: the whole prompt is now a cached prefix.
    assert cm.match(list(range(100, 110))).length == 10


# ---- (c) memory ----------------------------------------------------------------------------


@pytest.mark.parametrize("radix", [True, False])
def test_memory_check_counts_reserved_output_with_ceil(radix):
    # need = 15 prompt tokens + ceil(10 x ratio); 20 slots.
    fits = make_cache(slots=20, radix=radix)
    req = make_req("a", range(100, 115), max_new=10)
    adder = PrefillAdder(fits, token_budget=INF, reserved=0, ratio=0.5)  # 15 + 5 == 20: fits exactly
    assert adder.try_add(req, None)
    assert adder.reserved == 5

    cm = make_cache(slots=20, radix=radix)
    req = make_req("b", range(100, 115), max_new=10)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.51)  # ceil(5.1) == 6: 21 > 20
    before = snapshot(cm)
    assert not adder.try_add(req, None)
    assert snapshot(cm) == before
    assert cm.free_slots == 20 and cm.free_rows == 4
    assert_untouched(req)
    assert adder.items == [] and adder.chunked is None
    assert adder.reserved == 0 and adder.budget == INF


@pytest.mark.parametrize("radix", [True, False])
def test_memory_check_subtracts_what_is_already_reserved(radix):
    cm = make_cache(slots=20, radix=radix)
    adder = PrefillAdder(cm, token_budget=INF, reserved=5, ratio=0.0)
    assert adder.available == 15
    too_big = make_req("big", range(100, 116))
    assert not adder.try_add(too_big, None)
    assert_untouched(too_big)
    fits = make_req("fits", range(200, 215))
    assert adder.try_add(fits, None)
    assert cm.free_slots == 5


def test_reservations_of_earlier_admissions_count_for_later_ones():
    cm = make_cache(slots=20)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=1.0)
    assert adder.try_add(make_req("a", range(100, 105), max_new=5), None)  # 5 + 5 <= 20
    assert adder.reserved == 5 and adder.available == 10
    late = make_req("late", range(200, 206), max_new=5)  # 6 + 5 > 15 free - 5 reserved
    assert not adder.try_add(late, None)
    assert_untouched(late)
    assert cm.free_slots == 15
    ok = make_req("ok", range(300, 305), max_new=5)  # 5 + 5 == 10
    assert adder.try_add(ok, None)
    assert cm.free_slots == 10 and adder.reserved == 10


def test_reserved_tokens():
    req = make_req("a", [1, 2], max_new=10)
    assert reserved_tokens(req, 0.51) == 6
    assert reserved_tokens(req, 1.0) == 10
    assert reserved_tokens(req, 0.0) == 0
    req.output_ids = [5, 6, 7]
    assert reserved_tokens(req, 0.51) == math.ceil(7 * 0.51) == 4
    req.output_ids = list(range(12))  # past max_new_tokens: nothing more, never negative
    assert reserved_tokens(req, 0.7) == 0


def test_evictable_prefixes_count_as_room_and_are_evicted():
    cm = make_cache(slots=20)
    cache_prefix(cm, range(900, 908))  # 8 unrelated tokens, unlocked
    assert cm.free_slots == 12 and cm.available == 20
    req = make_req("a", range(100, 118), max_new=2)  # 18 + 2 == 20
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=1.0)
    assert adder.try_add(req, None)
    assert cm.stats()["evicted_tokens"] == 8
    assert cm.free_slots == 2
    assert cm.match(list(range(900, 908))).length == 0


def test_own_locked_prefix_is_not_counted_as_room_and_is_unlocked_on_refusal():
    cm = make_cache(slots=20)
    prefix = list(range(900, 908))
    cache_prefix(cm, prefix)  # 8 cached, 12 free
    cached_slots = cm.match(prefix).slots.tolist()
    # 12 new tokens + 1 reserved: its own 8 cached tokens are locked by it, so not evictable.
    req = make_req("a", prefix + list(range(100, 112)), max_new=1)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=1.0)
    before = snapshot(cm)
    assert not adder.try_add(req, None)
    assert snapshot(cm) == before  # the match's lock was given back: 8 evictable again
    assert cm.available == 20
    assert_untouched(req)
    assert cm.match(prefix).slots.tolist() == cached_slots
    # Without the output reservation it fits exactly, reusing the prefix.
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(req, None)
    assert (adder.items[0].chunk_start, adder.items[0].extend_len) == (8, 12)
    assert cm.free_slots == 0
    assert cm.stats()["evicted_tokens"] == 0


# ---- (d) prefix reuse --------------------------------------------------------------------


def test_cached_prefix_is_reused():
    cm = make_cache(slots=64)
    prefix = list(range(100, 108))
    cache_prefix(cm, prefix)
    cached_slots = cm.match(prefix).slots.tolist()
    free = cm.free_slots
    req = make_req("a", prefix + [1, 2, 3, 4])
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)

    assert adder.try_add(req, None)
    item = adder.items[0]
    assert (item.chunk_start, item.extend_len, item.completes_prompt) == (8, 4, True)
    assert req.cached_len == 8
    assert cm.free_slots == free - 4
    assert row_slots(cm, req, 8) == cached_slots
    assert not set(row_slots(cm, req, 12)[8:]) & set(cached_slots)
    assert_slot_accounting(cm, [(req, 12)])


def test_policy_match_is_used_as_given():
    cm = make_cache(slots=64)
    prefix = list(range(100, 108))
    cache_prefix(cm, prefix)
    req = make_req("a", prefix + [1, 2, 3, 4])
    order, matches = SchedulePolicy("lpm", cm).order([req])
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(req, matches[id(req)])
    assert adder.items[0].chunk_start == 8 and req.cached_len == 8


def test_a_fully_cached_prompt_still_computes_its_last_token():
    cm = make_cache(slots=64)
    prompt = list(range(100, 108))
    cache_prefix(cm, prompt)
    free = cm.free_slots
    req = make_req("again", prompt)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(req, None)
    item = adder.items[0]
    assert (item.chunk_start, item.extend_len, item.completes_prompt) == (7, 1, True)
    assert cm.free_slots == free - 1


def test_no_prefix_reuse_without_radix():
    cm = make_cache(slots=64, radix=False)
    prefix = list(range(100, 108))
    cache_prefix(cm, prefix)
    assert cm.free_slots == 64  # nothing kept
    req = make_req("a", prefix + [1, 2, 3, 4])
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(req, None)
    assert (adder.items[0].chunk_start, adder.items[0].extend_len) == (0, 12)
    assert cm.free_slots == 64 - 12


# ---- (e) waiting for a batch-mate ------------------------------------------------------------


def shared_pair(shared: int):
    common = list(range(1000, 1000 + shared))
    return make_req("first", common + [1, 2, 3]), make_req("second", common + [4, 5])


def test_request_sharing_many_uncached_tokens_with_a_batch_mate_waits():
    cm = make_cache(slots=128)
    first, second = shared_pair(IN_BATCH_SHARE_TOKENS + 1)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(first, None)
    before = snapshot(cm)
    assert not adder.try_add(second, None)
    assert snapshot(cm) == before
    assert_untouched(second)
    assert len(adder.items) == 1
    # Waiting does not close the batch: an unrelated request is still admitted.
    assert not adder.exhausted
    assert adder.try_add(make_req("unrelated", [5, 6, 7]), None)
    # Next step, with the shared part cached by the first, the second is admitted and reuses it.
    compute(cm, adder)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(second, None)
    assert adder.items[0].chunk_start == IN_BATCH_SHARE_TOKENS + 1


def test_identical_prompts_in_one_batch_wait():
    cm = make_cache(slots=128)
    prompt = list(range(1000, 1040))
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(make_req("a", prompt), None)
    assert not adder.try_add(make_req("b", prompt), None)


def test_request_sharing_few_uncached_tokens_is_admitted():
    cm = make_cache(slots=128)
    first, second = shared_pair(IN_BATCH_SHARE_TOKENS)  # not more than the threshold
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(first, None)
    assert adder.try_add(second, None)
    assert [i.req for i in adder.items] == [first, second]


def test_only_uncached_shared_tokens_count():
    cm = make_cache(slots=128)
    shared = IN_BATCH_SHARE_TOKENS + 10
    first, second = shared_pair(shared)
    cache_prefix(cm, first.input_ids[:10])  # 10 of the shared tokens are cached: 32 uncached left
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(first, None)
    assert adder.try_add(second, None)
    assert [i.chunk_start for i in adder.items] == [10, 10]


def test_sharing_with_a_continuing_chunk_counts_too():
    cm = make_cache(slots=128)
    shared = IN_BATCH_SHARE_TOKENS + 9
    first, second = shared_pair(shared)
    third = make_req("third", second.input_ids[: shared - 1] + [9])  # one shared token fewer
    adder = PrefillAdder(cm, token_budget=8, reserved=0, ratio=0.0)
    assert adder.try_add(first, None) and adder.chunked is first
    compute(cm, adder)  # 8 tokens cached
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    adder.add_continuing(first)
    assert adder.items[0].chunk_start == 8 and adder.items[0].completes_prompt
    # second shares 41 tokens with the continuing request, 8 cached: 33 uncached, it waits;
    # third shares 40, 8 cached: 32, it is admitted.
    assert not adder.try_add(second, None)
    assert_untouched(second)
    assert adder.try_add(third, None)
    assert adder.items[1].req is third and adder.items[1].chunk_start == 8


def test_never_waits_for_a_batch_mate_without_radix():
    cm = make_cache(slots=128, radix=False)
    first, second = shared_pair(IN_BATCH_SHARE_TOKENS + 20)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(first, None)
    assert adder.try_add(second, None)
    assert [i.req for i in adder.items] == [first, second]


# ---- (f) rows ------------------------------------------------------------------------------


def test_no_free_row_exhausts_the_adder():
    cm = make_cache(slots=64, rows=2)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert not adder.exhausted
    assert adder.try_add(make_req("a", [1, 2, 3]), None)
    assert not adder.exhausted
    assert adder.try_add(make_req("b", [4, 5, 6]), None)
    assert cm.free_rows == 0
    assert adder.exhausted
    third = make_req("c", [7, 8, 9])
    free = cm.free_slots
    assert not adder.try_add(third, None)
    assert_untouched(third)
    assert cm.free_slots == free and len(adder.items) == 2


def test_rows_held_by_running_requests_exhaust_a_new_adder():
    cm = make_cache(slots=64, rows=1)
    running = make_req("running", [1, 2, 3])
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.try_add(running, None)
    compute(cm, adder)
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    assert adder.exhausted
    assert not adder.try_add(make_req("new", [4, 5]), None)
    # Once released, its row is free again.
    cm.release(running)
    assert not PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0).exhausted


def test_zero_budget_exhausts_the_adder():
    cm = make_cache(slots=64)
    adder = PrefillAdder(cm, token_budget=0, reserved=0, ratio=0.0)
    assert adder.exhausted
    req = make_req("a", [1, 2])
    assert not adder.try_add(req, None)
    assert_untouched(req)


# ---- matches made before an eviction --------------------------------------------------------


def test_a_match_evicted_by_an_earlier_admission_of_the_same_step_is_not_adopted():
    """The policy's prefix matches are made before any admission of the step; an earlier
    admission's reserve() can evict a later request's matched prefix and give its slots to the
    earlier request. The later request must not adopt them (it re-matches)."""
    cm = make_cache(slots=30)
    cache_prefix(cm, [1] * 10)  # X
    cache_prefix(cm, [2] * 5)  # Y
    cache_prefix(cm, [3] * 3)  # Q; 12 slots free
    b = make_req("b", [2] * 5 + [4])  # matches Y
    e = make_req("e", [3] * 3 + [5])  # matches Q
    a = make_req("a", [1] * 10 + [6] * 13)  # matches X, needs 13 new: one more than free
    # As Scheduler._admit does it: order (touching Y, Q, X in that order), then admit in order.
    order, matches = SchedulePolicy("lpm", cm).order([b, e, a])
    assert order == [a, b, e]
    adder = PrefillAdder(cm, token_budget=INF, reserved=0, ratio=0.0)
    for req in order:
        if adder.exhausted:
            break
        adder.try_add(req, matches.get(id(req)))
    held = [(i.req, i.chunk_start + i.extend_len) for i in adder.items]
    assert a in [r for r, _ in held]
    a_slots = set(row_slots(cm, a, 23))
    for req, end in held:
        if req is not a:
            assert not set(row_slots(cm, req, end)) & a_slots, f"{req.rid} reads slots {a.rid} owns"
    assert_slot_accounting(cm, held)


def test_a_match_is_current_until_the_next_eviction_and_open_refuses_a_stale_one():
    cm = make_cache(slots=12)
    cache_prefix(cm, [1] * 4)
    cache_prefix(cm, [2] * 4)  # 4 slots free
    stale = cm.match([1] * 4 + [9])
    assert stale.length == 4 and cm.is_current(stale)
    cm.match([2] * 4)  # matching evicts nothing
    assert cm.is_current(stale)
    assert cm.make_room(8)  # evicts [1] * 4, the least recently used
    assert not cm.is_current(stale)
    with pytest.raises(AssertionError, match="before an eviction"):
        cm.open(make_req("late", [1] * 4 + [9]), stale)
