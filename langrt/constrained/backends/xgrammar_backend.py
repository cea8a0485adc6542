"""`--grammar-backend xgrammar`: grammars compiled and matched by xgrammar, behind the matcher
interface the scheduler uses (base.GrammarMatcherLike).

The vocabulary is langrt's (TokenVocabulary: each token's bytes, None for special tokens), handed
to xgrammar as raw bytes, so xgrammar needs no tokenizer of its own and its masks are as wide as
the model's logits. What each kind becomes:

- regex: xgrammar's regex (ECMAScript-like; Python-only syntax is refused by xgrammar);
- json_schema: xgrammar's JSON schema grammar without free whitespace, so `, ` and `: ` exactly
  as json.dumps writes them (langrt's default also allows `,` and `:`: xgrammar has one separator
  per position, and the spaced one is what models write); `open_objects` -> not strict mode,
  `any_order` -> xgrammar's any_order (which does not check required keys);
- ebnf and choices: langrt's EBNF parsed by langrt, written as xgrammar EBNF (dialects.py);
- structural_tag: xgrammar's structural tag format (triggered_tags / tags_with_separator, or
  sequences of any_text and repeated tags where max_tags bounds them), each tag's JSON in the
  json_schema kind's grammar.

Matchers have no jump-forward (no drafts, no certain tail): langrt drafts from its own
automaton's forced runs and the spellings models wrote there. (xgrammar's forced string,
`find_jump_forward_string`, could feed drafts; not done.)
"""

from __future__ import annotations

import json
import re

import torch

from langrt.constrained.backends import dialects
from langrt.constrained.spec import GrammarSpec
from langrt.constrained.vocab import TokenVocabulary, eos_words
from langrt.errors import InvalidRequest

# Why 1: compiling precomputes token masks and xgrammar would start 8 threads for it; the model
# decodes on the same cores meanwhile. On one, a schema compiles in 5 to 500 ms (49k tokens).
COMPILE_THREADS = 1


class XGrammarBackend:
    # xgrammar's compile is native code, which cannot be stopped: the service runs each compile in a
    # thread of its own and abandons it at the time limit (base.GrammarBackend)
    stops_itself = False

    def __init__(self, vocab: TokenVocabulary):
        import xgrammar

        self.xgr = xgrammar
        self.vocab = vocab
        info = xgrammar.TokenizerInfo(
            [b or b"" for b in vocab.token_bytes],  # empty: a special token, never inside a grammar
            vocab_type=xgrammar.VocabType.RAW,
            vocab_size=vocab.vocab_size,
            stop_token_ids=sorted(vocab.eos_token_ids),
            add_prefix_space=False,
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=COMPILE_THREADS)
        self.stop_words = eos_words(vocab)

    def close(self) -> None:
        """Nothing to release: the compiler is freed with the object."""

    def compile(self, spec: GrammarSpec) -> "XGrammar":
        """The compiled grammar of `spec`; InvalidRequest naming what xgrammar refused."""
        try:
            compiled = self._compile(spec)
        except InvalidRequest:
            raise
        except (RuntimeError, ValueError) as e:  # xgrammar's errors (C++ RuntimeError, pydantic's ValueError)
            raise InvalidRequest(f"xgrammar refused the {spec.kind}: {_message(e)}", param=spec.kind) from None
        return XGrammar(compiled, self)

    def _compile(self, spec: GrammarSpec):
        if spec.kind == "regex":
            return self.compiler.compile_regex(spec.text)
        if spec.kind == "json_schema":
            return self.compiler.compile_json_schema(
                spec.text,
                any_whitespace=False,
                strict_mode="open_objects" not in spec.options,
                any_order="any_order" in spec.options,
            )
        if spec.kind == "ebnf":
            return self.compiler.compile_grammar(dialects.xgrammar_ebnf(dialects.parse_rules(spec.text)))
        if spec.kind == "choices":
            return self.compiler.compile_grammar(dialects.choices_xgrammar_ebnf(json.loads(spec.text)))
        if spec.kind == "structural_tag":
            return self.compiler.compile_structural_tag(json.dumps(self.structural_tag(spec.text)))
        raise InvalidRequest(f"xgrammar cannot serve a {spec.kind} constraint", param=spec.kind)

    def structural_tag(self, text: str) -> dict:
        """xgrammar's structural tag for langrt's canonical one (structural_tag.py's form)."""
        spec = json.loads(text)
        tags = [
            {
                "type": "tag",
                "begin": s["begin"],
                "content": {"type": "grammar", "grammar": self._json_ebnf(s["schema"])},
                "end": s["end"],
            }
            for s in spec["structures"]
        ]
        limit, separator = spec.get("max_tags"), spec.get("separator", "")
        if spec.get("free_text", True):
            triggers = dialects.minimal_triggers(spec["triggers"])
            if limit is None:
                return _format({"type": "triggered_tags", "triggers": triggers, "tags": tags})
            # triggered_tags bounds tags only to one (stop_after_first), and ends the output there
            text = {"type": "any_text", "excludes": triggers}
            return _format(_sequence(text, _repeat(0, limit, _sequence(_any_of(tags), text))))
        if limit in (None, 1):
            tags_format = {"type": "tags_with_separator", "tags": tags, "separator": separator}
            return _format({**tags_format, "at_least_one": True, "stop_after_first": limit == 1})
        more = _sequence({"type": "const_string", "value": separator}, _any_of(tags)) if separator else _any_of(tags)
        return _format(_sequence(_any_of(tags), _repeat(0, limit - 1, more)))

    def _json_ebnf(self, schema) -> str:
        """The json_schema kind's grammar for `schema` (same whitespace), as EBNF text: a
        structural tag's JSON content has no separator options of its own."""
        return str(self.xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True))


def _format(fmt: dict) -> dict:
    return {"type": "structural_tag", "format": fmt}


def _sequence(*elements: dict) -> dict:
    return {"type": "sequence", "elements": list(elements)}


def _any_of(tags: list[dict]) -> dict:
    return tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}


def _repeat(lo: int, hi: int, content: dict) -> dict:
    return {"type": "repeat", "min": lo, "max": hi, "content": content}


def _message(error: Exception) -> str:
    """xgrammar's message without the C++ log prefix (`[12:00:00] /project/cpp/x.cc:42: `)."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(error).strip()).strip()


class XGrammar:
    """A compiled grammar; `matcher()` for each request (cheap: the masks are shared)."""

    def __init__(self, compiled, backend: XGrammarBackend):
        self.compiled = compiled
        self.backend = backend
        self.vocab = backend.vocab

    def matcher(self) -> "XGrammarMatcher":
        return XGrammarMatcher(self, self.backend.xgr.GrammarMatcher(self.compiled))


class XGrammarMatcher:
    """One request's place in an xgrammar grammar (see base.GrammarMatcherLike)."""

    def __init__(self, grammar: XGrammar, matcher):
        self.grammar = grammar
        self._matcher = matcher
        # The current state's mask, when is_terminated had to look at it (reused by the next
        # fill_bitmask); None after every accepted token.
        self._mask: torch.Tensor | None = None

    def copy(self) -> "XGrammarMatcher":
        return XGrammarMatcher(self.grammar, self._matcher.fork())

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        mask = self._mask
        if mask is None and bitmask.shape[1] == self.grammar.vocab.num_words:
            self._matcher.fill_next_token_bitmask(bitmask, row)
            return
        mask = self._own_mask() if mask is None else mask
        bitmask[row, : mask.numel()].copy_(mask)
        bitmask[row, mask.numel() :] = 0

    def accept_token(self, token: int) -> bool:
        if self._matcher.is_terminated() or not self._matcher.accept_token(token):
            return False
        self._mask = None
        return True

    accept_sampled = accept_token  # nothing to learn: no drafts

    def is_terminated(self) -> bool:
        """EOS was accepted, or the grammar is complete and allows nothing but EOS (xgrammar's
        own is_terminated waits for the EOS token: one more pass)."""
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        return not bool((self._own_mask() & ~self.grammar.backend.stop_words).any())

    def _own_mask(self) -> torch.Tensor:
        if self._mask is None:
            scratch = torch.zeros((1, self.grammar.vocab.num_words), dtype=torch.int32)
            self._matcher.fill_next_token_bitmask(scratch, 0)
            self._mask = scratch[0]
        return self._mask

    def certain_tail(self, max_tokens: int) -> list[int]:
        return []

    def propose_drafts(self, max_tokens: int, encode) -> list[int]:
        return []

    def allowed_ids_along(self, drafts: list[int], n_rows: int) -> list[None]:
        return [None] * n_rows
