"""The router's prefix tree and policies, against a naive model; no servers."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from langrt.router.policies import (
    CacheAware,
    CacheAwareSettings,
    LeastLoad,
    RandomPolicy,
    RoundRobin,
    Worker,
    make_policy,
)
from langrt.router.tree import PrefixTree


def _naive_match(sent: dict[str, list[str]], text: str, among=None) -> int:
    best = 0
    for worker, texts in sent.items():
        if among is not None and worker not in among:
            continue
        for t in texts:
            n = 0
            while n < min(len(t), len(text)) and t[n] == text[n]:
                n += 1
            best = max(best, n)
    return best


def test_match_splits_edges_and_names_the_deepest_worker():
    tree = PrefixTree()
    tree.insert("hello world", "a")
    tree.insert("hello there", "b")
    assert tree.match("hello world, again").length == 11
    assert tree.match("hello world, again").workers == ("a",)
    assert tree.match("hello th").workers == ("b",)
    assert set(tree.match("hello").workers) == {"a", "b"}
    assert tree.match("goodbye").length == 0 and tree.match("goodbye").workers == ()
    assert tree.chars("a") == len("hello world") and tree.chars("b") == len("hello there")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.text("xyz", max_size=8)), max_size=20), st.text("xyz", max_size=10)
)
def test_match_length_equals_naive_longest_common_prefix(inserts, query):
    tree, sent = PrefixTree(), {}
    for worker, text in inserts:
        tree.insert(text, worker)
        sent.setdefault(worker, []).append(text)
    match = tree.match(query)
    assert match.length == _naive_match(sent, query)
    for worker in match.workers:
        assert _naive_match({worker: sent[worker]}, query) == match.length
    assert tree.match(query, among={"a"}).length == _naive_match(sent, query, among={"a"})


def test_remove_worker_forgets_it_everywhere():
    tree = PrefixTree()
    tree.insert("shared prefix one", "a")
    tree.insert("shared prefix two", "b")
    tree.remove_worker("a")
    assert tree.match("shared prefix one").workers == ("b",)
    assert tree.match("shared prefix one").length == len("shared prefix ")
    assert tree.chars("a") == 0


def test_evict_drops_least_recently_sent_first():
    tree = PrefixTree()
    tree.insert("old-" + "x" * 20, "a")
    tree.insert("new-" + "y" * 20, "a")
    tree.evict("a", 30)
    assert tree.chars("a") <= 30
    assert tree.match("new-" + "y" * 20).length == 24
    assert tree.match("old-" + "x" * 20).length == 0


def _workers(n=2):
    return [Worker(f"http://w{i}") for i in range(n)]


def test_cache_aware_keeps_a_prefix_on_one_worker_and_spreads_new_ones():
    policy, workers = CacheAware(), _workers()
    preambles = [f"tenant {t}: " + "example. " * 50 for t in range(4)]
    first = {}
    for i in range(40):
        t = i % 4
        chosen = policy.choose(preambles[t] + f"question {i}?", workers)
        chosen.sent += 1
        assert first.setdefault(t, chosen.url) == chosen.url
    assert len(set(first.values())) == 2  # the four tenants are spread over both workers


def test_cache_aware_follows_load_when_imbalanced():
    policy = CacheAware(CacheAwareSettings(balance_abs=4, balance_rel=1.5))
    workers = _workers()
    text = "a long shared preamble " * 10
    owner = policy.choose(text + "1", workers)
    other = next(w for w in workers if w is not owner)
    owner.in_flight = 3  # within the thresholds: the cache wins over the idler worker
    assert policy.choose(text + "2", workers) is owner
    owner.in_flight = 10  # 10 - 0 > 4 and 10 > 1.5 * 0: the idlest worker gets it
    assert policy.choose(text + "3", workers) is other


def test_cache_aware_only_chooses_among_the_given_workers():
    policy, workers = CacheAware(), _workers(3)
    text = "prefix " * 20
    owner = policy.choose(text, workers)
    rest = [w for w in workers if w is not owner]
    assert policy.choose(text + "more", rest) in rest
    policy.forget(owner.url)
    assert owner.url not in policy.tree.match(text).workers


def test_round_robin_random_and_least_load():
    workers = _workers(3)
    rr = RoundRobin()
    assert [rr.choose("", workers).url for _ in range(6)] == [w.url for w in workers] * 2
    workers[0].in_flight, workers[1].in_flight, workers[2].in_flight = 3, 1, 2
    assert LeastLoad().choose("x", workers) is workers[1]
    picks = {RandomPolicy(seed).choose("x", workers).url for seed in range(30)}
    assert picks == {w.url for w in workers}
    assert make_policy("random", seed=1).name == "random"
    try:
        make_policy("nearest")
    except ValueError as e:
        assert "cache_aware" in str(e)
    else:
        raise AssertionError("an unknown policy was accepted")


def test_policies_choose_a_given_worker_whatever_the_text():
    rng = random.Random(0)
    for name in ("cache_aware", "round_robin", "random", "least_load"):
        policy = make_policy(name, seed=0)
        workers = _workers(3)
        for _ in range(50):
            subset = rng.sample(workers, rng.randint(1, 3))
            text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
            assert policy.choose(text, subset) in subset
