"""Intersections of byte DFAs: a string that must match several patterns (`pattern` and `format`
together) and a length in characters (`minLength`/`maxLength`) beside a pattern the regex
rewrite cannot cut to length.

A regex cannot say "both" without growing into the product of its parts, but the automata can:
the product automaton runs every part side by side and accepts where all of them accept. It is
built here level by level (all states one step further at once, in numpy), over byte classes
(bytes every part treats alike), with the states that cannot reach an accepting state cut away,
as outlines-core's own automata are, so that a mask never allows a dead end.

A grammar rule asks for an intersection with a body written by `intersection_body`: opaque text
that travels to the grammar worker and keys the rule cache like any other body.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

from langrt.constrained.byte_dfa import ByteDFA, build_byte_dfa

INTERSECTION_PREFIX = "\U0010fffd"  # never the start of a regex the compiler writes
# Why 50,000: a product's states are its parts' times the lengths counted (a 10-word pattern cut
# to 120 characters: ~38k states, ~0.3 s); a dense row is 1 KB, so past this one string's
# automaton would hold more memory than all the usual rules of a schema together.
INTERSECTION_MAX_STATES = 50_000


def intersection_body(regexes: list[str], min_chars: int = 0, max_chars: int | None = None, why: str = "") -> str:
    """The rule body whose language is the JSON string texts (between the quotes) matching every
    regex in `regexes` and decoding to min_chars..max_chars characters. `why`: the schema
    keywords that asked for it, named if its automaton is refused."""
    spec = {"all": sorted(regexes), "min": min_chars, "max": max_chars} | ({"why": why} if why else {})
    return INTERSECTION_PREFIX + json.dumps(spec)


def build_intersection(body: str, max_states: int) -> ByteDFA:
    """The automaton of an intersection_body (ValueError past `max_states` states)."""
    spec = json.loads(body[len(INTERSECTION_PREFIX) :])
    max_states = min(max_states, INTERSECTION_MAX_STATES)
    try:
        parts = [build_byte_dfa(regex, max_states) for regex in spec["all"]]
        return intersect(parts, _char_counter(), spec["min"], spec["max"], max_states)
    except ValueError as e:
        if not spec.get("why"):
            raise
        raise ValueError(
            f"{spec['why']}: {e}; a simpler pattern or fewer of these keywords on one string compiles"
        ) from None


# The character counter: where, in JSON string text, a decoded character starts. A raw ASCII
# byte or a UTF-8 lead byte starts one; a backslash starts an escape, which is one character,
# except the \uDC00-\uDFFF half of a surrogate pair after a \uD800-\uDBFF half (one character
# together, as JSON decoders read them). States: 0 between characters, 1 after "\", 2 after "\u",
# 3/4/5 after 1/2/3 hex digits of a non-high-surrogate escape, 6/7/8 after 1/2/3 of a high one,
# 9 after a whole high surrogate (the next "\" continues the same character).
_HEX = b"0123456789abcdefABCDEF"


@functools.lru_cache(maxsize=1)
def _char_counter() -> tuple[np.ndarray, np.ndarray]:
    """(next[10, 256], starts[10, 256]): the counter's step and whether a byte starts a
    character. Bytes the counter never meets in valid text go to state 0."""
    nxt = np.zeros((10, 256), dtype=np.int64)
    starts = np.zeros((10, 256), dtype=np.int64)
    for state in (0, 9):
        starts[state, :0x80] = 1
        starts[state, 0xC0:] = 1
        nxt[state, ord("\\")] = 1
    starts[9, ord("\\")] = 0  # the low half of a pair
    nxt[1, ord("u")] = 2
    for b in _HEX:
        nxt[2, b] = 6 if b in b"dD" else 3
        nxt[3, b], nxt[4, b], nxt[5, b] = 4, 5, 0
        nxt[6, b] = 7 if b in b"89abAB" else 4
        nxt[7, b], nxt[8, b] = 8, 9
    return nxt, starts


def intersect(parts: list[ByteDFA], counter, min_count: int, max_count: int | None, max_states: int) -> ByteDFA:
    """The product of `parts` with a count of the bytes `counter` marks as starts, bounded to
    min_count..max_count (max None: unbounded). Accepting where every part accepts, the
    counter is between characters, and the count is in bounds."""
    pairs = _pairs(parts, counter, max_states)
    return _counted(pairs, min_count, max_count, max_states)


@dataclass
class _Pairs:
    """The product of the parts and the counter's state, without the count: `next` and
    `starts` per state and byte class (dead: the index `n`)."""

    next: np.ndarray  # [n, classes] int64
    starts: np.ndarray  # [n, classes] 0/1: the byte starts a character
    accepting: np.ndarray  # [n] bool: every part accepts and the counter is between characters
    byte_class: np.ndarray  # [256]


def _pairs(parts: list[ByteDFA], counter, max_states: int) -> _Pairs:
    cnext, cstarts = counter
    tables = [p.table.astype(np.int64) for p in parts] + [cnext]
    signature = np.vstack(tables + [cstarts]).T  # byte classes: bytes alike in every table
    _, first, byte_class = np.unique(signature, axis=0, return_index=True, return_inverse=True)
    reps = np.asarray(first)
    radix = [t.shape[0] for t in tables]
    deads = [t.shape[0] - 1 for t in tables[:-1]] + [-1]  # the counter has no dead state

    def encode(columns: list[np.ndarray]) -> np.ndarray:
        key = np.zeros_like(columns[0])
        for col, size in zip(columns, radix):
            key = key * size + col
        return key

    frontier = np.array([[p.initial for p in parts] + [0]], dtype=np.int64)
    states, nexts, seen = [frontier], [], {int(encode(list(frontier.T))[0])}
    while frontier.shape[0]:
        cols = [t[frontier[:, i]][:, reps] for i, t in enumerate(tables)]
        dead = np.zeros(cols[0].shape, dtype=bool)
        for col, d in zip(cols, deads):
            dead |= col == d
        key = np.where(dead, -1, encode(cols))
        nexts.append(key)
        fresh, where = np.unique(key[~dead], return_index=True)
        is_new = np.fromiter((k not in seen for k in fresh.tolist()), dtype=bool, count=len(fresh))
        seen.update(fresh[is_new].tolist())
        frontier = np.stack([c[~dead] for c in cols], axis=1)[where[is_new]]
        if len(seen) > max_states:
            raise ValueError(f"the intersection's automaton has over {max_states} states")
        states.append(frontier)
    states = np.concatenate(states)
    keys = encode(list(states.T))
    order = np.argsort(keys)
    raw = np.concatenate(nexts)
    n = len(keys)
    ids = np.where(raw < 0, n, order[np.searchsorted(keys[order], np.maximum(raw, 0))])
    accepting = states[:, -1] == 0
    for i, p in enumerate(parts):
        accepting &= p.accepting[states[:, i]]
    return _Pairs(ids, cstarts[states[:, -1]][:, reps], accepting, np.ravel(byte_class))


def _counted(pairs: _Pairs, min_count: int, max_count: int | None, max_states: int) -> ByteDFA:
    """`pairs` with the count: state k * n + r is pair state r after k characters (past
    max_count: dead; unbounded: the count stops at min_count). Written whole by broadcasting,
    then cut to the states reachable from the start that can reach an accepting one."""
    n = pairs.next.shape[0]
    cap = max_count if max_count is not None else min_count
    if n * (cap + 1) > 4 * max_states:
        raise ValueError(f"the intersection's automaton has over {max_states} states")
    count = np.arange(cap + 1)[:, None, None] + pairs.starts[None]  # [cap + 1, n, classes]
    dead = np.broadcast_to(pairs.next[None] == n, count.shape)
    if max_count is None:
        count = np.minimum(count, cap)
    else:
        dead = dead | (count > cap)
    total = n * (cap + 1)
    ids = np.where(dead, total, count * n + pairs.next[None]).reshape(total, -1)
    accepting = np.concatenate([pairs.accepting & (k >= min_count) for k in range(cap + 1)])
    keep = _reachable(ids, 0, total) & _co_reachable(ids, accepting, total)
    if keep.sum() > max_states:
        raise ValueError(f"the intersection's automaton has over {max_states} states")
    new_id = np.append(np.cumsum(keep) - 1, 0)
    kept = int(keep.sum())
    new_id[~np.append(keep, False)] = kept
    table = np.empty((kept + 1, 256), dtype=np.int32)
    table[:kept] = new_id[ids[keep]][:, pairs.byte_class]
    table[kept] = kept
    at = np.flatnonzero(keep)
    counted = Counted(at // n, at % n, min_count, max_count) if _paddable(pairs) else None
    return ByteDFA(table, np.append(accepting[keep], False), 0 if keep[0] else kept, counted)


@dataclass
class Counted:
    """A counted automaton's states as (characters counted, pair state), kept where every pair
    state finishes within one more character and every accepting one can take any number more
    (what a string of JSON characters is): then, for tokens of at most `horizon` bytes, the
    count matters only near the bounds, and states far from them share masks (same_masks)."""

    count: np.ndarray  # [states]
    pair: np.ndarray  # [states]
    lo: int
    hi: int | None

    def same_masks(self, horizon: int) -> np.ndarray:
        """state -> the state whose token masks (tokens of <= horizon bytes) are its own: the
        one with the fewest characters of its pair state among those that no token brings to
        a bound (below lo - horizon, or between lo and hi - horizon - 1)."""
        k, n = self.count, len(self.count)
        window = np.full(n, -1)
        window[k + horizon < self.lo] = 0
        upper = k >= self.lo if self.hi is None else (k >= self.lo) & (k + horizon + 1 <= self.hi)
        window[upper] = 1
        rep = np.arange(n)
        members = np.flatnonzero(window >= 0)
        if members.size:
            key = self.pair[members] * 2 + window[members]
            order = members[np.lexsort((k[members], key))]
            groups, first = np.unique(self.pair[order] * 2 + window[order], return_index=True)
            rep[order] = order[first[np.searchsorted(groups, self.pair[order] * 2 + window[order])]]
        return rep


def _paddable(pairs: _Pairs) -> bool:
    """Every pair state reaches an accepting one by at most one counted byte, and every
    accepting one loops on a one-byte character (so a string can always be made longer)."""
    n = len(pairs.accepting)
    loops = (pairs.next == np.arange(n)[:, None]) & (pairs.starts == 1)
    if not loops[pairs.accepting].any(axis=1).all():
        return False
    free = np.where(pairs.starts == 1, n, pairs.next)  # edges that count nothing
    zero = _co_reachable(free, pairs.accepting, n)
    one = zero | (np.append(zero, False)[np.where(pairs.starts == 1, pairs.next, n)]).any(axis=1)
    return bool(_co_reachable(free, one, n).all())


def _reachable(ids: np.ndarray, start: int, n: int) -> np.ndarray:
    """The states reachable from `start`, a level at a time."""
    seen = np.zeros(n + 1, dtype=bool)
    seen[start] = True
    frontier = np.array([start])
    while frontier.size:
        step = np.unique(ids[frontier])
        frontier = step[~seen[step] & (step < n)]
        seen[frontier] = True
    return seen[:n]


def _co_reachable(ids: np.ndarray, accepting: np.ndarray, n: int) -> np.ndarray:
    """The states from which an accepting state can be reached (a backward search, a level of
    predecessors at a time)."""
    src = np.repeat(np.arange(n), ids.shape[1])
    dst = ids.ravel()
    keep = dst < n
    src, dst = src[keep], dst[keep]
    order = np.argsort(dst, kind="stable")
    src = src[order]
    bounds = np.searchsorted(dst[order], np.arange(n + 1))
    live = accepting.copy()
    frontier = np.flatnonzero(accepting)
    while frontier.size:
        lo, hi = bounds[frontier], bounds[frontier + 1]
        sizes = hi - lo
        at = np.repeat(lo - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
        preds = np.unique(src[at])
        frontier = preds[~live[preds]]
        live[frontier] = True
    return live
