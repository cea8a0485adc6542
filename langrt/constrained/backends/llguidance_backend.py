"""`--grammar-backend llguidance`: grammars compiled and matched by llguidance, behind the matcher
interface the scheduler uses (base.GrammarMatcherLike).

The vocabulary is langrt's (TokenVocabulary), handed to llguidance as each token's bytes (special
tokens as `\\xff`-prefixed names, llguidance's convention, never inside a grammar) with the
tokenizer's encode for the text llguidance tokenizes itself. What each kind becomes:

- regex: llguidance's regex (Rust `regex` syntax: no lookaround, no backreferences);
- json_schema: llguidance's JSON schema compiler with langrt's whitespace exactly (separators
  `, ?` and `: ?`, nothing else between tokens). llguidance follows JSON Schema, where an object
  takes properties its schema does not list; langrt's default keeps them out (small models go on
  writing keys otherwise), so plain object schemas get `additionalProperties: false` written in
  (`close_objects`) unless `open_objects` is asked for. `any_order` is refused;
- ebnf and choices: langrt's EBNF parsed by langrt, written as Lark (dialects.py);
- structural_tag: Lark with a lexeme for free text containing no trigger, lazy lexemes ending at
  each trigger, and `%json` for each tag's schema.

A grammar is compiled once into a matcher at its initial state; each request's matcher is a deep
copy of it. Matchers have no jump-forward (no drafts, no certain tail).
"""

from __future__ import annotations

import json
import logging

import torch

from langrt.constrained.backends import dialects
from langrt.constrained.spec import GrammarSpec
from langrt.constrained.vocab import TokenVocabulary, eos_words
from langrt.errors import InvalidRequest

logger = logging.getLogger(__name__)

# langrt's JSON whitespace (docs/serving.md, native API): at most one space after ',' and ':', none elsewhere. The
# separators are read as regexes by llguidance's JSON compiler.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ?", "key_separator": ": ?"}
_ANY_TEXT = "(?s:.*)"


class _TokenizerView:
    """What llguidance.TokenizerWrapper reads from a tokenizer."""

    def __init__(self, vocab: TokenVocabulary, encode):
        self.eos_token_id = min(vocab.eos_token_ids, default=None)
        self.bos_token_id = None
        self.tokens = [b if b is not None else b"\xff<special_%d>" % i for i, b in enumerate(vocab.token_bytes)]
        self.special_token_ids = [i for i, b in enumerate(vocab.token_bytes) if b is None]
        self._encode = encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("encodes text (str)")  # tells TokenizerWrapper to pass str, not bytes
        return self._encode(text)


class LLGuidanceBackend:
    # llguidance's compile is native code, which cannot be stopped: the service runs each compile in a
    # thread of its own and abandons it at the time limit (base.GrammarBackend)
    stops_itself = False

    def __init__(self, vocab: TokenVocabulary, encode):
        """encode: the tokenizer's text -> ids, without special tokens."""
        import llguidance

        self.llg = llguidance
        self.vocab = vocab
        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_TokenizerView(vocab, encode)),
            n_vocab=vocab.vocab_size,
            eos_token=sorted(vocab.eos_token_ids),
        )
        self.eos_only = eos_words(vocab)

    def close(self) -> None:
        """Nothing to release: the compiler is freed with the object."""

    def compile(self, spec: GrammarSpec) -> "LLGuidanceGrammar":
        """The grammar of `spec`; InvalidRequest naming what llguidance refused."""
        try:
            text = self.grammar_text(spec)
        except InvalidRequest:
            raise
        except ValueError as e:  # a schema llguidance cannot read as JSON
            raise InvalidRequest(f"llguidance refused the {spec.kind}: {e}", param=spec.kind) from None
        matcher = self.llg.LLMatcher(self.tokenizer, text, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"llguidance refused the {spec.kind}: {matcher.get_error()}", param=spec.kind)
        words = min((self.tokenizer.vocab_size + 31) // 32, self.vocab.num_words)
        return LLGuidanceGrammar(matcher, self.vocab, self.eos_only, words)

    def grammar_text(self, spec: GrammarSpec) -> str:
        """llguidance's grammar (its JSON form) for `spec`."""
        LLMatcher = self.llg.LLMatcher
        if spec.kind == "regex":
            return LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "json_schema":
            if "any_order" in spec.options:
                raise InvalidRequest(
                    "llguidance cannot serve json_schema_options any_order", param="json_schema_options"
                )
            schema = json.loads(spec.text)
            if "open_objects" not in spec.options:
                schema = close_objects(schema)
            return LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        if spec.kind == "ebnf":
            return LLMatcher.grammar_from_lark(dialects.lark(dialects.parse_rules(spec.text)))
        if spec.kind == "choices":
            return LLMatcher.grammar_from_lark(dialects.choices_lark(json.loads(spec.text)))
        if spec.kind == "structural_tag":
            return LLMatcher.grammar_from_lark(structural_tag_lark(spec.text))
        raise InvalidRequest(f"llguidance cannot serve a {spec.kind} constraint", param=spec.kind)


def structural_tag_lark(text: str) -> str:
    """Lark for langrt's canonical structural tag (structural_tag.py's form).

    With free text, `FREE` is any text holding no trigger, and the lexeme `trig_i` is free text
    ending with trigger i (lazy: it ends at the trigger's first occurrence); a tag is a trigger
    lexeme, the rest of its begin, its JSON, its end. The output is tags each after free text,
    then free text (a greedy lexeme: no trigger in it, so none goes untagged at the end). Without
    free text: tags joined by the separator."""
    spec = json.loads(text)
    limit, free_text = spec.get("max_tags"), spec.get("free_text", True)
    triggers = dialects.minimal_triggers(spec["triggers"]) if free_text else []
    lines = ["%llguidance {}", "tag: " + " | ".join(_tag(s, triggers) for s in spec["structures"])]
    if free_text:
        lines.append(f"start: tag{_count(0, limit)} FREE")
        lines += [f"trig_{i}[lazy]: FREE {_literal(t)}" for i, t in enumerate(triggers)]
        avoided = "|".join(_regex_escape(t) for t in triggers)
        lines.append(f"FREE: /{_ANY_TEXT}/ & ~/{_ANY_TEXT}(?:{avoided}){_ANY_TEXT}/")
    elif limit == 1:
        lines.append("start: tag")
    elif spec.get("separator"):
        more = _count(0, None if limit is None else limit - 1)
        lines.append(f"start: tag ({_literal(spec['separator'])} tag){more}")
    else:
        lines.append(f"start: tag{_count(1, limit)}")
    return "\n".join(lines) + "\n"


def _tag(structure: dict, triggers: list[str]) -> str:
    """One structure: its begin (through the lexeme of the trigger it starts with, if any), its
    JSON with the json_schema kind's whitespace and closed objects, its end."""
    begin = structure["begin"]
    head = [_literal(begin)]
    for i, trigger in enumerate(triggers):
        if begin.startswith(trigger):
            head = [f"trig_{i}", _literal(begin[len(trigger) :])]
    schema = structure["schema"]
    if schema is False:
        body = "%json false"  # llguidance refuses it (unsatisfiable), naming it
    else:
        body = "%json " + json.dumps(
            {**(close_objects(schema) if isinstance(schema, dict) else {}), "x-guidance": JSON_OPTIONS}
        )
    return " ".join(filter(None, [*head, body, _literal(structure["end"])]))


# Keys after which a schema is not closed: it says how unlisted properties go, or its properties
# are merged with or chosen among others' (closing one part would refuse another's properties).
_LEAVE_OPEN = (
    "additionalProperties",
    "unevaluatedProperties",
    "patternProperties",
    "allOf",
    "$ref",
    "anyOf",
    "oneOf",
    "if",
    "not",
    "dependentSchemas",
)


def close_objects(schema):
    """`schema` with `additionalProperties: false` in every plain object schema (one that says
    nothing of unlisted properties and is not combined with others: not an allOf branch, nor a
    definition an allOf refers to), as langrt reads objects by default."""
    return _close(schema, _merged_definitions(schema), True) if isinstance(schema, dict) else schema


def _close(schema, merged: set[str], closable: bool):
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _close(v, merged, True) for k, v in out["properties"].items()}
    for key in ("$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: _close(v, merged, k not in merged) for k, v in out[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _close(out[key], merged, True)
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [_close(s, merged, key != "allOf") for s in out[key]]
    kind = out.get("type")
    is_object = "properties" in out or kind == "object" or (isinstance(kind, list) and "object" in kind)
    if closable and is_object and not any(k in out for k in _LEAVE_OPEN):
        out["additionalProperties"] = False
    return out


def _merged_definitions(node) -> set[str]:
    """The names of the definitions ($defs / definitions) that allOf branches refer to."""
    found = set()
    if isinstance(node, dict):
        for branch in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
            ref = branch.get("$ref") if isinstance(branch, dict) else None
            if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
                found.add(ref.rsplit("/", 1)[1])
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            found |= _merged_definitions(child)
    return found


def _literal(text: str) -> str:
    return dialects.lark_literal(text) if text else ""


def _count(lo: int, hi: int | None) -> str:
    if hi is None:
        return "*" if lo == 0 else "+"
    return "{%d,%d}" % (lo, hi)


def _regex_escape(text: str) -> str:
    """`text` as a Rust regex inside Lark's /.../ (every character by code point: no `/`)."""
    return "".join("\\x{%X}" % ord(c) for c in text)


class LLGuidanceGrammar:
    """A compiled grammar: its matcher at the initial state, copied for each request."""

    def __init__(self, initial, vocab: TokenVocabulary, eos_only: torch.Tensor, mask_words: int):
        self.initial = initial
        self.vocab = vocab
        self.eos_only = eos_only  # the bitmask row of a failed matcher
        # llguidance's masks cover the tokenizer's tokens only (its buffer must be exactly this
        # long), fewer words than the model's logits where the model pads its vocabulary (Qwen3:
        # 151,669 tokens, 151,936 logits); the padding's bits stay clear
        self.mask_words = mask_words

    def matcher(self) -> "LLGuidanceMatcher":
        return LLGuidanceMatcher(self, self.initial.deep_copy())


class LLGuidanceMatcher:
    """One request's place in an llguidance grammar (see base.GrammarMatcherLike)."""

    def __init__(self, grammar: LLGuidanceGrammar, matcher):
        self.grammar = grammar
        self._matcher = matcher

    def copy(self) -> "LLGuidanceMatcher":
        return LLGuidanceMatcher(self.grammar, self._matcher.deep_copy())

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        words = self.grammar.vocab.num_words
        if self._matcher.is_error():  # a limit hit mid-output: only EOS, so the request ends
            logger.warning("llguidance matcher failed: %s", self._matcher.get_error())
            bitmask[row, :words].copy_(self.grammar.eos_only)
        else:
            words = self.grammar.mask_words
            target = bitmask[row, :words]
            assert target.is_contiguous() and bitmask.dtype == torch.int32 and bitmask.device.type == "cpu"
            self._matcher.unsafe_compute_mask_ptr(target.data_ptr(), words * 4)
        bitmask[row, words:] = 0

    def accept_token(self, token: int) -> bool:
        if self._matcher.is_error():
            return token in self.grammar.vocab.eos_token_ids
        return self._matcher.try_consume_tokens([token]) == 1

    accept_sampled = accept_token  # nothing to learn: no drafts

    def is_terminated(self) -> bool:
        """EOS was accepted, or the grammar is complete and allows nothing more."""
        return self._matcher.is_stopped() or self._matcher.is_error()

    def certain_tail(self, max_tokens: int) -> list[int]:
        return []

    def propose_drafts(self, max_tokens: int, encode) -> list[int]:
        return []

    def allowed_ids_along(self, drafts: list[int], n_rows: int) -> list[None]:
        return [None] * n_rows
