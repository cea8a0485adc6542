"""Token ids -> text with the `tokenizers` library alone.

The scheduler (stop strings) and the detokenizer only decode; importing transformers and
building its tokenizer object would add a second of start-up to each of those processes (see
benchmarks/README.md). The main process, which encodes and applies chat templates, keeps the
full transformers tokenizer; both read the same vocabulary, so they decode alike.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from langrt.errors import ModelLoadError

# transformers' clean_up_tokenization, for tokenizers configured to use it.
_CLEANUPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class TextDecoder:
    """Decoding (and, for jump-forward, encoding a short text) without transformers."""

    def __init__(self, backend, eos_token_id: int | None, clean_up_spaces: bool = False):
        self.backend = backend
        self.eos_token_id = eos_token_id
        self.clean_up_spaces = clean_up_spaces

    def decode(
        self, ids: Sequence[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        """`spaces_between_special_tokens` is accepted for the slow-tokenizer API and, as in
        transformers' fast tokenizers, has no effect."""
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self.clean_up_spaces:
            for before, after in _CLEANUPS:
                text = text.replace(before, after)
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` alone (no BOS/EOS)."""
        return self.backend.encode(text, add_special_tokens=False).ids


class DeferredTextDecoder(TextDecoder):
    """A GGUF file's decoder, built on first use or by `load()`: the scheduler serves without it
    (a 151k-token vocabulary takes ~1 s to build) and builds it once idle, since only stop
    strings, grammars, reasoning and drafts need the text. The EOS id is the file's, known at once."""

    def __init__(self, path: Path, eos_token_id: int | None):
        self.path = path
        self.eos_token_id = eos_token_id

    @property
    def loaded(self) -> bool:
        return "backend" in vars(self)

    def load(self) -> None:
        if not self.loaded:
            decoder = load_text_decoder(self.path)
            self.backend, self.clean_up_spaces = decoder.backend, decoder.clean_up_spaces

    def __getattr__(self, name: str):  # reached only for what is not set yet: the backend's parts
        if name in ("backend", "clean_up_spaces"):
            self.load()
            return vars(self)[name]
        raise AttributeError(name)


def deferred_text_decoder(path: str | os.PathLike) -> TextDecoder:
    """A GGUF file's decoder deferred (DeferredTextDecoder); any other's loaded now."""
    path = Path(path)
    if path.is_file():
        from langrt.model.gguf_reader import read_header

        _, metadata, _ = read_header(path)
        return DeferredTextDecoder(path, metadata.get("tokenizer.ggml.eos_token_id"))
    return load_text_decoder(path)


def load_text_decoder(path: str | os.PathLike) -> TextDecoder:
    """The decoder of an HF model directory (its tokenizer.json) or of a GGUF file."""
    path = Path(path)
    if path.is_file():
        from langrt.model.gguf_reader import read_header
        from langrt.tokenizer.loader import gguf_backend

        _, metadata, _ = read_header(path)
        backend, _ = gguf_backend(metadata, str(path))
        return TextDecoder(backend, metadata.get("tokenizer.ggml.eos_token_id"))
    tokenizer_json = path / "tokenizer.json"
    if tokenizer_json.is_file():
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(tokenizer_json))
        config = _read_json(path / "tokenizer_config.json")
        eos = config.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        return TextDecoder(
            backend, backend.token_to_id(eos) if eos else None, bool(config.get("clean_up_tokenization_spaces", False))
        )
    # No fast tokenizer file (a sentencepiece-only directory): decode through transformers.
    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(path)
    return TextDecoder(_TransformersBackend(tokenizer), tokenizer.eos_token_id)


class _TransformersBackend:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def decode(self, ids, skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def encode(self, text: str, add_special_tokens: bool):
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return type("Encoding", (), {"ids": ids})()


def _read_json(file: Path) -> dict:
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {file}: {e}") from e
