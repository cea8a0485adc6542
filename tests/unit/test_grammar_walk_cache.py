"""Rule walks shared across grammars (langrt/constrained/cfg/walk_cache.py): a second schema
reusing a first one's rules walks fewer rule states, and its masks are exactly those of a
compiler that shares nothing."""

from __future__ import annotations

import numpy as np

from langrt.constrained import GrammarCompiler
from langrt.constrained.cfg.walk_cache import RuleWalks

FIRST = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "when": {"type": "string", "format": "date-time"},
        "n": {"type": "integer"},
    },
    "required": ["name", "when", "n"],
}
SECOND = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "at": {"type": "string", "format": "date-time"},
        "count": {"type": "integer"},
    },
    "required": ["title", "at", "count"],
}
TEXT = '{"title": "a \\"quoted\\" word", "at": "2024-01-02T03:04:05Z", "count": -12}'


def masks_along(grammar, text: str) -> list[np.ndarray]:
    matcher, found = grammar.matcher(), []
    for byte in text.encode():
        found.append(grammar.masks.packed(matcher.state).numpy().copy())
        assert matcher.accept_bytes(bytes([byte])), byte
    found.append(grammar.masks.packed(matcher.state).numpy().copy())
    return found


def test_a_second_schema_reuses_the_first_ones_rule_walks(vocab):
    shared = GrammarCompiler(vocab)
    masks_along(
        shared.compile_json_schema(FIRST), TEXT.replace("title", "name").replace('"at"', '"when"').replace("count", "n")
    )
    walks: RuleWalks = shared._walks
    hits_before, misses_before = walks.hits, walks.misses
    second = masks_along(shared.compile_json_schema(SECOND), TEXT)
    assert walks.hits > hits_before, "the string, date-time and integer rules were walked for the first schema"
    fresh = GrammarCompiler(vocab)
    alone = masks_along(fresh.compile_json_schema(SECOND), TEXT)
    assert walks.misses - misses_before < fresh._walks.misses, "sharing walks fewer rule states"
    assert len(second) == len(alone) and all(np.array_equal(a, b) for a, b in zip(second, alone))


def test_the_cache_drops_least_recent_walks_past_its_bytes():
    walks = RuleWalks(max_bytes=3 * 64)
    dfas = [object() for _ in range(5)]
    for k, dfa in enumerate(dfas):
        walks.get(dfa, b"", 0, lambda k=k: (np.full(16, k, np.int32), None, []))
    assert walks.bytes <= 3 * 64 and walks.misses == 5
    recomputed = []
    walks.get(dfas[0], b"", 0, lambda: recomputed.append(1) or (np.zeros(16, np.int32), None, []))
    assert recomputed, "the oldest walk was dropped"
    kept = walks.get(dfas[4], b"", 0, lambda: (_ for _ in ()).throw(AssertionError("recomputed a kept walk")))
    assert int(kept[0][0]) == 4
