"""JSON schemas as grammar rules (json_schema/rules.py over cfg/pda.py): unbounded recursion,
schemas past one regex's size limit, values left free nesting to any depth, the keywords the
grammar adds; and the JSON Schema Test Suite through the runtime's compiler, never accepting an
invalid instance."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from langrt.constrained import allocate_token_bitmask
from langrt.constrained.cfg.build import full_match, local_automaton
from langrt.constrained.cfg.rules import RuleSet
from langrt.constrained.json_schema import schema_to_grammar, schema_to_regex
from langrt.errors import UnsupportedSchema
from test_json_schema import NARROW_FORMAT_FILES

SUITE = Path(__file__).resolve().parents[1] / "data" / "json-schema-test-suite" / "draft2020-12"
MAX_STATES = 200_000


def matcher(schema, **options):
    source = schema_to_grammar(schema, **options)
    if isinstance(source, str):
        return lambda text: re.fullmatch(source, text) is not None
    automaton = local_automaton(source, MAX_STATES)
    return lambda text: full_match(automaton, text)


def check(schema, valid=(), invalid=()):
    """Each valid value (really valid: jsonschema agrees) accepted, each invalid one rejected."""
    accepts = matcher(schema)
    for v in valid:
        jsonschema.validate(v, schema)
        assert accepts(json.dumps(v)), f"valid rejected: {json.dumps(v)}"
    for v in invalid:
        assert not jsonschema.Draft202012Validator(schema).is_valid(v)
        assert not accepts(json.dumps(v)), f"invalid accepted: {json.dumps(v)}"


def nested_tree(depth: int, name="n"):
    node = {"name": name, "children": []}
    for i in range(depth):
        node = {"name": f"{name}{i}", "children": [node, {"name": "leaf", "children": []}]}
    return node


TREE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["name", "children"],
    "additionalProperties": False,
}


def test_recursion_is_unbounded_not_unrolled():
    assert isinstance(schema_to_grammar(TREE), RuleSet)
    deep = nested_tree(12)
    broken = nested_tree(12)
    inner = broken
    for _ in range(10):
        inner = inner["children"][0]
    del inner["name"]  # a required property missing ten levels down
    check(TREE, valid=[deep, nested_tree(0)], invalid=[broken, {"name": 1, "children": []}])
    # round 1's regex stops at max_ref_depth=3
    assert re.fullmatch(schema_to_regex(TREE), json.dumps(deep)) is None


def test_values_left_free_nest_to_any_depth():
    deep = [[[[[[[{"a": [1, {"b": None}]}]]]]]]]
    check(
        {"type": "object", "properties": {"x": {}}, "required": ["x"], "additionalProperties": False},
        valid=[{"x": deep}],
        invalid=[{"y": 1}, {"x": deep, "y": 1}],
    )


def test_a_schema_past_one_regexs_size_limit_compiles_as_rules():
    # 40 definitions, each an object of twelve enums, used by two anyOfs: one regex would copy
    # every definition into each use
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {f"p{j}": {"enum": [f"v{i}_{j}_{k}" for k in range(8)]} for j in range(12)},
            "required": [f"p{j}" for j in range(12)],
            "additionalProperties": False,
        }
        for i in range(40)
    }
    schema = {"$defs": defs, "type": "object", "properties": {
        "a": {"anyOf": [{"$ref": f"#/$defs/d{i}"} for i in range(40)]},
        "b": {"type": "array", "items": {"anyOf": [{"$ref": f"#/$defs/d{i}"} for i in range(40)]}}},
        "required": ["a", "b"], "additionalProperties": False}  # fmt: skip
    with pytest.raises(UnsupportedSchema):
        schema_to_regex(schema)
    item = {f"p{j}": f"v7_{j}_3" for j in range(12)}
    check(schema, valid=[{"a": item, "b": [item, {f"p{j}": f"v39_{j}_0" for j in range(12)}]}],
          invalid=[{"a": item, "b": [{**item, "p4": "v6_4_3"}]}, {"a": item}])  # fmt: skip


def test_suite_through_the_runtimes_compiler_never_accepts_invalid():
    compiled = valid = valid_accepted = 0
    for path in sorted(SUITE.glob("*.json")) + sorted(SUITE.glob("optional/format/*.json")):
        for group in json.loads(path.read_text()):
            try:
                accepts = matcher(group["schema"])
            except UnsupportedSchema as e:
                assert e.param, f"{path.name} / {group['description']}: refusal names no keyword"
                continue
            compiled += 1
            for test in group["tests"]:
                matched = accepts(json.dumps(test["data"]))
                if test["valid"] and path.name not in NARROW_FORMAT_FILES:
                    valid, valid_accepted = valid + 1, valid_accepted + matched
                elif not test["valid"]:
                    assert not matched, f"{path.name} / {group['description']} / {test['description']}"
    assert compiled >= 241 and valid_accepted / valid >= 0.90


def allowed(matcher, vocab_size: int) -> set[int]:
    bitmask = allocate_token_bitmask(1, vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    bits = bitmask[0].view(torch.uint8).numpy()
    return {i for i in range(vocab_size) if bits[i >> 3] >> (i & 7) & 1}


def test_token_masks_of_a_recursive_schema_are_what_accept_token_takes(compiler, tokenizer, vocab):
    grammar = compiler.compile_json_schema(TREE)
    text = json.dumps(nested_tree(3))
    matcher = grammar.matcher()
    for step, token in enumerate(tokenizer.encode(text)):
        mask = allowed(matcher, 49152)
        assert token in mask, tokenizer.decode([token])
        if step % 7 == 0:
            assert mask == {t for t in range(len(vocab.token_bytes)) if matcher.copy().accept_token(t)}
        assert matcher.accept_token(token)
    assert matcher.can_end and matcher.accept_token(2) and matcher.is_terminated()


# -- the keywords the grammar compiler adds ---------------------------------------------------

# Values every keyword test below runs through its matcher: whatever is accepted must be valid.
POOL = [None, True, False, 0, -3, 2.5, 7, "", "a", "x-y", "US", "CA", [], [1], [1, 1], ["a", "b"], {},
        {"a": 1}, {"a": "s"}, {"b": 1}, {"a": 1, "b": 2}, {"a": 1, "b": "2"}, {"x-a": 1}, {"x-a": "s"},
        {"x-a": 1, "y-b": "s"}, {"country": "US", "zip": "12345"}, {"country": "CA", "zip": "12345"},
        {"country": "CA", "postal": "K1A"}, {"country": "US", "postal": "K1A"}, {"name": "n"}, {"name": "n", "a": 1}]  # fmt: skip

KEYWORD_CASES = [
    ({"not": {"type": "string"}}, [None, 1, {"a": 1}], ["a"]),
    ({"not": {"enum": ["US", "CA"]}, "type": "string"}, ["a", "x-y"], ["US", "CA"]),
    ({"not": {"const": True}}, [False, None], [True]),
    ({"type": "object", "not": {"required": ["a"]}}, [{}, {"b": 1}], [{"a": 1}]),
    (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "not": {"required": ["a", "b"]}},
        [{"a": 1}, {"b": 1}, {}],
        [{"a": 1, "b": 2}],
    ),
    (
        {
            "type": "object",
            "properties": {"country": {"enum": ["US", "CA"]}, "zip": {"type": "string"}, "postal": {"type": "string"}},
            "required": ["country"],
            "if": {"properties": {"country": {"const": "US"}}},
            "then": {"required": ["zip"]},
            "else": {"required": ["postal"]},
        },
        [{"country": "US", "zip": "12345"}, {"country": "CA", "postal": "K1A"}],
        [{"country": "US", "postal": "K1A"}, {"country": "CA", "zip": "12345"}],
    ),
    (
        {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
        [{"a": 1, "b": 2}, {"b": 1}, {}],
        [{"a": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "dependencies": {"a": {"properties": {"b": {"type": "string"}}, "required": ["b"]}},
        },
        [{"a": 1, "b": "2"}, {"b": 1}],
        [{"a": 1, "b": 2}, {"a": 1}],
    ),
    (
        {
            "type": "object",
            "patternProperties": {"^x-": {"type": "integer"}, "^y-": {"type": "string"}},
            "additionalProperties": False,
        },
        [{"x-a": 1}, {"x-a": 1, "y-b": "s"}, {}],
        [{"x-a": "s"}, {"a": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "patternProperties": {"^[a-z]$": {"type": "integer"}},
            "additionalProperties": False,
        },
        [{"name": "n"}, {"name": "n", "a": 1}],
        [{"name": "n", "a": "s"}, {"a": 1}],
    ),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1}, [{"a": 1}, {"b": 1}], [{}]),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {}},
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
        [{"a": 1}, {"b": 1}],
        [{"a": 1, "b": 2}, {}],
    ),
    ({"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]}, [-3, 11], [5, 0, 10]),
    ({"type": "string", "format": "path"}, ["a", "x-y"], [1]),
    ({"type": "string", "pattern": "(^$)|(^a[0-9]$)"}, ["", "a1"], ["a", "xa1", "a12"]),
    (
        {"type": "string", "format": "duration"},
        ["P1D", "PT1H30M", "P2W"],
        [1],
    ),  # bad durations: the suite's duration.json
    ({"type": "object", "propertyNames": {"maxLength": 1}}, [{}, {"a": 1}, {"b": [2], "a": None}], [{"ab": 1}]),
    (
        {"type": "object", "properties": {"a": {}, "long": {}}, "propertyNames": {"enum": ["a", "b"]}},
        [{"a": 1}, {}],
        [{"long": 1}],
    ),
    (
        {"type": "array", "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": False},
        [[1, "a"], [1], []],
        [[1, 2], [1, "a", 3]],
    ),
    # propertyNames beside patterns and additionalProperties, a string leaving out one value
    # beside a pattern: the automata of both at once (dfa_product.py)
    (
        {
            "type": "object",
            "patternProperties": {"^[a-z]+$": {"type": "integer"}},
            "propertyNames": {"maxLength": 3},
            "additionalProperties": False,
        },
        [{"ab": 1}, {}, {"abc": 2, "x": 3}],
        [{"abcd": 1}, {"ab": "x"}, {"A": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "additionalProperties": {"type": "integer"},
            "propertyNames": {"pattern": "^[a-z]+$"},
        },
        [{"name": "x", "ab": 1}, {"ab": 2}],
        [{"AB": 1}, {"ab": "s"}, {"name": 1}],
    ),
    (
        {"type": "string", "pattern": "^[a-z]+$", "not": {"const": "stable"}},
        ["beta", "stables", "stabl"],
        ["stable", "Beta", ""],
    ),
    # oneOf whose complements cannot be written whole (items, pattern): each branch keeps the
    # instances proved to fail the other (here: by type), narrower, never wider
    (
        {
            "oneOf": [
                {"properties": {"e": {"type": "array", "items": {"type": "string", "pattern": "^a"}}}},
                {"properties": {"e": {"type": "string", "pattern": "^a"}}},
            ]
        },
        [{"e": ["ab"]}, {"e": "ab"}, {"e": []}],
        [{}, {"e": "b"}, {"e": ["b"]}, {"e": 1}, 5],
    ),
    # values pinned by enum/const beside keywords no grammar writes: checked by jsonschema
    (
        {
            "allOf": [
                {"enum": [{"x": 1, "xy": "a"}, {"x": "s"}, {"x": 1}]},
                {"not": {"patternProperties": {"^x": {"type": "integer"}}}},
            ]
        },
        [{"x": 1, "xy": "a"}, {"x": "s"}],
        [{"x": 1}, {"x": 2, "xy": "a"}],
    ),
    (
        {"type": "object", "const": {"ab": 1}, "not": {"propertyNames": {"maxLength": 1}}},
        [{"ab": 1}],
        [{"a": 1}, {"ab": 2}],
    ),
]


@pytest.mark.parametrize("schema, valid, invalid", KEYWORD_CASES)
def test_keywords_the_grammar_compiler_adds(schema, valid, invalid):
    validator = jsonschema.Draft7Validator(schema) if "dependencies" in schema or "additionalItems" in schema \
        else jsonschema.Draft202012Validator(schema)  # fmt: skip
    accepts = matcher(schema)
    for v in valid:
        assert validator.is_valid(v) and accepts(json.dumps(v)), f"valid rejected: {json.dumps(v)}"
    for v in invalid:
        assert not validator.is_valid(v) and not accepts(json.dumps(v)), f"invalid accepted: {json.dumps(v)}"
    for v in POOL:
        if accepts(json.dumps(v)):
            assert validator.is_valid(v), f"invalid accepted: {json.dumps(v)}"


def test_alternatives_that_contradict_are_dropped_before_they_count():
    """2**7 ways to take seven dependencies, each but one requiring and forbidding "q": under
    the limit of 64 alternatives once those are gone."""
    deps = {f"p{i}": {"not": {"required": ["q"]}} for i in range(7)}
    schema = {"type": "object", "properties": {"q": {"type": "integer"}}, "required": ["q"], "dependencies": deps}
    accepts = matcher(schema)
    validator = jsonschema.Draft7Validator(schema)
    for v, ok in [({"q": 1}, True), ({"q": 1, "p0": 1}, False), ({"q": 1, "p6": 2}, False), ({}, False)]:
        assert validator.is_valid(v) == ok and accepts(json.dumps(v)) == ok, v


def test_pinned_values_no_keyword_admits_are_refused_as_no_value():
    with pytest.raises(UnsupportedSchema, match="admits no value"):
        schema_to_grammar({"type": "object", "const": {"a": 1}, "not": {"propertyNames": {"maxLength": 1}}})


def test_open_objects_take_unlisted_properties_anywhere_and_nothing_invalid():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"],
              "patternProperties": {"^x-": {"type": "boolean"}}}  # fmt: skip
    source = schema_to_grammar(schema, open_objects=True)
    accepts = (lambda text: re.fullmatch(source, text) is not None) if isinstance(source, str) else None
    if accepts is None:
        automaton = local_automaton(source, MAX_STATES)
        accepts = lambda text: full_match(automaton, text)  # noqa: E731
    validator = jsonschema.Draft202012Validator(schema)
    valid = [
        {"$schema": "s", "a": 1},
        {"a": 1, "z": [1, {"q": None}], "b": "x", "w": 2},
        {"x-on": True, "a": 2, "x-off": False},
    ]
    invalid = [{"b": "x"}, {"a": "1"}, {"a": 1, "x-on": 1}, {"$schema": "s", "b": 2, "a": 1}]
    for v in valid:
        assert validator.is_valid(v) and accepts(json.dumps(v)), v
    for v in invalid + POOL:
        if accepts(json.dumps(v)):
            assert validator.is_valid(v), v
    for v in invalid:
        assert not accepts(json.dumps(v)), v
    closed = matcher(schema)
    assert not closed(json.dumps(valid[0])) and closed(json.dumps({"a": 1, "b": "x"}))


def test_any_order_takes_every_order_of_the_properties_and_nothing_invalid():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"},
              "d": {"type": "null"}, "e": {"type": "array", "items": {"$ref": "#"}}}, "required": ["a", "c", "e"],
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}  # fmt: skip
    validator = jsonschema.Draft202012Validator(schema)
    accepts = matcher(schema, any_order=True)
    leaf = {"a": 1, "c": True, "e": []}
    full = {"a": 1, "b": "s", "c": False, "d": None, "e": [leaf], "x-1": 3}
    for names in itertools.permutations(full):
        v = {n: full[n] for n in names}
        assert accepts(json.dumps(v)), v
        for drop in ("a", "c", "e", "b"):  # leaving out a required property is invalid
            w = {n: v[n] for n in names if n != drop}
            assert accepts(json.dumps(w)) == validator.is_valid(w), w
    for v in [{"c": True, "e": [], "a": "1"}, {"e": [{"c": True, "a": 1}], "c": True, "a": 1}, {"a": 1, "c": True, "e": [], "z": 1},
              {"x-1": 1.5, "a": 1, "c": True, "e": []}, {}]:  # fmt: skip
        assert not validator.is_valid(v) and not accepts(json.dumps(v)), v
    assert not matcher(schema)(json.dumps({"c": True, "a": 1, "e": []}))  # the default keeps the schema's order


def test_open_objects_keep_oneof_branches_apart():
    """Round 1 proved oneOf branches disjoint by a required key the other branch's objects never
    hold; with open objects they may hold it as an unlisted key, so the proof must not count."""
    schema = {"type": "object", "oneOf": [{"properties": {"a": {}}, "required": ["a"]},
                                          {"properties": {"b": {}}, "required": ["b"]}]}  # fmt: skip
    automaton = local_automaton(schema_to_grammar(schema, open_objects=True), MAX_STATES)
    assert full_match(automaton, json.dumps({"a": 1, "z": 2})) and full_match(automaton, json.dumps({"b": 1}))
    assert not full_match(automaton, json.dumps({"a": 1, "b": 2}))
    assert not full_match(automaton, json.dumps({"b": 1, "a": 2}))


# -- property test: random schemas, their instances and mutants ----------------------------------


def random_schema(rng, depth=0):
    kind = (
        "object"
        if depth == 0 and rng.random() < 0.6
        else rng.choice(
            ["string", "integer", "enum", "boolean", "array", "object", "object"]
            if depth < 2
            else ["string", "integer", "enum", "boolean"]
        )
    )
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(0, 4)} if rng.random() < 0.5 else {"type": "string"}
    if kind == "integer":
        return {"type": "integer", "minimum": rng.randint(-5, 5)}
    if kind == "enum":
        return {"enum": rng.sample(["a", "b", 1, 2, None, True], rng.randint(1, 3))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(0, 3)}
    names = rng.sample(["p", "q", "r", "s"], rng.randint(1, 4))
    schema = {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
              "required": [n for n in names if rng.random() < 0.5], "additionalProperties": False}  # fmt: skip
    if depth == 0 and rng.random() < 0.5:  # recursion: the schema becomes grammar rules
        schema["properties"]["kids"] = {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}
    extra = rng.random()
    if extra < 0.15:
        schema["not"] = {"required": [rng.choice(names)]}
    elif extra < 0.3:
        schema["dependentRequired"] = {names[0]: names[1:2]}
    elif extra < 0.45:
        schema["if"] = {"properties": {names[0]: {"const": "a"}}, "required": [names[0]]}
        schema["then"] = {"required": names[-1:]}
    return schema


def random_value(rng, schema, depth=0, root=None, shuffle=False):
    """A value following the schema's shape (often valid, sometimes not), keys in schema order
    (shuffle: in any order)."""
    root = root or schema
    if "$ref" in schema:
        return random_value(rng, root, depth + 1, root, shuffle) if depth < 4 else {}
    if "enum" in schema:
        return rng.choice(schema["enum"] + ["zz"])
    t = schema.get("type")
    if t == "string":
        return "".join(rng.choice('ab"é ') for _ in range(rng.randint(0, 5)))
    if t == "integer":
        return rng.randint(-7, 7)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        return [random_value(rng, schema["items"], depth + 1, root, shuffle) for _ in range(rng.randint(0, 4))]
    names = [n for n in schema["properties"] if rng.random() < 0.7]
    if shuffle:
        rng.shuffle(names)
    return {n: random_value(rng, schema["properties"][n], depth + 1, root, shuffle) for n in names}


@settings(
    max_examples=int(os.environ.get("LANGRT_RANDOM_SCHEMAS", 150)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1), any_order=st.booleans())
def test_random_schemas_accept_valid_instances_and_never_an_invalid_one(seed, any_order):
    """any_order: properties are compiled, and instances written, in any order."""
    rng = random.Random(seed)
    schema = random_schema(rng)
    validator = jsonschema.Draft202012Validator(schema)
    try:
        accepts = matcher(schema, any_order=any_order)
    except UnsupportedSchema as e:  # refused naming a keyword of the schema; "no value" only if so
        assert e.param in json.dumps(schema) or e.param == "json_schema", (e.param, schema)
        if "admits no value" in e.message:
            assert not any(validator.is_valid(random_value(rng, schema)) for _ in range(25)), schema
        return
    for _ in range(25):
        v = random_value(rng, schema, shuffle=any_order)
        text = json.dumps(v, ensure_ascii=False)
        if validator.is_valid(v):
            assert accepts(text), (schema, text)  # keys come in schema order unless any_order
        else:
            assert not accepts(text), (schema, text)


@settings(max_examples=300, deadline=None)
@given(
    points=st.lists(st.one_of(st.integers(0, 0x7F), st.integers(0xD7F0, 0xE010), st.integers(0, 0x10FFFF)), max_size=8)
)
@example(points=[0x100001, 0x100003])  # plane 16: complement() once gave back U+100000 (> MAX_CP)
def test_ranges_without_points_is_the_intersection_with_their_complement(points):
    """keys.py cuts names' first characters out of the key alphabet with rx.without (one pass),
    which must equal the slower set algebra it replaced."""
    from langrt.constrained.json_schema import regex as rx

    raw = rx.normalize([(0x20, 0x21), (0x23, 0x5B), (0x5D, rx.MAX_CP)])
    assert rx.without(raw, points) == rx.intersect(raw, rx.complement([(p, p) for p in points]))


def test_pinned_values_respect_the_negations_of_if_and_not():
    """A value pinned by enum that a negation leaves out (`if` false: s is not "a"; `not`) is not
    brought back by the pinned-values fallback, which checks values with jsonschema: langrt's
    markers for the negations are written as standard keywords for it (found by the random
    schema test: {"s": "a", "r": 2} was accepted, without the q that s = "a" requires)."""
    schema = {
        "type": "object",
        "properties": {"s": {"enum": ["a"]}, "r": {"enum": [None, 2, 1]}, "q": {"type": "integer"}},
        "additionalProperties": False,
        "if": {"properties": {"s": {"const": "a"}}, "required": ["s"]},
        "then": {"required": ["q"]},
    }
    for any_order in (False, True):
        accepts = matcher(schema, any_order=any_order)
        assert not accepts('{"s": "a", "r": 2}') and not accepts('{"s": "a"}')
        assert accepts('{"s": "a", "q": 3}') and accepts('{"r": 2}') and accepts("{}")
    nothing = {"type": "object", "properties": {"s": {"enum": ["a"]}}, "additionalProperties": False,
               "not": {"properties": {"s": {"const": "a"}}}}  # fmt: skip
    with pytest.raises(UnsupportedSchema, match="admits no value"):
        matcher(nothing)


def test_a_string_automaton_past_its_limit_names_its_keywords(vocab):
    from langrt.constrained import GrammarCompiler
    from langrt.errors import InvalidRequest

    small = GrammarCompiler(vocab, max_states=2_000)
    schema = {"type": "string", "pattern": "^(ab|cd|ef)[a-z]{3}x+$", "format": "email", "maxLength": 900}
    with pytest.raises(InvalidRequest) as refused:
        small.compile_json_schema(schema)
    message = str(refused.value)
    assert "'pattern' with 'format' with 'maxLength' 900" in message and "over 2000 states" in message
