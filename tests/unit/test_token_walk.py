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


def test_grammar_rule_masks_equal_too(compiler):
    grammar = compiler.compile_ebnf('root ::= "[" (item ("," item)*)? "]"\nitem ::= "\\"" [a-z ]* "\\"" | root')
    masks = grammar.masks
    for rule in range(len(grammar.dfa.rules)):
        masks._prepare(rule)
        for inner in (masks._inner[rule], masks._open[rule]):
            for state in range(inner.dfa.num_states):
                assert np.array_equal(inner._compute(state).numpy(), inner._compute_numpy(state).numpy())


def test_kernels_off_means_numpy(monkeypatch):
    monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    token_walk.reset()
    try:
        assert token_walk._walk_function() is None
    finally:
        monkeypatch.undo()
        token_walk.reset()
