"""The dashboard's pieces without a model (issue 28): the bounded tree snapshot, hit and
eviction records of the radix cache, percentiles and rates, SGLang's metric names, the flag."""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from langrt.mem.radix_cache import RadixCache
from langrt.mem.tree_snapshot import tree_snapshot
from langrt.server.metrics import Metrics, RateMeter, percentile, sglang_lines


def _tree(seqs) -> tuple[RadixCache, list]:
    freed = []
    tree = RadixCache(freed.append)
    slot = 0
    for seq in seqs:
        tree.insert(seq, torch.arange(slot, slot + len(seq)))
        slot += len(seq)
    return tree, freed


def _random_tree(seed: int = 0, n: int = 60):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(5, 40))] for _ in range(5)]
    seqs = [rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(1, 30))] for _ in range(n)]
    return _tree(seqs)


def _walk(tree):
    stack = [(c, 1) for c in tree.root.children.values()]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        stack += [(c, depth + 1) for c in node.children.values()]


def test_snapshot_is_bounded_connected_and_takes_the_largest_first():
    tree, _ = _random_tree()
    full = tree_snapshot(tree, 10_000, 100)
    assert len(full["nodes"]) == tree.num_nodes
    for max_nodes, max_depth in ((1, 100), (7, 100), (25, 2), (40, 1)):
        snap = tree_snapshot(tree, max_nodes, max_depth)
        nodes = snap["nodes"]
        assert len(nodes) == min(max_nodes, sum(1 for _, d in _walk(tree) if d <= max_depth))
        seen = set()
        for node in nodes:
            assert node["parent"] is None or node["parent"] in seen, "parents come first"
            assert node["depth"] <= max_depth
            seen.add(node["id"])
        biggest_top = max(tree.root.children.values(), key=lambda c: len(c.key))
        assert nodes[0]["id"] == biggest_top.id and nodes[0]["tokens"] == len(biggest_top.key)
    assert sum(n["tokens"] for n in full["nodes"]) == tree.total_size


def test_snapshot_of_a_wide_root_looks_at_max_nodes_children_only():
    tree, _ = _tree([[i, i + 1] if i % 2 else [i] * 3 for i in range(0, 3000, 3)])
    nodes = tree_snapshot(tree, 5, 4)["nodes"]
    assert [n["tokens"] for n in nodes] == [3] * 5, "the five largest of a thousand children"


def test_hits_follow_the_path_and_survive_splits():
    tree, _ = _tree([[1, 2, 3, 4, 5, 6]])
    match = tree.match_prefix([1, 2, 3, 4, 5, 6, 7])
    tree.record_hit(match.node)
    tree.match_prefix([1, 2, 3, 9])  # splits the node after 3 tokens
    nodes = {tuple(n["head"]): n for n in tree_snapshot(tree, 10, 10)["nodes"]}
    assert nodes[(1, 2, 3)]["hits"] == 1 and nodes[(4, 5, 6)]["hits"] == 1
    assert nodes[(1, 2, 3)]["hit_age"] < 5 and nodes[(1, 2, 3)]["children"] == 1
    tree.record_hit(tree.match_prefix([1, 2, 3]).node)
    nodes = {tuple(n["head"]): n for n in tree_snapshot(tree, 10, 10)["nodes"]}
    assert nodes[(1, 2, 3)]["hits"] == 2 and nodes[(4, 5, 6)]["hits"] == 1


def test_evictions_are_recorded_for_the_page():
    tree, freed = _tree([[1, 2, 3, 4], [1, 2, 7, 8, 9], [5, 6]])
    tree.lock(tree.match_prefix([1, 2, 7, 8, 9]).node)
    assert tree.evict(100) == 4  # [3, 4] and [5, 6]; the locked path stays
    snap = tree_snapshot(tree, 10, 10)
    evicted = {tuple(e["head"]): e for e in snap["evictions"]}
    assert set(evicted) == {(3, 4), (5, 6)}
    assert evicted[(5, 6)]["parent"] is None and evicted[(3, 4)]["parent"] is not None
    assert all(e["tokens"] == 2 and e["age"] >= 0 for e in evicted.values())
    assert snap["locked_tokens"] == 5 and snap["evictable_tokens"] == 0 and snap["evicted_tokens"] == 4
    assert [n["lock"] for n in snap["nodes"]] == [1, 1]


def test_percentile_and_rate():
    assert percentile([], 50) is None
    values = list(range(1, 101))
    random.Random(0).shuffle(values)
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    meter = RateMeter(min_interval_s=0.2)
    assert meter.update(0, 10.0) == 0.0
    assert meter.update(50, 10.1) == 0.0, "too soon: the last rate"
    assert meter.update(100, 11.0) == 100.0
    assert meter.update(100, 12.0) == 0.0


def test_sglang_names_and_labels():
    metrics = Metrics(prompt_tokens=10, generation_tokens=4, cached_tokens=6)
    metrics.ttft.observe(0.02)
    lines = sglang_lines(metrics, {"num_running_reqs": (3, "Running.")}, 'm"x')
    text = "\n".join(lines)
    assert 'sglang:prompt_tokens_total{model_name="m\\"x"} 10' in text
    assert 'sglang:cached_tokens_total{model_name="m\\"x"} 6' in text
    assert 'sglang:num_running_reqs{model_name="m\\"x"} 3' in text
    assert "# TYPE sglang:num_running_reqs gauge" in text
    assert 'sglang:time_to_first_token_seconds_bucket{model_name="m\\"x",le="0.025"} 1' in text
    assert 'sglang:time_to_first_token_seconds_count{model_name="m\\"x"} 1' in text


def test_the_dashboard_routes_follow_the_flag():
    from langrt.entrypoints.http_server import create_app
    from langrt.server_args import ServerArgs

    manager = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None))
    for disabled in (False, True):
        app = create_app(manager, ServerArgs(disable_dashboard=disabled), "model", "tokenizer")
        paths = {r.resource.canonical for r in app.router.routes()}
        assert ("/dashboard" in paths) is not disabled and ("/dashboard/state" in paths) is not disabled
        assert "/metrics" in paths
