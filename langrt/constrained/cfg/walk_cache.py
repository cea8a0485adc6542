"""Rule walks shared across grammars: the trie walk of a rule's DFA from one state (the tokens
read inside the rule, and where tokens leave it) depends only on that DFA and on which bytes
may leave it at each state, not on the stack below nor on the grammar around it. Rules built
from the same text share one DFA across the grammars a compiler builds (build.RuleCache), so
the `string`, `integer` or `date-time` rules of one schema walk once for every later schema
whose boundaries match.

Entries hold their DFA, so the id in a key cannot be reused while the entry lives. Least
recently used first out, bounded by the bytes of the masks kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from langrt.constrained.byte_dfa import ByteDFA

# (inner words, open words or None, escape trie nodes with the states before them):
# native/token_walk.VocabTrie.walk's result
Walk = tuple[np.ndarray, np.ndarray | None, list[tuple[int, int]]]

# Why 64 MB: a walk keeps one or two masks of the vocabulary (6 KB each at 49k tokens, 32 KB at
# 262k), so a few thousand rule states stay warm, more than the shared rules of a schema corpus
# have (a `string` rule is a handful of states).
MAX_BYTES = 64 << 20


class RuleWalks:
    """Walks by (rule DFA, its escape rows, state); thread-safe (a compile thread and the
    scheduler's mask fills both read it)."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes, self.bytes, self.hits, self.misses = max_bytes, 0, 0, 0
        self._found: OrderedDict[tuple, tuple[ByteDFA, Walk]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, dfa: ByteDFA, escapes_key: bytes, state: int, walk: Callable[[], Walk]) -> Walk:
        key = (id(dfa), escapes_key, state)
        with self._lock:
            found = self._found.get(key)
            if found is not None and found[0] is dfa:
                self._found.move_to_end(key)
                self.hits += 1
                return found[1]
        result = walk()
        self._keep(key, dfa, result)
        return result

    def _keep(self, key: tuple, dfa: ByteDFA, result: Walk) -> None:
        size = result[0].nbytes + (result[1].nbytes if result[1] is not None else 0)
        with self._lock:
            self.misses += 1
            old = self._found.pop(key, None)
            if old is not None:
                self.bytes -= _size(old[1])
            self._found[key] = (dfa, result)
            self.bytes += size
            while self.bytes > self.max_bytes and self._found:
                _, (_, dropped) = self._found.popitem(last=False)
                self.bytes -= _size(dropped)


def _size(walk: Walk) -> int:
    return walk[0].nbytes + (walk[1].nbytes if walk[1] is not None else 0)
