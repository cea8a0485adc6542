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

    kind: str  # "regex" | "json_schema" | "choices"
    text: str  # the regex, the schema's JSON, or the choices as a JSON list

    @classmethod
    def from_params(cls, params) -> GrammarSpec | None:
        if params.regex is not None:
            return cls("regex", params.regex)
        if params.json_schema is not None:
            return cls("json_schema", params.json_schema)
        if params.choices is not None:
            return cls("choices", json.dumps(list(params.choices)))
        return None

    def to_regex(self) -> str:
        """The regex this spec stands for (raises InvalidRequest / UnsupportedSchema).
        Remembered per spec: the scheduler checks every request's grammar as it arrives, and
        an extraction pipeline sends the same schema over and over (translating one takes a
        few ms, which would stall the batch each time). Refusals are not remembered."""
        with _REGEX_LOCK:
            regex = _REGEXES.get(self)
            if regex is not None:
                _REGEXES.move_to_end(self)
                return regex
        regex = _translate(self)
        if len(self.text) + len(regex) <= _REMEMBER_MAX_CHARS:
            with _REGEX_LOCK:
                _REGEXES[self] = regex
                while len(_REGEXES) > _REMEMBER_SPECS:
                    _REGEXES.popitem(last=False)
        return regex


# Why these: pipelines reuse a handful of schemas, and 256 specs of at most 256k characters
# (spec and regex together) keep the memory under ~130 MB even when full of the largest.
_REMEMBER_SPECS = 256
_REMEMBER_MAX_CHARS = 256_000
_REGEXES: OrderedDict[GrammarSpec, str] = OrderedDict()
_REGEX_LOCK = threading.Lock()  # the grammar service's thread translates too


def _translate(spec: GrammarSpec) -> str:
    if spec.kind == "regex":
        check_regex(spec.text)
        return spec.text
    if spec.kind == "json_schema":
        from langrt.constrained.json_schema import schema_to_regex

        return schema_to_regex(json.loads(spec.text))
    return choices_regex(json.loads(spec.text))
