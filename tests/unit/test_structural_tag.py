"""SGLang's structural_tag (langrt/constrained/structural_tag.py): free text in which a trigger
must open a tag whose JSON follows its schema; the free-text regex against brute force, the
grammar (regex or rules) on whole texts, and the checks that refuse a malformed tag."""

from __future__ import annotations

import json
import random

import pytest

from langrt.constrained.byte_dfa import build_byte_dfa, call_marker
from langrt.constrained.cfg.build import full_match, local_automaton
from langrt.constrained.cfg.rules import RuleSet
from langrt.constrained.json_schema import schema_to_grammar
from langrt.constrained.structural_tag import avoiding, canonical, shift_calls, structural_tag_grammar
from langrt.errors import InvalidRequest

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
}
TREE = {  # recursive: compiles to grammar rules, not one regex
    "$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
    "$ref": "#/$defs/node",
}
TAGS = {
    "structures": [
        {"begin": "<function=weather>", "schema": WEATHER, "end": "</function>"},
        {"begin": "<function=tree>", "schema": TREE, "end": "</function>"},
    ],
    "triggers": ["<function="],
}


@pytest.mark.parametrize(
    "triggers",
    [["<tool_call>"], ['{"name": '], ["aa"], ["abab"], ["ab", "b"], ["<f", "<g", "x<"], ["a|b", "]^-"], ["é<"]],
)
def test_free_text_holds_no_trigger(triggers):
    dfa = build_byte_dfa(avoiding(triggers), 100_000)
    alphabet = sorted(set("".join(triggers))) + ["z", "\n", "ü"]
    rng = random.Random(0)
    for _ in range(1500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        if rng.random() < 0.3:  # a piece of a trigger somewhere
            t = rng.choice(triggers)
            k = rng.randint(0, len(text))
            text = text[:k] + t[: rng.randint(1, len(t))] + text[k:]
        assert full_match(dfa, text) == (not any(t in text for t in triggers)), text


def automaton(tags: dict):
    source = structural_tag_grammar(canonical(tags), schema_to_grammar)
    return source, local_automaton(source if isinstance(source, RuleSet) else RuleSet(["root"], [source]), 200_000)


def test_tags_in_free_text():
    source, pda = automaton(TAGS)
    assert isinstance(source, RuleSet)  # the recursive schema's rules, renumbered behind the start
    good = [
        "",
        "no call at all < function",
        'Let me look. <function=weather>{"city": "Paris", "days": 3}</function> Done.',
        '<function=tree>{"kids": [{"kids": []}, {}]}</function><function=weather>{"city": "Oslo", "days": 1}</function>',
    ]
    bad = [
        "<function=",  # a trigger must open a tag
        "<function=rain>{}</function>",  # no structure begins so
        '<function=weather>{"city": "Paris"}</function>',  # days is required
        '<function=weather>{"city": "Paris", "days": 0}</function>',
        '<function=weather>{"city": "Paris", "days": 3}',  # no end
        '<function=tree>{"kids": [{"kids": 1}]}</function>',
    ]
    assert [full_match(pda, t) for t in good] == [True] * len(good)
    assert [full_match(pda, t) for t in bad] == [False] * len(bad)


def test_tags_only_with_a_separator_and_a_limit():
    call = '<function=weather>{"city": "Rome", "days": 2}</function>'
    small = {**WEATHER, "properties": {"city": {"enum": ["Rome", "Oslo"]}, "days": {"type": "integer"}}}
    structures = [{"begin": "<function=weather>", "schema": small, "end": "</function>"}]
    tags = {**TAGS, "structures": structures, "free_text": False, "separator": "\n", "max_tags": 2}
    _, pda = automaton(tags)
    assert full_match(pda, call) and full_match(pda, call + "\n" + call)
    assert not full_match(pda, "")  # at least one tag
    assert not full_match(pda, call + "\n" + call + "\n" + call)  # at most two
    assert not full_match(pda, "ok " + call) and not full_match(pda, call + call)


def test_a_schema_that_is_one_regex_is_copied_into_the_start_rule():
    source, pda = automaton(
        {**TAGS, "structures": [{"begin": "<function=any>", "schema": {"enum": [1, 2]}, "end": "<"}]}
    )
    assert isinstance(source, str)
    assert full_match(pda, "x <function=any>2< y") and not full_match(pda, "<function=any>3<")


def test_at_most_max_tags_between_free_text():
    call = '<function=weather>{"city": "Rome", "days": 2}</function>'
    _, pda = automaton({**TAGS, "structures": TAGS["structures"][:1], "max_tags": 1})
    assert full_match(pda, "a " + call + " b")
    assert not full_match(pda, call + " and " + call)


def test_calls_shift_only_where_they_are_calls():
    body = "a" + call_marker(0) + "\\\\x{100001}" + call_marker(3)  # an escaped backslash is text
    assert shift_calls(body, 5) == "a" + call_marker(5) + "\\\\x{100001}" + call_marker(8)


@pytest.mark.parametrize(
    "tag, words",
    [
        ({**TAGS, "triggers": ["<tool>"]}, "starts with no trigger"),
        ({**TAGS, "extra": 1}, "unknown key"),
        ({"type": "structural_tag", "format": {}}, "structures/triggers form"),
        ({**TAGS, "structures": []}, "non-empty list"),
        ({**TAGS, "max_tags": 0}, "max_tags"),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_malformed_tag_is_refused(tag, words):
    with pytest.raises(InvalidRequest, match=words):
        canonical(tag)


def test_sampling_params_take_it_as_a_grammar():
    from langrt.sampling.sampling_params import SamplingParams

    params = SamplingParams.from_dict({"structural_tag": json.dumps({"type": "structural_tag", **TAGS})})
    assert params.is_constrained and json.loads(params.structural_tag)["triggers"] == ["<function="]
    with pytest.raises(InvalidRequest, match="at most one of"):
        SamplingParams.from_dict({"structural_tag": TAGS, "regex": "a"})


def test_the_compiler_masks_tokens_inside_a_tag(smollm_path):
    from langrt.constrained import GrammarCompiler
    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(smollm_path)
    grammar = GrammarCompiler(tokenizer).compile_structural_tag(TAGS["structures"][:1], TAGS["triggers"])
    text = 'Sure. <function=weather>{"city": "Lima", "days": 4}</function>'
    matcher = grammar.matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept_token(token)
    opened = grammar.matcher()
    for token in tokenizer.encode("Sure. <function=weather>{", add_special_tokens=False):
        assert opened.accept_token(token)
    assert not opened.accept_token(tokenizer.encode("hello", add_special_tokens=False)[0])
