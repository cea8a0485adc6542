"""Jump-forward as the grammar matcher's own operations, without a model: certain tails, draft
proposals, learned spellings, and the allowed ids along a run of drafts."""

from __future__ import annotations

import pytest
import torch

from langrt.constrained.jump_forward import MAX_TOKENS_NOTED, LearnedSpellings
from langrt.constrained.masks import MAX_LISTED_IDS

LANGUAGES = r'\{"languages": ?\["[A-Z][a-z]+"\]\}'


@pytest.fixture(scope="module")
def encode(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def spell(vocab, tokens) -> bytes:
    return b"".join(vocab.token_bytes[t] for t in tokens)


def bitmask_ids(matcher, vocab) -> list[int]:
    bits = torch.zeros((1, vocab.num_words), dtype=torch.int32)
    matcher.fill_bitmask(bits, 0)
    flags = ((bits[0].unsqueeze(-1) >> torch.arange(32)) & 1).flatten()[: vocab.vocab_size]
    return torch.nonzero(flags).flatten().tolist()


def test_certain_tail_is_the_grammars_end_one_token_at_a_time(compiler, vocab, encode):
    grammar = compiler.compile_regex(r"[0-9]\}\n\}")
    matcher = grammar.matcher()
    assert matcher.certain_tail(10) == [], "a digit to choose first"
    assert matcher.accept_bytes(b"7")
    state = matcher.state
    tail = matcher.certain_tail(10)
    assert spell(vocab, tail) == b"}\n}" and tail == encode("}") + encode("\n") + encode("}")
    assert matcher.certain_tail(2) == tail[:2] and matcher.certain_tail(0) == []
    assert matcher.state == state and not matcher.is_terminated(), "the matcher itself does not move"
    for token in tail:
        assert matcher.accept_token(token)
    assert matcher.is_terminated() and matcher.certain_tail(10) == []


def test_certain_tail_refuses_where_two_tokens_fit(compiler, vocab):
    """`"}` may be written as `"` + `}` or as `"}`: not certain, though the bytes are forced."""
    matcher = compiler.compile_regex(r'\{"a":"[a-z]"\}').matcher()
    assert matcher.accept_bytes(b'{"a":"x')
    assert matcher.forced_bytes() == b'"}'
    assert matcher.certain_tail(10) == []
    closing = compiler.compile_regex(r'\{"legs": [0-9], "arms": [0-9]\}').matcher()
    assert closing.accept_bytes(b'{"legs": 4, "arms": 2')
    assert spell(vocab, closing.certain_tail(10)) == b"}"


def test_drafts_spell_the_forced_text_as_the_tokenizer_does_until_models_teach_otherwise(compiler, vocab, encode):
    grammar = compiler.compile_regex(LANGUAGES)
    matcher = grammar.matcher()
    expected = encode('{"languages": ["')  # the optional space guessed json.dumps's way
    assert matcher.propose_drafts(63, encode) == expected
    assert matcher.propose_drafts(2, encode) == expected[:2]
    assert matcher.propose_drafts(0, encode) == []

    model_spelling = [encode(piece)[0] for piece in ('{"', "language", "s", '":', ' ["')]
    assert spell(vocab, model_spelling) == b'{"languages": ["' and model_spelling != expected
    writer = grammar.matcher()
    for token in model_spelling:  # accept_token alone learns nothing
        assert writer.accept_token(token)
    assert len(grammar.spellings) == 0 and grammar.matcher().propose_drafts(63, encode) == expected
    writer = grammar.matcher()
    for token in model_spelling + encode("English"):
        assert writer.accept_sampled(token)
    assert grammar.matcher().propose_drafts(63, encode) == model_spelling, "learned for every matcher"
    assert len(grammar.spellings) == len(model_spelling), "noted only inside forced text"
    assert not writer.accept_sampled(encode("{")[0]), "a forbidden token is refused, and not learned"


def test_drafts_stop_where_nothing_is_forced(compiler, encode):
    matcher = compiler.compile_regex(LANGUAGES).matcher()
    assert matcher.accept_bytes(b'{"languages":["')
    assert matcher.propose_drafts(63, encode) == [], "the language's first letter is free"
    assert matcher.accept_bytes(b"Fr")
    assert matcher.propose_drafts(63, encode) == []


def test_learned_spellings_count_and_cap(compiler, encode):
    grammar = compiler.compile_regex(LANGUAGES)
    spellings = LearnedSpellings(grammar.dfa)
    start = grammar.dfa.initial
    assert spellings.most_common(start) is None
    a, b = encode("{")[0], encode('{"')[0]
    spellings.note(start, a)
    spellings.note(start, b)
    assert spellings.most_common(start) == a, "ties go to the first noted"
    spellings.note(start, b)
    assert spellings.most_common(start) == b
    for token in range(1000, 1000 + MAX_TOKENS_NOTED):
        spellings.note(start, token)
    spellings.note(start, 5000)
    spellings.note(start, 5000)
    spellings.note(start, 5000)
    assert spellings.most_common(start) == b, "past the cap new tokens are not counted"
    free = grammar.matcher()
    assert free.accept_bytes(b'{"languages":["F')
    spellings.note(free.state, encode("rench")[0])
    assert spellings.most_common(free.state) is None and len(spellings) == 1, "free text is not noted"


def test_allowed_ids_along_the_drafts(compiler, vocab, encode):
    matcher = compiler.compile_regex(LANGUAGES).matcher()
    drafts = matcher.propose_drafts(63, encode)
    state = matcher.state
    along = matcher.allowed_ids_along(drafts, len(drafts) + 1)
    assert matcher.state == state and len(along) == len(drafts) + 1
    walker = matcher.copy()
    for i, ids in enumerate(along):
        expected = bitmask_ids(walker, vocab)
        if len(expected) > MAX_LISTED_IDS:
            assert ids is None
        else:
            assert ids.tolist() == expected
        if i < len(drafts):
            assert drafts[i] in ids.tolist(), "each draft row lists the draft itself"
            assert walker.accept_token(drafts[i])
    assert along[-1] is None, "after `[\"` any capital letter's tokens: too many to list"
    assert all(ids is not None and len(ids) <= 8 for ids in along[:-1]), "forced text: a few spellings"
    assert matcher.allowed_ids_along(drafts[:2], 2)[1].tolist() == along[1].tolist()
    assert matcher.allowed_ids_along([], 1)[0].tolist() == along[0].tolist()
