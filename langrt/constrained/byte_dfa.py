"""A regex as a deterministic automaton over bytes, built by outlines-core.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_EOS = 256  # the byte vocabulary's end-of-sequence id
_END_MARKER = "\\x{10FFFF}"
_END_BYTES = "\U0010FFFF".encode("utf-8")


@dataclass
class ByteDFA:
    table: np.ndarray  # [num_states + 1, 256] int32 next state; row `dead` maps to itself
    accepting: np.ndarray  # [num_states + 1] bool
    initial: int

    @property
    def dead(self) -> int:
        return self.table.shape[0] - 1

    @property
    def num_states(self) -> int:
        return self.table.shape[0] - 1

    def __post_init__(self):
        # Python lists for the per-token walk (indexing numpy scalars one at a time is slower).
        self._rows = self.table.tolist()
        self._live = (self.table[:, :] != self.dead).any(axis=1)

    def walk(self, state: int, data: bytes) -> int:
        """The state after `data`, or `dead`."""
        rows, dead = self._rows, self.dead
        for byte in data:
            state = rows[state][byte]
            if state == dead:
                return dead
        return state

    def has_exit(self, state: int) -> bool:
        """Some byte leads on from `state`."""
        return bool(self._live[state])

    def forced_bytes(self, state: int, limit: int = 256) -> bytes:
        """The bytes every continuation from `state` must start with: followed while exactly one
        byte leads on and the state does not accept (where it could also end)."""
        out = bytearray()
        rows, dead = self._rows, self.dead
        while len(out) < limit and not self.accepting[state]:
            nexts = [(b, s) for b, s in enumerate(rows[state]) if s != dead]
            if len(nexts) != 1:
                break
            byte, state = nexts[0]
            out.append(byte)
        return bytes(out)


def build_byte_dfa(regex: str, max_states: int) -> ByteDFA:
    """Compile `regex` (raises ValueError with outlines-core's message if it rejects it, or if
    the automaton exceeds `max_states`)."""
    from outlines_core import Index, Vocabulary

    vocabulary = Vocabulary(_EOS, {bytes([b]): [b] for b in range(256)})
    try:
        index = Index(f"(?:{regex}){_END_MARKER}", vocabulary)
    except Exception as e:  # outlines-core raises plain exceptions with the parser's message
        raise ValueError(str(e)) from None
    transitions = index.get_transitions()
    if len(transitions) > max_states:
        raise ValueError(f"the regex's automaton has {len(transitions)} states, over the limit of {max_states}")
    states = sorted(transitions)
    number = {s: i for i, s in enumerate(states)}
    dead = len(states)
    table = np.full((dead + 1, 256), dead, dtype=np.int32)
    for s, edges in transitions.items():
        for byte, target in edges.items():
            if byte != _EOS:
                table[number[s], byte] = number[target]
    final = np.zeros(dead + 1, dtype=bool)
    for s in index.get_final_states():
        final[number[s]] = True
    accepting = np.zeros(dead + 1, dtype=bool)
    for row in range(dead):
        state = row
        for byte in _END_BYTES:
            state = table[state, byte]
        accepting[row] = final[state]
    table[:, _END_BYTES[0]] = dead
    return ByteDFA(table, accepting, number[index.get_initial_state()])


def compile_worker_main() -> None:
    """The grammar worker process (`python -m langrt.constrained.byte_dfa`): read (regex,
    max_states) requests from stdin and write ByteDFA parts or an error to stdout, forever;
    exits when its parent does (see service.py for why it is a separate process)."""
    import os
    import pickle
    import struct
    import sys
    import threading
    import time

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = stdin.read(8)
        if len(header) < 8:
            return
        regex, max_states = pickle.loads(stdin.read(struct.unpack("<Q", header)[0]))
        try:
            dfa = build_byte_dfa(regex, max_states)
            reply = (True, (dfa.table, dfa.accepting, dfa.initial))
        except ValueError as e:
            reply = (False, str(e))
        data = pickle.dumps(reply, protocol=5)
        stdout.write(struct.pack("<Q", len(data)) + data)
        stdout.flush()


if __name__ == "__main__":
    compile_worker_main()
