"""A tokenizer's vocabulary as bytes: what each token id spells, for walking it through a
byte-level automaton.

Byte-level BPE tokens (GPT-2 style) are spelled in a printable byte alphabet (`Ġ` is a space);
SentencePiece tokens use `▁` for spaces and `<0xNN>` for raw bytes. Either way a token is a byte
string, possibly not valid UTF-8 on its own (the automaton walks bytes, so that is fine).
Special tokens (BOS, EOS, chat markers) get no bytes: they are never allowed inside a grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np


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
        self.first_byte = matrix[:, 0].copy() if len(ids) else np.zeros(0, dtype=np.int32)
        self.byte_sets = _byte_sets(matrix, self.walk_lengths)

    @property
    def num_words(self) -> int:
        """int32 words per bitmask row."""
        return (self.vocab_size + 31) // 32


def _byte_sets(matrix: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """4 arrays of n uint64: bit b % 64 of array b // 64 set when byte b occurs in the token."""
    sets = np.zeros((4, matrix.shape[0]), dtype=np.uint64)
    for j in range(matrix.shape[1]):
        rows = np.flatnonzero(lengths > j)
        b = matrix[rows, j].astype(np.uint64)
        np.bitwise_or.at(sets, ((b >> np.uint64(6)).astype(np.int64), rows), np.uint64(1) << (b & np.uint64(63)))
    return [np.ascontiguousarray(words) for words in sets]


def vocabulary_from_decoder(decoder, vocab_size: int, eos_token_ids) -> TokenVocabulary:
    """Build from a `langrt.model.text_decoder.TextDecoder` (a `tokenizers` backend)."""
    backend = decoder.backend
    if not hasattr(backend, "to_str"):
        return _from_decode(decoder, vocab_size, eos_token_ids)
    spec = json.loads(backend.to_str())
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    size = backend.get_vocab_size(with_added_tokens=True)
    spell = _byte_level_speller() if _is_byte_level(spec.get("decoder")) else _sentencepiece_speller
    token_bytes: list[bytes | None] = []
    for i in range(size):
        token = backend.id_to_token(i)
        token_bytes.append(None if token is None or i in special else spell(token))
    return TokenVocabulary(token_bytes, frozenset(eos_token_ids), max(vocab_size, size))


def _is_byte_level(decoder: dict | None) -> bool:
    if not decoder:
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_is_byte_level(d) for d in decoder.get("decoders", []))


def _byte_level_speller():
    from langrt.model.tokenizer import _byte_alphabet

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


def _from_decode(decoder, vocab_size: int, eos_token_ids) -> TokenVocabulary:
    """Fallback without a `tokenizers` backend: each token decoded alone (tokens that are not
    whole characters decode to U+FFFD and are left out)."""
    token_bytes: list[bytes | None] = []
    for i in range(vocab_size):
        text = decoder.decode([i], skip_special_tokens=True)
        token_bytes.append(text.encode("utf-8") if text and "\ufffd" not in text else None)
    return TokenVocabulary(token_bytes, frozenset(eos_token_ids), vocab_size)
