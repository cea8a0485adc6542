"""Intersections of byte DFAs (constrained/dfa_product.py) and the strings the JSON-schema compiler
builds with them: several patterns/formats together, a pattern with a length the regex rewrite
refuses, strings counted or chunked by length. Checked against Python's `re` and `len` on the
decoded string, with the JSON text written raw and fully escaped."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from langrt.constrained.byte_dfa import build_rule_dfa
from langrt.constrained.cfg.build import full_match, local_automaton
from langrt.constrained.dfa_product import intersection_body
from langrt.constrained.json_schema import emit, schema_to_grammar, translate
from langrt.constrained.json_schema import regex as rx

MAX_STATES = 200_000
# Characters that take one byte, two, three, four (a surrogate pair when escaped), and escapes.
ALPHABET = 'ab-z0 \t"\\\né€😀'


def pattern_regex(pattern: str) -> str:
    return rx.alt(emit(a) for a in translate(pattern).alts)


def texts(value: str) -> list[str]:
    """The JSON text between the quotes, written raw and fully escaped."""
    return [json.dumps(value, ensure_ascii=False)[1:-1], json.dumps(value)[1:-1]]


def dead_ends(dfa) -> int:
    """States (not dead) from which no accepting state can be reached."""
    n = dfa.num_states
    live = dfa.accepting[:n].copy()
    while True:
        more = live | np.append(live, False)[dfa.table[:n]].any(axis=1)
        if (more == live).all():
            return int((~live).sum())
        live = more


PATTERNS = [
    ("^[a-z0-9]+(?:-[a-z0-9]+)*$", 1, 12),
    ("^(?:\\S+\\s+){0,3}\\S+$", 1, 20),
    ("a", 2, 5),
    ("^(é|€)+-?$", 0, 4),
]


@pytest.mark.parametrize("pattern,lo,hi", PATTERNS)
@settings(max_examples=150, deadline=None)
@given(value=st.text(alphabet=ALPHABET, max_size=24))
def test_a_pattern_cut_to_length_is_exactly_both(pattern, lo, hi, value):
    dfa, calls = build_rule_dfa(intersection_body([pattern_regex(pattern)], lo, hi), MAX_STATES)
    assert calls == {}
    # A pattern's characters are written raw where JSON allows, and its classes keep to the
    # Basic Multilingual Plane; its `$` is ECMA-262's, not also before a final newline as
    # Python's (pattern.py: what both engines accept, a subset, which is sound).
    valid = re.search(re.sub(r"\$$", r"\\Z", pattern), value) is not None and lo <= len(value) <= hi
    accepted = full_match(dfa, json.dumps(value, ensure_ascii=False)[1:-1])
    assert valid or not accepted, (pattern, value)
    if "😀" not in value:
        assert accepted == valid, (pattern, value)


@settings(max_examples=200, deadline=None)
@given(value=st.text(alphabet=ALPHABET, max_size=30), lo=st.integers(0, 6), extra=st.integers(0, 20))
def test_a_counted_string_counts_decoded_characters(value, lo, extra):
    """A surrogate pair written as two escapes is one character; so is a 4-byte UTF-8 one."""
    body = intersection_body([rx.repeat(rx.JSON_CHAR, 0, None)], lo, lo + extra)
    dfa, _ = build_rule_dfa(body, MAX_STATES)
    for text in texts(value):
        assert full_match(dfa, text) == (lo <= len(value) <= lo + extra), (value, text)


def test_intersections_have_no_dead_ends():
    for pattern, lo, hi in PATTERNS:
        dfa, _ = build_rule_dfa(intersection_body([pattern_regex(pattern)], lo, hi), MAX_STATES)
        assert dead_ends(dfa) == 0
    dfa, _ = build_rule_dfa(intersection_body([pattern_regex("^ab"), pattern_regex("c$")], 3, 9), MAX_STATES)
    assert dead_ends(dfa) == 0
    assert full_match(dfa, "abc") and full_match(dfa, "ab--c") and not full_match(dfa, "abd")


def test_an_intersection_past_its_state_limit_is_refused():
    with pytest.raises(ValueError, match="over 2000 states"):
        build_rule_dfa(intersection_body([rx.repeat(rx.JSON_CHAR, 0, None)], 0, 500), 2_000)


def grammar_matcher(schema, **options):
    source = schema_to_grammar(schema, **options)
    assert not isinstance(source, str), "expected rules"
    automaton = local_automaton(source, MAX_STATES)
    return lambda text: full_match(automaton, text)


def check(schema, valid, invalid, **options):
    accepts = grammar_matcher(schema, **options)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    for v in valid:
        assert validator.is_valid(v), v
        assert accepts(json.dumps(v)), f"valid rejected: {json.dumps(v)[:80]}"
    for v in invalid:
        assert not validator.is_valid(v), v
        assert not accepts(json.dumps(v)), f"invalid accepted: {json.dumps(v)[:80]}"


def test_a_pattern_and_a_format_together():
    schema = {"type": "string", "format": "uri", "pattern": "^(https|file)://"}
    check(schema, ["https://example.com/a", "file:///tmp/x"], ["http://example.com", "ftp://x"])
    # what only the format rules out (jsonschema checks "uri" only with rfc3987 installed)
    assert not grammar_matcher(schema)(json.dumps("https://exa mple.com"))


def test_a_pattern_with_a_length_the_rewrite_refuses():
    schema = {"type": "string", "pattern": "^[a-z\\d]+(?:-[a-z\\d]+)*$", "maxLength": 8}
    check(schema, ["a", "a-b-c", "abcd-efg"], ["", "abcd-efgh", "a--b", "-a", "a-"])
    words = {"type": "string", "pattern": "^(?:\\S+\\s+){0,2}\\S+$", "minLength": 3, "maxLength": 9}
    check(words, ["abc", "a b c", "ab cd ef"], ["ab", "a b c d", "ab cd efgh", " abc"])


@pytest.mark.parametrize("any_order", [False, True])
def test_long_strings_are_chunked_exactly(any_order):
    """maxLength past CHUNKED_MIN: runs of fixed-size chunks and a tail; every length is read
    once, the bounds hold at and around chunk boundaries, escapes count as one character."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 1100}},
        "required": ["s"],
    }
    accepts = grammar_matcher(schema, open_objects=any_order, any_order=any_order)
    for n in (2, 3, 4, 255, 256, 257, 511, 512, 513, 1099, 1100, 1101):
        for fill in ("a", "é", "\n", "😀"):
            value = {"s": fill * n}
            for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
                assert accepts(text) == (3 <= n <= 1100), (n, fill)


def test_counted_strings_beside_other_values():
    schema = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"a": {"type": "string", "maxLength": 100}, "b": {"type": "string", "maxLength": 70}},
        },
    }
    check(schema, [[{"a": "x" * 100, "b": "y" * 70}, {}], [{"b": "é" * 70}]], [[{"a": "x" * 101}], [{"b": "y" * 71}]])


def test_counted_strings_share_masks_far_from_their_bounds(tokenizer, vocab):
    """Within a counted string, states whose count no token can bring to a bound stand for each
    other (Counted.same_masks): the masks are those computed state by state, and fewer are
    computed."""
    from langrt.constrained.cfg.masks import PushdownMasks

    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 300},
                                               "t": {"type": "string", "minLength": 200, "maxLength": 1200}}}  # fmt: skip
    pda = local_automaton(schema_to_grammar(schema), MAX_STATES)
    shared, each = PushdownMasks(pda, vocab), PushdownMasks(pda, vocab)
    each._same_state = lambda rule, state: state
    value = {"s": "word " * 59 + "abcd", "t": 'é, "quoted" \\ and more ' * 40}
    assert len(value["s"]) == 299 and 200 <= len(value["t"]) <= 1200
    config = pda.initial
    for token in tokenizer.encode(json.dumps(value, ensure_ascii=False), add_special_tokens=False):
        assert np.array_equal(shared.packed(config).numpy(), each.packed(config).numpy())
        config = pda.walk(config, vocab.token_bytes[token])
        assert config != pda.dead
    assert pda.accepts(config)
    assert shared.states_computed < each.states_computed / 2
