"""Token masks of a byte DFA over a vocabulary, computed lazily per state and memoized.

A token is allowed in state s when walking its bytes from s never reaches the dead state. Per
state, one of two ways:

- A chain: the bytes X going where a letter goes keep moving together for D steps (a JSON
  string's characters; D unbounded when s loops on them, D counting down under maxLength).
  Tokens made only of X-bytes and at most D long are allowed from a bitmask memoized per
  vocabulary and byte set. The chain's states s_0 .. s_D are known, so a token leaving X at
  position p with byte b is in s_p there: only the vocabulary's (p, b) groups with b live at
  s_p are walked on.
- Otherwise, where few bytes lead on (structure, numbers), only tokens whose first two bytes
  live are gathered, from the vocabulary's groups by first two bytes; where many do, every
  token with a live first byte is walked.

Walks run in numpy, dropping rows as they die; the last few finish token by token in Python.
Only states a generation actually reaches are ever computed, which is what keeps compilation
fast for large schemas (an eager index pays every state up front).
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from langrt.constrained.byte_dfa import ByteDFA
from langrt.constrained.native.token_walk import WalkTable, vocab_trie
from langrt.constrained.vocab import TokenVocabulary


# Why 512: listed ids serve jump-forward's draft rows, whose logits are computed for the
# allowed tokens only (a gather of their embedding rows); past a few hundred tokens a full row
# of the batched LM-head GEMM costs less than the gather.
MAX_LISTED_IDS = 512


class TokenMasks:
    def __init__(self, dfa: ByteDFA, vocab: TokenVocabulary):
        self.dfa = dfa
        self.vocab = vocab
        self._flat_table: np.ndarray | None = None
        self._table32: WalkTable | None = None
        self._packed: dict[int, torch.Tensor] = {}
        self._ids: dict[int, torch.Tensor | None] = {}
        self._chains: dict[int, tuple[np.ndarray, int | None] | None] = {}
        self._lock = threading.Lock()  # masks may be read from several threads (forks)

    @property
    def _flat(self) -> np.ndarray:
        """The table as int64, flat (state * 256 + byte), made on first use: a grammar's rules
        each have masks, and a generation reads few of a big schema's."""
        if self._flat_table is None:
            self._flat_table = self.dfa.table.astype(np.int64).ravel()
            self._flat_view = memoryview(self._flat_table)  # indexing yields Python ints (walks in Python)
        return self._flat_table

    @property
    def _flat_ints(self) -> memoryview:
        self._flat  # noqa: B018 - made with the table
        return self._flat_view

    def packed(self, state: int) -> torch.Tensor:
        """int32 [num_words] bitmask of the tokens allowed in `state` (EOS included when the
        state accepts). Computed on first use, then memoized."""
        mask = self._packed.get(state)
        if mask is None:
            mask = self._compute(state)
            with self._lock:
                self._packed[state] = mask
        return mask

    def allowed_ids(self, state: int) -> torch.Tensor | None:
        """int32 ids of the tokens allowed in `state`, ascending; None when more than
        MAX_LISTED_IDS are. Memoized."""
        if state in self._ids:
            return self._ids[state]
        found = listed_ids(self.packed(state), self.vocab)
        with self._lock:
            self._ids[state] = found
        return found

    @property
    def states_computed(self) -> int:
        return len(self._packed)

    def _compute(self, state: int) -> torch.Tensor:
        native = vocab_trie(self.vocab)
        if native is not None:
            return self._compute_native(state, *native)
        return self._compute_numpy(state)

    def _compute_native(self, state: int, function, trie) -> torch.Tensor:
        """The C++ trie walk (native/token_walk.py)."""
        if self._table32 is None:
            self._table32 = WalkTable(self.dfa.table, self.dfa.dead)
        words, _, _ = trie.walk(function, self._table32, state, self.vocab.num_words)
        if self.dfa.accepting[state]:
            for eos in self.vocab.eos_token_ids:
                set_bit(words, eos)
        return torch.from_numpy(words)

    def _compute_numpy(self, state: int) -> torch.Tensor:
        v, dead, table = self.vocab, self.dfa.dead, self.dfa.table
        chain = self._chain(state, _MAX_CHAIN_DEPTH)
        if chain is None:
            words = np.zeros(v.num_words, dtype=np.int32)
            firsts = np.flatnonzero(table[state] != dead)
            if firsts.size <= _FEW_FIRST_BYTES:
                allowed_rows = self._walk_by_pairs(state, firsts)
            else:
                rows = np.concatenate([v.by_first_byte[b] for b in firsts])  # more than a few: non-empty
                allowed_rows = self._walk(rows, np.full(rows.size, state, dtype=np.int64), 0)
        else:
            inside, depth = chain
            split = v.spelled_with(inside)
            words = split.packed(depth).copy()
            allowed_rows = self._walk_chain_others(state, inside, depth, split)
        allowed = v.walk_ids[allowed_rows]
        if self.dfa.accepting[state]:
            allowed = np.concatenate([allowed, np.fromiter(v.eos_token_ids, dtype=np.int64)])
        if allowed.size <= _FEW_ALLOWED:
            np.bitwise_or.at(words.view(np.uint32), allowed >> 5, (np.uint32(1) << (allowed & 31).astype(np.uint32)))
        else:  # ufunc.at costs ~0.1 µs a token; packing flags costs ~30 µs whatever their number
            flags = np.zeros(words.size * 32, dtype=bool)
            flags[allowed] = True
            words |= np.packbits(flags, bitorder="little").view(np.int32)
        return torch.from_numpy(words)

    def _chain(self, state: int, budget: int) -> tuple[np.ndarray, int | None] | None:
        """(bytes X, depth D) such that every token made only of X-bytes and at most D long (D
        None: any length) can be read from `state`; None when no such X is worth using.

        X starts as the bytes going from `state` to its most common next state (byte x among
        them), and narrows, level by level along x's path, to those that keep going where x
        goes, for as many levels (up to `budget`) as at least _MIN_CHAIN_BYTES remain. A JSON
        string's state loops on its characters (D None); a string with maxLength counts: each
        character steps to the next state for as many characters as remain. Memoized."""
        if state in self._chains:
            return self._chains[state]
        table, dead, flat = self.dfa.table, self.dfa.dead, self._flat_ints
        row = table[state]
        result = None
        nxt = int(row[_PROBE_BYTE])  # in text-like states, where a letter goes most bytes go
        x = _PROBE_BYTE
        if nxt == dead or np.count_nonzero(row == nxt) < _MIN_CHAIN_BYTES:
            live = row[row != dead]
            if live.size >= _MIN_CHAIN_BYTES:
                targets, counts = np.unique(live, return_counts=True)
                nxt = int(targets[counts.argmax()])
                x = int(np.flatnonzero(row == nxt)[0])
            else:
                nxt = dead
        if nxt != dead and np.count_nonzero(row == nxt) >= _MIN_CHAIN_BYTES:
            path, loops = [state], False  # x's path: path[t] is the state before level t
            while len(path) < budget:
                after = flat[path[-1] * 256 + x]
                if after == path[-1]:
                    loops = True
                    break
                after_next = flat[after * 256 + x]
                if after_next == dead:
                    break
                path.append(after)
            path_arr = np.array(path, dtype=np.int64)
            targets = self._flat[path_arr * 256 + x]
            kept = np.logical_and.accumulate(table[path_arr] == targets[:, None], axis=0)  # [levels, 256]
            enough = np.count_nonzero(kept, axis=1) >= _MIN_CHAIN_BYTES
            levels = int(enough.argmin()) if not enough.all() else len(path)
            if levels:
                result = (kept[levels - 1], None if loops and levels == len(path) else levels)
        self._chains[state] = result
        return result

    def _walk_chain_others(self, state: int, inside: np.ndarray, depth: int | None, split) -> np.ndarray:
        """The allowed tokens not settled by a chain (X, D) from `state`: tokens made only of
        X-bytes and at most D long are allowed as they are (the caller's bitmask). The chain's
        states s_0 = state .. s_D are known (X-bytes move together), so a token whose first
        non-X byte b sits at position p <= D is in s_p there: only the vocabulary's (p, b)
        groups with b live at s_p are gathered, and walked on. Tokens whose X-prefix is longer
        than D go on from s_D at byte D, and only if some X-byte still leads on there."""
        v, table, dead = self.vocab, self.dfa.table, self.dfa.dead
        width = v.walk_columns.shape[0]
        x = int(np.flatnonzero(inside)[0])
        states = [state]  # s_0 .. s_D, or (D None) up to the state that loops on X
        while (len(states) <= depth) if depth is not None else (int(table[states[-1], x]) != states[-1]):
            states.append(int(table[states[-1], x]))
        if depth is None:  # every later position is in the looping state
            states += [states[-1]] * (width - len(states))
        states = np.array(states[:width], dtype=np.int64)
        rows, bounds = split.by_first_outside()
        positions, bytes_ = np.nonzero((table[states] != dead) & ~inside)
        keys = positions * 256 + bytes_
        lo, sizes = bounds[keys], bounds[keys + 1] - bounds[keys]
        index = _ranges(lo, sizes)
        walks = [
            self._walk(
                rows[index],
                np.repeat(self._flat[states[positions] * 256 + bytes_], sizes),
                np.repeat(positions + 1, sizes),
            )
        ]
        if depth is not None and (table[states[-1]][inside] != dead).any():
            far = rows[bounds[(depth + 1) * 256] :] if depth + 1 < width else rows[:0]
            longer = split.longer_than(depth)
            for group in (far, longer):
                walks.append(self._walk(group, np.full(group.size, states[-1], dtype=np.int64), depth))
        return np.concatenate(walks)

    def _walk_by_pairs(self, state: int, firsts: np.ndarray) -> np.ndarray:
        """The allowed rows when few first bytes lead on from `state`: only tokens whose first
        two bytes live are gathered (from the vocabulary's pair groups), then walked on."""
        v, table, dead = self.vocab, self.dfa.table, self.dfa.dead
        afters = table[state, firsts].astype(np.int64)
        ones = np.concatenate(
            [v.by_pair[v.pair_bounds[k] : v.pair_bounds[k + 1]] for k in (firsts * 257 + 256).tolist()] + [_NO_ROWS]
        )
        which, seconds = np.nonzero(table[afters] != dead)
        keys = firsts[which] * 257 + seconds
        lo, sizes = v.pair_bounds[keys], v.pair_bounds[keys + 1] - v.pair_bounds[keys]
        if not sizes.any():
            return ones
        index = _ranges(lo, sizes)
        starts = np.repeat(self._flat[afters[which] * 256 + seconds], sizes)
        return np.concatenate([ones, self._walk(v.by_pair[index], starts, 2)])

    def _walk(self, rows: np.ndarray, current: np.ndarray, j) -> np.ndarray:
        """The rows whose token walks without dying from byte j on (an int, or one per row),
        row k starting in state current[k]. Rows that die are dropped as the walk goes, so
        structured states (where most tokens die in a byte or two) cost little past the first
        steps."""
        v, dead = self.vocab, self.dfa.dead
        flat, columns, n = self._flat, v.walk_columns_flat, v.walk_lengths.size
        lengths = v.walk_lengths[rows]
        j = np.broadcast_to(np.asarray(j, dtype=np.int64), rows.shape)
        done = []
        while rows.size:
            if rows.size <= _SMALL_WALK:
                return np.concatenate(done + [self._walk_each(rows, current, j)])
            ended = lengths == j
            if ended.any():
                done.append(rows[ended])
                going = ~ended
                rows, lengths, current, j = rows[going], lengths[going], current[going], j[going]
            current = flat[current * 256 + columns[j * n + rows]]
            alive = current != dead
            if not alive.all():
                rows, lengths, current, j = rows[alive], lengths[alive], current[alive], j[alive]
            j = j + 1
        return np.concatenate(done) if done else rows

    def _walk_each(self, rows: np.ndarray, current: np.ndarray, j: np.ndarray) -> np.ndarray:
        """The end of a walk for a few rows, token by token (numpy's per-call cost would
        dominate): row k is at byte j[k] of its token, in state current[k]."""
        flat, dead, token_bytes, ids = self._flat_ints, self.dfa.dead, self.vocab.token_bytes, self.vocab.walk_ids
        keep = []
        for k, (r, s, start) in enumerate(zip(rows.tolist(), current.tolist(), j.tolist())):
            for byte in token_bytes[ids[r]][start:]:
                s = flat[s * 256 + byte]
                if s == dead:
                    break
            else:
                keep.append(k)
        return rows[keep]


# A uniform chain is used when at least this many bytes move together (below it, walking the
# few tokens is as cheap as checking them against the chain).
_MIN_CHAIN_BYTES = 16
# Longest counted run followed: tokens longer than this are walked (BPE tokens of letters are
# rarely longer than 16 bytes).
_MAX_CHAIN_DEPTH = 24
# The byte tried first as the chain's: a letter.
_PROBE_BYTE = ord("a")


def set_bit(words: np.ndarray, token: int) -> None:
    """Allow `token` in a mask of int32 words."""
    words.view(np.uint32)[token >> 5] |= np.uint32(1 << (token & 31))


def listed_ids(packed: torch.Tensor, vocab: TokenVocabulary) -> torch.Tensor | None:
    """The int32 ids set in a packed mask, ascending; None when more than MAX_LISTED_IDS."""
    bits = np.unpackbits(packed.numpy().view(np.uint8), bitorder="little")
    ids = np.flatnonzero(bits[: vocab.vocab_size])
    return torch.from_numpy(ids.astype(np.int32)) if ids.size <= MAX_LISTED_IDS else None


def _ranges(lo: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The positions lo[g] .. lo[g] + sizes[g] - 1 of every group g, concatenated."""
    offsets = np.cumsum(sizes) - sizes
    return np.repeat(lo - offsets, sizes) + np.arange(int(sizes.sum()))


_NO_ROWS = np.zeros(0, dtype=np.int64)
# Allowed tokens set bit by bit up to this many; more are packed from a flag array.
_FEW_ALLOWED = 256
# Walks of this few rows finish token by token in Python.
_SMALL_WALK = 48
# States with at most this many live first bytes gather candidates by their first two bytes.
_FEW_FIRST_BYTES = 16
