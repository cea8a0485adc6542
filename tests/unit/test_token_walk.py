"""The C++ trie walk (langrt/constrained/native/token_walk.py) gives exactly the numpy walk's
token masks, state by state, over automata of every kind of state (structure, strings, counted
strings, numbers, formats, grammar rules' opened DFAs); LANGRT_CPU_KERNELS=0 turns it off."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from langrt.constrained.masks import TokenMasks
from langrt.constrained.native import token_walk

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
                                      "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name"]},
    {"type": "string", "format": "date-time"},
    {"type": "number", "minimum": -3.5, "maximum": 1000},
    {"type": "string", "format": "email"},
    {"enum": ["é", "ü ñ", "日本", 7, None]},
]  # fmt: skip


# Where there is no C++ compiler langrt runs the numpy walk (tested everywhere else); the two
# walks can only be compared where the library builds.
pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler to build the walk")


def test_the_library_loads_here():
    assert token_walk.vocab_trie is not None and token_walk._walk_function() is not None


@pytest.mark.parametrize("schema", SCHEMAS)
def test_native_masks_equal_the_numpy_walk_in_every_state(compiler, schema):
    dfa = compiler.compile_json_schema(schema).dfa
    native, numpy_walk = TokenMasks(dfa, compiler.vocab), TokenMasks(dfa, compiler.vocab)
    for state in range(dfa.num_states):
        assert np.array_equal(native._compute(state).numpy(), numpy_walk._compute_numpy(state).numpy()), state


RULE_GRAMMARS = [
    ("ebnf", 'root ::= "[" (item ("," item)*)? "]"\nitem ::= "\\"" [a-z ]* "\\"" | root'),
    ("json_schema", {"type": "object", "properties": {"k": {"type": "string"}, "n": {"type": "integer"},
                     "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["k"]}),
]  # fmt: skip


@pytest.mark.parametrize("kind,source", RULE_GRAMMARS)
def test_grammar_rule_masks_equal_too(compiler, monkeypatch, kind, source):
    """Per top (rule, state): the tokens read inside the rule and those leaving it, from the one
    C++ pass and from numpy's two DFAs (the rule's, and the rule's opened at its boundaries)."""
    from langrt.constrained.cfg import masks as cfg_masks

    grammar = compiler.compile_ebnf(source) if kind == "ebnf" else compiler.compile_json_schema(source, any_order=True)
    native = cfg_masks.PushdownMasks(grammar.dfa, compiler.vocab)
    tops = [(r, s) for r, rule in enumerate(grammar.dfa.rules) for s in range(rule.num_states)]
    found = {top: native._top_masks(*top) for top in tops}
    monkeypatch.setattr(cfg_masks, "vocab_trie", lambda vocab: None)
    numpy_walk = cfg_masks.PushdownMasks(grammar.dfa, compiler.vocab)
    none = np.zeros(compiler.vocab.num_words, np.int32)
    opened = 0
    for top in tops:
        (inner, open_), (inner2, open2) = found[top], numpy_walk._top_masks(*top)
        assert np.array_equal(inner, inner2), top
        # the candidates walked beyond the rule (numpy's opened DFA also takes the inner ones)
        leaving, leaving2 = (none if o is None else o & ~inner for o in (open_, open2))
        assert np.array_equal(leaving, leaving2), top
        opened += bool(leaving.any())
    assert opened  # some tops do leave their rule


def test_kernels_off_means_numpy(monkeypatch):
    monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    token_walk.reset()
    try:
        assert token_walk._walk_function() is None
    finally:
        monkeypatch.undo()
        token_walk.reset()
