"""The grammar engine without a model: masks, matchers, the compile service."""

from __future__ import annotations

import re
import time

import pytest
import torch

from langrt.constrained.backends.langrt_backend import LangrtBackend
from langrt.constrained.service import GrammarService
from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest

REGEXES = [
    r"[0-9]{1,3}(\.[0-9]+)?",
    r"(yes|no|maybe)",
    r'\{"name":"[^"\\]{0,20}","age":[0-9]+\}',
    r"(é|ü|你好|🙂)+!",
    r"[a-z ]+\.",
]


def allowed_ids(matcher, vocab) -> set[int]:
    bitmask = torch.zeros((1, vocab.num_words), dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    bits = ((bitmask[0].unsqueeze(-1) >> torch.arange(32)) & 1).flatten()
    return set(torch.nonzero(bits).flatten().tolist())


def test_vocabulary_spells_tokens_as_bytes(vocab, tokenizer):
    for text in ["Hello world", " café", "你好", "🙂 ok", "\n\t{"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode("utf-8")
    assert vocab.token_bytes[1] is None and vocab.token_bytes[2] is None, "special tokens are never grammar text"


PREFIXES = {REGEXES[0]: ["", "1", "123", "12.", "12.5"], REGEXES[1]: ["", "ma", "yes"],
            REGEXES[2]: ["", '{"name":"', '{"name":"Bo', '{"name":"Bob","age":4'], REGEXES[3]: ["", "é", "你"],
            REGEXES[4]: ["", "ab c"]}  # fmt: skip


@pytest.mark.parametrize("regex", REGEXES)
def test_masks_equal_a_partial_match_oracle(regex, vocab, compiler):
    """Token t is allowed after text p exactly when p + t can still grow into a full match
    (checked with the `regex` module's partial matching), over the whole vocabulary."""
    import regex as oracle

    pattern = oracle.compile(regex)
    grammar = compiler.compile_regex(regex)
    for prefix in PREFIXES[regex]:
        matcher = grammar.matcher()
        assert matcher.accept_bytes(prefix.encode())
        allowed = allowed_ids(matcher, vocab)
        for token, data in enumerate(vocab.token_bytes):
            if not data:
                continue
            try:
                text = (prefix.encode() + data).decode("utf-8")
            except UnicodeDecodeError:
                continue  # a token ending mid-character: covered by the byte-level tests
            expected = pattern.fullmatch(text, partial=True) is not None
            assert (token in allowed) == expected, (prefix, data)
        assert (2 in allowed) == (pattern.fullmatch(prefix) is not None), "EOS exactly where the regex may end"


MASK_SCHEMAS = [
    {"type": "string", "maxLength": 30},
    {"type": "string", "format": "uuid"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "pattern": "^[a-z]{3}-[0-9]{2}$"},
    {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": -50, "maximum": 5000},
        "s": {"type": "string", "minLength": 2, "maxLength": 6},
        "e": {"enum": ["alpha", "beta", "alphabet"]},
        "a": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        "o": {"type": "object", "additionalProperties": {"type": "boolean"}, "maxProperties": 2},
    }, "required": ["n", "s", "e", "a", "o"], "additionalProperties": False},
]  # fmt: skip
MASK_TEXTS = [
    ['"a quick brown fox jumps over i"', '"Dès Noël où un zéphyr haï"', '"\\u00e9\\"x"'],
    ['"123e4567-e89b-12d3-a456-426614174000"'],
    ['"2024-02-29T23:59:59.123+05:30"', '"1999-12-31T00:00:00Z"'],
    ['"abc-42"'],
    ['{"n": -7, "s": "xy", "e": "alphabet", "a": [1.5, -2e3, 0], "o": {"k": true, "": false}}',
     '{"n":4999,"s":"ab\\"cd","e":"beta","a":[],"o":{}}'],
]  # fmt: skip


def _brute_force_mask(dfa, vocab, state) -> set[int]:
    """Every token walked from `state` over the whole vocabulary, no pruning: the reference.
    (A grammar of rules, whose pushdown automaton has no table, is walked token by token.)"""
    import numpy as np

    if not hasattr(dfa, "table"):
        allowed = {t for t, b in enumerate(vocab.token_bytes) if b and dfa.walk(state, b) != dfa.dead}
        return allowed | (set(vocab.eos_token_ids) if dfa.accepts(state) else set())
    rows = np.arange(vocab.walk_lengths.size)
    current = np.full(rows.size, state, dtype=np.int64)
    alive = np.ones(rows.size, dtype=bool)
    for j in range(vocab.walk_columns.shape[0]):
        going = alive & (vocab.walk_lengths > j)
        current[going] = dfa.table[current[going], vocab.walk_columns[j][going]]
        alive &= ~going | (current != dfa.dead)
    allowed = set(vocab.walk_ids[alive].tolist())
    return allowed | (set(vocab.eos_token_ids) if dfa.accepting[state] else set())


@pytest.mark.parametrize("index", range(len(MASK_SCHEMAS)))
def test_masks_equal_a_brute_force_walk_on_json_schemas(index, compiler, vocab, tokenizer):
    """Counted strings (chains with a depth), loops, formats, numbers, enums sharing a prefix:
    at every state the tokens of the texts pass through, the mask is exactly the set of tokens
    whose bytes walk from there without dying."""
    grammar = compiler.compile_json_schema(MASK_SCHEMAS[index])
    checked = set()
    for text in MASK_TEXTS[index]:
        matcher = grammar.matcher()
        for token in tokenizer.encode(text, add_special_tokens=False) + [2]:
            if matcher.state not in checked:
                checked.add(matcher.state)
                assert allowed_ids(matcher, vocab) == _brute_force_mask(grammar.dfa, vocab, matcher.state), (
                    text,
                    matcher.state,
                )
            assert matcher.accept_token(token), (text, token)
        assert matcher.is_terminated()
    assert len(checked) >= 5


def test_optional_suffix_after_a_possible_end(compiler, vocab):
    """After "1" the regex 1(x2)? may end or go on with x (outlines-core's Index loses the x)."""
    m = compiler.compile_regex("1(x2)?").matcher()
    assert m.accept_bytes(b"1") and m.can_end
    assert vocab.token_bytes.index(b"x") in allowed_ids(m, vocab)
    assert m.accept_bytes(b"x") and not m.can_end and m.accept_bytes(b"2") and m.is_terminated()


@pytest.mark.parametrize("text, regex", [("123.45", REGEXES[0]), ("maybe", REGEXES[1]), ('{"name":"Bob","age":42}', REGEXES[2]),
                                         ("éü你好🙂!", REGEXES[3])])  # fmt: skip
def test_matcher_follows_a_tokenized_match(text, regex, compiler, tokenizer, vocab):
    assert re.fullmatch(regex, text)
    matcher = compiler.compile_regex(regex).matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert token in allowed_ids(matcher, vocab)
        assert matcher.accept_token(token)
    assert matcher.can_end and 2 in allowed_ids(matcher, vocab), "EOS allowed once the regex may end"
    assert matcher.accept_token(2) and matcher.is_terminated()


def test_eos_only_where_the_grammar_may_end(compiler, vocab):
    matcher = compiler.compile_regex("ab+").matcher()
    assert 2 not in allowed_ids(matcher, vocab)
    assert not matcher.accept_token(2)
    assert matcher.accept_token(vocab.token_bytes.index(b"a"))
    assert not matcher.accept_token(vocab.token_bytes.index(b"a")), "a forbidden token changes nothing"
    assert matcher.accept_token(vocab.token_bytes.index(b"b"))
    assert 2 in allowed_ids(matcher, vocab) and not matcher.is_terminated()


def test_complete_grammar_with_nothing_more_terminates(compiler, tokenizer):
    matcher = compiler.compile_choices(["yes", "no"]).matcher()
    (token,) = tokenizer.encode("yes", add_special_tokens=False)
    assert matcher.accept_token(token)
    assert matcher.is_terminated(), "nothing can follow 'yes'"


def test_copies_are_independent(compiler, vocab):
    a = compiler.compile_regex("[ab]+").matcher()
    b = a.copy()
    assert a.accept_token(vocab.token_bytes.index(b"a"))
    assert b.state != a.state


def test_choices_with_metacharacters(compiler, tokenizer):
    choices = ["a.b", "(x)", "1+1", "$5", "q?"]
    grammar = compiler.compile_choices(choices)
    for c in choices:
        m = grammar.matcher()
        assert all(m.accept_token(t) for t in tokenizer.encode(c, add_special_tokens=False)) and m.is_terminated()
    m = grammar.matcher()
    assert not all(m.accept_token(t) for t in tokenizer.encode("axb", add_special_tokens=False))


def test_forced_bytes(compiler):
    m = compiler.compile_regex(r'\{"name":"[a-z]+"\}').matcher()
    assert m.forced_bytes() == b'{"name":"'
    assert m.accept_bytes(b'{"name":"bob')
    assert m.forced_bytes() == b""  # more letters or the closing quote
    assert m.accept_bytes(b'"')
    assert m.forced_bytes() == b"}"


def test_likely_bytes_run_through_optional_spaces(compiler):
    m = compiler.compile_regex(r'\{"a": ?[0-9]+, ?"b": ?"[a-z ]+"\}').matcher()
    assert m.forced_bytes() == b'{"a":'  # then a space or a digit
    assert m.likely_bytes() == b'{"a": '  # no output yet: guess json.dumps's style
    assert m.accept_bytes(b'{"a":5')
    assert m.forced_bytes() == m.likely_bytes() == b""  # more digits or ','
    m.spaced = False  # as if the output had taken no space after ':'
    assert m.accept_bytes(b",")
    assert m.likely_bytes() == b'"b":"'
    m.spaced = True
    assert m.likely_bytes() == b' "b": "'
    assert m.accept_bytes(b' "b": "x')
    assert m.likely_bytes() == b""  # inside the string a space is a character, not a choice


def test_accepted_tokens_record_the_space_choice(compiler, tokenizer):
    grammar = compiler.compile_regex(r'\{"a": ?[0-9]+, ?"b": ?[0-9]+\}')
    m = grammar.matcher()
    for t in tokenizer.encode('{"a":1,', add_special_tokens=False):
        assert m.accept_token(t)
    assert m.spaced is False
    assert m.likely_bytes() == b'"b":'
    m = grammar.matcher()
    for t in tokenizer.encode('{"a": 1,', add_special_tokens=False):
        assert m.accept_token(t)
    assert m.spaced is True
    assert m.likely_bytes() == b' "b": '
    assert m.copy().spaced is True


def test_drafts_learn_the_models_spelling(compiler, tokenizer):
    """Jump-forward drafts first spell forced text as the tokenizer would; once an output has
    spelled the same run otherwise, later drafts from that state (any request) use its tokens."""
    from langrt.scheduler.constraints import GrammarDrafts, advance_grammar

    grammar = compiler.compile_regex(r'\{"languages": ?\["[A-Z][a-z]+"\]\}')
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    first = _constrained_req(grammar)
    assert GrammarDrafts(encode).drafts(first) == encode('{"languages": ["')
    model_spelling = [encode(piece)[0] for piece in ('{"', "language", "s", '":', ' ["')]
    assert b"".join(grammar.vocab.token_bytes[t] for t in model_spelling) == b'{"languages": ["'
    assert model_spelling != encode('{"languages": ["')
    for t in model_spelling + encode("English"):  # the model's own tokens, then a free word
        first.output_ids.append(t)
        advance_grammar(first, t, None)
    assert GrammarDrafts(encode).drafts(_constrained_req(grammar)) == model_spelling


def test_drafts_follow_the_most_frequent_spelling_and_stop_where_models_leave_the_run(compiler, tokenizer):
    """From each state the draft takes the token models wrote most often there; where that
    token runs on past the forced text (` true` after the forced space), drafting stops: the
    model's own sample at that row continues the output."""
    from langrt.scheduler.constraints import GrammarDrafts, advance_grammar

    grammar = compiler.compile_regex(r'\{"employed": (true|false), "n": [0-9]\}')
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    token = lambda piece: encode(piece)[0]  # noqa: E731

    def write(pieces):
        req = _constrained_req(grammar)
        for piece in pieces:
            advance_grammar(req, token(piece), None)
        return req

    em, employ = ['{"', "em", "ployed", '":', " true"], ['{"', "employ", "ed", '":', " true"]
    for pieces in (em, em, employ):
        write(pieces)
    # two of three wrote `em` + `ployed`; every one ran on into the free value with ` true`
    assert GrammarDrafts(encode).drafts(_constrained_req(grammar)) == [token(p) for p in em[:4]]
    write(employ)
    write(employ)  # now `employ` leads 3 to 2
    assert GrammarDrafts(encode).drafts(_constrained_req(grammar)) == [token(p) for p in employ[:4]]


def _constrained_req(grammar):
    from langrt.request import Req
    from langrt.sampling.sampling_params import SamplingParams

    req = Req("r", [1, 2, 3], SamplingParams(max_new_tokens=64))
    req.matcher = grammar.matcher()
    return req


def test_allowed_ids_list_the_mask(compiler, vocab):
    """A state's allowed ids are its bitmask's set bits, ascending; past MAX_LISTED_IDS, None."""
    from langrt.constrained.masks import MAX_LISTED_IDS

    grammar = compiler.compile_regex(r'\{"key": "[a-z]*"\}')
    matcher = grammar.matcher()
    listed = 0
    for piece in (b'{"k', b'ey": ', b'"', b"abc"):
        bits = torch.zeros((1, vocab.num_words), dtype=torch.int32)
        matcher.fill_bitmask(bits, 0)
        expected = [t for t in range(vocab.vocab_size) if (int(bits[0, t // 32]) >> (t % 32)) & 1]
        ids = grammar.masks.allowed_ids(matcher.state)
        if len(expected) > MAX_LISTED_IDS:
            assert ids is None
        else:
            assert ids.tolist() == expected
            listed += 1
        assert matcher.accept_bytes(piece)
    assert listed >= 2, "the forced key's states list their few tokens"


def test_bad_regex_names_the_position(compiler):
    with pytest.raises(InvalidRequest, match="position 3"):
        compiler.compile_regex("abc(")


def test_a_specs_regex_is_translated_once_and_refusals_every_time(monkeypatch):
    """The scheduler checks each arriving request's grammar: a schema sent again must not be
    translated again, and a refused one must be refused again (never remembered as valid)."""
    from langrt.constrained import spec as spec_module

    calls = []
    translate = spec_module._translate
    monkeypatch.setattr(spec_module, "_translate", lambda s: calls.append(s) or translate(s))
    schema = GrammarSpec(
        "json_schema", '{"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}'
    )
    first = schema.translate()
    assert GrammarSpec(schema.kind, schema.text).translate() == first
    assert len(calls) == 1
    if isinstance(first, str):
        assert re.fullmatch(first, '{"id":7}')
    else:  # rules: the object calls its values' rules
        from langrt.constrained.cfg.build import full_match, local_automaton

        assert full_match(local_automaton(first, 200_000), '{"id":7}')
    bad = GrammarSpec("json_schema", '{"type": "object", "not": {"pattern": "^a"}}')
    for _ in range(2):
        with pytest.raises(InvalidRequest, match="not"):
            bad.translate()
    assert len(calls) == 3


@pytest.mark.parametrize("native", [True, False], ids=["cpp", "outlines"])
def test_service_caches_and_survives_an_exploding_regex(vocab, monkeypatch, native):
    from langrt.constrained.native import regex_dfa

    if not native:  # outlines-core builds the automaton whole: past the time limit
        monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    # the C++ builder stops at the state limit instead: its refusal names the limit, whatever the
    # CPU's speed (200,000 states take 0.6-1.2 s on 2020-era cores), so it gets the default time
    # limit; outlines-core is cut off at a short one
    by_states = native and regex_dfa.available()
    refusal = "over the limit of" if by_states else "time limit"
    timeout_s = 10.0 if by_states else 1.0
    service = GrammarService(LangrtBackend(vocab, timeout_s), timeout_s)
    try:
        ok = service.submit(GrammarSpec("regex", "[0-9]+"))
        assert service.submit(GrammarSpec("regex", "[0-9]+")) is ok, "one compile per spec"
        slow = service.submit(GrammarSpec("regex", "(a|b)*a(a|b){22}"))
        after = service.submit(GrammarSpec("regex", "[a-z]+"))
        assert ok.result(timeout=10).matcher().accept_bytes(b"42")
        start = time.monotonic()
        with pytest.raises(InvalidRequest, match=refusal):
            slow.result(timeout=30)
        if not by_states:  # killed at the time limit, not left running
            assert time.monotonic() - start < 5
        assert after.result(timeout=30).matcher().accept_bytes(b"abc"), "the next grammar compiles in a fresh worker"
    finally:
        service.close()
