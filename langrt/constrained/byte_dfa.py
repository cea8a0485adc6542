"""A regex as a deterministic automaton over bytes: built in C++ (native/regex_dfa.py, minimal
and with no markers) where the library loads and the regex is in the compilers' subset, and
otherwise by outlines-core, as follows.

outlines-core's `Index` maps a regex and a vocabulary to a token-level automaton. Given the 256
single bytes as the vocabulary, that automaton *is* the byte-level DFA of the regex (UTF-8
multi-byte characters become chains of states), built in Rust in milliseconds. Token masks for
the real vocabulary are then computed lazily, per state reached (`masks.py`).

The regex is matched whole: generation must end in an accepting state.

outlines-core's Index drops every transition out of a state where the regex has matched so far
unless the token also ends in a full match (regex-automata reports matches one byte late, and
the Index reads that as "complete"): for `1(x2)?` it keeps "1" and forgets "1x2". So the regex
is compiled with an end marker, U+10FFFF (bytes F4 8F BF BF), appended: then nothing matches
before the very end and no transition is lost. A state accepts exactly when the marker can be
read from it; afterwards every F4 edge is removed. The cost: constrained output never contains
characters U+100000-U+10FFFF (Supplementary Private Use Area-B).

The regex also gets a start marker, U+10FFFE, prepended, and the automaton starts after it.
outlines-core determinises the unanchored search too (a match may start anywhere), and with no
match before the end marker that search must track every position where the regex could have
started (30x slower for the JSON "any value" regex, see benchmarks/README.md). Behind a start marker
the regex never reads (the JSON-schema compiler leaves plane 16 out of its classes), at most
one match is ever in progress, so the unanchored automaton is no bigger than the anchored one.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

_EOS = 256  # the byte vocabulary's end-of-sequence id
_START_MARKER = "\\x{10FFFE}"
_START_BYTES = "\U0010fffe".encode("utf-8")
_END_MARKER = "\\x{10FFFF}"
_END_BYTES = "\U0010ffff".encode("utf-8")


class ByteAutomaton(ABC):
    """What matchers, masks and jump-forward ask of an automaton over bytes, whatever builds it:
    a regex's DFA (ByteDFA, below) or a grammar's pushdown automaton (cfg/pda.py). States are
    ints; `dead` is the state nothing leads on from. Subclasses give `dead`, `initial`,
    `row(state)` (the next state of each of the 256 bytes), `accepts(state)` and
    `has_exit(state)`; the rest is written here once."""

    dead: int
    initial: int

    def _init_memos(self) -> None:
        self._space_choice: dict[int, bool] = {}
        self._forced: dict[tuple[int, int, bool | None], bytes] = {}

    @abstractmethod
    def row(self, state: int) -> list[int]:
        """The state after each of the 256 bytes (`dead` where none)."""

    @abstractmethod
    def accepts(self, state: int) -> bool:
        """The automaton may end in `state` (the text so far is complete)."""

    @abstractmethod
    def has_exit(self, state: int) -> bool:
        """Some byte leads on from `state`."""

    def step(self, state: int, byte: int) -> int:
        return self.row(state)[byte]

    def is_space_choice(self, state: int) -> bool:
        """An optional space: after a space, exactly the same bytes lead on as without one
        (JSON's optional space after ':' and ','). Jump-forward drafts run through these,
        guessing the output's habit. Decided on first visit (a few µs)."""
        choice = self._space_choice.get(state)
        if choice is None:
            row = self.row(state)
            after = row[0x20]
            if after == self.dead or after == state:
                choice = False
            else:
                without = list(row)
                without[0x20] = self.dead
                choice = self.row(after) == without
            self._space_choice[state] = choice
        return choice

    def walk_noting_space(self, state: int, data: bytes) -> tuple[int, bool | None]:
        """The state after `data` (or `dead`), and whether a space was taken at the last space
        choice passed (None if none was passed)."""
        dead, spaced = self.dead, None
        for byte in data:
            if self.is_space_choice(state):
                spaced = byte == 0x20
            state = self.step(state, byte)
            if state == dead:
                return dead, spaced
        return state, spaced

    def in_run(self, state: int) -> bool:
        """One byte leads on (or an optional space and what follows it): `state` lies inside
        forced text, where jump-forward drafts."""
        return bool(self.forced_bytes(state, limit=1, space=True))

    def forced_bytes(self, state: int, limit: int = 256, space: bool | None = None) -> bytes:
        """The bytes every continuation from `state` must start with: followed while exactly one
        byte leads on and the state does not accept (where it could also end). With `space`
        set, also through space choices (taking the space or not as told): then the bytes are
        a likely continuation, not a forced one. Memoized."""
        key = (state, limit, space)
        found = self._forced.get(key)
        if found is None:
            found = self._forced[key] = self._follow_forced(state, limit, space)
        return found

    def _follow_forced(self, state: int, limit: int, space: bool | None) -> bytes:
        out = bytearray()
        dead = self.dead
        while len(out) < limit and not self.accepts(state):
            nexts = [(b, s) for b, s in enumerate(self.row(state)) if s != dead]
            if space is not None and len(nexts) > 1 and self.is_space_choice(state):
                nexts = [n for n in nexts if (n[0] == 0x20) == space]
            if len(nexts) != 1:
                break
            byte, state = nexts[0]
            out.append(byte)
        return bytes(out)


@dataclass
class ByteDFA(ByteAutomaton):
    """A regex's automaton as a dense table."""

    table: np.ndarray  # [num_states + 1, 256] int32 next state; row `dead` maps to itself
    accepting: np.ndarray  # [num_states + 1] bool
    initial: int
    counted: object = None  # dfa_product.Counted: a counted string's states, whose masks repeat

    @property
    def dead(self) -> int:
        return self.table.shape[0] - 1

    @property
    def num_states(self) -> int:
        return self.table.shape[0] - 1

    def __post_init__(self):
        # Rows as Python lists for the per-token walk (indexing numpy scalars one at a time is
        # slower), made on first visit: converting a big table up front cost more than a compile.
        self._rows: dict[int, list[int]] = {}
        self._live = (self.table != self.dead).any(axis=1)
        self._init_memos()

    def row(self, state: int) -> list[int]:
        r = self._rows.get(state)
        if r is None:
            r = self._rows[state] = self.table[state].tolist()
        return r

    def accepts(self, state: int) -> bool:
        return bool(self.accepting[state])

    def has_exit(self, state: int) -> bool:
        return bool(self._live[state])


def build_byte_dfa(regex: str, max_states: int) -> ByteDFA:
    """Compile `regex` (raises ValueError with outlines-core's message if it rejects it, or if
    the automaton exceeds `max_states`)."""
    table, accepting, initial, _ = _built_table(regex, max_states)
    table[:, _END_BYTES[0]] = table.shape[0] - 1  # both markers start with F4
    return ByteDFA(table, accepting, initial)


# A grammar rule's body is a regex in which calling rule i is the character CALL_BASE + i
# (plane 16, which constrained text never contains; U+10FFFE/F are the start and end markers).
CALL_BASE = 0x100000
MAX_RULES = 0xFFFE


def call_marker(rule: int) -> str:
    """The regex text that calls rule number `rule` inside another rule's body."""
    return "\\x{%X}" % (CALL_BASE + rule)


def build_rule_dfa(regex: str, max_states: int) -> tuple[ByteDFA, dict[int, list[tuple[int, int]]]]:
    """A grammar rule's body (see call_marker) as a byte DFA without its call edges, and those
    edges: {state: [(callee, state after the call)]}. A body from dfa_product.intersection_body
    is built there (it calls no rule)."""
    from langrt.constrained import dfa_product

    if regex.startswith(dfa_product.INTERSECTION_PREFIX):
        return dfa_product.build_intersection(regex, max_states), {}
    table, accepting, initial, plane16 = _built_table(regex, max_states)
    dead = table.shape[0] - 1
    calls: dict[int, list[tuple[int, int]]] = {}
    edges = marker_edges(table) if plane16 is None else plane16.tolist()  # outlines-core's: follow F4 here
    for state, rule, after in edges:
        calls.setdefault(state, []).append((rule, after))
    table[:, 0xF4] = dead
    return ByteDFA(table, accepting, initial), calls


def marker_edges(table: np.ndarray) -> list[tuple[int, int, int]]:
    """(state, rule, state after) for every call marker a table's F4 bytes spell."""
    dead = table.shape[0] - 1
    return [
        (s, r, a)
        for s in np.flatnonzero(table[:, 0xF4] != dead).tolist()
        for r, a in _marker_paths(table, int(table[s, 0xF4]), dead)
    ]


def _marker_paths(table: np.ndarray, state: int, dead: int) -> list[tuple[int, int]]:
    """The plane-16 characters readable after an F4 byte (from `state`): (rule, state after
    it) for each call marker; the end marker and anything else are left out."""
    found, level = [], [(state, 0)]
    for _ in range(3):  # the three continuation bytes 80-BF
        level = [
            (int(t), code << 6 | (b & 0x3F))
            for s, code in level
            for b, t in zip(range(0x80, 0xC0), table[s, 0x80:0xC0].tolist())
            if t != dead
        ]
    for after, code in level:
        rule = (0x100000 | code) - CALL_BASE
        if 0 <= rule < MAX_RULES:
            found.append((rule, after))
    return found


def _built_table(regex: str, max_states: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray | None]:
    """(table, accepting, initial, plane-16 edges) from the C++ builder, else outlines-core's
    table (edges None: its F4 bytes also lead to the end marker)."""
    from langrt.constrained.native import regex_dfa

    if (built := regex_dfa.build(regex, max_states)) is not None:
        return built
    return (*_marked_table(regex, max_states), None)


def _marked_table(regex: str, max_states: int) -> tuple[np.ndarray, np.ndarray, int]:
    """outlines-core's automaton: `regex` between the start and end markers as a dense table
    (F4 edges still in), the accepting flags (the end marker readable) and the state after the
    start marker."""
    from outlines_core import Index, Vocabulary

    vocabulary = Vocabulary(_EOS, {bytes([b]): [b] for b in range(256)})
    try:
        index = Index(f"{_START_MARKER}(?:{regex}){_END_MARKER}", vocabulary)
    except Exception as e:  # outlines-core raises plain exceptions with the parser's message
        raise ValueError(str(e)) from None
    transitions = index.get_transitions()
    if len(transitions) > max_states:
        raise ValueError(f"the regex's automaton has {len(transitions)} states, over the limit of {max_states}")
    table, final, number = _dense_table(transitions, index.get_final_states())
    dead = table.shape[0] - 1
    # A state accepts when the end marker can be read from it into a final state.
    state = np.arange(dead + 1)
    for byte in _END_BYTES:
        state = table[state, byte]
    accepting = final[state]
    accepting[dead] = False
    initial = int(np.searchsorted(number, index.get_initial_state()))
    for byte in _START_BYTES:
        initial = int(table[initial, byte])
    return table, accepting, initial


def _dense_table(transitions: dict, finals) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """outlines-core's {state: {byte: state}} as a dense [states + 1, 256] table (last row: the
    dead state), the final flags, and the sorted outlines state ids (row i is number[i]).
    Built from whole lists (C speed): a per-edge Python loop cost ~30 ms per 2k states."""
    number = np.array(sorted(transitions), dtype=np.int64)
    dead = len(number)
    edges = [transitions[s] for s in number.tolist()]
    src = np.repeat(np.arange(dead, dtype=np.int64), np.fromiter(map(len, edges), dtype=np.int64, count=dead))
    byte = np.fromiter(itertools.chain.from_iterable(edges), dtype=np.int64, count=src.size)
    targets = np.fromiter(itertools.chain.from_iterable(e.values() for e in edges), dtype=np.int64, count=src.size)
    dst = np.searchsorted(number, targets)
    keep = byte != _EOS
    table = np.full((dead + 1, 256), dead, dtype=np.int32)
    table[src[keep], byte[keep]] = dst[keep]
    final = np.zeros(dead + 1, dtype=bool)
    final[np.searchsorted(number, np.array(sorted(finals), dtype=np.int64))] = True
    return table, final, number


def compile_worker_main() -> None:
    """The grammar worker process (`python -m langrt.constrained.byte_dfa`): read (regex,
    max_states, is_rule) requests from stdin and write ByteDFA parts (and a rule's calls) or an
    error to stdout, forever;
    exits when its parent does (see service.py for why it is a separate process)."""
    import os
    import sys
    import threading
    import time

    from langrt import pickle_pipe

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    for regex, max_states, is_rule in pickle_pipe.messages(sys.stdin.buffer):
        try:
            dfa, calls = build_rule_dfa(regex, max_states) if is_rule else (build_byte_dfa(regex, max_states), None)
            reply = (True, (dfa.table, dfa.accepting, dfa.initial, dfa.counted, calls))
        except ValueError as e:
            reply = (False, str(e))
        pickle_pipe.send(sys.stdout.buffer, reply)


if __name__ == "__main__":
    compile_worker_main()
