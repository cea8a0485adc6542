"""The grammar engine's public interface (DESIGN §7): `langrt.constrained.GrammarCompiler` built
from what a user has (a transformers tokenizer, a `tokenizers.Tokenizer`, a .gguf file, an HF
directory), with the same vocabulary the runtime builds for that model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from langrt.errors import ModelLoadError

REPO = Path(__file__).resolve().parents[2]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines"]}


@pytest.fixture(scope="module")
def hf_tokenizer(smollm_path):
    from langrt.tokenizer.loader import load_tokenizer

    return load_tokenizer(smollm_path)


def runtime_vocabulary(path):
    """The vocabulary the scheduler builds for the model at `path` (scheduler._make_grammar_service)."""
    from langrt.constrained.vocab import vocabulary_from_decoder
    from langrt.request import eos_token_ids
    from langrt.model.source import ModelSource
    from langrt.tokenizer.text_decoder import load_text_decoder

    config = ModelSource.resolve(path).model_config()
    decoder = load_text_decoder(path)
    return vocabulary_from_decoder(decoder, config.vocab_size, eos_token_ids(config, decoder))


@pytest.fixture(scope="module")
def builtin_runtime_vocab(smollm_path):
    return runtime_vocabulary(smollm_path)


def allowed(matcher, compiler) -> torch.Tensor:
    """Bool [vocab_size]: the tokens the matcher's bitmask allows."""
    from langrt.constrained import allocate_token_bitmask

    bitmask = allocate_token_bitmask(2, compiler.vocab_size)
    matcher.fill_bitmask(bitmask, 1)
    bits = ((bitmask[1].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten().bool()
    return bits[: compiler.vocab_size]


def walk_instance(compiler, ids: list[int], eos: int) -> None:
    """Walk `ids` (a valid instance) through a fresh matcher, checking each step's mask; then EOS."""
    grammar = compiler.compile_json_schema(SCHEMA)
    matcher = grammar.matcher()
    mask = allowed(matcher, compiler)
    assert not mask[eos] and not matcher.accept_token(eos), "EOS before the instance is complete"
    for step, token in enumerate(ids):
        if step == len(ids) - 1:
            fork = matcher.copy()
        mask = allowed(matcher, compiler)
        assert mask[token], f"token {token} (step {step}) valid here but masked out"
        assert not matcher.is_terminated()
        assert matcher.accept_token(token), f"token {token} (step {step}) rejected"
    assert allowed(matcher, compiler)[eos], "EOS not allowed after a complete instance"
    assert matcher.accept_token(eos) and matcher.is_terminated()
    assert not matcher.accept_token(ids[0]), "nothing follows EOS"
    # the copy taken before the last token is independent of the original
    assert not fork.is_terminated() and not allowed(fork, compiler)[eos]
    assert fork.accept_token(ids[-1]) and fork.accept_token(eos) and fork.is_terminated()


def check_rejects_invalid(compiler, encode) -> None:
    """After `{"name":"Ada"`, "}" (required keys missing) is masked out and rejected, leaving the
    matcher as it was; an unquoted key at the start is too."""
    matcher = compiler.compile_json_schema(SCHEMA).matcher()
    for token in encode('{"name":"Ada"'):
        assert matcher.accept_token(token)
    state = matcher.state
    (closing,) = encode("}")
    (comma,) = encode(",")
    mask = allowed(matcher, compiler)
    assert not mask[closing] and mask[comma]
    assert not matcher.accept_token(closing) and matcher.state == state and not matcher.is_terminated()
    assert matcher.accept_token(comma)
    fresh = compiler.compile_json_schema(SCHEMA).matcher()
    letter = encode("x")[0]
    assert not allowed(fresh, compiler)[letter] and not fresh.accept_token(letter)
    assert fresh.state == fresh.grammar.dfa.initial


def compact(instance) -> str:
    return json.dumps(instance, separators=(",", ":"))


# --- building a compiler from what a user has ----------------------------------------------------


def test_from_hf_tokenizer(hf_tokenizer, builtin_runtime_vocab):
    from langrt.constrained import GrammarCompiler

    compiler = GrammarCompiler(hf_tokenizer)
    assert compiler.vocab == builtin_runtime_vocab
    assert GrammarCompiler.from_tokenizer(hf_tokenizer).vocab == builtin_runtime_vocab

    def encode(text):
        return hf_tokenizer.encode(text, add_special_tokens=False)

    ids = encode(compact(INSTANCE))
    walk_instance(compiler, ids, hf_tokenizer.eos_token_id)
    walk_instance(compiler, encode(json.dumps(INSTANCE)), hf_tokenizer.eos_token_id)  # ", " and ": " too
    check_rejects_invalid(compiler, encode)


def test_from_tokenizers_tokenizer(hf_tokenizer, builtin_runtime_vocab):
    from tokenizers import Tokenizer

    from langrt.constrained import GrammarCompiler

    backend = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    eos = hf_tokenizer.eos_token_id
    compiler = GrammarCompiler(backend, eos_token_ids=[eos])
    assert compiler.vocab == builtin_runtime_vocab
    assert GrammarCompiler.from_tokenizer(backend, eos_token_ids=eos).vocab == builtin_runtime_vocab

    def encode(text):
        return backend.encode(text, add_special_tokens=False).ids

    walk_instance(compiler, encode(compact(INSTANCE)), eos)
    check_rejects_invalid(compiler, encode)


def test_from_gguf_path(smollm_path, hf_tokenizer, builtin_runtime_vocab):
    from langrt.constrained import GrammarCompiler

    compiler = GrammarCompiler(smollm_path)
    assert compiler.vocab == builtin_runtime_vocab
    assert GrammarCompiler(str(smollm_path)).vocab == builtin_runtime_vocab
    assert GrammarCompiler.from_pretrained(smollm_path).vocab == builtin_runtime_vocab

    def encode(text):
        return hf_tokenizer.encode(text, add_special_tokens=False)

    walk_instance(compiler, encode(compact(INSTANCE)), hf_tokenizer.eos_token_id)
    check_rejects_invalid(compiler, encode)


def test_from_hf_directory_with_only_a_tokenizer(tmp_path, hf_tokenizer, builtin_runtime_vocab):
    from langrt.constrained import GrammarCompiler

    hf_tokenizer.save_pretrained(tmp_path)
    compiler = GrammarCompiler.from_pretrained(tmp_path)
    assert compiler.vocab == builtin_runtime_vocab
    assert GrammarCompiler(str(tmp_path)).vocab == builtin_runtime_vocab

    def encode(text):
        return hf_tokenizer.encode(text, add_special_tokens=False)

    walk_instance(compiler, encode(compact(INSTANCE)), hf_tokenizer.eos_token_id)
    check_rejects_invalid(compiler, encode)


def test_from_hf_model_directory_takes_the_models_logits_width_and_eos(tmp_path, tiny_model_builder, hf_tokenizer):
    """A model whose logits are wider than its tokenizer (padded), with a second EOS id in its
    config: the compiler covers the logits and ends on either EOS, as the runtime does."""
    from langrt.constrained import GrammarCompiler

    width = len(hf_tokenizer) + 70
    tiny_model_builder("llama", tmp_path, vocab_size=width)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = [hf_tokenizer.eos_token_id, 1]
    config_file.write_text(json.dumps(config))

    compiler = GrammarCompiler(tmp_path)
    assert compiler.vocab == runtime_vocabulary(tmp_path)
    assert compiler.vocab_size == width and compiler.vocab.eos_token_ids == {hf_tokenizer.eos_token_id, 1}
    assert compiler.vocab.num_words == (width + 31) // 32

    ids = hf_tokenizer.encode(compact(INSTANCE), add_special_tokens=False)
    walk_instance(compiler, ids, 1)
    matcher = compiler.compile_json_schema(SCHEMA).matcher()
    for token in ids:
        matcher.accept_token(token)
    mask = allowed(matcher, compiler)
    assert mask.shape[0] == width and not mask[len(hf_tokenizer) :].any(), "padded ids are never allowed"
    assert mask[1] and mask[hf_tokenizer.eos_token_id]


def test_vocab_size_and_eos_options(hf_tokenizer):
    from langrt.constrained import GrammarCompiler, allocate_token_bitmask

    n = len(hf_tokenizer)
    compiler = GrammarCompiler(hf_tokenizer, vocab_size=n + 64, eos_token_ids=[0, hf_tokenizer.eos_token_id])
    assert compiler.vocab_size == n + 64 and compiler.vocab.eos_token_ids == {0, hf_tokenizer.eos_token_id}
    grammar = compiler.compile_regex("[0-9]+")
    matcher = grammar.matcher()
    assert matcher.accept_token(hf_tokenizer.encode("42", add_special_tokens=False)[0])
    bitmask = allocate_token_bitmask(1, compiler.vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    assert bitmask.shape == (1, (n + 64 + 31) // 32)
    mask = allowed(matcher, compiler)
    assert mask[0] and mask[hf_tokenizer.eos_token_id] and not mask[n:].any()
    # a narrower vocab_size than the tokenizer's never drops tokens
    assert GrammarCompiler(hf_tokenizer, vocab_size=100).vocab_size == n
    # choices and regexes compile through the same compiler
    choice = compiler.compile_choices(["yes", "no"]).matcher()
    for token in hf_tokenizer.encode("yes", add_special_tokens=False):
        assert choice.accept_token(token)
    assert choice.accept_token(0) and choice.is_terminated()


def test_slow_transformers_tokenizer():
    """A transformers tokenizer with no `tokenizers` backend: each token decoded alone."""
    from transformers import PreTrainedTokenizer

    from langrt.constrained import GrammarCompiler

    class CharTokenizer(PreTrainedTokenizer):
        chars = ["<eos>", *'{}[]":,0123456789abcdefghijklmnopqrstuvwxyzAL ']

        def __init__(self, **kw):
            self.ids = {c: i for i, c in enumerate(self.chars)}
            super().__init__(eos_token="<eos>", **kw)

        @property
        def vocab_size(self):
            return len(self.chars)

        def get_vocab(self):
            return dict(self.ids)

        def _tokenize(self, text):
            return list(text)

        def _convert_token_to_id(self, token):
            return self.ids[token]

        def _convert_id_to_token(self, index):
            return self.chars[index]

        def convert_tokens_to_string(self, tokens):
            return "".join(tokens)

    tokenizer = CharTokenizer()
    compiler = GrammarCompiler(tokenizer)
    assert compiler.vocab.token_bytes[0] is None and compiler.vocab.token_bytes[1] == b"{"
    assert compiler.vocab.eos_token_ids == {0} and compiler.vocab_size == len(CharTokenizer.chars)

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    walk_instance(compiler, encode(compact({"name": "Ada", "age": 36, "tags": ["math"]})), 0)
    check_rejects_invalid(compiler, encode)


def test_token_vocabulary_still_accepted(builtin_runtime_vocab):
    from langrt.constrained import GrammarCompiler, TokenVocabulary

    assert isinstance(builtin_runtime_vocab, TokenVocabulary)
    compiler = GrammarCompiler(builtin_runtime_vocab)
    assert compiler.vocab is builtin_runtime_vocab and compiler.vocab_size == builtin_runtime_vocab.vocab_size
    assert GrammarCompiler(builtin_runtime_vocab, 1000).max_states == 1000
    with pytest.raises(TypeError, match="already fixes vocab_size and eos_token_ids"):
        GrammarCompiler(builtin_runtime_vocab, vocab_size=50000)
    with pytest.raises(TypeError, match="already fixes"):
        GrammarCompiler(builtin_runtime_vocab, eos_token_ids=[2])


# --- bad input ------------------------------------------------------------------------------------


def test_path_that_does_not_exist(tmp_path):
    from langrt.constrained import GrammarCompiler

    missing = tmp_path / "no-such-model.gguf"
    for build in (GrammarCompiler, GrammarCompiler.from_pretrained):
        with pytest.raises(ModelLoadError, match="no-such-model.gguf.*does not exist"):
            build(missing)
    with pytest.raises(ModelLoadError, match="does not exist"):
        GrammarCompiler(str(missing))


def test_paths_that_hold_no_tokenizer(tmp_path):
    from langrt.constrained import GrammarCompiler

    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="weights.bin is a file but not a GGUF file"):
        GrammarCompiler(not_gguf)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="cannot load a tokenizer from the directory .*empty"):
        GrammarCompiler(empty)


@pytest.mark.parametrize("thing", [42, None, {"vocab": {}}, ["a", "b"], object()])
def test_objects_that_are_not_tokenizers(thing):
    from langrt.constrained import GrammarCompiler

    kind = f"{type(thing).__module__}.{type(thing).__qualname__}"
    with pytest.raises(TypeError, match=rf"cannot build a token vocabulary from .*\({kind}\)"):
        GrammarCompiler(thing)
    with pytest.raises(TypeError, match="cannot build a token vocabulary"):
        GrammarCompiler.from_tokenizer(thing)


def test_wrong_entry_point(hf_tokenizer, smollm_path):
    from langrt.constrained import GrammarCompiler

    with pytest.raises(TypeError, match="from_tokenizer takes a tokenizer object, got .*PosixPath.*from_pretrained"):
        GrammarCompiler.from_tokenizer(smollm_path)
    with pytest.raises(
        TypeError, match=r"a model path \(str or os.PathLike\) is needed, got a .*TokenizersBackend object"
    ):
        GrammarCompiler.from_pretrained(hf_tokenizer)


def test_tokenizers_tokenizer_needs_eos(hf_tokenizer):
    from langrt.constrained import GrammarCompiler

    backend = hf_tokenizer.backend_tokenizer
    with pytest.raises(ValueError, match=r"tokenizers\.Tokenizer object does not say which token ends the text"):
        GrammarCompiler(backend)
    assert GrammarCompiler(backend, eos_token_ids=()).vocab.eos_token_ids == frozenset()


def test_bad_vocab_size_and_eos(hf_tokenizer):
    from langrt.constrained import GrammarCompiler

    for bad in (0, -5, 3.5, "49152", True):
        with pytest.raises(ValueError, match="vocab_size must be a positive int"):
            GrammarCompiler(hf_tokenizer, vocab_size=bad)
    with pytest.raises(ValueError, match=r"eos_token_ids \[49152\] are not ids of a vocabulary of 49152 tokens"):
        GrammarCompiler(hf_tokenizer, eos_token_ids=[2, 49152])
    with pytest.raises(ValueError, match="eos_token_ids"):
        GrammarCompiler(hf_tokenizer, eos_token_ids=-1)
    with pytest.raises(TypeError, match="eos_token_ids must be token ids"):
        GrammarCompiler(hf_tokenizer, eos_token_ids=["</s>"])


# --- the package ----------------------------------------------------------------------------------


def test_package_exports_and_stays_light():
    code = (
        "import sys\n"
        "import langrt.constrained as c\n"
        "heavy = ('torch', 'transformers', 'tokenizers', 'langrt.model', 'langrt.constrained.grammar')\n"
        "assert not [m for m in heavy if m in sys.modules], sorted(sys.modules)\n"
        "from langrt.constrained import (Grammar, GrammarCompiler, GrammarMatcher, TokenVocabulary,\n"
        "    allocate_token_bitmask, apply_token_bitmask)\n"
        "assert not [m for m in ('transformers', 'langrt.model') if m in sys.modules], sorted(sys.modules)\n"
        "assert set(c.__all__) <= set(dir(c))\n"
        "try:\n"
        "    c.NoSuchThing\n"
        "except AttributeError as e:\n"
        "    assert 'NoSuchThing' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
