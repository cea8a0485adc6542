"""How an OpenAI-compatible server is asked to constrain output: one `Constraints` per kind of
server, each giving the request fields for a regex, a JSON schema, a grammar or a choice.

| name | servers | regex, dtype, select | json_schema (chat / completion) | ebnf |
|---|---|---|---|---|
| `regex` | langrt, SGLang | `regex` field | `response_format` json_schema / `json_schema` field | `ebnf` field |
| `gbnf` | llama.cpp (llama-server, llama-cpp-python) | `grammar` field: the regex as GBNF | `response_format` json_object + `schema` / refused | `grammar` field |
| `none` | hosted APIs (OpenAI, ...) | refused | `response_format` json_schema / refused | refused |

A refusal is an `UnsupportedPrimitive` naming the primitive and the server. `prefix` is text the
output must start with (an assistant message already begun: the chat API cannot continue one,
so the constraint writes it again and the backend cuts it off).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

from langrt_frontend.backends.gbnf import UnsupportedRegex, choices_to_gbnf, regex_to_gbnf


class UnsupportedPrimitive(NotImplementedError):
    """A primitive (or one of its settings) that this backend and server cannot run."""


# Sampling fields beyond OpenAI's that a kind of server takes (docs/serving.md, OpenAI API for langrt).
_LANGRT_EXTENSIONS = frozenset({"top_k", "min_p", "min_tokens", "ignore_eos", "stop_token_ids"})
_LLAMA_CPP_EXTENSIONS = frozenset({"top_k", "min_p", "min_tokens"})


@dataclass(frozen=True)
class Constraints:
    """The `none` kind: a plain OpenAI API. The others override what their servers add."""

    server: str  # names the server in errors: "http://host:port/v1 (llama.cpp)"
    name = "none"
    extensions = frozenset()
    scores_choices = False  # /v1/completions echo + logprobs give usable prompt logprobs

    def refuse(self, primitive: str, why: str = "") -> UnsupportedPrimitive:
        reason = why or f"the server ({self.name} constraints) has no way to constrain output like that"
        return UnsupportedPrimitive(f"{primitive}: not supported by the OpenAI backend on {self.server}: {reason}")

    def regex(self, pattern: str, prefix: str, primitive: str) -> dict:
        raise self.refuse(
            primitive, "an OpenAI API takes no regex constraint (use a langrt, SGLang or llama.cpp server)"
        )

    def choice(self, choices: Sequence[str], prefix: str) -> dict:
        return self.regex(choices_regex(choices), prefix, "select")

    def json_schema(self, schema: str, chat: bool, prefix: str) -> dict:
        if prefix:
            raise self.refuse(
                "gen(json_schema)", f"it must begin the assistant message, which already holds {prefix!r}"
            )
        if not chat:
            raise self.refuse(
                "gen(json_schema)", "a JSON schema goes in response_format, which only chat completions take"
            )
        return {
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": json.loads(schema)}}
        }

    def ebnf(self, grammar: str, prefix: str) -> dict:
        raise self.refuse("gen(ebnf)", "an OpenAI API takes no grammar")


@dataclass(frozen=True)
class RegexConstraints(Constraints):
    """langrt and SGLang: their extension fields `regex`, `json_schema`, `ebnf`."""

    name = "regex"
    extensions = _LANGRT_EXTENSIONS
    scores_choices = True

    def regex(self, pattern: str, prefix: str, primitive: str) -> dict:
        return {"regex": re.escape(prefix) + f"(?:{pattern})" if prefix else pattern}

    def json_schema(self, schema: str, chat: bool, prefix: str) -> dict:
        if chat:
            return super().json_schema(schema, chat, prefix)
        if prefix:
            raise self.refuse("gen(json_schema)", f"the output must begin with {prefix!r}")
        return {"json_schema": schema}

    def ebnf(self, grammar: str, prefix: str) -> dict:
        if prefix:
            raise self.refuse("gen(ebnf)", f"the output must begin with {prefix!r}")
        return {"ebnf": grammar}


@dataclass(frozen=True)
class GbnfConstraints(Constraints):
    """llama.cpp's servers: `grammar` (GBNF); a JSON schema only in chat's response_format.
    Their echoed prompt logprobs are not usable for scoring (llama-cpp-python 0.3 pairs each
    token with the next position's distribution), so select is a constrained choice."""

    name = "gbnf"
    extensions = _LLAMA_CPP_EXTENSIONS

    def regex(self, pattern: str, prefix: str, primitive: str) -> dict:
        try:
            return {"grammar": regex_to_gbnf(pattern, prefix)}
        except UnsupportedRegex as e:
            raise self.refuse(primitive, f"the regex cannot be written as the GBNF grammar llama.cpp takes: {e}") from e

    def choice(self, choices: Sequence[str], prefix: str) -> dict:
        return {"grammar": choices_to_gbnf(choices, prefix)}

    def json_schema(self, schema: str, chat: bool, prefix: str) -> dict:
        if prefix or not chat:
            return super().json_schema(schema, chat, prefix)  # refused, with the reason
        return {"response_format": {"type": "json_object", "schema": json.loads(schema)}}

    def ebnf(self, grammar: str, prefix: str) -> dict:
        if prefix:
            raise self.refuse("gen(ebnf)", f"the output must begin with {prefix!r}")
        return {"grammar": grammar}


KINDS = {"none": Constraints, "regex": RegexConstraints, "gbnf": GbnfConstraints}


def make_constraints(name: str, server: str) -> Constraints:
    if name not in KINDS:
        raise ValueError(f"unknown constraints {name!r}; use 'auto' or one of {', '.join(KINDS)}")
    return KINDS[name](server)


def choices_regex(choices: Sequence[str]) -> str:
    return "(?:" + "|".join(re.escape(c) for c in choices) + ")"
