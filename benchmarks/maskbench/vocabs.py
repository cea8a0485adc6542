"""The vocabularies MaskBench runs over: the built-in SmolLM2's 49,152 tokens, and Qwen2.5's
151,936 and Gemma 3's 262,144 from their GGUF files (benchmarks/fetch_models.py fetches them).
Every engine of a run gets the same transformers tokenizer; a GGUF's (built in ~30 s for
Gemma's) is saved once under the cache folder and read back by later workers."""

from __future__ import annotations

import os
from pathlib import Path

# name -> fetch_models.py's model name (None: the built-in model)
VOCABS = {"smollm2": None, "qwen2.5": "qwen2.5-coder-0.5b", "gemma3": "gemma3-270m"}


def vocab_source(name: str) -> Path:
    """The model file (or folder) whose tokenizer `name` is."""
    if name not in VOCABS:
        raise SystemExit(f"unknown vocabulary {name!r}; choose from {', '.join(VOCABS)}")
    if VOCABS[name] is None:
        from langrt.builtin import builtin_model_path

        return Path(builtin_model_path())
    from benchmarks.fetch_models import model_path

    path = model_path(VOCABS[name])
    if not path.exists():
        raise SystemExit(f"{path} is absent: python benchmarks/fetch_models.py {VOCABS[name]}")
    return path


def load_vocab_tokenizer(name: str):
    """The transformers tokenizer of vocabulary `name`; a GGUF's is cached as a tokenizer folder
    keyed by the file's size and time."""
    from langrt.tokenizer.loader import load_tokenizer

    path = vocab_source(name)
    if path.is_dir():
        return load_tokenizer(path)
    stat = path.stat()
    cache = Path(os.environ.get("LANGRT_CACHE_DIR") or Path.home() / ".cache" / "langrt") / "maskbench-tokenizers"
    folder = cache / f"{path.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    if (folder / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    tokenizer = load_tokenizer(path)
    tokenizer.save_pretrained(folder)
    return tokenizer


def vocab_label(name: str, tokenizer) -> str:
    return f"{name} ({len(tokenizer):,} tokens)"
