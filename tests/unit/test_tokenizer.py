"""Tokenizers built from GGUF metadata agree with transformers' GGUF tokenizer (the reference)."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from gguf_utils import tokenizer_fields, write_vocab_gguf
from langrt.builtin import builtin_model_path
from langrt.errors import ModelLoadError
from langrt.model.gguf_loader import GGUFFile
from langrt.tokenizer.loader import load_tokenizer

CORPUS = [
    "Hello world",
    "What is the capital of France?",
    " leading space, trailing space ",
    "I'm sure they'll say it's John's, we've done, you're right, I'd go.",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i * 2); }',
    '{"key": [1, 2.5, -3e10], "nested": {"a": null, "b": true}}',
    "3.14159265358979 and 1234567890 and 2024-01-31 and 1,000,000 and 0x1F",
    "a  b   c    d\t\te\t \tf",
    "line one\nline two\n\n\nline five\r\nwindows\r\n",
    "   \n  \n",
    "Ünïcödé çåfé naïve résumé — “quotes” ‘single’ … €5 £3 ¥7",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 😀👍🏽🇫🇷 👨‍👩‍👧‍👦 and symbols ∑∫√∞ ≠ ≤ ≥",
    "Ελληνικά και русский текст и العربية و עברית",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<repo_name>x<file_sep>y",
    "<|im_start|><|im_start|>nested<|im_end|>",
    "not special: <|im_start, |im_end|>, <im_start>",
    "",
    " ",
    "\n",
    "x" * 300,
    "The quick brown fox jumps over the lazy dog. " * 20,
]

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?\nExplain briefly."},
]


def _reference(path: Path):
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def reference():
    return _reference(builtin_model_path())


@pytest.fixture(scope="module")
def ours():
    return load_tokenizer(builtin_model_path())


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_encodes_like_transformers(ours, reference, text):
    assert ours.encode(text) == reference.encode(text)
    assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)
    assert ours.tokenize(text) == reference.tokenize(text)


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_decodes_back_to_the_input(ours, text):
    assert ours.decode(ours.encode(text)) == text


def test_batch_encoding_matches(ours, reference):
    assert ours(CORPUS)["input_ids"] == reference(CORPUS)["input_ids"]


def test_special_tokens_match(ours, reference):
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(ours, name) == getattr(reference, name), name
        assert getattr(ours, f"{name}_id") == getattr(reference, f"{name}_id"), name
    assert (ours.bos_token_id, ours.eos_token_id) == (1, 2)
    assert ours.add_bos_token is False
    assert set(ours.all_special_ids) == set(reference.all_special_ids)
    assert len(ours) == len(reference) == 49152
    assert ours.get_vocab() == reference.get_vocab()
    assert ours.convert_tokens_to_ids("<|im_start|>") == 1
    assert ours.encode("<|im_end|>", add_special_tokens=False) == [2]


def test_skip_special_tokens_on_decode(ours):
    ids = ours.encode("<|im_start|>user\nHi<|im_end|>")
    assert ours.decode(ids, skip_special_tokens=True) == "user\nHi"


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_chat_template_matches(ours, reference, generation_prompt):
    for conversation in (CONVERSATION, CONVERSATION[1:]):  # the second gets the template's default system
        kwargs = {"add_generation_prompt": generation_prompt, "tokenize": False}
        text = ours.apply_chat_template(conversation, **kwargs)
        assert text == reference.apply_chat_template(conversation, **kwargs)
        assert text.startswith("<|im_start|>system\n")
        assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)
    assert ours.chat_template == GGUFFile(builtin_model_path()).chat_template


def test_loads_without_transformers_gguf_conversion(monkeypatch, reference):
    """The GGUF tokenizer is built from the file's own vocabulary and merges: transformers'
    conversion of the whole checkpoint (what makes its load take seconds) is never called."""
    import transformers
    import transformers.modeling_gguf_pytorch_utils as hf_gguf

    def refuse(*args, **kwargs):
        raise AssertionError("transformers' GGUF conversion was called")

    monkeypatch.setattr(hf_gguf, "load_gguf_checkpoint", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    fresh = load_tokenizer(builtin_model_path())
    assert fresh.encode(CORPUS[0]) == reference.encode(CORPUS[0])


def test_load_tokenizer_from_hf_directory(ours, tmp_path):
    ours.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    for text in CORPUS:
        assert again.encode(text) == ours.encode(text)
    assert again.chat_template == ours.chat_template


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(tmp_path / "absent")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_tokenizer(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="cannot load a tokenizer"):
        load_tokenizer(tmp_path / "empty")


def test_unsupported_tokenizer_model(tmp_path):
    fields = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "a"]}
    path = write_vocab_gguf(tmp_path / "bert.gguf", fields)
    with pytest.raises(ModelLoadError, match="tokenizer model 'bert' is not supported"):
        load_tokenizer(path)


@pytest.fixture(scope="module")
def smollm2_fields() -> dict:
    return tokenizer_fields(GGUFFile(builtin_model_path()).metadata)


def test_digits_are_split_one_by_one_for_smollm(ours):
    # SmolLM2's tokenizer.json (and llama.cpp's 'smollm' pre-tokenizer) isolate every digit.
    assert ours.tokenize("x 2024") == ["x", "Ġ", "2", "0", "2", "4"]


def test_add_bos_token_from_metadata(tmp_path, smollm2_fields):
    path = write_vocab_gguf(tmp_path / "bos.gguf", {**smollm2_fields, "tokenizer.ggml.add_bos_token": True})
    tokenizer = load_tokenizer(path)
    assert tokenizer.encode("Hello world") == [1, 19556, 905]
    assert tokenizer.encode("Hello world", add_special_tokens=False) == [19556, 905]


def test_user_defined_tokens_match_whole_but_are_not_special(tmp_path, smollm2_fields):
    tokens = [*smollm2_fields["tokenizer.ggml.tokens"], "<tool>"]
    types = [*smollm2_fields["tokenizer.ggml.token_type"], 4]
    fields = {**smollm2_fields, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    tokenizer = load_tokenizer(write_vocab_gguf(tmp_path / "user.gguf", fields))
    ids = tokenizer.encode("a<tool>b")
    assert ids == [tokenizer.convert_tokens_to_ids("a"), 49152, tokenizer.convert_tokens_to_ids("b")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a<tool>b"


def test_control_token_outside_the_byte_alphabet(tmp_path, smollm2_fields):
    """A control token with a space (stored as raw text) keeps its id and matches whole."""
    tokens = [*smollm2_fields["tokenizer.ggml.tokens"], "<|tool call|>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>"]
    types = [*smollm2_fields["tokenizer.ggml.token_type"], 3, 3]
    fields = {**smollm2_fields, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    tokenizer = load_tokenizer(write_vocab_gguf(tmp_path / "space.gguf", fields))
    assert len(tokenizer) == 49154
    text = "x<|tool call|> y<\uff5cbegin\u2581of\u2581sentence\uff5c>"
    ids = tokenizer.encode(text)
    assert ids[1] == 49152 and ids[-1] == 49153
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "x y"


def test_inconsistent_metadata_is_a_load_error(tmp_path, smollm2_fields):
    fields = {**smollm2_fields, "tokenizer.ggml.merges": ["Ġ nowhere-token"]}
    with pytest.raises(ModelLoadError, match="inconsistent"):
        load_tokenizer(write_vocab_gguf(tmp_path / "bad.gguf", fields))


def test_qwen2_pre_tokenizer_normalizes_to_nfc(tmp_path, smollm2_fields):
    path = write_vocab_gguf(tmp_path / "qwen2.gguf", {**smollm2_fields, "tokenizer.ggml.pre": "qwen2"})
    tokenizer = load_tokenizer(path)
    assert tokenizer.encode("cafe\u0301") == tokenizer.encode("caf\u00e9")


# Same vocabulary, other pre-tokenizers: each split rule agrees with transformers' for it.
@pytest.mark.slow
@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_other_pre_tokenizers_match_transformers(tmp_path, smollm2_fields, pre):
    path = write_vocab_gguf(tmp_path / f"{pre}.gguf", {**smollm2_fields, "tokenizer.ggml.pre": pre})
    ours, reference = load_tokenizer(path), _reference(path)
    for text in CORPUS:
        assert ours.encode(text) == reference.encode(text), text
        assert ours.decode(ours.encode(text)) == text


def _sentencepiece_fields(smollm2_fields: dict) -> dict:
    """A SentencePiece-style vocabulary made from SmolLM2's: its pieces respelled with '\u2581' for
    space, ranked by their position, plus <unk>/<s>/</s> and the 256 byte tokens."""
    byte_decoder = {char: byte for byte, char in _byte_spelling().items()}
    tokens, types, seen = ["<unk>", "<s>", "</s>"], [2, 3, 3], set()
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    for token, token_type in zip(smollm2_fields["tokenizer.ggml.tokens"], smollm2_fields["tokenizer.ggml.token_type"]):
        if token_type != 1:
            continue
        try:
            text = bytes(byte_decoder[c] for c in token).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        piece = text.replace(" ", "\u2581")
        if piece not in seen and piece.isprintable():
            seen.add(piece)
            tokens.append(piece)
            types.append(1)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def _byte_spelling() -> dict[int, str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


@pytest.mark.slow
def test_sentencepiece_vocabulary_matches_transformers(tmp_path, smollm2_fields):
    path = write_vocab_gguf(tmp_path / "spm.gguf", _sentencepiece_fields(smollm2_fields))
    ours, reference = load_tokenizer(path), _reference(path)
    assert ours.add_bos_token is True
    # transformers' Metaspace differs from SentencePiece and llama.cpp in two places, checked below.
    plain = [text for text in CORPUS if "<" not in text and not text[:1].isspace()]
    for text in plain:
        assert ours.encode(text) == reference.encode(text), text
        assert ours.decode(ours.encode(text), skip_special_tokens=True) == text
    # byte fallback for characters the vocabulary lacks
    assert ours.tokenize("\u2603")[-3:] == ["<0xE2>", "<0x98>", "<0x83>"]
    # The space prefix is added even to text that starts with a space, and after a special
    # token too, as in llama.cpp and Llama 2's own tokenizer.json (Prepend normalizer).
    assert ours.tokenize(" leading")[:2] == ["\u2581\u2581", "leading"]
    assert ours.tokenize("<s>Hello") == ["<s>", "\u2581Hello"]
    assert ours.decode(ours.encode(" leading"), skip_special_tokens=True) == " leading"


def test_a_deferred_decoder_builds_on_first_use_and_decodes_as_the_eager_one(tmp_path):
    """The scheduler's decoder of a GGUF file waits until used (or `load()`ed when idle), knowing
    its EOS id from the metadata meanwhile; an HF directory's is built at once."""
    from langrt.tokenizer.text_decoder import DeferredTextDecoder, deferred_text_decoder, load_text_decoder

    eager = load_text_decoder(builtin_model_path())
    deferred = deferred_text_decoder(builtin_model_path())
    assert isinstance(deferred, DeferredTextDecoder) and not deferred.loaded
    assert deferred.eos_token_id == eager.eos_token_id is not None
    ids = eager.encode(CORPUS[1])
    assert deferred.decode(ids) == eager.decode(ids) == CORPUS[1]
    assert deferred.loaded and deferred.encode(CORPUS[4]) == eager.encode(CORPUS[4])
    explicit = deferred_text_decoder(builtin_model_path())
    explicit.load()
    assert explicit.loaded and explicit.decode(ids) == CORPUS[1]
    with pytest.raises(AttributeError):
        explicit.no_such_attribute
    load_tokenizer(builtin_model_path()).save_pretrained(tmp_path)
    assert not isinstance(deferred_text_decoder(tmp_path), DeferredTextDecoder)
