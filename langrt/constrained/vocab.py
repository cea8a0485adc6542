"""A tokenizer's vocabulary as bytes: what each token id spells, for walking it through a
byte-level automaton.

Byte-level BPE tokens (GPT-2 style) are spelled in a printable byte alphabet (`Ġ` is a space);
SentencePiece tokens use `▁` for spaces and `<0xNN>` for raw bytes. Either way a token is a byte
string, possibly not valid UTF-8 on its own (the automaton walks bytes, so that is fine).
Special tokens (BOS, EOS, chat markers) get no bytes: they are never allowed inside a grammar.
"""

from __future__ import annotations

import json
import operator
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch  # eos_words imports it when called: this module stays numpy-only


@dataclass
class TokenVocabulary:
    token_bytes: list[bytes | None]  # by token id; None: never part of constrained text
    eos_token_ids: frozenset[int]
    vocab_size: int  # width of the model's logits (>= len(token_bytes))

    def __post_init__(self):
        ids = [i for i, b in enumerate(self.token_bytes) if b]
        lengths = np.array([len(self.token_bytes[i]) for i in ids], dtype=np.int64)
        order = np.argsort(-lengths, kind="stable")  # longest first: walks shrink to a prefix
        self.walk_ids = np.array(ids, dtype=np.int64)[order]
        self.walk_lengths = lengths[order]
        width = int(lengths.max()) if len(lengths) else 1
        matrix = np.zeros((len(ids), width), dtype=np.int32)
        for row, i in enumerate(self.walk_ids):
            b = self.token_bytes[i]
            matrix[row, : len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.walk_columns = np.ascontiguousarray(matrix.T)  # [width, n]: byte j of every token
        self.walk_columns_flat = self.walk_columns.ravel()  # byte j of row r at j * n + r
        self.first_byte = matrix[:, 0].copy() if len(ids) else np.zeros(0, dtype=np.int32)
        # Walk rows grouped by their first two bytes (key first * 257 + second, second 256 for
        # a one-byte token): a state where few bytes lead on finds its candidates without
        # touching the rest of the vocabulary.
        second = np.where(self.walk_lengths > 1, matrix[:, 1] if width > 1 else 256, 256)
        keys = self.first_byte.astype(np.int64) * 257 + second
        self.by_pair = np.argsort(keys, kind="stable")
        self.pair_bounds = np.searchsorted(keys[self.by_pair], np.arange(256 * 257 + 1))
        self.byte_sets = _byte_sets(matrix, self.walk_lengths)
        order = np.argsort(self.first_byte, kind="stable")
        bounds = np.searchsorted(self.first_byte[order], np.arange(257))
        self.by_first_byte = [order[bounds[b] : bounds[b + 1]] for b in range(256)]  # walk rows
        self._spelled: dict[bytes, SpelledWith] = {}
        self._spelled_lock = threading.Lock()

    def spelled_with(self, allowed: np.ndarray) -> "SpelledWith":
        """The tokens made only of the bytes flagged in `allowed` (256 bools), memoized: JSON
        grammars keep meeting the same few byte sets (a string's characters, digits)."""
        key = np.packbits(allowed).tobytes()
        found = self._spelled.get(key)
        if found is None:
            found = SpelledWith(self, allowed)
            with self._spelled_lock:
                if len(self._spelled) >= _SPELLED_CACHE:
                    self._spelled.pop(next(iter(self._spelled)))
                self._spelled[key] = found
        return found

    @property
    def num_words(self) -> int:
        """int32 words per bitmask row."""
        return (self.vocab_size + 31) // 32


# Byte sets remembered per vocabulary (each ~0.5 MB of index arrays).
_SPELLED_CACHE = 64


class SpelledWith:
    """A vocabulary split by a byte set X: the walk rows of tokens made only of X-bytes (longest
    first) and of the others, with the packed bitmask of X-tokens up to each length."""

    def __init__(self, vocab: TokenVocabulary, allowed: np.ndarray):
        self.vocab = vocab
        outside = ~np.packbits(allowed, bitorder="little").view(np.uint64)
        sets = vocab.byte_sets
        hits = sets[0] & outside[0]
        for word in range(1, 4):
            hits |= sets[word] & outside[word]
        inside = hits == 0
        self.within = np.flatnonzero(inside)  # ascending walk rows: longest first
        self.within_lengths = vocab.walk_lengths[self.within]
        self.others = np.flatnonzero(~inside)
        self._allowed = allowed
        self._masks: dict[int | None, np.ndarray] = {}
        self._by_first_outside: tuple[np.ndarray, np.ndarray] | None = None

    def by_first_outside(self) -> tuple[np.ndarray, np.ndarray]:
        """`others` grouped by (position p, byte b) of their first byte outside X: walk rows
        ordered by key p * 256 + b, and the bounds of each key's group in that order."""
        if self._by_first_outside is None:
            columns, outside = self.vocab.walk_columns, ~self._allowed
            keys = np.zeros(self.others.size, dtype=np.int64)
            undecided = np.arange(self.others.size)
            for j in range(columns.shape[0]):  # every other-row has an outside byte: all decide
                if not undecided.size:
                    break
                b = columns[j][self.others[undecided]]
                hit = outside[b]
                keys[undecided[hit]] = j * 256 + b[hit]
                undecided = undecided[~hit]
            order = np.argsort(keys, kind="stable")
            self._by_first_outside = (
                self.others[order],
                np.searchsorted(keys[order], np.arange(columns.shape[0] * 256 + 1)),
            )
        return self._by_first_outside

    def longer_than(self, depth: int) -> np.ndarray:
        """Walk rows of X-tokens longer than `depth` bytes."""
        return self.within[: int(np.searchsorted(-self.within_lengths, -depth, side="left"))]

    def packed(self, depth: int | None) -> np.ndarray:
        """int32 bitmask words of the X-tokens at most `depth` bytes long (None: all)."""
        mask = self._masks.get(depth)
        if mask is None:
            rows = self.within if depth is None else self.within[len(self.longer_than(depth)) :]
            flags = np.zeros(self.vocab.num_words * 32, dtype=bool)
            flags[self.vocab.walk_ids[rows]] = True
            mask = self._masks[depth] = np.packbits(flags, bitorder="little").view(np.int32)
        return mask


def _byte_sets(matrix: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """4 arrays of n uint64: bit b % 64 of array b // 64 set when byte b occurs in the token."""
    sets = np.zeros((4, matrix.shape[0]), dtype=np.uint64)
    for j in range(matrix.shape[1]):
        rows = np.flatnonzero(lengths > j)
        b = matrix[rows, j].astype(np.uint64)
        np.bitwise_or.at(sets, ((b >> np.uint64(6)).astype(np.int64), rows), np.uint64(1) << (b & np.uint64(63)))
    return [np.ascontiguousarray(words) for words in sets]


def vocabulary_from_tokenizer(tokenizer, vocab_size: int | None = None, eos_token_ids=None) -> TokenVocabulary:
    """Build from a tokenizer object: a transformers tokenizer (fast or slow), a
    `tokenizers.Tokenizer`, or langrt's `TextDecoder` (what the scheduler holds).

    vocab_size: the width of the model's logits; the tokenizer's length when None or smaller.
    eos_token_ids: the ids that end the output (allowed where the grammar may end); when None,
    the tokenizer's EOS id. A `tokenizers.Tokenizer` names no EOS, so it needs them given.
    """
    backend, decode, length, eos = _tokenizer_parts(tokenizer)
    if eos_token_ids is None:
        if eos is None:
            raise ValueError(
                f"{describe(tokenizer)} does not say which token ends the text: pass eos_token_ids=[...] "
                "(or eos_token_ids=() for none)"
            )
        eos_token_ids = (eos,)
    width = 0 if vocab_size is None else _positive(vocab_size)
    if backend is not None:
        length = backend.get_vocab_size(with_added_tokens=True)
    eos_token_ids = _as_ids(eos_token_ids, max(width, length or 0))
    if backend is not None:
        return _from_backend(backend, width, eos_token_ids)
    return _from_decode(decode, length, width, eos_token_ids)


def vocabulary_from_decoder(decoder, vocab_size: int, eos_token_ids) -> TokenVocabulary:
    """Build from a `langrt.tokenizer.text_decoder.TextDecoder` (the scheduler's way in)."""
    return vocabulary_from_tokenizer(decoder, vocab_size, eos_token_ids)


def vocabulary_from_pretrained(path, vocab_size: int | None = None, eos_token_ids=None) -> TokenVocabulary:
    """Build from a model on disk: a GGUF file or an HF directory (a model's, or one holding
    only a tokenizer). Where the model's config is there (config.json, or the GGUF file's
    metadata and embedding), vocab_size and eos_token_ids default as the runtime sets them for
    that model: its logits width, and its config's EOS ids with the tokenizer's."""
    import os
    from pathlib import Path

    from langrt.tokenizer.loader import load_tokenizer

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a model path (str or os.PathLike) is needed, got {describe(path)}")
    path = Path(path).expanduser()
    if path.is_dir():  # as the runtime resolves it (a directory holding just one .gguf file: that file)
        from langrt.model.source import ModelSource

        path = ModelSource.resolve(path).path
    tokenizer = load_tokenizer(path)  # ModelLoadError naming the path when it holds no tokenizer
    model_width, model_eos = _model_defaults(path)
    if eos_token_ids is None:
        own = getattr(tokenizer, "eos_token_id", None)
        eos_token_ids = set(model_eos) | ({own} if own is not None else set())
        if not eos_token_ids:
            raise ValueError(
                f"neither the tokenizer nor the config at {path} names an EOS token: pass eos_token_ids=[...]"
            )
    if vocab_size is None and model_width:
        vocab_size = model_width
    return vocabulary_from_tokenizer(tokenizer, vocab_size, eos_token_ids)


def _tokenizer_parts(tokenizer):
    """-> (tokenizers.Tokenizer or None, decode(ids) or None, length or None, EOS id or None)."""
    from tokenizers import Tokenizer

    from langrt.tokenizer.text_decoder import TextDecoder

    if isinstance(tokenizer, Tokenizer):
        return tokenizer, None, None, None
    if isinstance(tokenizer, TextDecoder):
        inner = tokenizer.backend
        if isinstance(inner, Tokenizer):
            return inner, None, None, tokenizer.eos_token_id
        length = len(inner.tokenizer) if hasattr(inner, "tokenizer") else None
        return None, tokenizer.decode, length, tokenizer.eos_token_id
    backend = getattr(tokenizer, "backend_tokenizer", None)  # transformers' fast tokenizers
    if isinstance(backend, Tokenizer):
        return backend, None, None, getattr(tokenizer, "eos_token_id", None)
    if callable(getattr(tokenizer, "convert_ids_to_tokens", None)) and callable(getattr(tokenizer, "decode", None)):
        # a transformers tokenizer without a `tokenizers` backend (a slow one)
        return None, tokenizer.decode, len(tokenizer), getattr(tokenizer, "eos_token_id", None)
    raise TypeError(
        f"cannot build a token vocabulary from {describe(tokenizer)}: pass a transformers tokenizer, "
        "a tokenizers.Tokenizer, a model path (a .gguf file or an HF directory) or a TokenVocabulary"
    )


def describe(obj) -> str:
    """`obj` for an error message: its repr when short, and its type."""
    kind = type(obj)
    name = f"{kind.__module__}.{kind.__qualname__}"
    text = repr(obj)
    return f"a {name} object" if len(text) > 80 else f"{text} ({name})"


def _as_ids(ids, width: int) -> frozenset[int]:
    """EOS ids as a frozenset, each checked to be a token id below the vocabulary's width."""
    try:
        ids = (operator.index(ids),)
    except TypeError:
        pass
    try:
        out = frozenset(operator.index(i) for i in ids)
    except TypeError:
        raise TypeError(f"eos_token_ids must be token ids (ints), got {ids!r}") from None
    bad = sorted(i for i in out if not 0 <= i < width)
    if bad:
        raise ValueError(f"eos_token_ids {bad} are not ids of a vocabulary of {width} tokens")
    return out


def _positive(vocab_size) -> int:
    try:
        if isinstance(vocab_size, bool):
            raise TypeError
        width = operator.index(vocab_size)
    except TypeError:
        width = 0
    if width < 1:
        raise ValueError(f"vocab_size must be a positive int (the model's logits width), got {vocab_size!r}")
    return width


def _model_defaults(path) -> tuple[int, tuple[int, ...]]:
    """(logits width or 0, EOS ids) from the model's config beside its tokenizer, if any."""
    if path.is_file():
        from langrt.model.gguf_reader import read_header

        _, metadata, tensors = read_header(path)
        width = next((t.shape[0] for t in tensors if t.name == "token_embd.weight"), 0)
        eos = metadata.get("tokenizer.ggml.eos_token_id")
        return int(width), (() if eos is None else (int(eos),))
    config = path / "config.json"
    if not config.is_file():
        return 0, ()
    d = json.loads(config.read_text())
    eos = d.get("eos_token_id")
    eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    return int(d.get("vocab_size") or 0), tuple(int(e) for e in eos)


def _from_backend(backend, vocab_size: int, eos_token_ids: frozenset[int]) -> TokenVocabulary:
    """Each token of a `tokenizers.Tokenizer` spelled in bytes from its vocabulary entry."""
    spec = json.loads(backend.to_str())
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    size = backend.get_vocab_size(with_added_tokens=True)
    spell = _byte_level_speller() if _is_byte_level(spec.get("decoder")) else _sentencepiece_speller
    token_bytes: list[bytes | None] = []
    for i in range(size):
        token = backend.id_to_token(i)
        token_bytes.append(None if token is None or i in special else spell(token))
    return TokenVocabulary(token_bytes, eos_token_ids, max(vocab_size, size))


def _is_byte_level(decoder: dict | None) -> bool:
    if not decoder:
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(d) for d in decoder.get("decoders", []))


def _byte_level_speller():
    from langrt.tokenizer.loader import _byte_alphabet

    inverse = {c: b for b, c in _byte_alphabet().items()}

    def spell(token: str) -> bytes | None:
        try:
            return bytes(inverse[c] for c in token)
        except KeyError:  # an added token stored as raw text
            return token.encode("utf-8")

    return spell


def _sentencepiece_speller(token: str) -> bytes:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


def _from_decode(decode, length: int | None, vocab_size: int, eos_token_ids: frozenset[int]) -> TokenVocabulary:
    """Fallback without a `tokenizers` backend: each token decoded alone (tokens that are not
    whole characters decode to U+FFFD and are left out)."""
    count = length if length is not None else vocab_size
    token_bytes: list[bytes | None] = []
    for i in range(count):
        text = decode([i], skip_special_tokens=True)
        token_bytes.append(text.encode("utf-8") if text and "\ufffd" not in text else None)
    return TokenVocabulary(token_bytes, eos_token_ids, max(vocab_size, count))


def eos_words(vocab: TokenVocabulary) -> torch.Tensor:
    """A bitmask row (int32 words) allowing only the EOS tokens (the adapters' finished grammars)."""
    import torch

    words = [0] * vocab.num_words
    for token in vocab.eos_token_ids:
        words[token // 32] |= 1 << (token % 32)
    return torch.tensor([w - 2**32 if w >= 2**31 else w for w in words], dtype=torch.int32)
