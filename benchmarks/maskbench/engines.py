"""One adapter per grammar engine, all over the same tokenizer (maskbench/vocabs.py: SmolLM2's by default).

Settings, following MaskBench's runner (maskbench/maskbench/*_engine.py) where it has one:
langrt with its default (compact) whitespace; as `langrt-open`, with open_objects (properties a
schema does not list allowed where it does not say additionalProperties); as `langrt-any`, with
open_objects and any_order (properties in any order too: what JSON Schema itself allows); xgrammar as MaskBench's "XGrammar" (strict_mode,
json.dumps's fixed whitespace) and, opt-in, `xgrammar-compliant` as its "XGrammar (compliant)"
(any whitespace, no strict_mode); llguidance and outlines-core with their JSON-schema defaults.
One thread each: xgrammar's compiler is given max_threads=1, and the worker process sets the
thread variables of the others (worker.WORKER_ENV).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import numpy as np

# engine -> the module it needs; DEFAULT_ENGINES run unless --engines says otherwise.
MODULES = {
    "langrt": "langrt",
    "xgrammar": "xgrammar",
    "llguidance": "llguidance",
    "outlines-core": "outlines_core",
    "xgrammar-compliant": "xgrammar",
    "langrt-open": "langrt",
    "langrt-any": "langrt",
}
DEFAULT_ENGINES = ("langrt", "langrt-open", "langrt-any", "xgrammar", "llguidance", "outlines-core")
DISTRIBUTIONS = {
    "langrt": "langrt",
    "xgrammar": "xgrammar",
    "llguidance": "llguidance",
    "outlines_core": "outlines-core",
}


class MaskEngine(Protocol):
    """One grammar engine inside a worker. compile() raises when the engine refuses the schema;
    then, per instance, start() makes a fresh matcher, fill() writes its next-token mask into
    `mask` (int32 words, bit t % 32 of word t // 32 set when token t is allowed), and accept(t)
    advances it (called only with tokens the mask allows)."""

    mask: np.ndarray

    def compile(self, schema: Any) -> None: ...

    def start(self) -> None: ...

    def fill(self) -> None: ...

    def accept(self, token: int) -> bool: ...


class LangrtEngine:
    def __init__(self, tokenizer, **options):
        import torch

        from langrt.constrained import GrammarCompiler, allocate_token_bitmask

        torch.set_num_threads(1)
        # the tokenizer's own width and EOS, as the other engines are given
        self.compiler = GrammarCompiler.from_tokenizer(tokenizer, vocab_size=len(tokenizer))
        self.bitmask = allocate_token_bitmask(1, self.compiler.vocab_size)
        self.mask = self.bitmask[0].numpy()
        self.options = options  # none by default: round 1's compiler has no such options

    def compile(self, schema):
        self.grammar = self.compiler.compile_json_schema(schema, **self.options)

    def start(self):
        self.matcher = self.grammar.matcher()

    def fill(self):
        self.matcher.fill_bitmask(self.bitmask, 0)

    def accept(self, token):
        return self.matcher.accept_token(token)


class XgrammarEngine:
    def __init__(self, tokenizer, compliant: bool = False):
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
        self.mask = self.bitmask[0].numpy()
        self.options = (
            dict(any_whitespace=True, strict_mode=False) if compliant else dict(any_whitespace=False, strict_mode=True)
        )

    def compile(self, schema):
        self.grammar = self.compiler.compile_json_schema(json.dumps(schema), **self.options)

    def start(self):
        self.matcher = self.xgr.GrammarMatcher(self.grammar)

    def fill(self):
        self.matcher.fill_next_token_bitmask(self.bitmask, 0)

    def accept(self, token):
        return self.matcher.accept_token(token)


class LlguidanceEngine:
    def __init__(self, tokenizer):
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, self.tokenizer.vocab_size)
        self.mask = self.bitmask[0]

    def compile(self, schema):
        # the grammar as MaskBench's runner writes it; LLMatcher reports errors, never raises
        matcher = self.llg.LLMatcher(self.tokenizer, json.dumps({"grammars": [{"json_schema": schema}]}), log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        self.compiled = matcher

    def start(self):
        self.matcher = self.compiled.deep_copy()

    def fill(self):
        self.llg.numpy.fill_next_token_bitmask(self.matcher, self.bitmask, 0)

    def accept(self, token):
        return self.matcher.consume_token(token) and not self.matcher.is_error()


class OutlinesEngine:
    def __init__(self, tokenizer):
        import outlines_core

        from langrt.constrained.vocab import vocabulary_from_tokenizer

        table: dict[bytes, list[int]] = {}
        for i, spelling in enumerate(vocabulary_from_tokenizer(tokenizer).token_bytes):
            if spelling:  # special tokens spell nothing
                table.setdefault(spelling, []).append(i)
        self.oc = outlines_core
        self.vocabulary = outlines_core.Vocabulary(tokenizer.eos_token_id, table)
        self.mask = np.zeros((len(tokenizer) + 31) // 32, dtype=np.int32)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        self.index = self.oc.Index(regex, self.vocabulary)

    def start(self):
        self.guide = self.oc.Guide(self.index)

    def fill(self):
        self.guide.write_mask_into(self.mask.ctypes.data, self.mask.size, self.mask.itemsize)

    def accept(self, token):
        try:
            self.guide.advance(token, return_tokens=False)
        except ValueError:
            return False
        return True


def make_engine(name: str, tokenizer) -> MaskEngine:
    if name == "xgrammar-compliant":
        return XgrammarEngine(tokenizer, compliant=True)
    if name == "langrt-open":
        return LangrtEngine(tokenizer, open_objects=True)
    if name == "langrt-any":
        return LangrtEngine(tokenizer, open_objects=True, any_order=True)
    makers = {
        "langrt": LangrtEngine,
        "xgrammar": XgrammarEngine,
        "llguidance": LlguidanceEngine,
        "outlines-core": OutlinesEngine,
    }
    return makers[name](tokenizer)


def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)
