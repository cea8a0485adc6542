"""SamplingParams: defaults, every rejection rule, from_dict normalization, round trips."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from langrt.errors import InvalidRequest
from langrt.sampling import SamplingParams


def test_defaults():
    p = SamplingParams()
    assert (p.max_new_tokens, p.min_new_tokens, p.n) == (128, 0, 1)
    assert (p.stop, p.stop_token_ids, p.stop_regex) == ((), (), ())
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, -1, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.ignore_eos, p.skip_special_tokens) == (False, True)
    assert (p.spaces_between_special_tokens, p.no_stop_trim) == (True, False)
    assert (p.regex, p.json_schema, p.ebnf, p.seed) == (None, None, None, None)
    assert not p.is_greedy and not p.needs_penalties


def test_frozen_and_hashable():
    p = SamplingParams(stop=["a", "b"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5  # type: ignore[misc]
    assert hash(p) == hash(SamplingParams(stop=("a", "b")))


REJECTED = [
    # (kwargs, param)
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": -0.2}, "top_p"),
    ({"top_p": math.nan}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.01}, "min_p"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": 2.1}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"min_new_tokens": -1}, "min_new_tokens"),
    ({"min_new_tokens": 11, "max_new_tokens": 10}, "min_new_tokens"),
    ({"n": 0}, "n"),
    ({"regex": "a+", "json_schema": "{}"}, "json_schema"),
    ({"regex": "a+", "ebnf": "root ::= 'a'"}, "ebnf"),
    ({"json_schema": "{}", "ebnf": "root ::= 'a'"}, "ebnf"),
    ({"stop": ("ok", "")}, "stop"),
    ({"stop": ""}, "stop"),
    ({"stop_regex": "(unclosed"}, "stop_regex"),
    ({"stop_regex": ["ok", "[z-a]"]}, "stop_regex"),
    ({"regex": "(unclosed"}, "regex"),
    ({"stop_token_ids": (5, -1)}, "stop_token_ids"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"json_schema": "42"}, "json_schema"),
    ({"json_schema": "{}", "json_schema_options": {"any_order": 1}}, "json_schema_options"),
    ({"json_schema": "{}", "json_schema_options": ["sorted_keys"]}, "json_schema_options"),
    ({"json_schema": "{}", "json_schema_options": "any_order"}, "json_schema_options"),
    ({"regex": "a", "json_schema_options": ["any_order"]}, "json_schema_options"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    # wrong types: bool is not an int, strings are never numbers
    ({"max_new_tokens": True}, "max_new_tokens"),
    ({"min_new_tokens": False}, "min_new_tokens"),
    ({"n": True}, "n"),
    ({"top_k": True}, "top_k"),
    ({"seed": True}, "seed"),
    ({"stop_token_ids": (True,)}, "stop_token_ids"),
    ({"temperature": True}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"max_new_tokens": "16"}, "max_new_tokens"),
    ({"max_new_tokens": 16.0}, "max_new_tokens"),
    ({"top_p": None}, "top_p"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"skip_special_tokens": "yes"}, "skip_special_tokens"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a", 5]}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": ("5",)}, "stop_token_ids"),
    ({"regex": 5}, "regex"),
    ({"ebnf": ["root"]}, "ebnf"),
    ({"seed": 1.0}, "seed"),
]


@pytest.mark.parametrize("kwargs,param", REJECTED, ids=[repr(k) for k, _ in REJECTED])
def test_rejections_name_the_param(kwargs, param):
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(**kwargs)
    assert err.value.param == param
    assert param in err.value.message


REJECTED_AS_DICT = [(k, p) for k, p in REJECTED if None not in k.values()]  # None = default


@pytest.mark.parametrize("kwargs,param", REJECTED_AS_DICT, ids=[repr(k) for k, _ in REJECTED_AS_DICT])
def test_from_dict_rejects_the_same(kwargs, param):
    with pytest.raises(InvalidRequest) as err:
        SamplingParams.from_dict(kwargs)
    assert err.value.param == param


def test_messages_state_the_range():
    with pytest.raises(InvalidRequest, match=r"top_p must be in \(0, 1\], got 1\.5"):
        SamplingParams(top_p=1.5)
    with pytest.raises(InvalidRequest, match=r"temperature must be .*>= 0, got -1\.0"):
        SamplingParams(temperature=-1)
    with pytest.raises(InvalidRequest, match=r"max_new_tokens must be an integer, got bool"):
        SamplingParams(max_new_tokens=True)


def test_stop_regex_message_includes_re_error():
    with pytest.raises(re.error) as re_err:
        re.compile("(ab")
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(stop_regex=("(ab",))
    assert str(re_err.value) in err.value.message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0},
        {"temperature": 2},
        {"top_p": 1},
        {"top_p": 1e-9},
        {"top_k": 1},
        {"top_k": -1},
        {"min_p": 0},
        {"min_p": 1},
        {"frequency_penalty": -2, "presence_penalty": 2},
        {"repetition_penalty": 2},
        {"repetition_penalty": 1e-3},
        {"max_new_tokens": 0},
        {"min_new_tokens": 5, "max_new_tokens": 5},
        {"seed": 0},
        {"seed": 2**64 - 1},
        {"regex": r"\d+"},
        {"json_schema": '{"type": "object"}'},
        {"ebnf": "root ::= 'a'"},
    ],
)
def test_boundary_values_accepted(kwargs):
    p = SamplingParams(**kwargs)
    for key, value in kwargs.items():
        assert getattr(p, key) == value


def test_int_accepted_where_float_expected_and_stored_as_float():
    p = SamplingParams(temperature=1, top_p=1, min_p=0, repetition_penalty=2)
    assert isinstance(p.temperature, float) and p.temperature == 1.0
    assert isinstance(p.repetition_penalty, float)
    assert p == SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0, repetition_penalty=2.0)


def test_from_dict_none_means_default():
    assert SamplingParams.from_dict(None) == SamplingParams()
    assert SamplingParams.from_dict({}) == SamplingParams()
    d = {name: None for name in SamplingParams().to_dict()}
    assert SamplingParams.from_dict(d) == SamplingParams()
    assert SamplingParams.from_dict({"temperature": None, "top_k": 5}).temperature == 1.0


def test_from_dict_normalizes_containers():
    p = SamplingParams.from_dict({"stop": "</s>", "stop_token_ids": [2, 7], "stop_regex": r"\n\n+"})
    assert p.stop == ("</s>",)
    assert p.stop_token_ids == (2, 7)
    assert p.stop_regex == (r"\n\n+",)
    p = SamplingParams.from_dict({"stop": ["a", "b"], "stop_regex": ["x", "y+"]})
    assert p.stop == ("a", "b") and p.stop_regex == ("x", "y+")


def test_from_dict_json_schema_dict_and_string():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    p = SamplingParams.from_dict({"json_schema": schema})
    assert isinstance(p.json_schema, str) and json.loads(p.json_schema) == schema
    q = SamplingParams.from_dict({"json_schema": json.dumps(schema)})
    assert json.loads(q.json_schema) == schema


def test_from_dict_unknown_key():
    with pytest.raises(InvalidRequest) as err:
        SamplingParams.from_dict({"temprature": 0.5})
    assert err.value.param == "temprature"
    assert "unknown sampling parameter 'temprature'" in err.value.message
    assert "temperature" in err.value.message.split("'temprature'")[1]  # the suggestion


@pytest.mark.parametrize("bad", [[("temperature", 1.0)], "temperature=1", 3, ["a"]])
def test_from_dict_rejects_non_mapping(bad):
    with pytest.raises(InvalidRequest) as err:
        SamplingParams.from_dict(bad)
    assert err.value.param == "sampling_params"


def test_is_greedy_and_needs_penalties():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(top_k=1, temperature=0.8).is_greedy
    assert not SamplingParams(temperature=1e-3, top_k=2).is_greedy
    assert SamplingParams(frequency_penalty=0.1).needs_penalties
    assert SamplingParams(presence_penalty=-0.1).needs_penalties
    assert SamplingParams(repetition_penalty=1.1).needs_penalties
    assert not SamplingParams(temperature=0.3, top_p=0.5).needs_penalties


def test_to_dict_is_json_ready():
    p = SamplingParams(stop=("a",), stop_token_ids=(3,), json_schema={"type": "string"})
    d = p.to_dict()
    assert d["stop"] == ["a"] and d["stop_token_ids"] == [3]
    assert SamplingParams.from_dict(json.loads(json.dumps(d))) == p


_finite = dict(allow_nan=False, allow_infinity=False)
valid_params = st.builds(
    SamplingParams,
    max_new_tokens=st.integers(0, 4096),
    n=st.integers(1, 8),
    stop=st.lists(st.text(min_size=1, max_size=5), max_size=3).map(tuple),
    stop_token_ids=st.lists(st.integers(0, 200_000), max_size=3).map(tuple),
    temperature=st.floats(0, 5, **_finite),
    top_p=st.floats(0, 1, exclude_min=True, **_finite),
    top_k=st.one_of(st.just(-1), st.integers(1, 1000)),
    min_p=st.floats(0, 1, **_finite),
    frequency_penalty=st.floats(-2, 2, **_finite),
    presence_penalty=st.floats(-2, 2, **_finite),
    repetition_penalty=st.floats(0, 2, exclude_min=True, **_finite),
    ignore_eos=st.booleans(),
    regex=st.one_of(st.none(), st.sampled_from([r"\d+", "(a|b)*", "[a-z]{2,3}"])),
    seed=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)


@settings(max_examples=200, deadline=None)
@given(valid_params)
def test_round_trip_through_dict(p):
    assert SamplingParams.from_dict(p.to_dict()) == p
    assert SamplingParams.from_dict(json.loads(json.dumps(p.to_dict()))) == p


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_top_p_accepted_exactly_on_its_range(x):
    if 0 < x <= 1:
        assert SamplingParams(top_p=x).top_p == x
    else:
        with pytest.raises(InvalidRequest):
            SamplingParams(top_p=x)


def test_json_schema_options_reach_the_schema_compiler():
    """{"any_order": true} or ["any_order"] are one option set; the grammar it names takes the
    properties in any order, the default only in the schema's."""
    from langrt.constrained.cfg.build import full_match, local_automaton
    from langrt.constrained.spec import GrammarSpec

    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }
    p = SamplingParams(json_schema=schema, json_schema_options={"any_order": True, "open_objects": False})
    assert p.json_schema_options == ("any_order",) == SamplingParams.from_dict(p.to_dict()).json_schema_options
    assert SamplingParams(json_schema=schema, json_schema_options=["any_order", "any_order"]) == p
    spec, plain = GrammarSpec.from_params(p), GrammarSpec.from_params(SamplingParams(json_schema=schema))
    assert spec != plain and spec.options == ("any_order",)

    def accepts(source, text):
        return (
            re.fullmatch(source, text) is not None
            if isinstance(source, str)
            else full_match(local_automaton(source, 10_000), text)
        )

    assert accepts(spec.translate(), '{"b": 1, "a": 2}') and not accepts(plain.translate(), '{"b": 1, "a": 2}')
    assert accepts(spec.translate(), '{"a": 1, "b": 2}') and not accepts(spec.translate(), '{"b": 1}')
