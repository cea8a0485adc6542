"""Reasoning models: the think-then-grammar matcher (constrained/reasoning.py) over each grammar
engine, and the parser that splits thinking from the answer (entrypoints/reasoning_parser.py),
whole and chunked at every size."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from langrt.constrained.reasoning import FreeAnswer, ThinkTokens, think_then, think_tokens_for
from langrt.constrained.spec import GrammarSpec
from langrt.constrained.reasoning_syntax import PARSERS
from langrt.entrypoints.reasoning_parser import ReasoningStream, split_reasoning
from langrt.errors import InvalidRequest
from langrt.sampling.sampling_params import SamplingParams
from langrt.tokenizer.text_decoder import load_text_decoder

EOS, END = 2, 1  # the built-in vocabulary's EOS; <|im_start|> stands in for </think>
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
QWEN3, R1 = PARSERS["qwen3"], PARSERS["deepseek-r1"]


@pytest.fixture(scope="module")
def decoder(smollm_path):
    return load_text_decoder(smollm_path)


@pytest.fixture(scope="module")
def tokens():
    return ThinkTokens.build(END, 49152, {EOS})


@pytest.fixture(scope="module", params=["langrt", "xgrammar", "llguidance"])
def schema_grammar(request, vocab, decoder, compiler):
    """The schema's compiled grammar in each engine (skipped where its package is missing)."""
    if request.param == "langrt":
        return compiler.compile_json_schema(SCHEMA)
    pytest.importorskip(request.param)
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    if request.param == "xgrammar":
        from langrt.constrained.backends.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(vocab).compile(spec)
    from langrt.constrained.backends.llguidance_backend import LLGuidanceBackend

    return LLGuidanceBackend(vocab, decoder.encode).compile(spec)


def allowed(matcher) -> set[int]:
    bitmask = torch.zeros((1, 49152 // 32), dtype=torch.int32)
    matcher.fill_bitmask(bitmask, 0)
    bits = ((bitmask[0].unsqueeze(1) >> torch.arange(32)) & 1).flatten()
    return set(torch.nonzero(bits).flatten().tolist())


def test_thinking_is_free_but_for_eos_then_the_grammar_holds(tokens, schema_grammar, decoder):
    matcher = think_then(tokens, schema_grammar.matcher(), budget=None)
    free = allowed(matcher)
    assert EOS not in free and len(free) == 49151  # everything but EOS: an answer must follow
    thinking = decoder.encode("Hmm, {not json} at all")
    assert all(matcher.accept_sampled(t) for t in thinking)
    assert not matcher.accept_token(EOS) and not matcher.is_terminated()
    assert matcher.accept_sampled(END) and not matcher.thinking
    assert allowed(matcher) == allowed(schema_grammar.matcher())  # the grammar from its start
    assert not matcher.accept_token(decoder.encode("Hmm")[0])  # free text is over
    answer = decoder.encode('{"a": 12}')
    assert all(matcher.accept_sampled(t) for t in answer)
    jsonschema.validate(json.loads(decoder.decode(answer)), SCHEMA)
    assert matcher.is_terminated() or matcher.accept_token(EOS)


def test_budget_forces_the_end_token(tokens, schema_grammar, decoder):
    matcher = think_then(tokens, schema_grammar.matcher(), budget=3)
    words = decoder.encode(" a b c d")
    assert all(matcher.accept_token(t) for t in words[:3])
    assert allowed(matcher) == {END}
    assert not matcher.accept_token(words[3]) and matcher.thought == 3
    fork = matcher.copy()
    assert matcher.accept_token(END)
    assert fork.thinking and allowed(fork) == {END}  # a copy keeps its own place
    assert allowed(matcher) == allowed(schema_grammar.matcher())


def test_zero_budget_answers_at_once(tokens, compiler):
    matcher = think_then(tokens, compiler.compile_regex("[0-9]+").matcher(), budget=0)
    assert allowed(matcher) == {END}
    assert matcher.certain_tail(5) == [] and matcher.allowed_ids_along([], 2) == [None, None]


def test_budget_without_grammar_leaves_the_answer_free(tokens, decoder):
    matcher = think_then(tokens, None, budget=2)
    assert isinstance(matcher.inner, FreeAnswer)
    assert EOS in allowed(matcher)  # no answer is owed: thinking may end the output
    assert all(matcher.accept_token(t) for t in decoder.encode(" x y"))
    assert allowed(matcher) == {END}
    assert matcher.accept_token(END) and len(allowed(matcher)) == 49152
    assert matcher.accept_token(decoder.encode("ok")[0]) and not matcher.is_terminated()
    assert matcher.accept_token(EOS) and matcher.is_terminated()
    assert matcher.grammar.vocab.eos_token_ids == {EOS}


def test_end_tag_must_be_one_token(decoder):
    with pytest.raises(ValueError, match="spells </think> as .* tokens"):
        think_tokens_for("qwen3", decoder.encode, 49152, {EOS})
    assert think_tokens_for(None, decoder.encode, 49152, {EOS}) is None
    found = think_tokens_for("deepseek-r1", lambda text: [7], 49152, {EOS})
    assert found.end_id == 7


def test_sampling_params_budget_needs_reasoning():
    assert SamplingParams(reasoning=True, max_reasoning_tokens=0).max_reasoning_tokens == 0
    with pytest.raises(InvalidRequest, match="needs reasoning"):
        SamplingParams(max_reasoning_tokens=5)
    with pytest.raises(InvalidRequest, match="max_reasoning_tokens must be >= 0"):
        SamplingParams(reasoning=True, max_reasoning_tokens=-1)
    with pytest.raises(InvalidRequest, match="reasoning must be a boolean"):
        SamplingParams.from_dict({"reasoning": "yes"})


# ---- the parser ---------------------------------------------------------------------------------

CASES = [
    # (syntax, thinking, text, reasoning, content)
    (QWEN3, True, '<think>\nLet me see.\nOK </think>\n\n{"a": 1}', "Let me see.\nOK", '{"a": 1}'),
    (QWEN3, True, "cut short before the end", "cut short before the end", ""),
    (QWEN3, False, "  no thinking here", "", "  no thinking here"),
    (QWEN3, False, "<think>opened anyway</think>answer", "opened anyway", "answer"),
    (QWEN3, False, "<thin is not the tag", "", "<thin is not the tag"),
    (R1, True, "no start tag </think> the answer", "no start tag", "the answer"),
    (R1, True, "<think></think>{}", "", "{}"),
    (R1, True, "a </thi", "a </thi", ""),  # a partial end tag at the very end is thinking
    (R1, True, "x</think>a</think>b", "x", "a</think>b"),  # only the first end tag splits
]


@pytest.mark.parametrize("syntax, thinking, text, reasoning, content", CASES)
def test_split_whole_and_streamed_agree(syntax, thinking, text, reasoning, content):
    assert split_reasoning(text, syntax, thinking) == (reasoning, content)
    for size in range(1, len(text) + 1):
        stream, pieces, contents = ReasoningStream(syntax, thinking), [], []
        for end in range(size, len(text) + size, size):
            pieces.append(stream.feed(text[:end], final=end >= len(text)))
            contents.append(stream.content)
        assert "".join(pieces) == reasoning and stream.content == content, size
        assert all(b.startswith(a) for a, b in zip(contents, contents[1:])), "content only grows"


def test_partial_end_tag_is_held_back():
    stream = ReasoningStream(R1, True)
    assert stream.feed("think </th") == "think"
    assert stream.feed("think </think") == ""
    assert stream.feed("think </think>ans") == "" and stream.content == "ans"


def test_buffered_reasoning_comes_in_one_piece():
    stream = ReasoningStream(QWEN3, True, stream_reasoning=False)
    assert stream.feed("<think>a b") == "" and stream.feed("<think>a b c") == ""
    assert stream.feed("<think>a b c</think>x") == "a b c" and stream.content == "x"
    cut = ReasoningStream(QWEN3, True, stream_reasoning=False)
    assert cut.feed("<think>never ended") == "" and cut.feed("<think>never ended", final=True) == "never ended"


def test_thinking_switch():
    assert QWEN3.thinks({}) and QWEN3.thinks({"enable_thinking": True})
    assert not QWEN3.thinks({"enable_thinking": False})
    assert R1.thinks({"enable_thinking": False})  # R1 always thinks


# ---- the chat request's fields ------------------------------------------------------------------


def test_chat_fields_without_a_parser_change_nothing():
    from langrt.entrypoints import chat_reasoning as cr

    body = {"chat_template_kwargs": {"enable_thinking": False}}
    assert cr.reasoning_request(body, None, cr.template_kwargs(body)) is None
    sampling = {"max_new_tokens": 5}
    cr.apply_reasoning(sampling, None, body)
    assert sampling == {"max_new_tokens": 5}
    assert cr.split_text(None, "<think>a</think>b") == (None, "<think>a</think>b")
    assert cr.message_fields(None, None) == {}
    with pytest.raises(InvalidRequest, match="needs a server started with --reasoning-parser"):
        cr.reasoning_request({"max_reasoning_tokens": 3}, None, {})


def test_chat_fields_with_a_parser():
    from langrt.entrypoints import chat_reasoning as cr

    on = cr.reasoning_request({}, "qwen3", {})
    sampling = {}
    cr.apply_reasoning(sampling, on, {"max_reasoning_tokens": 9})
    assert sampling == {"reasoning": True, "max_reasoning_tokens": 9}
    assert cr.split_text(on, "<think>a</think> b") == ("a", "b") and cr.message_fields(on, "a") == {
        "reasoning_content": "a"
    }
    off = cr.reasoning_request({}, "qwen3", {"enable_thinking": False})
    sampling = {}
    cr.apply_reasoning(sampling, off, {})
    assert sampling == {} and cr.split_text(off, '{"x": 1}') == (None, '{"x": 1}')
    joined = cr.reasoning_request({"separate_reasoning": False}, "deepseek-r1", {})
    assert cr.split_text(joined, "a</think>b") == (None, "a</think>b") and cr.message_fields(joined, None) == {}
    with pytest.raises(InvalidRequest, match="may not set tokenize"):
        cr.template_kwargs({"chat_template_kwargs": {"tokenize": True}})
    with pytest.raises(InvalidRequest, match="stream_reasoning must be a boolean"):
        cr.reasoning_request({"stream_reasoning": 1}, "qwen3", {})


def test_llguidance_masks_a_model_with_padded_logits(decoder):
    """A model whose logits outnumber its tokenizer's tokens by 32 or more (Qwen3 pads 151,669
    tokens to 151,936; so does the e2e test's checkpoint): llguidance's mask is shorter than the
    row, and the padding stays disallowed."""
    pytest.importorskip("llguidance")
    from langrt.constrained.backends.llguidance_backend import LLGuidanceBackend
    from langrt.constrained.vocab import vocabulary_from_decoder

    rows = []
    for width in (49152, 49152 + 64):
        vocab = vocabulary_from_decoder(decoder, width, {EOS})
        matcher = LLGuidanceBackend(vocab, decoder.encode).compile(GrammarSpec("regex", "[a-z]+")).matcher()
        bitmask = torch.full((1, vocab.num_words), -1, dtype=torch.int32)
        matcher.fill_bitmask(bitmask, 0)
        rows.append(bitmask[0])
    assert torch.equal(rows[1][: rows[0].numel()], rows[0]) and not rows[1][rows[0].numel() :].any()
    assert rows[0].any()
