"""What a request's output is constrained to, and the checks that need no model (torch-free:
the main process runs them to answer a bad grammar with a 400 at once)."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from langrt.errors import InvalidRequest

# Why: regexes past 200k characters come only from pathological schemas, and the automaton's
# size grows with the regex.
MAX_REGEX_CHARS = 200_000


def check_regex(regex: str, param: str = "regex") -> None:
    """Reject a regex Python cannot parse, naming the position (cheap; run before compiling)."""
    if not isinstance(regex, str) or not regex:
        raise InvalidRequest(f"{param} must be a non-empty string", param=param)
    if len(regex) > MAX_REGEX_CHARS:
        raise InvalidRequest(f"{param} is {len(regex)} characters, over the limit of {MAX_REGEX_CHARS}", param=param)
    try:
        re.compile(regex)
    except re.error as e:
        raise InvalidRequest(f"regex compile failed at position {e.pos}: {e.msg}", param=param) from None


def choices_regex(choices: list[str]) -> str:
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequest("choices must be a non-empty list of non-empty strings", param="choices")
    return "(?:" + "|".join(_escape(c) for c in choices) + ")"


def _escape(text: str) -> str:
    """Escape the metacharacters of Python's and Rust's regex syntax (both accept these
    escapes; other characters stay as they are)."""
    return "".join("\\" + c if c in _META else c for c in text)


_META = set(r"\.^$|?*+()[]{}-#&~")


@dataclass(frozen=True)
class GrammarSpec:
    """What a request constrains its output to, hashable (the grammar cache's key)."""

    kind: str  # "regex" | "json_schema" | "ebnf" | "structural_tag" | "choices"
    text: str  # the regex, the schema's JSON, the grammar, or the choices as a JSON list
    options: tuple[str, ...] = ()  # a json_schema's options on (sampling_params.JSON_SCHEMA_OPTIONS)

    @classmethod
    def from_params(cls, params) -> GrammarSpec | None:
        if params.json_schema is not None:
            return cls("json_schema", params.json_schema, params.json_schema_options or ())
        for kind in ("regex", "ebnf", "structural_tag"):
            if getattr(params, kind) is not None:
                return cls(kind, getattr(params, kind))
        if params.choices is not None:
            return cls("choices", json.dumps(list(params.choices)))
        return None

    def translate(self):
        """What this spec compiles from: a regex (str), or for a grammar its rules (cfg.rules.
        RuleSet). Raises InvalidRequest / UnsupportedSchema. Remembered per spec: the
        scheduler checks every request's grammar as it arrives, and an extraction pipeline
        sends the same schema over and over (translating one takes a few ms, which would stall
        the batch each time). Refusals are not remembered."""
        with _TRANSLATE_LOCK:
            found = _TRANSLATED.get(self)
            if found is not None:
                _TRANSLATED.move_to_end(self)
                return found
        found = _translate(self)
        size = len(found) if isinstance(found, str) else sum(map(len, found.bodies))
        if len(self.text) + size <= _REMEMBER_MAX_CHARS:
            with _TRANSLATE_LOCK:
                _TRANSLATED[self] = found
                while len(_TRANSLATED) > _REMEMBER_SPECS:
                    _TRANSLATED.popitem(last=False)
        return found


# Why these: pipelines reuse a handful of schemas, and 256 specs of at most 256k characters
# (spec and regex together) keep the memory under ~130 MB even when full of the largest.
_REMEMBER_SPECS = 256
_REMEMBER_MAX_CHARS = 256_000
_TRANSLATED: OrderedDict[GrammarSpec, object] = OrderedDict()
_TRANSLATE_LOCK = threading.Lock()  # the grammar service's thread translates too


def _translate(spec: GrammarSpec) -> str:
    if spec.kind == "regex":
        check_regex(spec.text)
        return spec.text
    if spec.kind == "json_schema":
        from langrt.constrained.json_schema import schema_to_grammar

        return schema_to_grammar(json.loads(spec.text), **dict.fromkeys(spec.options, True))
    if spec.kind == "structural_tag":
        from langrt.constrained.json_schema import schema_to_grammar
        from langrt.constrained.structural_tag import structural_tag_grammar

        return structural_tag_grammar(spec.text, schema_to_grammar)
    if spec.kind == "ebnf":
        from langrt.constrained.cfg.build import ebnf_rules

        return ebnf_rules(spec.text)
    return choices_regex(json.loads(spec.text))
