"""SchedulePolicy on its own: a real CacheManager over small CPU pools and real Reqs, no model."""

from __future__ import annotations

import pytest

from kv_helpers import cache_prefix, make_cache, make_req
from langrt.mem.cache_manager import CacheManager
from langrt.request import Req
from langrt.scheduler.schedule_policy import MAX_QUEUE_FOR_MATCHING, SchedulePolicy
from langrt.server_args import SCHEDULE_POLICIES


def rids(reqs) -> list[str]:
    return [r.rid for r in reqs]


P = list(range(100, 108))  # cached, 8 tokens
Q = list(range(200, 204))  # cached, 4 tokens


def mixed_waiting() -> list[Req]:
    """Arrival order: unmatched, Q-matched, P-matched, unmatched, a copy of P (matches 7)."""
    return [
        make_req("u1", [1, 2, 3]),
        make_req("q", Q + [5, 6]),
        make_req("p", P + [7]),
        make_req("u2", [9, 9]),
        make_req("p-again", P),
    ]


def cache_with_p_and_q(radix: bool = True) -> CacheManager:
    cm = make_cache(radix=radix)
    cache_prefix(cm, Q)
    cache_prefix(cm, P)
    return cm


def test_policy_names_are_the_cli_choices():
    assert set(SCHEDULE_POLICIES) == {"lpm", "dfs-weight", "fcfs", "random"}
    with pytest.raises(ValueError, match="unknown schedule policy"):
        SchedulePolicy("sjf", make_cache())


@pytest.mark.parametrize("name", SCHEDULE_POLICIES)
@pytest.mark.parametrize("radix", [True, False])
def test_order_is_a_permutation_and_matches_are_real(name, radix):
    cm = cache_with_p_and_q(radix)
    waiting = mixed_waiting()
    arrival = list(waiting)
    available = cm.available
    order, matches = SchedulePolicy(name, cm, seed=3).order(waiting)

    assert waiting == arrival and all(a is b for a, b in zip(waiting, arrival))  # input untouched
    assert order is not waiting
    assert len(order) == len(waiting)
    assert sorted(map(id, order)) == sorted(map(id, waiting))
    assert cm.available == available  # matching locks nothing
    if name in ("fcfs", "random"):
        assert matches == {}
    else:
        assert set(matches) == {id(r) for r in waiting}
        expected = {"u1": 0, "q": 4, "p": 8, "u2": 0, "p-again": 7} if radix else dict.fromkeys(rids(waiting), 0)
        assert {r.rid: matches[id(r)].length for r in waiting} == expected
        for r in waiting:  # the matches carry the cached slots, usable as given by try_add
            assert matches[id(r)].slots.tolist() == cm.match(r.all_ids[: r.max_prefix_len]).slots.tolist()


def test_lpm_puts_the_longest_cached_prefix_first_ties_in_arrival_order():
    cm = cache_with_p_and_q()
    order, _ = SchedulePolicy("lpm", cm).order(mixed_waiting())
    assert rids(order) == ["p", "p-again", "q", "u1", "u2"]


def test_lpm_with_one_cached_prefix_moves_its_request_first():
    cm = make_cache()
    cache_prefix(cm, P)
    waiting = [make_req(f"u{i}", [i, i + 1]) for i in range(4)] + [make_req("p", P + [1, 2])]
    order, _ = SchedulePolicy("lpm", cm).order(waiting)
    assert rids(order) == ["p", "u0", "u1", "u2", "u3"]


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_cache_aware_orders_fall_back_to_arrival_without_radix(name):
    cm = cache_with_p_and_q(radix=False)
    waiting = mixed_waiting()
    order, matches = SchedulePolicy(name, cm).order(waiting)
    assert rids(order) == rids(waiting)
    assert all(m.length == 0 for m in matches.values())


def test_fcfs_keeps_arrival_order_even_with_cached_prefixes():
    cm = cache_with_p_and_q()
    waiting = mixed_waiting()
    order, matches = SchedulePolicy("fcfs", cm).order(waiting)
    assert rids(order) == rids(waiting)
    assert matches == {}


def test_random_is_a_seeded_shuffle():
    cm = make_cache()
    waiting = [make_req(f"r{i}", [i + 1]) for i in range(12)]
    first = SchedulePolicy("random", cm, seed=7)
    same = SchedulePolicy("random", cm, seed=7)
    a1, m1 = first.order(waiting)
    a2, _ = first.order(waiting)
    b1, _ = same.order(waiting)
    b2, _ = same.order(waiting)
    assert m1 == {}
    # Reproducible: the same seed gives the same sequence of orders.
    assert rids(a1) == rids(b1) and rids(a2) == rids(b2)
    for order in (a1, a2):
        assert sorted(map(id, order)) == sorted(map(id, waiting))
    # A shuffle: not arrival order, and other seeds give other orders (12! orders: a clash
    # by chance is negligible, and the seeds are fixed so this never flakes).
    assert rids(a1) != rids(waiting)
    others = {tuple(rids(SchedulePolicy("random", cm, seed=s).order(waiting)[0])) for s in range(5)}
    assert len(others) == 5


def test_random_ignores_the_cache():
    cm = make_cache()
    cache_prefix(cm, P)
    waiting = [make_req(f"u{i}", [i + 1, 1]) for i in range(8)] + [make_req("p", P + [1])]
    cacheless = make_cache(radix=False)
    order, _ = SchedulePolicy("random", cm, seed=11).order(waiting)
    same, _ = SchedulePolicy("random", cacheless, seed=11).order(waiting)
    assert rids(order) == rids(same)


# ---- dfs-weight ------------------------------------------------------------------------------

X = [1] * 8  # a shared cached prefix
X1 = X + [2] * 4  # two cached continuations of it
X2 = X + [3] * 4
Y = [5] * 6  # another cached prefix


def dfs_setup():
    cm = make_cache()
    # Inserted lightest first, so "heaviest first" is not insertion order.
    cache_prefix(cm, Y)
    cache_prefix(cm, X2)
    cache_prefix(cm, X1)
    waiting = [
        make_req("y1", Y + [7]),
        make_req("x1a", X1 + [7]),
        make_req("u", [9, 9, 9]),
        make_req("x2", X2 + [7]),
        make_req("x1b", X1 + [8, 8]),
        make_req("x", X + [6]),  # its match ends at X itself
        make_req("y2", Y + [8]),
    ]
    return cm, waiting


def test_dfs_weight_groups_requests_by_shared_prefix_heaviest_subtree_first():
    cm, waiting = dfs_setup()
    order, matches = SchedulePolicy("dfs-weight", cm).order(waiting)
    names = rids(order)
    assert sorted(names) == sorted(rids(waiting))
    assert {r.rid: matches[id(r)].length for r in waiting} == {
        "y1": 6, "x1a": 12, "u": 0, "x2": 12, "x1b": 12, "x": 8, "y2": 6
    }  # fmt: skip

    def block(members):
        pos = sorted(names.index(m) for m in members)
        assert pos == list(range(pos[0], pos[0] + len(pos))), f"{members} not contiguous in {names}"
        return pos

    x_block = block({"x", "x1a", "x1b", "x2"})  # the subtree under X: 4 requests
    y_block = block({"y1", "y2"})  # 2 requests
    x1_block = block({"x1a", "x1b"})  # 2 requests
    x2_block = block({"x2"})  # 1 request
    assert x_block[0] < y_block[0]  # heavier subtree first
    assert x1_block[0] < x2_block[0]
    # Requests whose matches end at the same node keep arrival order.
    assert names.index("x1a") < names.index("x1b")
    assert names.index("y1") < names.index("y2")


def test_dfs_weight_visits_a_node_before_its_subtree():
    """What this implementation does (a pre-order walk): a node's own requests come before those
    of its children, so requests with no cached prefix (at the root) come first. SGLang's
    dfs-weight walks children first and puts them last."""
    cm, waiting = dfs_setup()
    order, _ = SchedulePolicy("dfs-weight", cm).order(waiting)
    assert rids(order) == ["u", "x", "x1a", "x1b", "x2", "y1", "y2"]


def test_dfs_weight_differs_from_lpm_where_it_should():
    """lpm interleaves subtrees by match length (x2 between x1a and x1b); dfs-weight does not."""
    cm, waiting = dfs_setup()
    lpm, _ = SchedulePolicy("lpm", cm).order(waiting)
    assert rids(lpm) == ["x1a", "x2", "x1b", "x", "y1", "y2", "u"]


# ---- large queues ----------------------------------------------------------------------------


def big_queue(n: int) -> list[Req]:
    """n requests: one matching Q, one matching P, n - 3 matching nothing, another matching P."""
    return (
        [make_req("q", Q + [1]), make_req("pa", P + [1])]
        + [make_req(f"u{i}", [1000 + i, 1]) for i in range(n - 3)]
        + [make_req("pb", P + [2])]
    )


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_cache_aware_orders_match_up_to_the_queue_limit(name):
    cm = cache_with_p_and_q()
    waiting = big_queue(MAX_QUEUE_FOR_MATCHING)
    order, matches = SchedulePolicy(name, cm).order(waiting)
    assert len(matches) == MAX_QUEUE_FOR_MATCHING
    names = rids(order)
    # Both put the two P requests together, before the Q one (arrival order has q first).
    assert names.index("pb") == names.index("pa") + 1
    assert names.index("pb") < names.index("q")
    if name == "lpm":
        assert names[:3] == ["pa", "pb", "q"]


@pytest.mark.parametrize("name", ["lpm", "dfs-weight"])
def test_cache_aware_orders_fall_back_to_fcfs_past_the_queue_limit(name):
    cm = cache_with_p_and_q()
    waiting = big_queue(MAX_QUEUE_FOR_MATCHING + 1)
    order, matches = SchedulePolicy(name, cm).order(waiting)
    assert rids(order) == rids(waiting)
    assert matches == {}


def test_queue_limit_value():
    assert MAX_QUEUE_FOR_MATCHING == 128


def test_random_still_shuffles_past_the_queue_limit():
    cm = make_cache()
    waiting = big_queue(MAX_QUEUE_FOR_MATCHING + 1)
    order, matches = SchedulePolicy("random", cm, seed=0).order(waiting)
    assert rids(order) != rids(waiting)
    assert sorted(map(id, order)) == sorted(map(id, waiting))
    assert matches == {}
