"""Constrained generation end to end: outputs follow their grammar; jump-forward; errors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from langrt.errors import InvalidRequest

REGEXES = [
    r"[0-9]{1,4}",
    r"(yes|no|maybe)",
    r"[a-z]+( [a-z]+){0,4}\.",
    r'\{"id": [0-9]{1,3}, "tags": \["[a-z]{1,8}"(, "[a-z]{1,8}"){0,2}\]\}',
    r"(é|ü|ñ)[a-zñ]{0,6}",
]


def ends_well(text: str, meta: dict, regex: str) -> bool:
    """A constrained output either fullmatches, or stopped at max_new_tokens on the way."""
    import regex as partial

    if meta["finish_reason"]["type"] == "length":
        return partial.fullmatch(regex, text, partial=True) is not None
    return re.fullmatch(regex, text) is not None


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    import langrt

    with langrt.Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=8192, context_length=1024,
                       log_level="warning", grammar_compile_timeout=2.0) as engine:  # fmt: skip
        yield engine


def test_random_model_follows_every_regex(tiny):
    prompts = ["Hello", "Once upon a time", "1 2 3", "The answer is"]
    for regex in REGEXES:
        for seed in range(3):
            params = {"regex": regex, "max_new_tokens": 40, "temperature": 1.0, "seed": seed}
            outs = tiny.generate(prompts, params)
            for out in outs:
                assert ends_well(out["text"], out["meta_info"], regex), (regex, out["text"], out["meta_info"])


JSON_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": -5, "maximum": 500},
     "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["x", "y", 3]}, "maxItems": 3}},
     "required": ["name", "n"], "additionalProperties": False},
    {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "string", "format": "date"}, {"type": "null"}]},
    {"type": "array", "prefixItems": [{"const": "id"}, {"type": "string", "format": "uuid"}], "items": False},
    {"type": "object"},
]  # fmt: skip


def ends_valid(text: str, meta: dict, schema: dict) -> bool:
    """A JSON-schema output validates, or stopped at max_new_tokens on the way."""
    if meta["finish_reason"]["type"] == "length":
        return True  # a prefix; test_json_schema.py checks the grammar admits only valid texts
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return validator.is_valid(json.loads(text))


def test_random_model_follows_every_json_schema(tiny):
    finished = 0
    for schema in JSON_SCHEMAS:
        for seed in range(3):
            params = {"json_schema": json.dumps(schema), "max_new_tokens": 60, "temperature": 1.0, "seed": seed}
            for out in tiny.generate(["Hello", "JSON:"], params):
                assert ends_valid(out["text"], out["meta_info"], schema), (schema, out["text"], out["meta_info"])
                finished += out["meta_info"]["finish_reason"]["type"] == "stop"
    assert finished >= 6, "most random generations should complete within 60 tokens"


def test_unsupported_schema_keyword_is_named(tiny):
    with pytest.raises(Exception) as info:
        tiny.generate("x", {"json_schema": json.dumps({"type": "string", "format": "idn-email"})})
    assert getattr(info.value, "param", None) == "format" and "idn-email" in str(info.value)


def test_choices(tiny):
    outs = tiny.generate(["a", "b", "c"], {"choices": ["alpha", "beta", "gamma (3)"], "temperature": 1.0, "seed": 1})
    for out in outs:
        assert out["text"] in ("alpha", "beta", "gamma (3)")
        assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_jump_forward_same_text_fewer_steps(tiny_llama_dir):
    import langrt

    regex = r'\{"name": "[a-z]{1,10}", "kind": "(cat|dog)", "legs": [0-9]\}'
    prompts = ["Describe an animal:", "JSON please:"]
    texts, passes = {}, {}
    for jump in (True, False):
        with langrt.Engine(str(tiny_llama_dir), dtype="float32", max_total_tokens=4096, context_length=512,
                           log_level="warning", disable_jump_forward=not jump) as engine:  # fmt: skip
            outs = engine.generate(prompts, {"regex": regex, "max_new_tokens": 80, "temperature": 0})
            texts[jump] = [o["text"] for o in outs]
            stats = engine.cache_stats()
            passes[jump] = stats["forward_passes"]
            if jump:
                assert stats["jump_forward_tokens"] > 0
    assert texts[True] == texts[False]
    assert all(re.fullmatch(regex, t) for t in texts[True])
    assert passes[True] < passes[False]


def test_bad_regex_is_refused_with_its_position(tiny):
    with pytest.raises(InvalidRequest) as info:
        tiny.generate("x", {"regex": "ab(c"})
    assert info.value.param == "regex" and "position" in info.value.message


def test_exploding_grammar_fails_alone(tiny):
    """A grammar past the compile limit fails its own request; the others finish normally."""
    import threading

    results = {}

    def long_request():
        results["long"] = tiny.generate("Hello", {"max_new_tokens": 200, "ignore_eos": True, "temperature": 0})

    thread = threading.Thread(target=long_request)
    thread.start()
    with pytest.raises(InvalidRequest, match="time limit"):
        tiny.generate("x", {"regex": "(a|b)*a(a|b){24}", "max_new_tokens": 5})
    thread.join(60)
    assert results["long"]["meta_info"]["completion_tokens"] == 200


@pytest.mark.slow
def test_smollm_regex_and_json(smollm_path):
    import langrt

    with langrt.Engine(log_level="warning", max_total_tokens=16384) as engine:
        tok = engine.tokenizer

        def chat(q):
            return tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)

        out = engine.generate(chat("What is 17 + 25?"), {"regex": r"[0-9]+", "max_new_tokens": 8, "temperature": 0})
        assert re.fullmatch(r"[0-9]+", out["text"]) and out["meta_info"]["finish_reason"]["type"] == "stop"
        out = engine.generate(chat("Is the sky blue?"), {"choices": ["yes", "no"], "temperature": 0})
        assert out["text"] in ("yes", "no")
        regex = r'\{"city": "[A-Za-z ]{1,20}", "country": "[A-Za-z ]{1,20}"\}'
        out = engine.generate(chat("Name a city and its country as JSON."), {"regex": regex, "max_new_tokens": 60, "temperature": 0})
        assert re.fullmatch(regex, out["text"]), out["text"]
        assert set(json.loads(out["text"])) == {"city", "country"}
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "age": {"type": "integer", "minimum": 0,
                  "maximum": 120}, "city": {"type": "string", "maxLength": 30}}, "required": ["name", "age", "city"]}  # fmt: skip
        out = engine.generate(chat("Extract as JSON: Maria Lopez, 34, lives in Seville."),
                              {"json_schema": json.dumps(schema), "max_new_tokens": 60, "temperature": 0})  # fmt: skip
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        value = json.loads(out["text"])
        jsonschema.validate(value, schema)
        assert value["age"] == 34 and "Seville" in value["city"], value
