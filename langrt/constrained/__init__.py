"""Constrained decoding: langrt's grammar engine, usable without a model (DESIGN §7).

    from langrt.constrained import GrammarCompiler, allocate_token_bitmask

    compiler = GrammarCompiler(tokenizer)   # transformers tokenizer, tokenizers.Tokenizer, .gguf / HF dir path
    grammar = compiler.compile_json_schema(schema)   # also compile_regex, compile_choices
    matcher = grammar.matcher()
    bitmask = allocate_token_bitmask(1, compiler.vocab_size)
    matcher.fill_bitmask(bitmask, 0)     # allowed next tokens of row 0 (EOS only where it may end)
    matcher.accept_token(token_id)       # -> bool; False leaves the matcher unchanged
    matcher.is_terminated(); matcher.copy()
    apply_token_bitmask(logits, bitmask) # disallowed logits -> -inf, in place

The names below load on first use: importing this package (or a submodule such as `spec`)
imports neither torch nor the model package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langrt.constrained.bitmask import allocate_token_bitmask, apply_token_bitmask
    from langrt.constrained.grammar import Grammar, GrammarCompiler, GrammarMatcher
    from langrt.constrained.vocab import TokenVocabulary

_EXPORTS = {
    "GrammarCompiler": "langrt.constrained.grammar",
    "Grammar": "langrt.constrained.grammar",
    "GrammarMatcher": "langrt.constrained.grammar",
    "TokenVocabulary": "langrt.constrained.vocab",
    "allocate_token_bitmask": "langrt.constrained.bitmask",
    "apply_token_bitmask": "langrt.constrained.bitmask",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'langrt.constrained' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
