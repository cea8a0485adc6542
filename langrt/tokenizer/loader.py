"""Loading a tokenizer: from an HF model directory, or built from a GGUF file's metadata.

A GGUF file has no tokenizer.json; it stores llama.cpp's description of the tokenizer
(`tokenizer.ggml.*`): the vocabulary, merges or scores, token types, special ids, and the name
of the pre-tokenizer (`tokenizer.ggml.pre`), whose regexes live in llama.cpp's source
(llama-vocab.cpp). `tokenizer_from_gguf_metadata` writes the equivalent tokenizer.json for the
`tokenizers` library and wraps it in a `PreTrainedTokenizerFast`. Two families:

- `gpt2`: byte-level BPE with the file's merges, split first by the pre-tokenizer's regexes
  (`_PRE_TOKENIZERS`; an unknown name falls back to GPT-2's split, with a warning).
- `llama`: SentencePiece-style BPE (Llama 2, Mistral): merges ranked by the merged piece's score,
  "\u2581" for spaces, byte fallback through the `<0xNN>` tokens. The "\u2581" prefix goes on
  every stretch of text, also right after a special token and also before a leading space, as
  llama.cpp and Llama 2's tokenizer.json do (transformers' GGUF path, with Metaspace, does not).

Control tokens (type 3) become special added tokens and user-defined ones (type 4) plain added
tokens: both then match whole in the text, as in llama.cpp and in the models' own tokenizer.json.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from langrt.errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

# llama.cpp token types (tokenizer.ggml.token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_ADDED_TYPES = (_UNKNOWN, _CONTROL, _USER_DEFINED)  # matched whole in the text, before the model

# Pre-tokenizer regexes, as in each family's tokenizer.json (llama.cpp's are the same, respelled
# for its own regex engine). Applied in order, each splitting the pieces the previous one left.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's fallback for files that name no pre-tokenizer ("default").
_LLAMACPP_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class _PreTokenizer:
    """One `tokenizer.ggml.pre` family: its split regexes, and the options its tokenizer.json
    (and llama.cpp) pair with it. `add_bos` is the default when the file does not say."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    nfc: bool = False
    add_bos: bool = False


_GPT2_FAMILY = _PreTokenizer((_GPT2,))
_STARCODER_FAMILY = _PreTokenizer((r"\p{N}", _GPT2))  # digits one by one, then GPT-2's split
_LLAMA3_FAMILY = _PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_FAMILY = _PreTokenizer((_QWEN2,), nfc=True)
_PRE_TOKENIZERS = {
    **dict.fromkeys(["gpt2", "mpt", "olmo", "jais", "trillion"], _GPT2_FAMILY),
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"], _STARCODER_FAMILY
    ),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral"], _LLAMA3_FAMILY),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"], _QWEN2_FAMILY),
    "tekken": _PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    **dict.fromkeys(["gpt-4o", "llama4", "minimax-m2"], _PreTokenizer((_GPT4O,))),
    "default": _PreTokenizer(_LLAMACPP_DEFAULT),
}


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The tokenizer of an HF model directory (local files only) or of a GGUF file."""
    path = Path(path)
    if path.is_file():
        if not _is_gguf(path):
            raise ModelLoadError(f"{path} is a file but not a GGUF file; pass a .gguf file or an HF model directory")
        return _gguf_tokenizer(path)
    if path.is_dir():
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, KeyError) as e:
            raise ModelLoadError(f"cannot load a tokenizer from the directory {path}: {e}") from e
    raise ModelLoadError(f"tokenizer path {path} does not exist (expected an HF model directory or a .gguf file)")


def _gguf_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    """The tokenizer a GGUF file's metadata describes, with its chat template (the architecture's
    own where the file has none)."""
    from langrt.model.gguf_loader import GGUFFile

    gguf = GGUFFile(path)
    tokenizer = tokenizer_from_gguf_metadata(gguf.metadata, source=str(path))
    if tokenizer.chat_template is None and gguf.chat_template is not None:
        logger.info("%s has no chat template; using %s's own", path, gguf.arch.hf_class)
        tokenizer.chat_template = gguf.chat_template
    return tokenizer


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def tokenizer_from_gguf_metadata(metadata: Mapping[str, Any], source: str = "GGUF file") -> PreTrainedTokenizerFast:
    """Build the tokenizer a GGUF file's `tokenizer.*` metadata describes. `source` names the file in errors."""
    from transformers import PreTrainedTokenizerFast

    spec, default_add_bos = gguf_tokenizer_json(metadata, source)
    tokens = metadata["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    # Handed over as a file: given a `tokenizers.Tokenizer` object instead, transformers deep-copies
    # it (serialized and parsed again, ~0.8 s for a 151k-token vocabulary).
    with tempfile.TemporaryDirectory(prefix="langrt-tokenizer-") as directory:
        file = Path(directory) / "tokenizer.json"
        file.write_text(spec, encoding="utf-8")
        try:
            return PreTrainedTokenizerFast(
                tokenizer_file=str(file),
                bos_token=token("bos_token_id"),
                eos_token=token("eos_token_id"),
                unk_token=token("unknown_token_id"),
                pad_token=token("padding_token_id"),
                add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", default_add_bos)),
                add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
                chat_template=metadata.get("tokenizer.chat_template"),
                clean_up_tokenization_spaces=False,
            )
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise ModelLoadError(f"{source}: its tokenizer metadata is inconsistent: {e}") from e


def gguf_backend(metadata: Mapping[str, Any], source: str = "GGUF file"):
    """The `tokenizers.Tokenizer` a GGUF file describes, and whether its family adds BOS by default."""
    from tokenizers import Tokenizer

    spec, default_add_bos = gguf_tokenizer_json(metadata, source)
    try:
        return Tokenizer.from_str(spec), default_add_bos
    except Exception as e:  # the tokenizers library raises plain Exceptions
        raise ModelLoadError(f"{source}: its tokenizer metadata is inconsistent: {e}") from e


def gguf_tokenizer_json(metadata: Mapping[str, Any], source: str = "GGUF file") -> tuple[str, bool]:
    """The tokenizer.json a GGUF file's metadata describes, and whether its family adds BOS by default."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelLoadError(f"{source} has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    types = metadata.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if kind == "gpt2":
        pre = _pre_tokenizer(metadata.get("tokenizer.ggml.pre"), source)
        spec, default_add_bos = _byte_level_spec(tokens, types, metadata, pre), pre.add_bos
    elif kind == "llama":
        spec, default_add_bos = _sentencepiece_spec(tokens, types, metadata, source), True
    else:
        raise ModelLoadError(
            f"{source}: tokenizer model {kind!r} is not supported; langrt builds 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece BPE) tokenizers"
        )
    return json.dumps(spec, ensure_ascii=False), default_add_bos


def _pre_tokenizer(name: str | None, source: str) -> _PreTokenizer:
    if name is None:
        return _PRE_TOKENIZERS["default"]
    if name not in _PRE_TOKENIZERS:
        logger.warning("%s: pre-tokenizer %r is unknown to langrt; splitting text as GPT-2 does", source, name)
        return _GPT2_FAMILY
    return _PRE_TOKENIZERS[name]


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    """Tokens matched whole before the model runs: control (special) and user-defined (not)."""
    return [
        {
            "id": index,
            "content": tokens[index],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": token_type != _USER_DEFINED,
        }
        for index, token_type in enumerate(types)
        if token_type in _ADDED_TYPES
    ]


def _bpe_model(vocab: dict[str, int], merges: list, **options: Any) -> dict[str, Any]:
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
    }
    return {**model, **options, "vocab": vocab, "merges": merges}


def _spec(model: dict, added: list, normalizer: Any, pre_tokenizer: Any, decoder: Any) -> dict[str, Any]:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,  # PreTrainedTokenizerFast writes it from add_bos_token / add_eos_token
        "decoder": decoder,
        "model": model,
    }


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the inverse of the ByteLevel decoder)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    spelling, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _byte_level_spec(tokens: list[str], types: list[int], metadata: Mapping[str, Any], pre: _PreTokenizer) -> dict:
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise ModelLoadError("a 'gpt2' tokenizer needs tokenizer.ggml.merges, which this GGUF file lacks")
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for index, (token, token_type) in enumerate(zip(tokens, types)):
        # Added tokens are stored as raw text ("<|im_start|>", "<|tool call|>") and must stay so:
        # `tokenizers` gives an added token the id of the model entry spelled like it (or a new
        # id past the end). Any other token outside the byte alphabet is a mislabelled one;
        # respell it in the alphabet so that merges can reach it.
        if token_type not in _ADDED_TYPES and not alphabet.issuperset(token):
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, index)
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in pre.regexes]
    if pre.regexes == (_GPT2,):  # ByteLevel's built-in regex is GPT-2's
        splits = []
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": not splits}
    pre_tokenizer = {"type": "Sequence", "pretokenizers": [*splits, byte_level]} if splits else byte_level
    return _spec(
        model=_bpe_model(vocab, list(merges), ignore_merges=pre.ignore_merges),
        added=_added_tokens(tokens, types),
        normalizer={"type": "NFC"} if pre.nfc else None,
        pre_tokenizer=pre_tokenizer,
        decoder={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    )


def _sentencepiece_spec(tokens: list[str], types: list[int], metadata: Mapping[str, Any], source: str) -> dict:
    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None and metadata.get("tokenizer.ggml.merges") is None:
        raise ModelLoadError(f"{source}: a 'llama' tokenizer needs tokenizer.ggml.scores or merges")
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    if metadata.get("tokenizer.ggml.merges") is not None:
        merges = [merge.split(" ", 1) for merge in metadata["tokenizer.ggml.merges"]]
    else:
        merges = _merges_from_scores(tokens, types, scores, vocab)
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    replace_space = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    normalizer = (
        {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, replace_space]}
        if prefix
        else replace_space
    )
    decoders = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return _spec(
        model=_bpe_model(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True),
        added=_added_tokens(tokens, types),
        normalizer=normalizer,
        pre_tokenizer=None,
        decoder={"type": "Sequence", "decoders": decoders},
    )


def _merges_from_scores(tokens: list[str], types: list[int], scores: list[float], vocab: dict[str, int]) -> list:
    """SentencePiece BPE merges: every way to split a normal piece into two vocabulary pieces,
    ranked by the merged piece's score, best first (ties: longer left, then longer right part;
    then vocabulary order), the order transformers' converter gives them. Control and byte
    pieces are never merge results, as in SentencePiece."""
    ranked = []
    for index, token in enumerate(tokens):
        if types[index] not in (_NORMAL, _USER_DEFINED):
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], -cut, cut - len(token), index, vocab[left], vocab[right]))
    ranked.sort()
    return [[tokens[left], tokens[right]] for *_, left, right in ranked]
