"""Token masks by a walk of the vocabulary's trie in C++ (token_walk.cpp): from one automaton
state, every token whose bytes the automaton reads without dying, each shared prefix read once,
a dead prefix's whole subtree skipped, and a subtree whose bytes all loop on the state reached
marked whole (inside a free string, most of the trie). masks.TokenMasks uses it where it loads; elsewhere
(no C++ compiler, LANGRT_CPU_KERNELS=0) its numpy walk gives the same masks.

The library is plain C++ (no vector instructions: the trie walk is a chain of table lookups),
built on first use by build.py.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from langrt.constrained.native.build import LazyLibrary, build_library
from langrt.constrained.per_vocab import PerVocabCache

SOURCE = Path(__file__).with_name("token_walk.cpp")


def _load():
    library = build_library(SOURCE)
    pointer, head = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32]
    sizes = [ctypes.c_int64, ctypes.c_int32, ctypes.c_int32]  # nodes, trie depth, table rows
    library.langrt_token_walk.argtypes = head + [pointer] * 9 + sizes + [pointer] * 3 + [ctypes.c_int64, pointer]
    library.langrt_token_walk.restype = ctypes.c_int64
    return library


_library = LazyLibrary(_load, "token masks in numpy")


def _walk_function():
    """The library (its langrt_token_walk), built and loaded on first use; None where it cannot be."""
    return _library.get()


def reset() -> None:
    """Forget the library (tests that change LANGRT_CPU_KERNELS)."""
    _library.reset()


class VocabTrie:
    """A vocabulary's tokens as a trie in preorder arrays (what token_walk.cpp reads)."""

    def __init__(self, token_bytes: list):
        spelled: dict[bytes, list[int]] = {}
        for token, spelling in enumerate(token_bytes):
            if spelling:
                spelled.setdefault(bytes(spelling), []).append(token)
        node_byte, depth, counts, ids, previous = [], [], [], [], b""
        for word in sorted(spelled):  # sorted: a word's new nodes follow its shared prefix (preorder)
            shared = common_prefix(previous, word)
            for d in range(shared, len(word)):
                node_byte.append(word[d])
                depth.append(d + 1)
                counts.append(0)
            counts[-1] = len(spelled[word])
            ids += spelled[word]
            previous = word
        self.node_byte = np.array(node_byte, dtype=np.uint8)
        self.depth = np.array(depth, dtype=np.int32)
        self.skip = _subtree_ends(depth)
        self.node_tokens = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        self.token_ids = np.array(ids, dtype=np.int32)
        self.max_depth = int(self.depth.max(initial=0))
        self._lists = None
        # per node, the word and bit of the first token it spells (0 and 0 where none)
        has = self.node_tokens[1:] > self.node_tokens[:-1]
        first = (
            self.token_ids[np.minimum(self.node_tokens[:-1], len(ids) - 1)].astype(np.int64)
            if ids
            else np.zeros(0, np.int64)
        )
        self.node_word = np.where(has, first >> 5, 0).astype(np.int32)
        self.node_bit = np.where(has, np.int64(1) << (first & 31), 0).astype(np.uint32)
        self.subtree_bytes = _subtree_bytes(self.node_byte, self.depth)
        self._pointers: tuple[int, ...] | None = None
        self._local = threading.local()

    def walk(
        self, library, table: "WalkTable", state: int, num_words: int, escapes: EscapeBits | None = None
    ) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
        """(words, open, nodes): the tokens readable from `state` of `table`, as int32 mask
        words. With a rule's `escapes`: only those read without leaving the rule, and `nodes`
        lists the trie nodes where a token, after one byte or more, reaches a byte `escapes`
        marks (their subtrees are walked beyond the rule); past MAX_ESCAPE_NODES those
        subtrees' tokens are set in `open` instead (None: no escapes given, or none there)."""
        scratch = self._scratch(num_words)
        rows, bits = escapes.addresses if escapes is not None else (None, None)
        n = library.langrt_token_walk(
            table.address,
            table.dead,
            state,
            rows,
            bits,
            *self._addresses(),
            self.node_byte.size,
            self.max_depth,
            table.num_states,
            scratch.words_at,
            scratch.open_at,
            scratch.nodes_at,
            MAX_ESCAPE_NODES if escapes is not None else 0,
            self._subtree_at,
        )
        return scratch.take(escapes is not None, n)

    def _addresses(self) -> tuple[int, ...]:
        """The trie arrays' addresses, taken once (each `.ctypes.data` costs microseconds)."""
        if self._pointers is None:
            arrays = (
                self.node_byte,
                self.depth,
                self.skip,
                self.node_tokens,
                self.token_ids,
                self.node_word,
                self.node_bit,
            )
            self._pointers = tuple(a.ctypes.data for a in arrays)
            self._subtree_at = self.subtree_bytes.ctypes.data
        return self._pointers

    def _scratch(self, num_words: int) -> "_Scratch":
        """This thread's output buffers (masks may be computed from several threads)."""
        found = getattr(self._local, "scratch", None)
        if found is None or found.words.size != num_words:
            found = self._local.scratch = _Scratch(num_words)
        return found

    def lists(self) -> tuple[list, list, list, list, list]:
        """The trie as Python lists (node byte, depth, skip, token offsets, token ids), for
        walks in Python (cfg/masks.py); made on first use."""
        if self._lists is None:
            self._lists = (
                self.node_byte.tolist(),
                self.depth.tolist(),
                self.skip.tolist(),
                self.node_tokens.tolist(),
                self.token_ids.tolist(),
            )
        return self._lists


class EscapeBits:
    """Per state of a rule's DFA, the bytes that may leave the rule there, packed: `row[s]` is
    -1 or the index of s's 256 bits (8 uint32 words) in `bits`. `escapes`: {state: 256-bit int}."""

    def __init__(self, num_states: int, escapes: dict[int, int]):
        self.row = np.full(num_states + 1, -1, dtype=np.int32)
        states = sorted(escapes)
        self.row[states] = np.arange(len(states), dtype=np.int32)
        packed = b"".join(escapes[s].to_bytes(32, "little") for s in states)
        self.bits = np.frombuffer(packed, dtype="<u4").reshape(len(states), 8).copy()
        self.addresses = (self.row.ctypes.data, self.bits.ctypes.data)
        # what the rows say, whichever rule they belong to: rules built from the same text
        # share a DFA across grammars, and their walks are shared where these match too
        self.key = self.row.tobytes() + self.bits.tobytes()


class WalkTable:
    """A DFA's transition table as the C++ walk reads it: int32 in C order, its address taken
    once."""

    def __init__(self, table: np.ndarray, dead: int):
        self.table = np.ascontiguousarray(table, dtype=np.int32)
        self.dead, self.num_states = int(dead), self.table.shape[0]
        self.address = self.table.ctypes.data


class _Scratch:
    """One thread's buffers for the walk's outputs, their addresses taken once; `take` copies
    the results out and clears them for the next walk."""

    def __init__(self, num_words: int):
        self.words, self.open = np.zeros(num_words, np.int32), np.zeros(num_words, np.int32)
        self.nodes = np.empty(MAX_ESCAPE_NODES, dtype=np.int32)
        self.words_at, self.open_at, self.nodes_at = (
            self.words.ctypes.data,
            self.open.ctypes.data,
            self.nodes.ctypes.data,
        )

    def take(self, escapes: bool, n: int) -> tuple[np.ndarray, np.ndarray | None, list[int]]:
        words = self.words.copy()
        self.words.fill(0)
        open_ = None
        if escapes and self.open.any():
            open_ = self.open.copy()
            self.open.fill(0)
        return words, open_, self.nodes[:n].tolist()


# Why 256: escape nodes are where a token leaves a rule (a delimiter then a value's first byte);
# a state has a handful; past this many their tokens are walked one by one instead.
MAX_ESCAPE_NODES = 256

_tries: PerVocabCache[VocabTrie] = PerVocabCache(lambda vocab: VocabTrie(vocab.token_bytes))


def vocab_trie(vocab) -> tuple[object, VocabTrie] | None:
    """(the C function, the vocabulary's trie), or None where the library cannot be used."""
    function = _walk_function()
    if function is None:
        return None
    return function, _tries.get(vocab)


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _subtree_bytes(node_byte: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Per node (preorder), the bytes on the edges below it as 256 bits ([nodes, 8] uint32):
    folded up one depth at a time, a node's children being consecutive among its depth's."""
    below = np.zeros((len(depth), 8), dtype=np.uint32)
    if not len(depth):
        return below
    own = np.zeros((len(depth), 8), dtype=np.uint32)
    own[np.arange(len(depth)), node_byte >> 5] = np.uint32(1) << (node_byte & 31).astype(np.uint32)
    for d in range(int(depth.max()), 1, -1):
        children = np.flatnonzero(depth == d)
        above = np.flatnonzero(depth == d - 1)
        parents = above[np.searchsorted(above, children) - 1]  # the last node one level up before each
        starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
        below[parents[starts]] |= np.bitwise_or.reduceat(below[children] | own[children], starts, axis=0)
    return below


def _subtree_ends(depth: list[int]) -> np.ndarray:
    """Per node (preorder), the index of the first node after its subtree."""
    ends = np.full(len(depth), len(depth), dtype=np.int32)
    open_nodes: list[int] = []
    for i, d in enumerate(depth):
        while open_nodes and depth[open_nodes[-1]] >= d:
            ends[open_nodes.pop()] = i
        open_nodes.append(i)
    return ends
