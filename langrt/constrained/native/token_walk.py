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
    pointer, int32 = ctypes.c_void_p, ctypes.c_int32
    # trie, table, dead, table rows, start state, escape rows, escape bits, below node, outputs
    library.langrt_token_walk.argtypes = [pointer, pointer, int32, int32, int32, pointer, pointer, int32, pointer]
    library.langrt_token_walk.restype = ctypes.c_int64
    return library


_library = LazyLibrary(_load, "token masks in numpy")


def _walk_function():
    """The library (its langrt_token_walk), built and loaded on first use; None where it cannot be."""
    return _library.get()


def reset() -> None:
    """Forget the library (tests that change LANGRT_CPU_KERNELS)."""
    _library.reset()


# token_walk.cpp's Node: one 64-byte cache line per trie node
NODE = np.dtype(
    [
        ("below", "<u4", 8),
        ("word", "<i4"),
        ("bit", "<u4"),
        ("skip", "<i4"),
        ("tokens", "<i4"),
        ("own_end", "<i4"),
        ("tokens_end", "<i4"),
        ("children", "<i4"),
        ("num_children", "<u2"),
        ("unused", "<u2"),
    ]
)
assert NODE.itemsize == 64


class _TrieArgs(ctypes.Structure):
    """token_walk.cpp's Trie."""

    _fields_ = [
        ("nodes", ctypes.c_void_p),
        ("children", ctypes.c_void_p),
        ("token_ids", ctypes.c_void_p),
        ("num_root_children", ctypes.c_int32),
        ("root_children", ctypes.c_int32),
        ("max_depth", ctypes.c_int32),
    ]


class _OutputArgs(ctypes.Structure):
    """token_walk.cpp's Output."""

    _fields_ = [
        ("words", ctypes.c_void_p),
        ("open", ctypes.c_void_p),
        ("escapes", ctypes.c_void_p),
        ("escape_states", ctypes.c_void_p),
        ("max_escapes", ctypes.c_int64),
    ]


class VocabTrie:
    """A vocabulary's tokens as a trie in preorder arrays (Python walks read them), and as the
    node lines and child lists token_walk.cpp reads."""

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
        parents = _parents(self.depth)
        self.nodes = _node_lines(self, parents)
        self.subtree_bytes = self.nodes["below"]
        self.children, self._root = _child_lists(self.node_byte, parents)
        self._args: _TrieArgs | None = None
        self._local = threading.local()

    def walk(
        self,
        library,
        table: "WalkTable",
        state: int,
        num_words: int,
        escapes: EscapeBits | None = None,
        below: int = -1,
    ) -> tuple[np.ndarray, np.ndarray | None, list[tuple[int, int]]]:
        """(words, open, nodes): the tokens readable from `state` of `table`, as int32 mask
        words. With a rule's `escapes`: only those read without leaving the rule, and `nodes`
        lists the trie nodes where a token, after one byte or more, reaches a byte `escapes`
        marks (their subtrees are walked beyond the rule), each with the rule's state before
        that byte; past MAX_ESCAPE_NODES those subtrees' tokens are set in `open` instead
        (None: no escapes given, or none there). With `below` a trie node: only the tokens
        below it (not its own), their bytes after the node's read from `state`."""
        scratch = self._scratch(num_words, escapes is not None)
        rows, bits = escapes.addresses if escapes is not None else (None, None)
        found = library.langrt_token_walk(
            self._address(), table.address, table.dead, table.num_states, state, rows, bits, below, scratch.address
        )
        return scratch.take(found & 0xFFFFFFFF, found >> 32)

    def _address(self) -> int:
        """The address of the C++ walk's Trie, made once (each `.ctypes.data` costs microseconds)."""
        if self._args is None:
            self._args = _TrieArgs(
                self.nodes.ctypes.data,
                self.children.ctypes.data,
                self.token_ids.ctypes.data,
                self._root[1] - self._root[0],
                self._root[0],
                self.max_depth,
            )
            self._args_at = ctypes.addressof(self._args)
        return self._args_at

    def _scratch(self, num_words: int, escapes: bool) -> "_Scratch":
        """This thread's output buffers (masks may be computed from several threads)."""
        found = getattr(self._local, "scratch", None)
        if found is None or found.words.size != num_words:
            found = self._local.scratch = _Scratch(num_words)
        found.args.max_escapes = MAX_ESCAPE_NODES if escapes else 0
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


def _parents(depth: np.ndarray) -> np.ndarray:
    """Per node (preorder), its parent: the last node before it one level up (-1: the root)."""
    parents = np.full(len(depth), -1, dtype=np.int64)
    for d in range(2, int(depth.max(initial=0)) + 1):
        children = np.flatnonzero(depth == d)
        above = np.flatnonzero(depth == d - 1)
        parents[children] = above[np.searchsorted(above, children) - 1]
    return parents


def _node_lines(trie: VocabTrie, parents: np.ndarray) -> np.ndarray:
    """The trie's nodes as token_walk.cpp's 64-byte lines, the array aligned to a line."""
    n, offsets = len(trie.depth), trie.node_tokens
    raw = np.zeros((n + 1) * NODE.itemsize, dtype=np.uint8)
    shift = -raw.ctypes.data % NODE.itemsize
    nodes = raw[shift : shift + n * NODE.itemsize].view(NODE)
    nodes["below"] = _subtree_bytes(trie.node_byte, trie.depth, parents)
    has = offsets[1:] > offsets[:-1]
    first = trie.token_ids[np.minimum(offsets[:-1], len(trie.token_ids) - 1)].astype(np.int64) if n else offsets[:0]
    nodes["word"] = np.where(has, first >> 5, 0)
    nodes["bit"] = np.where(has, np.int64(1) << (first & 31), 0)
    nodes["skip"] = trie.skip
    nodes["tokens"], nodes["own_end"], nodes["tokens_end"] = offsets[:-1], offsets[1:], offsets[trie.skip]
    counts = np.bincount(parents[parents >= 0], minlength=n)
    nodes["num_children"] = counts
    nodes["children"] = np.cumsum(counts) - counts + np.count_nonzero(parents < 0)  # the root's come first
    return nodes


def _child_lists(node_byte: np.ndarray, parents: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    """Every node's children, parent after parent (the root's first) in byte order, as
    (node << 8 | byte) words; and where the root's are."""
    assert len(node_byte) < 1 << 24, "trie nodes are numbered in 24 bits"
    order = np.argsort(parents, kind="stable")  # preorder keeps siblings in byte order
    entries = (order.astype(np.uint32) << np.uint32(8)) | node_byte[order].astype(np.uint32)
    return np.ascontiguousarray(entries), (0, int(np.count_nonzero(parents < 0)))


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
        self.nodes, self.states = np.empty((2, MAX_ESCAPE_NODES), dtype=np.int32)
        self.args = _OutputArgs(
            self.words.ctypes.data, self.open.ctypes.data, self.nodes.ctypes.data, self.states.ctypes.data, 0
        )
        self.address = ctypes.addressof(self.args)

    def take(self, n: int, opened: int) -> tuple[np.ndarray, np.ndarray | None, list[tuple[int, int]]]:
        words = self.words.copy()
        self.words.fill(0)
        open_ = None
        if opened:
            open_ = self.open.copy()
            self.open.fill(0)
        return words, open_, list(zip(self.nodes[:n].tolist(), self.states[:n].tolist()))


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


def _subtree_bytes(node_byte: np.ndarray, depth: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """Per node (preorder), the bytes on the edges below it as 256 bits ([nodes, 8] uint32):
    folded up one depth at a time, a node's children being consecutive among its depth's."""
    below = np.zeros((len(depth), 8), dtype=np.uint32)
    if not len(depth):
        return below
    own = np.zeros((len(depth), 8), dtype=np.uint32)
    own[np.arange(len(depth)), node_byte >> 5] = np.uint32(1) << (node_byte & 31).astype(np.uint32)
    for d in range(int(depth.max()), 1, -1):
        children = np.flatnonzero(depth == d)
        up = parents[children]
        starts = np.flatnonzero(np.r_[True, up[1:] != up[:-1]])
        below[up[starts]] |= np.bitwise_or.reduceat(below[children] | own[children], starts, axis=0)
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
