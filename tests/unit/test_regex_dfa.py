"""The C++ regex DFA builder (native/regex_dfa.cpp) against outlines-core, which builds the same
regexes where the library cannot be used: the same language (walked pairwise, call edges
included), never more states, and the syntax it leaves to outlines-core left there."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langrt.constrained import byte_dfa
from langrt.constrained.dfa_equivalence import first_difference as difference
from langrt.constrained.dfa_equivalence import rule_view
from langrt.constrained.native import regex_dfa

pytestmark = pytest.mark.skipif(
    not regex_dfa.available(), reason="the C++ regex builder cannot be built here (no g++, or LANGRT_CPU_KERNELS=0)"
)


def outlines_table(regex: str, max_states: int = 200_000):
    """outlines-core's automaton for `regex`, as byte_dfa builds it without the library."""
    return byte_dfa._marked_table(regex, max_states)


# Regexes in the compilers' subset: literals of one to four UTF-8 bytes, escapes, classes
# (negated ones leave plane 16 out, as regex.py's do), calls, groups, alternation, counts.
_CHARS = ["a", "b", "z", "0", "é", "中", "😀", '"', "\\\\", "\\.", "\\x{41}", "\\u00e9", "\\n", " "]
_RANGES = [
    "a-c",
    "x",
    "0-9",
    "é-ü",
    "\\x{80}-\\x{7FF}",
    "\\x{800}-\\x{FFFF}",
    "\\x{10000}-\\x{FFFFF}",
    "\\x00-\\x1f",
    '"',
    "\\\\",
    "\\-",
]


@st.composite
def char_class(draw):
    ranges = "".join(draw(st.lists(st.sampled_from(_RANGES), min_size=1, max_size=3)))
    if draw(st.booleans()):
        return f"[^{ranges}\\U00100000-\\U0010ffff]"
    return f"[{ranges}]"


def _count(draw_pair):
    lo, extra = draw_pair
    return st.sampled_from(["*", "+", "?", f"{{{lo}}}", f"{{{lo},}}", f"{{{lo},{lo + extra}}}"])


_ATOMS = st.one_of(
    st.sampled_from(_CHARS), char_class(), st.sampled_from(["\\x{100003}", "\\x{100000}", "\\x{10FFFD}"])
)


def _grow(inner):
    group = st.lists(inner, min_size=1, max_size=4).map(lambda parts: "(?:" + "".join(parts) + ")")
    alternation = st.lists(inner, min_size=2, max_size=3).map(lambda parts: "(?:" + "|".join(parts) + ")")
    repeated = st.tuples(inner, st.tuples(st.integers(0, 3), st.integers(0, 3)).flatmap(_count)).map("".join)
    return st.one_of(group, alternation, repeated)


REGEXES = st.recursive(_ATOMS, _grow, max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(REGEXES)
def test_same_language_as_outlines_core_and_never_more_states(regex):
    native = regex_dfa.build(regex, 200_000)
    assert native is not None, f"left to outlines-core: {regex}"
    reference = outlines_table(regex)
    assert difference(native, reference) is None, regex
    assert native[0].shape[0] <= reference[0].shape[0]
    # the plane-16 edges the builder lists are those its table spells
    assert sorted(map(tuple, native[3].tolist())) == sorted(
        (s, r, a) for s, calls in rule_view(native)[3].items() for r, a in calls
    )


@pytest.mark.parametrize(
    "regex",
    [
        '"(?:[^"\\\\\\x00-\\x1f\\U00100000-\\U0010ffff]|\\\\["\\\\/bfnrt])*"',  # a JSON string
        '\\{(?:"a": ?\\x{100001}(?:, ?"b": ?\\x{100002})?)?\\}',  # an object calling its values
        "-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
        "(?:ab|a)(?:bc|c)?",
        "[^\\x{0}-\\x{10FFFF}]|x",  # an empty class beside a character
    ],
)
def test_compiler_regexes(regex):
    native = regex_dfa.build(regex, 200_000)
    assert native is not None and difference(native, outlines_table(regex)) is None


def test_minimal_automata():
    # the minimal DFA of "any number of a or b, then c" has two live states
    table, accepting, initial, _ = regex_dfa.build("(?:a|b)*c", 100)
    assert table.shape[0] - 1 == 2 and not accepting[initial]
    # a key that is none of several names: one state per trie node and the free tail (outlines-core
    # keeps a copy of every UTF-8 branch per node)
    names = ["name", "note", "age"]
    regex = (
        '"(?:' + "|".join(['(?:[^\\x00-\\x1f"\\\\ans\\U00100000-\\U0010ffff]|n(?:[^ao]|a[^m]|o[^t]))x*'] + names) + ')"'
    )
    native = regex_dfa.build(regex, 200_000)
    assert native is not None and native[0].shape[0] < outlines_table(regex)[0].shape[0]


def test_dot_is_any_character_but_newline():
    table, accepting, initial, _ = regex_dfa.build("a.c", 100)

    def matches(text: str) -> bool:
        state = initial
        for byte in text.encode():
            state = table[state, byte]
        return bool(accepting[state])

    for text in ["abc", "a c", "aéc", "a😀c", "a\nc", "ac", "abbc"]:
        assert matches(text) == bool(re.fullmatch("a.c", text)), text


@pytest.mark.parametrize(
    "regex", ["\\d+", "^a", "a$", "(?i)a", "[[:alpha:]]", "a{,3}", "[a&&b]", "\\p{L}", "\\bx", "(?P<n>a)", "\\x{D800}"]
)
def test_syntax_it_does_not_read_goes_to_outlines_core(regex):
    assert regex_dfa.build(regex, 1000) is None


def test_past_the_state_limit_is_refused_quickly():
    with pytest.raises(ValueError, match="over the limit of 5000"):
        regex_dfa.build("(?:a|b)*a(?:a|b){20}", 5000)


def test_turned_off_it_leaves_every_regex_to_outlines_core(monkeypatch):
    monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    regex_dfa.reset()
    try:
        assert regex_dfa.build("abc", 100) is None
        table, accepting, initial = byte_dfa._marked_table("abc", 100)  # outlines-core's
        assert accepting.sum() == 1
    finally:
        monkeypatch.delenv("LANGRT_CPU_KERNELS")
        regex_dfa.reset()
    assert regex_dfa.build("abc", 100) is not None
