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
pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="no C++ compiler to build the walk"
)


@pytest.fixture(autouse=True)
def library_on(monkeypatch):
    """The comparisons run with the library on even where the run turns it off (CI's AVX2
    pass sets LANGRT_CPU_KERNELS=0), and leave it as the run had it."""
    monkeypatch.delenv("LANGRT_CPU_KERNELS", raising=False)
    token_walk.reset()
    yield
    monkeypatch.undo()
    token_walk.reset()


def test_the_library_loads_here():
    assert token_walk.vocab_trie is not None and token_walk._walk_function() is not None


@pytest.mark.parametrize("schema", SCHEMAS)
def test_native_masks_equal_the_numpy_walk_in_every_state(compiler, schema):
    from langrt.constrained.json_schema import schema_to_regex

    # one regex's DFA with every kind of state (with rules, an object's values are other rules)
    dfa = compiler.compile_regex(schema_to_regex(schema)).dfa
    native, numpy_walk = TokenMasks(dfa, compiler.vocab), TokenMasks(dfa, compiler.vocab)
    for state in range(dfa.num_states):
        assert np.array_equal(native._compute(state).numpy(), numpy_walk._compute_numpy(state).numpy()), state


RULE_GRAMMARS = [
    ("ebnf", 'root ::= "[" (item ("," item)*)? "]"\nitem ::= "\\"" [a-z ]* "\\"" | root'),
    ("json_schema", {"type": "object", "properties": {"k": {"type": "string"}, "n": {"type": "integer"},
                     "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["k"]}),
]  # fmt: skip


RULE_TEXTS = {
    "ebnf": ['["ab",["","c d"],[]]'],
    "json_schema": ['{"n": 3, "k": "x", "kids": [{"k": "", "kids": []}]}', '{"k": "q"}'],
}


@pytest.mark.parametrize("kind,source", RULE_GRAMMARS)
def test_grammar_rule_masks_equal_too(compiler, monkeypatch, kind, source):
    """Per top (rule, state), the tokens read inside the rule; per configuration along texts,
    the whole mask: from the C++ pass (escape nodes, their subtrees walked in the trie) and from
    numpy's two DFAs (the rule's, and the rule's opened at its boundaries)."""
    from langrt.constrained.cfg import masks as cfg_masks

    grammar = compiler.compile_ebnf(source) if kind == "ebnf" else compiler.compile_json_schema(source, any_order=True)
    pda = grammar.dfa
    configs = [pda.initial]
    for text in RULE_TEXTS[kind]:
        config = pda.initial
        for byte in text.encode():
            config = pda.step(config, byte)
            assert config, text
            configs.append(config)
    native = cfg_masks.PushdownMasks(pda, compiler.vocab)
    tops = [(r, s) for r, rule in enumerate(pda.rules) for s in range(rule.num_states)]
    inners = {top: native._top_masks(*top)[0] for top in tops}
    masks = [native.packed(c).numpy() for c in configs]
    assert sum(len(native._top_masks(*top)[2]) for top in tops)  # some tokens leave their rule
    monkeypatch.setattr(cfg_masks, "vocab_trie", lambda vocab: None)
    numpy_walk = cfg_masks.PushdownMasks(pda, compiler.vocab)
    for top in tops:
        assert np.array_equal(inners[top], numpy_walk._top_masks(*top)[0]), top
    for config, mask in zip(configs, masks):
        assert np.array_equal(mask, numpy_walk.packed(config).numpy()), config


def test_kernels_off_means_numpy(monkeypatch):
    monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    token_walk.reset()
    try:
        assert token_walk._walk_function() is None
    finally:
        monkeypatch.undo()
        token_walk.reset()


def test_subtree_bytes_are_the_bytes_below_each_node():
    """What lets the walk mark a subtree whole (its bytes all loop on the state there): per trie
    node, exactly the bytes on the edges below it."""
    import random

    rng = random.Random(3)
    words = [bytes(rng.choice(b'ab\x00\xff"') for _ in range(rng.randint(1, 6))) for _ in range(300)]
    trie = token_walk.VocabTrie(words)
    n = trie.node_byte.size
    for i in range(n):
        below = {int(trie.node_byte[j]) for j in range(i + 1, int(trie.skip[i]))}
        bits = np.unpackbits(trie.subtree_bytes[i].view(np.uint8), bitorder="little")
        assert set(np.flatnonzero(bits).tolist()) == below, i


@pytest.mark.parametrize("kind,source", RULE_GRAMMARS)
def test_escape_nodes_resume_where_their_bytes_lead(compiler, kind, source):
    """Each escape node comes with its rule's state before the node's byte: the stack with that
    state on top is where the node's prefix leads it inside its rule (one of the stacks the
    prefix leads to), which is how the subtrees' walks start without walking the prefix."""
    from langrt.constrained.cfg import masks as cfg_masks

    grammar = compiler.compile_ebnf(source) if kind == "ebnf" else compiler.compile_json_schema(source, any_order=True)
    pda = grammar.dfa
    native = cfg_masks.PushdownMasks(pda, compiler.vocab)
    trie = native._trie
    resumed = 0
    for text in RULE_TEXTS[kind]:
        config = pda.initial
        for byte in text.encode():
            for stack in pda.reading(config):
                for node, before in native._top_masks(*pda.top(stack))[2]:
                    spelling = compiler.vocab.token_bytes[int(trie.token_ids[trie.node_tokens[node]])]
                    prefix = spelling[: trie.depth[node] - 1]
                    inside, walked = pda.inside(stack, before), pda.walk(pda._closure([stack]), prefix)
                    assert pda._configs[inside] <= pda._configs[walked], (text, node)
                    resumed += 1
            config = pda.step(config, byte)
    assert resumed
