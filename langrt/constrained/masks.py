"""Token masks of a byte DFA over a vocabulary, computed lazily per state and memoized.

A token is allowed in state s when walking its bytes from s never reaches the dead state. Per
state: if the bytes going to s's most common next state keep moving together for D steps (a
JSON string's characters; D unbounded when s loops on them), every token made only of those
bytes and at most D long is allowed without a walk, from a bitmask memoized per vocabulary and
byte set. The other tokens whose first byte is live are walked with numpy, dropping rows as they
die; the last few finish token by token. Only states a generation actually reaches are ever
computed, which is what keeps compilation fast for large schemas (an eager index pays every
state up front).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from langrt.constrained.byte_dfa import ByteDFA
from langrt.constrained.vocab import TokenVocabulary


class TokenMasks:
    def __init__(self, dfa: ByteDFA, vocab: TokenVocabulary):
        self.dfa = dfa
        self.vocab = vocab
        self._flat = dfa.table.astype(np.int64).ravel()
        self._packed: dict[int, torch.Tensor] = {}
        self._chains: dict[int, tuple[np.ndarray, int | None] | None] = {}
        self._lock = threading.Lock()  # masks may be read from several threads (forks)

    def packed(self, state: int) -> torch.Tensor:
        """int32 [num_words] bitmask of the tokens allowed in `state` (EOS included when the
        state accepts). Computed on first use, then memoized."""
        mask = self._packed.get(state)
        if mask is None:
            mask = self._compute(state)
            with self._lock:
                self._packed[state] = mask
        return mask

    @property
    def states_computed(self) -> int:
        return len(self._packed)

    def _compute(self, state: int) -> torch.Tensor:
        v, dead = self.vocab, self.dfa.dead
        live_first = self.dfa.table[state] != dead
        chain = self._chain(state, _MAX_CHAIN_DEPTH)
        if chain is None:
            words = np.zeros(v.num_words, dtype=np.int32)
            candidates = [v.by_first_byte[b] for b in np.flatnonzero(live_first)]
        else:
            # Tokens made only of chain bytes and no longer than the chain are allowed as they
            # are; the rest (with a live first byte) are walked.
            inside, depth = chain
            split = v.spelled_with(inside)
            words = split.packed(depth).copy()
            others = split.others[live_first[v.first_byte[split.others]]]
            candidates = [others] if depth is None else [others, split.longer_than(depth)]
        rows = np.concatenate(candidates) if candidates else np.zeros(0, dtype=np.int64)
        allowed = v.walk_ids[self._walk(state, rows)]
        if self.dfa.accepting[state]:
            allowed = np.concatenate([allowed, np.fromiter(v.eos_token_ids, dtype=np.int64)])
        np.bitwise_or.at(words.view(np.uint32), allowed >> 5, (np.uint32(1) << (allowed & 31).astype(np.uint32)))
        return torch.from_numpy(words)

    def _chain(self, state: int, budget: int) -> tuple[np.ndarray, int | None] | None:
        """(bytes X, depth D) such that every token made only of X-bytes and at most D long (D
        None: any length) can be read from `state`; None when no such X is worth using.

        X starts as the bytes going from `state` to its most common next state, and narrows to
        those that keep moving together from there (memoized per state). A JSON string's state
        loops on its characters (D None); a string with maxLength counts: each character steps
        to the next state for as many characters as remain."""
        if state in self._chains:
            return self._chains[state]
        table, dead = self.dfa.table, self.dfa.dead
        row = table[state]
        live = row[row != dead]
        result = None
        if live.size >= _MIN_CHAIN_BYTES:
            nxt = int(row[_PROBE_BYTE])  # in text-like states, where a letter goes most bytes go
            inside = row == nxt
            if nxt == dead or inside.sum() < _MIN_CHAIN_BYTES:
                targets, counts = np.unique(live, return_counts=True)
                nxt = int(targets[counts.argmax()])
                inside = row == nxt
            if inside.sum() >= _MIN_CHAIN_BYTES:
                result = (inside, None) if nxt == state else (inside, 1)
                after = self._chain(nxt, budget - 1) if nxt != state and budget > 1 else None
                if after is not None:
                    narrowed = inside & after[0]
                    if narrowed.sum() >= _MIN_CHAIN_BYTES:
                        result = (narrowed, None if after[1] is None else after[1] + 1)
        self._chains[state] = result
        return result

    def _walk(self, state: int, rows: np.ndarray) -> np.ndarray:
        """The rows whose whole token walks from `state` without dying. Rows that die are
        dropped as the walk goes, so structured states (where most tokens die in a byte or two)
        cost little past the first steps."""
        v, dead = self.vocab, self.dfa.dead
        flat, columns = self._flat, v.walk_columns
        lengths = v.walk_lengths[rows]
        current = np.full(rows.size, state, dtype=np.int64)
        done = []
        j = 0
        while rows.size:
            if rows.size <= _SMALL_WALK:
                return np.concatenate(done + [self._walk_each(rows, current, j)])
            ended = lengths == j
            if ended.any():
                done.append(rows[ended])
                going = ~ended
                rows, lengths, current = rows[going], lengths[going], current[going]
            current = flat[current * 256 + columns[j][rows]]
            alive = current != dead
            if not alive.all():
                rows, lengths, current = rows[alive], lengths[alive], current[alive]
            j += 1
        return np.concatenate(done) if done else rows

    def _walk_each(self, rows: np.ndarray, current: np.ndarray, j: int) -> np.ndarray:
        """The end of a walk for a few rows, token by token (numpy's per-call cost would
        dominate): each row is at byte j of its token, in state current[k]."""
        dfa, token_bytes, ids = self.dfa, self.vocab.token_bytes, self.vocab.walk_ids
        keep = [k for k, (r, s) in enumerate(zip(rows.tolist(), current.tolist())) if dfa.walk(s, token_bytes[ids[r]][j:]) != dfa.dead]
        return rows[keep]


# A uniform chain is used when at least this many bytes move together (below it, walking the
# few tokens is as cheap as checking them against the chain).
_MIN_CHAIN_BYTES = 16
# Longest counted run followed: tokens longer than this are walked (BPE tokens of letters are
# rarely longer than 16 bytes).
_MAX_CHAIN_DEPTH = 24
# The byte tried first as the chain's: a letter.
_PROBE_BYTE = ord("a")
# Walks of this few rows finish token by token in Python.
_SMALL_WALK = 48
