"""Whether two byte automata read the same language, calls included: for checking one regex DFA
builder against another (native/regex_dfa.cpp against outlines-core, in the tests and in
benchmarks/bench_regex_dfa.py)."""

from __future__ import annotations

from collections import deque

import numpy as np

from langrt.constrained.byte_dfa import marker_edges

Parts = tuple  # (table [states + 1, 256] with the dead state last, accepting, initial, ...)


def rule_view(parts: Parts) -> tuple[np.ndarray, np.ndarray, int, dict[int, list[tuple[int, int]]]]:
    """(table with its F4 edges cut, accepting, initial, {state: sorted [(rule, state after)]}):
    a rule's automaton with its call markers read as calls (byte_dfa.call_marker)."""
    table, accepting, initial = parts[:3]
    table = table.copy()
    calls: dict[int, list[tuple[int, int]]] = {}
    for state, rule, after in marker_edges(table):
        calls.setdefault(state, []).append((rule, after))
    calls = {s: sorted(found) for s, found in calls.items()}
    table[:, 0xF4] = table.shape[0] - 1
    return table, accepting, initial, calls


def first_difference(a: Parts, b: Parts) -> str | None:
    """Where two automata with their dead ends cut read differently (a state pair, walked from
    both starts, that differs in accepting, in the bytes leading on, or in the rules called),
    or None where their languages are equal."""
    (ta, aa, ia, ca), (tb, ab, ib, cb) = rule_view(a), rule_view(b)
    da, db = ta.shape[0] - 1, tb.shape[0] - 1
    seen, todo = {(ia, ib)}, deque([(ia, ib)])
    while todo:
        x, y = todo.popleft()
        if bool(aa[x]) != bool(ab[y]):
            return f"accepting differs at {x}/{y}"
        live_a, live_b = ta[x] != da, tb[y] != db
        if (live_a != live_b).any():
            return f"bytes {np.flatnonzero(live_a != live_b)[:8].tolist()} differ at {x}/{y}"
        xa, xb = ca.get(x, []), cb.get(y, [])
        if [r for r, _ in xa] != [r for r, _ in xb]:
            return f"calls differ at {x}/{y}: {xa} vs {xb}"
        pairs = [(p, q) for (_, p), (_, q) in zip(xa, xb)]
        pairs += [(int(ta[x, byte]), int(tb[y, byte])) for byte in np.flatnonzero(live_a).tolist()]
        for pair in pairs:
            if pair not in seen:
                seen.add(pair)
                todo.append(pair)
    return None
