"""Token masks of a byte DFA over a vocabulary, computed lazily per state and memoized.

A token is allowed in state s when walking its bytes from s never reaches the dead state. For
one state the whole vocabulary is walked at once with numpy: tokens sorted longest first, so
step j only touches the prefix of tokens longer than j, and tokens whose first byte is dead from
s are left out up front. Only states a generation actually reaches are ever computed, which is
what keeps compilation fast for large schemas (an eager index pays every state up front).
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
        v = self.vocab
        allowed = np.zeros(v.num_words * 32, dtype=bool)
        allowed[v.walk_ids[self._allowed_rows(state)]] = True
        if self.dfa.accepting[state]:
            allowed[list(v.eos_token_ids)] = True
        packed = np.packbits(allowed, bitorder="little").view(np.int32)
        return torch.from_numpy(packed.copy())

    def _allowed_rows(self, state: int) -> np.ndarray:
        """Rows of the vocabulary's walk order whose token can be read from `state`.

        Tokens whose first byte is dead from `state` are dropped at once. Of the rest, those made
        only of bytes that loop on `state` (inside a JSON string: almost every token) are allowed
        without a walk; the others are walked."""
        v, dead = self.vocab, self.dfa.dead
        row = self.dfa.table[state]
        rows = np.flatnonzero((row != dead)[v.first_byte])  # ascending, so still longest first
        if rows.size == 0:
            return rows
        loops = row == state
        if loops.any():
            outside = ~_bits(loops)
            sets = v.byte_sets
            hits = sets[0][rows] & outside[0]
            for word in range(1, 4):
                hits |= sets[word][rows] & outside[word]
            stays = hits == 0
            return np.concatenate([rows[stays], self._walk(state, rows[~stays])])
        return self._walk(state, rows)

    def _walk(self, state: int, rows: np.ndarray) -> np.ndarray:
        if rows.size == 0:
            return rows
        v, dead = self.vocab, self.dfa.dead
        lengths = v.walk_lengths[rows]
        negative = -lengths  # ascending, for searchsorted
        current = np.full(rows.size, state, dtype=np.int64)
        flat, columns = self._flat, v.walk_columns
        for j in range(int(lengths[0])):
            active = int(np.searchsorted(negative, -j, side="left"))  # rows longer than j
            current[:active] = flat[current[:active] * 256 + columns[j][rows[:active]]]
        return rows[current != dead]


def _bits(flags: np.ndarray) -> np.ndarray:
    """256 booleans -> 4 uint64 words (bit b of word b // 64)."""
    return np.packbits(flags, bitorder="little").view(np.uint64)
