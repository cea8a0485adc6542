"""Which bytes may come next where a rule calls another or ends, whatever the stack: the
classic FIRST and FOLLOW sets, over the rules' DFAs, as 256-bit ints.

The masks (masks.py) use them to keep the candidates walked past a rule's boundary to tokens
whose next byte could be read there: after `":" ws` in an object, where `value` is called, a
token ` hello` cannot go on (`h` starts no value), so it is never walked.
"""

from __future__ import annotations

import numpy as np

from langrt.constrained.byte_dfa import ByteDFA

Calls = dict[int, list[tuple[int, int]]]


class Lookahead:
    def __init__(self, rules: list[ByteDFA], calls: list[Calls]):
        self.rules, self.calls = rules, calls
        self._live = [_live_bytes(r) for r in rules]
        self.nullable = self._fix(lambda r: self._ends(r, rules[r].initial, set()), False)
        self.first = self._fix(lambda r: self._starts(r, rules[r].initial, set()), 0)
        self.follow = self._follows()

    def _fix(self, compute, start):
        """Iterate `compute` over every rule until nothing changes."""
        self._values = values = [start] * len(self.rules)
        changed = True
        while changed:
            changed = False
            for r in range(len(self.rules)):
                value = compute(r)
                if value != values[r]:
                    values[r], changed = value, True
        return values

    def _ends(self, r: int, s: int, seen: set) -> bool:
        """Rule r may end from state s reading nothing (through nullable calls)."""
        if self.rules[r].accepting[s]:
            return True
        if s in seen:
            return False
        seen.add(s)
        return any(self._values[c] and self._ends(r, t, seen) for c, t in self.calls[r].get(s, ()))

    def _starts(self, r: int, s: int, seen: set) -> int:
        """The bytes readable next in rule r from state s before it returns (FIRST of the calls
        there, and past the nullable ones)."""
        if s in seen:
            return 0
        seen.add(s)
        found = self._live[r][s]
        for c, t in self.calls[r].get(s, ()):
            found |= self._values[c]
            if self.nullable[c]:
                found |= self._starts(r, t, seen)
        return found

    def starts(self, r: int, s: int) -> int:
        self._values = self.first
        return self._starts(r, s, set())

    def ends(self, r: int, s: int) -> bool:
        self._values = self.nullable
        return self._ends(r, s, set())

    def _follows(self) -> list[int]:
        """FOLLOW per rule: the bytes after its end, at any of its call sites."""
        sites = [(p, t, c) for p in range(len(self.rules)) for edges in self.calls[p].values() for c, t in edges]
        # what follows a call site within its rule is fixed (FIRST and nullable are known): found
        # once per site, not once per round of the fixpoint (a large schema has thousands)
        after = {(p, t): (self.starts(p, t), self.ends(p, t)) for p, t, _ in sites}
        follow = [0] * len(self.rules)
        changed = True
        while changed:
            changed = False
            for p, t, c in sites:
                starts, ends = after[(p, t)]
                value = follow[c] | starts | (follow[p] if ends else 0)
                if value != follow[c]:
                    follow[c], changed = value, True
        return follow

    def boundary_rows(self, r: int) -> dict[int, int]:
        """after_boundary for every state of rule r where it calls a rule or may end, in one
        pass (a rule's first mask needs them all)."""
        calls, accepting = self.calls[r], self.rules[r].accepting
        ends_at = np.flatnonzero(accepting[: self.rules[r].num_states]).tolist()
        rows = dict.fromkeys(ends_at, self.follow[r])
        first, nullable = self.first, self.nullable
        for s, edges in calls.items():
            found = rows.get(s, 0)
            for c, t in edges:
                found |= first[c] | (self.starts(r, t) if nullable[c] else 0)
            if s not in rows and any(nullable[c] for c, _ in edges) and self.ends(r, s):
                found |= self.follow[r]  # ends through a nullable call
            rows[s] = found
        return rows

    def after_boundary(self, r: int, s: int) -> int:
        """The bytes that may be read at state s of rule r by leaving it (calling a rule there,
        or returning from r), as a 256-bit int."""
        found = 0
        for c, t in self.calls[r].get(s, ()):
            found |= self.first[c] | (self.starts(r, t) if self.nullable[c] else 0)
        if self.ends(r, s):
            found |= self.follow[r]
        return found


def _live_bytes(dfa: ByteDFA) -> list[int]:
    """Per state, the bytes leading on, as a 256-bit int."""
    bits = np.packbits(dfa.table != dfa.dead, axis=1, bitorder="little")
    return [int.from_bytes(row.tobytes(), "little") for row in bits]
