"""--grammar-backend: the xgrammar and llguidance adapters over the built-in model's vocabulary
(each kind accepts what it should and refuses what it should, masks agree with the matcher,
errors are InvalidRequest), langrt's EBNF written for both engines, the threaded compile
service, and the start-up error when a backend's package is missing.

An engine's tests are skipped only where its package is not installed."""

from __future__ import annotations

import importlib.util
import json
import threading
import time

import pytest
import torch

from grammar_texts import JSON_GBNF
from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest
from langrt.tokenizer.text_decoder import load_text_decoder

EOS = 2
ARITH_GBNF = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]{1,3} | "(" expr ")"\n'
# langrt's syntax the engines' own EBNF readers get wrong: `.`, an empty alternative, escapes,
# names with `-` and `.`, a comment inside a rule, a character outside the BMP
ODD_GBNF = (
    'root ::= . "x\\"\\\\" [^a-z\\]]{2,3} "\\u00e9" ws r-2.b\nws ::= | " "\nr-2.b ::= "😀"? [\\t\\n]+ # c\n  | "b"\n'
)
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}},
    "required": ["a", "b"],
}


def tag_spec(**options) -> GrammarSpec:
    """A structural tag in langrt's canonical form (structural_tag.py)."""
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    spec = {
        "structures": [
            {"begin": "<fn=a>", "schema": schema, "end": "</fn>"},
            {"begin": "<fn=b>", "schema": True, "end": "</fn>"},
        ],
        "triggers": ["<fn="],
        "free_text": True,
        "separator": "",
        "max_tags": None,
        **options,
    }
    return GrammarSpec("structural_tag", json.dumps(spec, sort_keys=True, ensure_ascii=False))


@pytest.fixture(scope="module")
def decoder(smollm_path):
    return load_text_decoder(smollm_path)


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def backend(request, vocab, decoder):
    pytest.importorskip(request.param, reason=f"{request.param} is not installed (pip install {request.param})")
    if request.param == "xgrammar":
        from langrt.constrained.backends.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(vocab)
    from langrt.constrained.backends.llguidance_backend import LLGuidanceBackend

    return LLGuidanceBackend(vocab, decoder.encode)


def allowed(matcher, vocab) -> torch.Tensor:
    bitmask = torch.zeros((1, vocab.num_words), dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    return bitmask[0]


def bit(words: torch.Tensor, token: int) -> bool:
    return bool((int(words[token // 32]) >> (token % 32)) & 1)


def walk(backend, spec: GrammarSpec, text: str, decoder) -> str:
    """How `text` fares token by token: "refused", "open" (a prefix), "ends" (EOS allowed and
    accepted), or "complete" (the grammar allows nothing more: terminated without EOS). Every
    token the mask allows is accepted (llguidance's masks allow only the canonical tokenization
    of forced text, so the mask may allow less than the matcher accepts)."""
    matcher = backend.compile(spec).matcher()
    for token in decoder.encode(text):
        mask = allowed(matcher, backend.vocab)
        accepted = matcher.accept_token(token)
        assert accepted or not bit(mask, token), f"mask allows {token} that the matcher refuses"
        if not accepted:
            return "refused"
    if matcher.is_terminated():
        return "complete"
    if not bit(allowed(matcher, backend.vocab), EOS):
        return "open"
    assert matcher.accept_token(EOS) and matcher.is_terminated()
    return "ends"


@pytest.mark.parametrize(
    "spec, text, expected",
    [
        (GrammarSpec("regex", "[0-9]{1,3}"), "12", "ends"),
        (GrammarSpec("regex", "[0-9]{1,3}"), "123", "complete"),
        (GrammarSpec("regex", "[0-9]{1,3}"), "1234", "refused"),
        (GrammarSpec("json_schema", json.dumps(SCHEMA)), '{"a": 1, "b": ["x", "y"]}', "complete"),
        (GrammarSpec("json_schema", json.dumps(SCHEMA)), '{"a": 1, "b": ["x"', "open"),
        (GrammarSpec("json_schema", json.dumps(SCHEMA)), '{ "a": 1, "b": []}', "refused"),
        (GrammarSpec("json_schema", json.dumps(SCHEMA)), '{"a": "1", "b": []}', "refused"),
        (GrammarSpec("ebnf", JSON_GBNF), '{"a": [1, 2.5e3, "x\\n"]}', "complete"),
        (GrammarSpec("ebnf", ARITH_GBNF), "1+(2-3)", "ends"),
        (GrammarSpec("ebnf", ARITH_GBNF), "1+)", "refused"),
        (GrammarSpec("ebnf", ODD_GBNF), 'Qx"\\!!é 😀\t\n', "ends"),
        (GrammarSpec("ebnf", ODD_GBNF), 'Qx"\\!!éb', "complete"),
        (GrammarSpec("ebnf", ODD_GBNF), 'Qx"\\abéb', "refused"),
        (GrammarSpec("choices", json.dumps(["yes", "no", 'a"b'])), 'a"b', "complete"),
        (GrammarSpec("choices", json.dumps(["yes", "no"])), "ye", "open"),
        (GrammarSpec("choices", json.dumps(["yes", "no"])), "yo", "refused"),
    ],
)
def test_each_kind_accepts_and_refuses(backend, decoder, spec, text, expected):
    assert walk(backend, spec, text, decoder) == expected


@pytest.mark.parametrize(
    "options, text, expected",
    [
        ({}, 'hi <fn=a>{"x": 1}</fn> bye <fn=b>[true]</fn>.', "ends"),
        ({}, "no tags at all", "ends"),
        ({}, "a trigger must start a tag: <fn=c", "refused"),
        ({}, 'a tag with invalid JSON: <fn=a>{"y": 1}', "refused"),
        ({}, "a trigger left open at the end <fn=", "open"),
        ({"max_tags": 1}, '<fn=a>{"x": 1}</fn> text after', "ends"),
        ({"max_tags": 1}, '<fn=a>{"x": 1}</fn> <fn=', "refused"),
        ({"free_text": False, "separator": ","}, '<fn=a>{"x": 1}</fn>,<fn=b>2</fn>', "ends"),
        ({"free_text": False, "separator": ","}, 'text <fn=a>{"x": 1}</fn>', "refused"),
        ({"free_text": False, "separator": ",", "max_tags": 2}, '<fn=a>{"x": 1}</fn>,<fn=b>2</fn>', "complete"),
        ({"free_text": False, "separator": ",", "max_tags": 1}, '<fn=a>{"x": 1}</fn>', "complete"),
        ({"free_text": False, "max_tags": 3}, "<fn=b>1</fn><fn=b>2</fn>", "ends"),
    ],
)
def test_structural_tag(backend, decoder, options, text, expected):
    assert walk(backend, tag_spec(**options), text, decoder) == expected


def test_nested_triggers_need_only_the_shorter(backend, decoder):
    """A trigger with another as its prefix adds nothing (dialects.minimal_triggers)."""
    spec = json.loads(tag_spec().text)
    spec["triggers"] = ["<fn", "<fn="]
    nested = GrammarSpec("structural_tag", json.dumps(spec, sort_keys=True))
    assert walk(backend, nested, 'x <fn=a>{"x": 1}</fn>', decoder) == "ends"
    assert walk(backend, nested, "x <fnord", decoder) == "refused"


def test_json_whitespace_is_langrts_or_a_narrower_one(backend, decoder):
    """langrt's rule: at most one space after ':' and ',', none elsewhere. llguidance enforces it
    exactly; xgrammar always wants the space (json.dumps's style)."""
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    compact = walk(backend, spec, '{"a":1,"b":["x","y"]}', decoder)
    assert compact == ("refused" if type(backend).__name__ == "XGrammarBackend" else "complete")
    assert walk(backend, spec, '{"a": 1,"b": []}', decoder) in ("refused", "complete")
    assert walk(backend, spec, '{"a" : 1, "b": []}', decoder) == "refused"
    assert walk(backend, spec, '{"a": 1, "b": [] }', decoder) == "refused"


def test_copy_is_independent_and_masks_cover_the_row(backend, decoder):
    matcher = backend.compile(GrammarSpec("regex", "(ab|cd)x")).matcher()
    fork = matcher.copy()
    assert matcher.accept_token(decoder.encode("ab")[0]) and not fork.is_terminated()
    assert not fork.accept_token(decoder.encode("x")[0]), "the fork is still at the start"
    wide = torch.full((2, backend.vocab.num_words + 3), -1, dtype=torch.int32)
    fork.fill_bitmask(wide, 1)
    assert bool((wide[1, backend.vocab.num_words :] == 0).all()), "bits past the vocabulary are zero"
    assert torch.equal(wide[1, : backend.vocab.num_words], allowed(fork, backend.vocab))
    assert bool((wide[0] == -1).all()), "other rows untouched"


def test_no_jump_forward(backend):
    matcher = backend.compile(GrammarSpec("regex", "forced text")).matcher()
    assert matcher.certain_tail(10) == [] and matcher.propose_drafts(10, lambda s: [1]) == []
    assert matcher.allowed_ids_along([5, 6], 3) == [None, None, None]


@pytest.mark.parametrize(
    "spec, says",
    [
        (GrammarSpec("regex", "(a"), "regex"),
        (GrammarSpec("json_schema", '{"type": "foo"}'), "json_schema"),
        (GrammarSpec("ebnf", 'root ::= "a" | b'), "line 1, column 16: no rule named 'b'"),
        (GrammarSpec("ebnf", 'root ::= "a'), "ebnf: line 1"),
    ],
)
def test_errors_are_invalid_requests_naming_the_kind(backend, spec, says):
    with pytest.raises(InvalidRequest) as info:
        backend.compile(spec)
    assert info.value.param == spec.kind and says in info.value.message


def test_a_tag_schema_nothing_satisfies_is_refused(backend):
    spec = json.loads(tag_spec().text)
    spec["structures"][1]["schema"] = False
    with pytest.raises(InvalidRequest) as info:
        backend.compile(GrammarSpec("structural_tag", json.dumps(spec, sort_keys=True)))
    assert info.value.param == "structural_tag" and "refused the structural_tag" in info.value.message


def test_json_schema_options(backend, decoder):
    """Unlisted properties are kept out unless open_objects lets them in (langrt's default);
    properties come in the schema's order; xgrammar takes any_order, llguidance refuses it."""
    extra, reordered = '{"a": 1, "b": [], "c": 2}', '{"b": [], "a": 1}'
    closed = GrammarSpec("json_schema", json.dumps(SCHEMA))
    assert walk(backend, closed, extra, decoder) == "refused"
    assert (
        walk(backend, GrammarSpec("json_schema", json.dumps(SCHEMA), ("open_objects",)), extra, decoder) == "complete"
    )
    assert walk(backend, closed, reordered, decoder) == "refused"
    any_order = GrammarSpec("json_schema", json.dumps(SCHEMA), ("any_order",))
    if type(backend).__name__ == "XGrammarBackend":
        assert walk(backend, any_order, reordered, decoder) == "complete"
    else:
        with pytest.raises(InvalidRequest, match="any_order"):
            backend.compile(any_order)


def test_close_objects_closes_plain_objects_only():
    from langrt.constrained.backends.llguidance_backend import close_objects

    base = {"type": "object", "properties": {"a": {"type": "integer"}}}
    schema = {
        "type": "object",
        "properties": {"inner": {"properties": {"x": {}}}, "free": {"type": "object", "additionalProperties": True},
                       "list": {"type": "array", "items": {"type": "object"}}},
        "anyOf": [base],
        "$defs": {"base": base, "other": base},
        "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {}}}],
    }  # fmt: skip
    closed = close_objects(schema)
    assert "additionalProperties" not in closed, "combined with allOf: left as it is"
    assert closed["properties"]["inner"]["additionalProperties"] is False
    assert closed["properties"]["free"]["additionalProperties"] is True
    assert closed["properties"]["list"]["items"]["additionalProperties"] is False
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in closed["$defs"]["base"], "an allOf refers to it"
    assert closed["$defs"]["other"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["allOf"][1]
    assert schema["properties"]["inner"] == {"properties": {"x": {}}}, "the input is not changed"
    assert close_objects(True) is True


# ---- the service, the dialects, the start-up check ------------------------------------------


class _FakeBackend:
    """A native-style backend (stops_itself False): "slow" blocks until released, "bad" is
    refused, "bug" raises what an adapter's bug would; anything else compiles to its text."""

    stops_itself = False

    def __init__(self):
        self.release = threading.Event()
        self.compiled: list[str] = []
        self.closed = False

    def compile(self, spec):
        self.compiled.append(spec.text)
        if spec.text == "slow":
            self.release.wait(10)
        if spec.text == "bad":
            raise InvalidRequest("bad grammar", param="regex")
        if spec.text == "bug":
            raise KeyError("oops")
        return spec.text

    def close(self):
        self.closed = True


def test_service_caches_and_abandons_a_native_compile_at_the_limit():
    from langrt.constrained.service import GrammarService

    backend = _FakeBackend()
    release, compiled = backend.release, backend.compiled
    service = GrammarService(backend, timeout_s=0.3, cache_size=8)
    try:
        ok = service.submit(GrammarSpec("regex", "a"))
        assert service.submit(GrammarSpec("regex", "a")) is ok and ok.result(5) == "a"
        slow, after = service.submit(GrammarSpec("regex", "slow")), service.submit(GrammarSpec("regex", "b"))
        with pytest.raises(InvalidRequest, match="time limit of 0.3 s"):
            slow.result(5)
        assert after.result(5) == "b" and not release.is_set(), "the next compile is not held up by the stuck one"
        with pytest.raises(InvalidRequest, match="bad grammar"):
            service.submit(GrammarSpec("regex", "bad")).result(5)
        with pytest.raises(InvalidRequest, match="KeyError"):
            service.submit(GrammarSpec("regex", "bug")).result(5)
        service.submit(GrammarSpec("regex", "bad")).exception(5)
        assert compiled.count("bad") == 2, "a failure is not cached: a later request retries"
    finally:
        release.set()
        service.close()
    assert backend.closed, "closing the service releases its backend"


def test_a_backend_that_stops_itself_compiles_on_the_service_thread():
    """langrt's engine (stops_itself True) is never run concurrently nor abandoned: its compiles
    run one after another on the service's thread, however long one takes."""
    from langrt.constrained.service import GrammarService

    threads = []

    class Serial(_FakeBackend):
        stops_itself = True

        def compile(self, spec):
            threads.append(threading.current_thread().name)
            time.sleep(0.2 if spec.text == "slow" else 0)
            return spec.text

    service = GrammarService(Serial(), timeout_s=0.05)
    try:
        slow, after = service.submit(GrammarSpec("regex", "slow")), service.submit(GrammarSpec("regex", "b"))
        slow.result(5)  # its own limit is the backend's: 0.2 s past the service's is not abandoned
        assert after.result(5) == "b"
        assert threads == ["grammar-compiler", "grammar-compiler"]
    finally:
        service.close()


def test_missing_package_fails_at_start(monkeypatch, capsys):
    """`langrt launch --grammar-backend X` without X installed stops before starting anything,
    naming the package and how to install it."""
    from langrt import cli
    from langrt.server_args import ServerArgs

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("xgrammar", "llguidance") else real(name, *a)
    )
    for name, install in (
        ("xgrammar", "pip install 'xgrammar==0.2.7'"),
        ("llguidance", "pip install 'llguidance>=1.9'"),
    ):
        with pytest.raises(ValueError, match=f"--grammar-backend {name} needs the {name} package") as info:
            ServerArgs(grammar_backend=name)
        assert install in str(info.value)
        assert cli.main(["launch", "--grammar-backend", name, "--port", "1"]) == 2
        assert f"needs the {name} package" in capsys.readouterr().err
    assert ServerArgs(grammar_backend="langrt").grammar_backend == "langrt"


def test_ebnf_is_parsed_by_langrt_whatever_the_backend():
    from langrt.constrained.cfg.ebnf import EbnfError
    from langrt.constrained.backends import dialects

    rules = dialects.parse_rules('root ::= expr\nexpr ::= expr "+" [0-9] | [0-9]\n')
    assert "r1 ::= ((r1) (" in dialects.xgrammar_ebnf(rules), "left recursion is the engines' to parse"
    with pytest.raises(EbnfError, match="no rule named 'nope'"):
        dialects.parse_rules("root ::= nope")
    assert dialects.minimal_triggers(["<f", "<fn=", "[", "<g"]) == ["<f", "[", "<g"]
