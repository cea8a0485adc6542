"""OpenAI's response_format, strict flag included, onto langrt's sampling parameters."""

from __future__ import annotations

import json

import pytest

from langrt.entrypoints.response_format import apply_response_format
from langrt.errors import InvalidRequest
from langrt.sampling.sampling_params import SamplingParams

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def applied(response_format, **sampling) -> dict:
    apply_response_format(sampling, response_format)
    return sampling


def json_schema(**spec) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA, **spec}}


def test_strict_picks_the_schema_mode_where_no_options_are_sent():
    assert "json_schema_options" not in applied(json_schema())  # the default mode
    assert "json_schema_options" not in applied(json_schema(strict=True))
    relaxed = applied(json_schema(strict=False))
    assert relaxed["json_schema_options"] == ["open_objects"] and json.loads(relaxed["json_schema"]) == SCHEMA
    assert SamplingParams.from_dict({**relaxed, "max_new_tokens": 4}).json_schema_options == ("open_objects",)


def test_options_sent_with_strict_false_win():
    sent = {"any_order": True, "open_objects": True}
    assert applied(json_schema(strict=False), json_schema_options=sent)["json_schema_options"] == sent
    # options all off ask for nothing: strict false still reads the schema as given
    off = applied(json_schema(strict=False), json_schema_options={"any_order": False})
    assert off["json_schema_options"] == ["open_objects"]


@pytest.mark.parametrize("options", [["any_order"], {"open_objects": True}, "any_order"])
def test_strict_true_with_a_relaxed_mode_is_refused(options):
    with pytest.raises(InvalidRequest, match="strict true") as err:
        applied(json_schema(strict=True), json_schema_options=options)
    assert err.value.param == "response_format"


def test_strict_true_with_options_all_off_is_the_default_mode():
    assert applied(json_schema(strict=True), json_schema_options=[])["json_schema_options"] == []


@pytest.mark.parametrize("strict", ["true", 1, {}])
def test_strict_must_be_a_boolean(strict):
    with pytest.raises(InvalidRequest, match="must be true or false"):
        applied(json_schema(strict=strict))


def test_other_formats():
    assert applied({"type": "text"}) == {}
    assert json.loads(applied({"type": "json_object"})["json_schema"]) == {"type": "object"}
    tag = {"type": "structural_tag", "structures": [], "triggers": []}
    assert json.loads(applied(tag)["structural_tag"]) == tag
    for bad in ({"type": "json_schema", "json_schema": {"name": "x"}}, {"type": "yaml"}, "json"):
        with pytest.raises(InvalidRequest):
            applied(bad)
