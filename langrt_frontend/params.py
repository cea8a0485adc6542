"""`GenParams`: the sampling settings of one `gen`, and of a `run` (its defaults).

Every field is optional: `None` means "inherit" (from `run`/`run_batch`, then the built-in
default). The object is built once where the user gives it and passed unchanged to the request
builder; only `regex` syntax and `dtype` are checked here, the server validates the rest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace
from typing import Any

# What `dtype` turns into (docs/programs.md, gen): a regex, plus stop strings for the numeric ones. A number
# may be followed by a space or newline, which the stop strings then cut off: without a way to
# end it, a model that does not want EOS right after a number keeps appending digits.
INT_REGEX = r"[-+]?[0-9]+"
FLOAT_REGEX = r"[-+]?[0-9]*\.?[0-9]+"
BOOL_REGEX = r"(True|False)"
STR_REGEX = r'"[\w\d\s]*"'
_NUMBER_END = r"[ \n]?"
_NUMBER_STOPS = (" ", "\n")
_DTYPES = {
    int: (INT_REGEX + _NUMBER_END, _NUMBER_STOPS),
    "int": (INT_REGEX + _NUMBER_END, _NUMBER_STOPS),
    float: (FLOAT_REGEX + _NUMBER_END, _NUMBER_STOPS),
    "float": (FLOAT_REGEX + _NUMBER_END, _NUMBER_STOPS),
    bool: (BOOL_REGEX, ()),
    "bool": (BOOL_REGEX, ()),
    str: (STR_REGEX, ()),
    "str": (STR_REGEX, ()),
}

# Fields sent inside `sampling_params`; the logprob fields travel at the top of the request.
_SAMPLING_FIELDS = (
    "max_new_tokens",
    "min_new_tokens",
    "n",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "regex",
    "json_schema",
    "ebnf",
    "reasoning",
    "max_reasoning_tokens",
)
LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
# Fields at the top of the request besides the logprob ones: the LoRA adapter (docs/lora.md)
_REQUEST_FIELDS = (*LOGPROB_FIELDS, "lora_path")

# `run`/`run_batch` keyword arguments that are sampling settings (docs/programs.md, run and forks), and their defaults.
RUN_DEFAULTS: dict[str, Any] = dict(
    max_new_tokens=128,
    stop=(),
    stop_token_ids=(),
    temperature=1.0,
    top_p=1.0,
    top_k=-1,
    min_p=0.0,
    frequency_penalty=0.0,
    presence_penalty=0.0,
    ignore_eos=False,
    return_logprob=None,
    logprob_start_len=None,
    top_logprobs_num=None,
    return_text_in_logprobs=None,
    lora_path=None,
)


@dataclass(frozen=True)
class GenParams:
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    n: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    stop_regex: tuple[str, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    dtype: Any = None
    reasoning: bool | None = None  # the model thinks first; the constraint holds its answer (reasoning.py)
    max_reasoning_tokens: int | None = None
    lora_path: str | None = None  # the runtime's LoRA adapter to generate with (None: the base model)

    def __post_init__(self):
        for name in ("stop", "stop_regex"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            elif value is not None:
                object.__setattr__(self, name, tuple(value))
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.json_schema, (dict, bool)):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise ValueError(f"gen: unsupported dtype {self.dtype!r}; use int, float, bool or str (or their names)")
        if self.regex is not None:
            re.compile(self.regex)  # a bad pattern raises re.error here, where gen was called

    @classmethod
    def run_defaults(cls, **overrides) -> "GenParams":
        """The settings of a `run`: API defaults, with the caller's values over them."""
        return cls(**{**RUN_DEFAULTS, **overrides})

    def over(self, base: "GenParams") -> "GenParams":
        """These settings, with `base`'s filling every field left as None."""
        given = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return replace(base, **given)

    def with_extra_stops(self, stops) -> "GenParams":
        if not stops:
            return self
        return replace(self, stop=(*(self.stop or ()), *(s for s in stops if s not in (self.stop or ()))))

    def sampling_params(self) -> dict[str, Any]:
        """The `sampling_params` of a /generate request: set fields only; dtype becomes a regex."""
        out = {name: getattr(self, name) for name in _SAMPLING_FIELDS if getattr(self, name) is not None}
        for name in ("stop", "stop_token_ids", "stop_regex"):
            if name in out:
                out[name] = list(out[name])
        if self.dtype is not None:
            regex, stops = _DTYPES[self.dtype]
            out["regex"] = regex  # dtype wins over regex (docs/programs.md, gen)
            out.pop("json_schema", None)
            out.pop("ebnf", None)
            out["stop"] = out.get("stop", []) + [s for s in stops if s not in out.get("stop", [])]
        return out

    def logprob_options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LOGPROB_FIELDS if getattr(self, name) is not None}

    def adapter_fields(self) -> dict[str, Any]:
        """A run's LoRA adapter for the requests no gen configures (a select's rows, the prefix
        they share): they must see the adapter's K/V too."""
        return {"lora_path": self.lora_path} if self.lora_path else {}

    def request_options(self) -> dict[str, Any]:
        """The fields a /generate request carries beside text and sampling_params."""
        return {name: getattr(self, name) for name in _REQUEST_FIELDS if getattr(self, name) is not None}
