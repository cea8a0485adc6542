"""`SamplingParams`: the one object that carries a request's sampling settings.

It is built once at the API boundary (`from_dict` for HTTP/engine input), validated once in
`__post_init__`, and then passed unchanged to the scheduler, the sampler and the detokenizer.
Every rejection is an `InvalidRequest` whose `param` names the offending field.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from langrt.errors import InvalidRequest

_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "n", "top_k")
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_BOOL_FIELDS = (
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "reasoning",
)
_GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")
_STR_TUPLE_FIELDS = ("stop", "stop_regex")
# How a JSON schema may be read beyond its default (listed properties only, in the schema's
# order): json_schema/compiler.py's schema_to_grammar options.
JSON_SCHEMA_OPTIONS = ("any_order", "open_objects")
_SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds below 2**64
# Why: temperatures divide logits in float32, where values below ~1e-45 round to 0 (0/0 = NaN
# probabilities); this close to 0 sampling is greedy anyway (SGLang's threshold).
GREEDY_BELOW_TEMPERATURE = 1e-6
_INT64_LIMIT = 2**63  # other integers become int64 tensors in the sampler; past this they overflow
# Why: stops are checked after every token in the scheduler's loop, where a request's cost is
# every request's latency (600k stop strings added 70 ms a token; 20k stop regexes, 0.8 s).
_MAX_STOPS = 1024
_MAX_STOP_REGEXES = 16


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stop_regex: tuple[str, ...] = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    regex: str | None = None
    json_schema: str | None = None
    json_schema_options: tuple[str, ...] | None = None  # some of JSON_SCHEMA_OPTIONS, sorted
    ebnf: str | None = None
    structural_tag: str | None = None  # SGLang's structural tag, canonical JSON (constrained/structural_tag.py)
    choices: tuple[str, ...] | None = None  # output is exactly one of these strings
    seed: int | None = None
    # The output opens with a reasoning model's thinking, ended by the server's end-of-thinking
    # token (--reasoning-parser); a grammar constrains only what follows that token.
    reasoning: bool = False
    max_reasoning_tokens: int | None = None  # thinking tokens before the end token is forced

    def __post_init__(self) -> None:
        self._normalize_containers()
        self._check_types()
        self._check_ranges()
        self._check_stops()
        self._check_grammar()
        self._check_reasoning()

    # ---- construction from untyped input -------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SamplingParams:
        """Build from a JSON-like mapping. `None` (the mapping or a value) means the default."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise InvalidRequest(
                f"sampling_params must be an object, got {type(d).__name__}",
                param="sampling_params",
            )
        for key in d:
            if key not in _FIELD_NAMES:
                raise InvalidRequest(_unknown_key_message(key), param=str(key))
        return cls(**{k: v for k, v in d.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples as lists); `from_dict(p.to_dict()) == p`."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @property
    def is_constrained(self) -> bool:
        """The output must follow a grammar (regex, JSON schema, choices, EBNF, structural tag)."""
        return any(getattr(self, name) is not None for name in (*_GRAMMAR_FIELDS, "choices"))

    # ---- derived values ---------------------------------------------------------------------

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1

    @property
    def needs_penalties(self) -> bool:
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    # ---- validation -------------------------------------------------------------------------

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # normalization inside a frozen dataclass

    def _normalize_containers(self) -> None:
        for name in _STR_TUPLE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                self._set(name, (value,))
            elif isinstance(value, list):
                self._set(name, tuple(value))
        if isinstance(self.stop_token_ids, list):
            self._set("stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.json_schema, (dict, bool)):
            self._set("json_schema", json.dumps(self.json_schema))
        if self.structural_tag is not None:
            from langrt.constrained.structural_tag import canonical

            self._set("structural_tag", canonical(self.structural_tag))
        if self.json_schema_options is not None:
            self._set("json_schema_options", _schema_options(self.json_schema_options))
        if isinstance(self.choices, list):
            self._set("choices", tuple(self.choices))

    def _check_types(self) -> None:
        for name in _INT_FIELDS:
            _require_int(name, getattr(self, name))
            _require_int64(name, getattr(self, name))
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _type_error(name, "a number", value)
            try:
                self._set(name, float(value))
            except OverflowError:  # an integer past the float range (JSON allows 10**400)
                raise InvalidRequest(
                    f"{name} must be a number within the float range, got a {value.bit_length()}-bit integer",
                    param=name,
                ) from None
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise _type_error(name, "a boolean", getattr(self, name))
        for name in _STR_TUPLE_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(s, str) for s in value):
                raise _type_error(name, "a string or a list of strings", value)
        if not isinstance(self.stop_token_ids, tuple):
            raise _type_error("stop_token_ids", "a list of integers", self.stop_token_ids)
        for token_id in self.stop_token_ids:
            _require_int("stop_token_ids", token_id)
            _require_int64("stop_token_ids", token_id)
        for name in _GRAMMAR_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise _type_error(name, "a string", value)
        if self.seed is not None:
            _require_int("seed", self.seed)
        if self.choices is not None and (
            not isinstance(self.choices, tuple)
            or not self.choices
            or not all(isinstance(c, str) and c for c in self.choices)
        ):
            raise _type_error("choices", "a non-empty list of non-empty strings", self.choices)

    def _check_ranges(self) -> None:
        t, p, k = self.temperature, self.top_p, self.top_k
        _require(0.0 <= t < math.inf, "temperature", "a finite number >= 0", t)
        _require(0.0 < p <= 1.0, "top_p", "in (0, 1]", p)
        _require(k == -1 or k >= 1, "top_k", "-1 (disabled) or >= 1", k)
        _require(0.0 <= self.min_p <= 1.0, "min_p", "in [0, 1]", self.min_p)
        for name in ("frequency_penalty", "presence_penalty"):
            _require(-2.0 <= getattr(self, name) <= 2.0, name, "in [-2, 2]", getattr(self, name))
        rep = self.repetition_penalty
        _require(0.0 < rep <= 2.0, "repetition_penalty", "in (0, 2]", rep)
        _require(self.max_new_tokens >= 0, "max_new_tokens", ">= 0", self.max_new_tokens)
        _require(
            0 <= self.min_new_tokens <= self.max_new_tokens,
            "min_new_tokens",
            f"in [0, max_new_tokens={self.max_new_tokens}]",
            self.min_new_tokens,
        )
        _require(self.n >= 1, "n", ">= 1", self.n)
        if self.seed is not None:
            _require(0 <= self.seed < _SEED_LIMIT, "seed", "in [0, 2**64)", self.seed)

    def _check_stops(self) -> None:
        for name, limit in (("stop", _MAX_STOPS), ("stop_token_ids", _MAX_STOPS), ("stop_regex", _MAX_STOP_REGEXES)):
            if len(getattr(self, name)) > limit:
                raise InvalidRequest(
                    f"{name} holds {len(getattr(self, name))} entries, over the limit of {limit}", param=name
                )
        if "" in self.stop:
            raise InvalidRequest("stop strings must be non-empty, got ''", param="stop")
        for token_id in self.stop_token_ids:
            _require(token_id >= 0, "stop_token_ids", "non-negative token ids", token_id)
        for pattern in self.stop_regex:
            _require_compiles("stop_regex", pattern)

    def _check_grammar(self) -> None:
        given = [name for name in (*_GRAMMAR_FIELDS, "choices") if getattr(self, name) is not None]
        if len(given) > 1:
            raise InvalidRequest(
                f"at most one of regex, json_schema, ebnf, structural_tag, choices may be set, got {', '.join(given)}",
                param=given[1],
            )
        if self.regex is not None:
            _require_compiles("regex", self.regex)
        if self.json_schema is not None:
            _require_json_schema(self.json_schema)
        elif self.json_schema_options:
            raise InvalidRequest("json_schema_options needs a json_schema", param="json_schema_options")

    def _check_reasoning(self) -> None:
        budget = self.max_reasoning_tokens
        if budget is None:
            return
        _require_int("max_reasoning_tokens", budget)
        _require(0 <= budget < _INT64_LIMIT, "max_reasoning_tokens", ">= 0", budget)
        if not self.reasoning:
            raise InvalidRequest(
                "max_reasoning_tokens needs reasoning: true (an output that opens with its thinking)",
                param="max_reasoning_tokens",
            )


_FIELD_NAMES = frozenset(f.name for f in fields(SamplingParams))


def _schema_options(value: Any) -> tuple[str, ...]:
    """{"any_order": true, ...} or ["any_order", ...] as the sorted names of the options on."""
    if isinstance(value, Mapping):
        bad = [v for v in value.values() if not isinstance(v, bool)]
        if bad:
            raise _type_error("json_schema_options", "an object of booleans", value)
        names = [k for k, on in value.items() if on]
        known = list(value)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        names = known = list(value)
    else:
        raise _type_error("json_schema_options", "an object of booleans or a list of option names", value)
    unknown = [k for k in known if k not in JSON_SCHEMA_OPTIONS]
    if unknown:
        raise InvalidRequest(
            f"json_schema_options: unknown option {unknown[0]!r}; options are {', '.join(JSON_SCHEMA_OPTIONS)}",
            param="json_schema_options",
        )
    return tuple(sorted(set(names)))


def _require(ok: bool, name: str, rule: str, value: Any) -> None:
    if not ok:  # NaN fails every comparison, so it lands here too
        raise InvalidRequest(f"{name} must be {rule}, got {value!r}", param=name)


def _type_error(name: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"{name} must be {expected}, got {type(value).__name__} {value!r}", param=name)


def _require_int(name: str, value: Any) -> None:
    # bool is an int subclass; `max_new_tokens: true` is a client bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "an integer", value)


def _require_int64(name: str, value: int) -> None:
    if not -_INT64_LIMIT <= value < _INT64_LIMIT:
        raise InvalidRequest(
            f"{name} must be within the 64-bit integer range, got a {value.bit_length()}-bit integer", param=name
        )


def _require_compiles(name: str, pattern: str) -> None:
    from langrt.constrained.spec import MAX_REGEX_CHARS  # torch-free

    if len(pattern) > MAX_REGEX_CHARS:  # before compiling: re.compile takes ~1 s per MB
        raise InvalidRequest(f"{name} is {len(pattern)} characters, over the limit of {MAX_REGEX_CHARS}", param=name)
    try:
        re.compile(pattern)
    except re.error as e:
        raise InvalidRequest(f"{name} {pattern!r} is not a valid regex: {e}", param=name) from e


def _require_json_schema(text: str) -> None:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"json_schema is not valid JSON: {e}", param="json_schema") from e
    except RecursionError:
        raise InvalidRequest("json_schema nests too deeply to parse", param="json_schema") from None
    except ValueError as e:  # e.g. an integer past Python's 4300-digit limit
        raise InvalidRequest(f"json_schema holds a value JSON parsing refuses: {e}", param="json_schema") from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest(
            f"json_schema must be a JSON object (or boolean), got {type(schema).__name__}",
            param="json_schema",
        )


def _unknown_key_message(key: Any) -> str:
    message = f"unknown sampling parameter {key!r}"
    close = difflib.get_close_matches(str(key), sorted(_FIELD_NAMES), n=1)
    return f"{message} (did you mean {close[0]!r}?)" if close else message
