"""A bounded picture of the radix tree, for the dashboard (GET /dashboard/state).

Cheap by construction: a best-first walk from the root takes the largest nodes first (by the
tokens of their own edge), stops after `max_nodes` and never goes deeper than `max_depth`. A
parent is always taken before its children, so the picture is a connected tree, and only the
children of taken nodes are looked at: the cost grows with `max_nodes`, not with the tree.
Token ids are sent as they are; the main process turns them into words.
"""

from __future__ import annotations

import heapq
import time

from langrt.mem.radix_cache import RadixCache, TreeNode

HEAD_TOKENS = 8  # token ids sent per node: enough for a label of its first words


def tree_snapshot(tree: RadixCache, max_nodes: int, max_depth: int) -> dict:
    """{"nodes": [...], "evictions": [...], sizes}: nodes parent-first, each with its id,
    parent id (None under the root), depth, tokens, first token ids, lock count, hits, the
    seconds since its last hit and last access, and its number of children (taken or not)."""
    now = time.monotonic()
    nodes: list[dict] = []
    heap: list[tuple[int, int, int, TreeNode]] = []
    _push_children(heap, tree.root, 1, max_nodes)
    while heap and len(nodes) < max_nodes:
        _, _, depth, node = heapq.heappop(heap)
        nodes.append(_describe(node, tree.root, depth, now))
        if depth < max_depth:
            _push_children(heap, node, depth + 1, max_nodes - len(nodes))
    evictions = [
        {"age": now - e.at, "node": e.node_id, "parent": e.parent_id, "tokens": e.tokens, "head": list(e.head)}
        for e in tree.recent_evictions
    ]
    return {
        "nodes": nodes,
        "evictions": evictions,
        "evictable_tokens": tree.evictable_size,
        "locked_tokens": tree.protected_size,
        "evicted_tokens": tree.evicted_tokens,
    }


def _push_children(heap: list, node: TreeNode, depth: int, room: int) -> None:
    if room <= 0 or not node.children:
        return
    children = node.children.values()
    if len(node.children) > room:  # a wide node (the root of a no-reuse workload): the largest only
        children = heapq.nlargest(room, children, key=lambda c: len(c.key))
    for child in children:
        heapq.heappush(heap, (-len(child.key), child.id, depth, child))


def _describe(node: TreeNode, root: TreeNode, depth: int, now: float) -> dict:
    return {
        "id": node.id,
        "parent": None if node.parent is root else node.parent.id,
        "depth": depth,
        "tokens": len(node.key),
        "head": list(node.key[:HEAD_TOKENS]),
        "lock": node.lock_ref,
        "hits": node.hits,
        "hit_age": None if node.last_hit is None else now - node.last_hit,
        "age": now - node.last_access,
        "children": len(node.children),
    }
