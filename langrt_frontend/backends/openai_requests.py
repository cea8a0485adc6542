"""OpenAI request bodies from a `gen`'s settings, and values and meta info from the responses.

A setting the OpenAI API has goes under its OpenAI name (max_new_tokens -> max_tokens); one it
lacks goes as the server's extension field where the server kind takes it (top_k, min_p,
min_tokens, ignore_eos, stop_token_ids on langrt; top_k, min_p, min_tokens on llama.cpp), and
is refused otherwise, naming it, unless it is at its default (then it changes nothing).
`stop_regex` and `logprob_start_len` have no OpenAI equivalent anywhere.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from langrt_frontend.backends.constraints import Constraints
from langrt_frontend.params import GenParams

_STANDARD = {
    "temperature": "temperature",
    "top_p": "top_p",
    "n": "n",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
}
# native name -> (extension field, the default at which it may be left out)
_EXTENSIONS = {
    "top_k": ("top_k", -1),
    "min_p": ("min_p", 0.0),
    "min_new_tokens": ("min_tokens", 0),
    "ignore_eos": ("ignore_eos", False),
    "stop_token_ids": ("stop_token_ids", []),
}


@dataclass(frozen=True)
class Check:
    """What a constrained output must be, checked after the server answers: a server that
    ignores an extension field it does not know (llama-cpp-python ignores `regex`) must not
    pass off unconstrained text as constrained."""

    primitive: str
    regex: str | None = None
    json: bool = False

    def __call__(self, text: str, finish_reason: str | None, server: str) -> None:
        if finish_reason == "length":
            return  # cut off by max_tokens: not a whole match, and not the server's fault
        if self.regex is not None and re.fullmatch(self.regex, text) is None:
            raise RuntimeError(
                f"{self.primitive}: the output of {server} does not match {self.regex!r}: {text!r} (did the server ignore the constraint?)"
            )
        if self.json:
            try:
                json.loads(text)
            except ValueError as e:
                raise RuntimeError(f"{self.primitive}: the output of {server} is not JSON ({e}): {text!r}") from e


def sampling_fields(params: GenParams, constraints: Constraints) -> dict:
    """The request's sampling fields (constraints aside)."""
    native = params.sampling_params()
    body = {"max_tokens": native.get("max_new_tokens")}
    body.update({field: native[name] for name, field in _STANDARD.items() if native.get(name) is not None})
    if native.get("stop"):
        body["stop"] = native["stop"]
    for name, (field, default) in _EXTENSIONS.items():
        value = native.get(name)
        if value is None or value == default:
            continue
        if field not in constraints.extensions:
            raise constraints.refuse(f"gen({name}={value!r})", "the server takes no such sampling parameter")
        body[field] = value
    if native.get("stop_regex"):
        raise constraints.refuse("gen(stop_regex)", "the OpenAI API has no stop_regex (use stop strings)")
    if params.lora_path:
        raise constraints.refuse(
            "gen(lora_path=...)", "an OpenAI server takes the adapter as its model: OpenAI(model='BASE:NAME')"
        )
    if native.get("reasoning"):
        raise constraints.refuse(
            "gen(reasoning=True)",
            "it keeps only message.content; run a reasoning model through RuntimeEndpoint or Engine",
        )
    return body


def logprob_fields(params: GenParams, chat: bool, constraints: Constraints) -> dict:
    if params.logprob_start_len is not None and params.logprob_start_len != -1:
        raise constraints.refuse("gen(logprob_start_len)", "the OpenAI API returns the output's logprobs only")
    if not params.return_logprob:
        return {}
    top = params.top_logprobs_num or 0
    return {"logprobs": True, "top_logprobs": top} if chat else {"logprobs": top}


def constraint_fields(params: GenParams, constraints: Constraints, chat: bool, prefix: str) -> tuple[dict, Check]:
    """The constraint's request fields, and the check of the output (prefix cut off)."""
    native = params.sampling_params()  # dtype already turned into its regex, winning over the rest
    if native.get("regex") is not None:
        primitive = f"gen(dtype={_dtype_name(params.dtype)})" if params.dtype is not None else "gen(regex)"
        return constraints.regex(native["regex"], prefix, primitive), Check(primitive, regex=native["regex"])
    if native.get("json_schema") is not None:
        return constraints.json_schema(native["json_schema"], chat, prefix), Check("gen(json_schema)", json=True)
    if native.get("ebnf") is not None:
        return constraints.ebnf(native["ebnf"], prefix), Check("gen(ebnf)")
    return {}, Check("gen")


def _dtype_name(dtype) -> str:
    return dtype if isinstance(dtype, str) else dtype.__name__


# ---- responses ---------------------------------------------------------------------------------


def choice_text(choice: dict, chat: bool) -> str:
    if chat:
        return (choice.get("message") or {}).get("content") or ""
    return choice.get("text") or ""


def meta_info(response: dict, choice: dict, chat: bool) -> dict:
    """Meta info in the native shape where the response has it (docs/serving.md, native API): id, token counts
    (summed over the n choices when n > 1), finish_reason, and output logprobs as
    [logprob, None, token text] (the OpenAI API gives no token ids)."""
    usage = response.get("usage") or {}
    meta = {
        "id": response.get("id"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": finish_reason(choice.get("finish_reason"), usage.get("completion_tokens")),
    }
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        meta["cached_tokens"] = cached
    logprobs = choice.get("logprobs")
    if logprobs:
        meta.update(_chat_logprobs(logprobs) if chat else _completion_logprobs(logprobs))
    return meta


def finish_reason(reason: str | None, completion_tokens: int | None) -> dict | None:
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": completion_tokens}
    return {"type": reason}


def _chat_logprobs(logprobs: dict) -> dict:
    content = logprobs.get("content") or []
    return {
        "output_token_logprobs": [[t.get("logprob"), None, t.get("token")] for t in content],
        "output_top_logprobs": [
            [[x.get("logprob"), None, x.get("token")] for x in t.get("top_logprobs") or []] for t in content
        ],
    }


def _completion_logprobs(logprobs: dict) -> dict:
    tokens = logprobs.get("tokens") or []
    return {"output_token_logprobs": [[v, None, t] for v, t in zip(logprobs.get("token_logprobs") or [], tokens)]}


def echoed_entries(choice: dict) -> list[list]:
    """A /v1/completions echo row's prompt logprobs as select's [logprob, token, text] entries:
    the token's text stands in for its id (select compares rows token by token)."""
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("tokens") or []
    return [[v, t, t] for v, t in zip(logprobs.get("token_logprobs") or [], tokens)]
