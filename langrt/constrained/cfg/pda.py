"""A context-free grammar as a pushdown automaton over bytes, determinised lazily.

Each rule (rules.py) is a byte DFA whose call edges push: a *frame* is (rule, DFA state, the
frame to return to), and a stack is its top frame. Calling rule q from state s of rule r, with
t the state after the call, pushes (q, q's start, (r, t, ...)); where rule r may end, the stack
pops to its return frame. Frames are interned (a stack is one int, and stacks share their
tails), so a *configuration*, every stack the text read so far may be in, is a frozenset of ints
and is itself interned: it is the automaton's state. A configuration is closed: it holds every
stack reachable by calls and returns without reading a byte, so stepping reads the byte in each
stack's top rule only.

Configurations and their byte steps are built on first use and memoized, so a grammar that does
not recurse becomes, as text is read, the DFA it stands for; a recursive one stays finite in
what a generation visits. Stack depth is unbounded (nesting costs one frame per level).
"""

from __future__ import annotations

import numpy as np

from langrt.constrained.byte_dfa import ByteAutomaton, ByteDFA

_END = 0  # the frame below the start rule's: reached when the whole grammar may end
# Why 10,000: an ambiguous grammar keeps one stack per way of reading the text; past this many
# the automaton is exploding and would not keep up with decoding.
MAX_STACKS = 10_000


class GrammarTooAmbiguous(ValueError):
    pass


class PushdownAutomaton(ByteAutomaton):
    dead = 0  # the empty configuration

    def __init__(self, rules: list[ByteDFA], calls: list[dict[int, list[tuple[int, int]]]], names: list[str]):
        self.rules, self.calls, self.names = rules, calls, names
        self._tables = [r.table for r in rules]
        self._live = [(r.table != r.dead).any(axis=1) for r in rules]
        self._tails = [self._tail_states(i) for i in range(len(rules))]
        self._frames: list[tuple[int, int, int]] = [(-1, -1, -1)]  # frame 0: _END
        self._frame_ids: dict[tuple[int, int, int], int] = {}
        self._configs: list[frozenset[int]] = [frozenset()]
        self._config_ids: dict[frozenset[int], int] = {frozenset(): 0}
        self._steps: list[dict[int, int]] = [{}]
        self._rows: dict[int, list[int]] = {0: [0] * 256}
        self._inside: dict[tuple[int, int], int] = {}
        self._reading: dict[int, list[int]] = {}
        self._init_memos()
        self.initial = self._closure([self._frame(0, rules[0].initial, _END)])

    def _tail_states(self, rule: int) -> np.ndarray:
        """States of `rule` where it can only end (accepting, no byte or call leaves them): a
        call leading there is a tail call, which pushes no frame for the caller (it would only
        pop), so rules that end in a call to the next one run in constant stack depth."""
        tails = self.rules[rule].accepting & ~self._live[rule]
        for state in self.calls[rule]:
            tails[state] = False
        return tails

    @property
    def num_configurations(self) -> int:
        return len(self._configs)

    def _frame(self, rule: int, state: int, parent: int) -> int:
        key = (rule, state, parent)
        found = self._frame_ids.get(key)
        if found is None:
            found = self._frame_ids[key] = len(self._frames)
            self._frames.append(key)
        return found

    def _closure(self, stacks) -> int:
        """The configuration of `stacks` and every stack they reach by calls and returns."""
        seen: set[int] = set()
        todo = list(stacks)
        frames, calls, rules = self._frames, self.calls, self.rules
        while todo:
            k = todo.pop()
            if k in seen:
                continue
            seen.add(k)
            if k == _END:
                continue
            rule, state, parent = frames[k]
            for callee, after in calls[rule].get(state, ()):
                back = parent if self._tails[rule][after] else self._frame(rule, after, parent)
                todo.append(self._frame(callee, rules[callee].initial, back))
            if rules[rule].accepting[state]:
                todo.append(parent)
            if len(seen) > MAX_STACKS:
                raise GrammarTooAmbiguous(f"the grammar keeps over {MAX_STACKS} parses of the text at once")
        return self._config(frozenset(seen))

    def _config(self, stacks: frozenset[int]) -> int:
        found = self._config_ids.get(stacks)
        if found is None:
            found = self._config_ids[stacks] = len(self._configs)
            self._configs.append(stacks)
            self._steps.append({})
        return found

    def renamed(self, config: int, rename) -> int:
        """`config` with each stack's top state s of rule r replaced by rename(r, s), a state
        that reads the same (so the configuration stays closed); itself if none changes."""
        frames, stacks, changed = self._frames, [], False
        for k in self._configs[config]:
            if k != _END:
                rule, state, parent = frames[k]
                other = rename(rule, state)
                if other != state:
                    k, changed = self._frame(rule, other, parent), True
            stacks.append(k)
        return self._config(frozenset(stacks)) if changed else config

    def tops(self, config: int) -> list[tuple[int, int]]:
        """(rule, state) of every stack of `config` that reads a byte next."""
        frames = self._frames
        return [frames[k][:2] for k in self.reading(config)]

    def reading(self, config: int) -> list[int]:
        """The stacks of `config` that read a byte next (their top frames). What a configuration
        reads is what any of them reads: each reads on its own, and a call or return a stack
        may make before its next byte is another of these stacks (configurations are closed)."""
        found = self._reading.get(config)
        if found is None:
            frames, live = self._frames, self._live
            found = self._reading[config] = [
                k for k in self._configs[config] if k != _END and live[frames[k][0]][frames[k][1]]
            ]
        return found

    def top(self, stack: int) -> tuple[int, int]:
        """(rule, state) of a stack's top frame."""
        return self._frames[stack][:2]

    def inside(self, stack: int, state: int) -> int:
        """The configuration after bytes that `stack` reads inside its top rule from its top
        state to `state`, none of them after the first able to leave the rule (a rule's trie
        walk finds such bytes: cfg/masks.py): the stack with its top at `state`, closed.
        Memoized."""
        key = (stack, state)
        found = self._inside.get(key)
        if found is None:
            rule, _, parent = self._frames[stack]
            found = self._inside[key] = self._closure([self._frame(rule, state, parent)])
        return found

    def step(self, config: int, byte: int) -> int:
        steps = self._steps[config]
        found = steps.get(byte)
        if found is None:
            found = steps[byte] = self._step(config, byte)
        return found

    def _step(self, config: int, byte: int) -> int:
        frames, tables, nexts = self._frames, self._tables, []
        for k in self._configs[config]:
            if k == _END:
                continue
            rule, state, parent = frames[k]
            table = tables[rule]
            after = int(table[state, byte])
            if after != table.shape[0] - 1:
                nexts.append(self._frame(rule, after, parent))
        return self._closure(nexts) if nexts else 0

    def row(self, config: int) -> list[int]:
        """The configuration after each byte (0: dead). Bytes that move every stack alike are
        stepped once."""
        row = self._rows.get(config)
        if row is None:
            stacks = [k for k in self._configs[config] if k != _END]
            if not stacks:
                row = [0] * 256
            else:
                moves = np.stack([self._tables[self._frames[k][0]][self._frames[k][1]] for k in stacks])
                _, first, inverse = np.unique(moves.T, axis=0, return_index=True, return_inverse=True)
                targets = [self.step(config, int(b)) for b in first.tolist()]
                row = [targets[i] for i in inverse.ravel().tolist()]
            self._rows[config] = row
        return row

    def accepts(self, config: int) -> bool:
        return _END in self._configs[config]

    def has_exit(self, config: int) -> bool:
        return bool(self.tops(config))

    def walk(self, config: int, data: bytes) -> int:
        for byte in data:
            config = self.step(config, byte)
            if config == 0:
                return 0
        return config
