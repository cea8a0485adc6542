"""The router's approximate prefix tree: which worker was last sent which prompt text.

A radix tree over characters (not tokens: the router has no tokenizer, and a character prefix
is a token prefix for every tokenizer but at the seam). Each node records, per worker, when a
prompt through it was last sent there. A worker at a node is at every ancestor too, so the
deepest node that still names a worker gives that worker's match length. It is approximate:
a worker's radix cache evicts on its own, and this tree only forgets by its own size budget
(`evict`), least recently used first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class _Node:
    edge: str = ""
    children: dict[str, "_Node"] = field(default_factory=dict)
    last_sent: dict[str, float] = field(default_factory=dict)  # worker -> time (a clock tick)
    parent: "_Node | None" = None


@dataclass(frozen=True)
class Match:
    """The longest match of a text: how many characters, and the workers that hold that many."""

    length: int
    workers: tuple[str, ...]


class PrefixTree:
    def __init__(self):
        self.root = _Node()
        self._chars: dict[str, int] = {}  # worker -> characters of the tree it holds
        self._tick = itertools.count()

    def chars(self, worker: str) -> int:
        """Characters this worker holds in the tree (its approximate cache size)."""
        return self._chars.get(worker, 0)

    def insert(self, text: str, worker: str) -> None:
        """Record that `text` was sent to `worker`: every node on its path gains the worker."""
        now = next(self._tick)
        node, rest = self.root, text
        node.last_sent[worker] = now
        while rest:
            child = node.children.get(rest[0])
            if child is None:
                child = _Node(edge=rest, parent=node)
                node.children[rest[0]] = child
            else:
                common = _common_length(child.edge, rest)
                if common < len(child.edge):
                    child = self._split(child, common)
            if worker not in child.last_sent:
                self._chars[worker] = self.chars(worker) + len(child.edge)
            child.last_sent[worker] = now
            node, rest = child, rest[len(child.edge) :]

    def match(self, text: str, among: set[str] | None = None) -> Match:
        """The longest prefix of `text` some worker (of `among`, if given) holds; a match may
        end inside an edge. With no match, `workers` is empty."""
        node, rest, length, workers = self.root, text, 0, ()
        while rest:
            child = node.children.get(rest[0])
            holders = tuple(w for w in child.last_sent if among is None or w in among) if child else ()
            if not holders:
                break
            common = _common_length(child.edge, rest)
            length += common
            workers = holders
            if common < len(child.edge):
                break
            node, rest = child, rest[common:]
        return Match(length, workers)

    def remove_worker(self, worker: str) -> None:
        """Forget a worker everywhere (it was removed, or restarted with an empty cache)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            node.last_sent.pop(worker, None)
            stack.extend(node.children.values())
        self._chars.pop(worker, None)
        self._prune(self.root)

    def evict(self, worker: str, max_chars: int) -> None:
        """Drop this worker's least recently sent leaves until it holds at most `max_chars`."""
        while self.chars(worker) > max_chars:
            leaf = self._oldest_leaf(worker)
            if leaf is None:
                break
            del leaf.last_sent[worker]
            self._chars[worker] -= len(leaf.edge)
            if not leaf.last_sent and not leaf.children and leaf.parent is not None:
                del leaf.parent.children[leaf.edge[0]]

    def _oldest_leaf(self, worker: str) -> _Node | None:
        """The node of `worker` with no child of `worker`, sent least recently."""
        oldest, stack = None, [c for c in self.root.children.values() if worker in c.last_sent]
        while stack:
            node = stack.pop()
            below = [c for c in node.children.values() if worker in c.last_sent]
            if below:
                stack.extend(below)
            elif oldest is None or node.last_sent[worker] < oldest.last_sent[worker]:
                oldest = node
        return oldest

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut `child`'s edge at `at`; the new upper node keeps the workers, returned."""
        parent = child.parent
        upper = _Node(edge=child.edge[:at], last_sent=dict(child.last_sent), parent=parent)
        parent.children[upper.edge[0]] = upper
        child.edge = child.edge[at:]
        child.parent = upper
        upper.children[child.edge[0]] = child
        return upper

    def _prune(self, node: _Node) -> None:
        for key, child in list(node.children.items()):
            self._prune(child)
            if not child.last_sent and not child.children:
                del node.children[key]


def _common_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
