"""`langrt launch --grammar-backend xgrammar | llguidance` on the built-in model, over HTTP: every
constraint kind gives valid output, a bad grammar is a 400 naming the engine. One server per
engine (module scope); skipped only where the engine's package is not installed."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammar_texts import JSON_GBNF
from server_utils import LaunchedServer

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ARITH_GBNF = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]{1,3} | "(" expr ")"\n'


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def server(request):
    pytest.importorskip(request.param, reason=f"{request.param} is not installed (pip install {request.param})")
    s = LaunchedServer("--max-total-tokens", "16384", "--grammar-backend", request.param)
    s.backend = request.param
    yield s
    s.stop()


@pytest.fixture(scope="module")
def chat():
    from langrt.builtin import builtin_model_path
    from langrt.tokenizer.loader import load_tokenizer

    tok = load_tokenizer(builtin_model_path())
    return lambda q: tok.apply_chat_template(
        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
    )


def generate(server, text, **params):
    return server.post("/generate", {"text": text, "sampling_params": {"temperature": 0, **params}})[1]


def test_server_reports_its_backend(server):
    assert server.get("/get_server_info")[1]["grammar_backend"] == server.backend


def test_regex_and_choices(server, chat):
    out = generate(server, chat("What is 17 + 25?"), regex=r"[0-9]+", max_new_tokens=8)
    assert re.fullmatch(r"[0-9]+", out["text"]), out
    regex = r'\{"city": "[A-Za-z ]{1,20}", "country": "[A-Za-z ]{1,20}"\}'
    out = generate(server, chat("Name a city and its country as JSON."), regex=regex, max_new_tokens=40)
    assert re.fullmatch(regex, out["text"]) and out["meta_info"]["finish_reason"]["type"] == "stop", out
    out = generate(server, chat("Is the sky blue? Answer yes or no."), choices=["yes", "no"])
    assert out["text"] in ("yes", "no") and out["meta_info"]["finish_reason"]["type"] == "stop", out


def test_json_schema(server, chat):
    prompts = [
        chat(f"Extract as JSON: {p}")
        for p in ("Maria Lopez, 34, lives in Seville.", "Tom Berg is 51 and lives in Oslo.")
    ]
    outs = server.post(
        "/generate",
        {
            "text": prompts,
            "sampling_params": {"json_schema": json.dumps(PERSON), "max_new_tokens": 48, "temperature": 0},
        },
    )[1]
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), PERSON)
    assert json.loads(outs[0]["text"])["age"] == 34, outs[0]["text"]
    sampled = server.post("/generate", {"text": prompts[0], "sampling_params": {"json_schema": json.dumps(PERSON), "max_new_tokens": 48,
                                                                               "temperature": 1.0, "n": 3, "seed": 1}})[1]  # fmt: skip
    for out in sampled:
        if out["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(out["text"]), PERSON)


def test_ebnf(server, chat):
    out = generate(server, chat("Write a short sum."), ebnf=ARITH_GBNF, max_new_tokens=16)
    assert re.fullmatch(r"[0-9()+-]+", out["text"]) and out["text"].count("(") >= out["text"].count(")"), out
    if out["meta_info"]["finish_reason"]["type"] == "stop":
        assert out["text"].count("(") == out["text"].count(")"), out
    out = generate(server, chat("Give a JSON list of two colors."), ebnf=JSON_GBNF, max_new_tokens=24)
    if out["meta_info"]["finish_reason"]["type"] == "stop":
        json.loads(out["text"])


def test_structural_tag(server, chat):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    tag = {
        "structures": [{"begin": "<city>", "schema": schema, "end": "</city>"}],
        "triggers": ["<city>"],
        "free_text": False,
    }
    out = generate(server, chat("Name a city."), structural_tag=tag, max_new_tokens=32)
    match = re.fullmatch(r"<city>(.*)</city>", out["text"], flags=re.S)
    assert match and out["meta_info"]["finish_reason"]["type"] == "stop", out
    jsonschema.validate(json.loads(match.group(1)), schema)


@pytest.mark.parametrize(
    "params", [{"regex": "a(?=b)b"}, {"ebnf": 'root ::= "a" | b'}, {"json_schema": '{"type": "foo"}'}]
)
def test_bad_grammar_is_a_400_naming_it(server, params):
    """Refused by the engine's compile (Python's `re` accepts the lookahead; neither engine
    does), except EBNF, which langrt parses first whatever the engine."""
    status, body = server.post("/generate", {"text": "x", "sampling_params": params}, check=False)
    kind = next(iter(params))
    assert status == 400 and body["error"]["param"] == kind, body
    message = body["error"]["message"]
    assert (
        ("line 1, column 16" in message) if kind == "ebnf" else (f"{server.backend} refused the {kind}" in message)
    ), message
