"""`OpenAI`: a backend over any OpenAI-compatible server (langrt's own `/v1`, SGLang, vLLM,
llama.cpp, hosted APIs), so one `@function` program runs against any of them.

Plain HTTP through the frontend's stdlib client rather than the `openai` SDK: the SDK is not a
dependency of langrt (only of its tests), `import langrt_frontend` stays light, and the three
routes used (chat completions, completions, their SSE streams) are small JSON.

Chat models (the default) send the program's finished role blocks as `messages`; a `gen` or
`select` must sit in an assistant block. A completion model (`is_chat_model=False`) sends the
program's whole text as `prompt`, as the native backends do. What each primitive becomes, per
kind of server, is in docs/frontend_backends.md; what a server cannot do raises an
`UnsupportedPrimitive` naming the primitive and the server.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator, Sequence

from langrt_frontend.backends.base import Context
from langrt_frontend.backends.constraints import Constraints, make_constraints
from langrt_frontend.backends.http import HttpClient
from langrt_frontend.backends.openai_requests import (
    Check,
    choice_text,
    constraint_fields,
    echoed_entries,
    logprob_fields,
    meta_info,
    sampling_fields,
)
from langrt_frontend.chat_template import ChatTemplate, get_chat_template, resolve_chat_template
from langrt_frontend.params import GenParams
from langrt_frontend.select import decide

# OpenAI's models that only have /v1/completions; every other name is taken for a chat model.
COMPLETION_MODELS = ("gpt-3.5-turbo-instruct", "davinci-002", "babbage-002")
_PROBE_TIMEOUT_S = 10.0


class OpenAI:
    """`OpenAI(model, base_url=None, api_key=None)`. `base_url` defaults to $OPENAI_BASE_URL,
    then OpenAI's own; `api_key` to $OPENAI_API_KEY. `constraints` says how the server takes
    regex / grammar / choice constraints ('regex', 'gbnf', 'none'); 'auto' asks the server
    what it is (langrt or SGLang: 'regex'; llama.cpp: 'gbnf'; anything else: 'none')."""

    caches_prefixes = False  # the OpenAI API has no prefill-only call: forks send no warm-up

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        is_chat_model: bool | None = None,
        constraints: str = "auto",
        chat_template_name: str | None = None,
        timeout_s: float | None = None,
    ):
        self.model = model
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.http = HttpClient(base_url, api_key=api_key, timeout_s=timeout_s)
        self.base_url = self.http.base_url
        self.is_chat_model = model not in COMPLETION_MODELS if is_chat_model is None else is_chat_model
        kind, model_info = ("", None) if constraints != "auto" else _probe(self.base_url, api_key)
        self.server_kind = kind or "OpenAI-compatible"
        name = (
            constraints
            if constraints != "auto"
            else {"langrt or SGLang": "regex", "llama.cpp": "gbnf"}.get(kind, "none")
        )
        self.server = f"{self.base_url} ({self.server_kind})"
        self.constraints: Constraints = make_constraints(name, self.server)
        self.chat_template: ChatTemplate = _template(chat_template_name, self.is_chat_model, model_info)
        self._path = "/chat/completions" if self.is_chat_model else "/completions"

    # ---- gen ----------------------------------------------------------------------------------

    def gen(self, context: Context, params: GenParams):
        request = self._gen_request(context, params)
        check, prefix = request.check, request.prefix
        response = self._post(self._path, request.body, check.primitive)
        choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
        n = params.n or 1
        if len(choices) < n:
            raise self.constraints.refuse(f"gen(n={n})", f"the server answered {len(choices)} choice(s) (it ignores n)")
        texts, metas = [], []
        for choice in choices[:n]:
            text = self._cut(choice_text(choice, self.is_chat_model), prefix, check.primitive)
            check(text, choice.get("finish_reason"), self.server)
            texts.append(_cut_at_stops(text, request.stops))
            metas.append(meta_info(response, choice, self.is_chat_model))
        return (texts, metas) if n > 1 else (texts[0], metas[0])

    def gen_stream(self, context: Context, params: GenParams) -> Iterator[tuple[str, dict | None]]:
        request = self._gen_request(context, params)
        check, body = request.check, request.body
        if request.prefix:  # the repeated assistant text is cut off before anything is shown: at once
            yield self.gen(context, params)
            return
        body.update(stream=True, stream_options={"include_usage": True})
        text, last = "", {"finish_reason": None, "usage": None, "id": None}
        for delta in self._stream_deltas(body, check.primitive, last):
            text += delta
            yield delta, None
        check(text, last["finish_reason"], self.server)
        response = {"id": last["id"], "usage": last["usage"]}
        yield "", meta_info(response, {"finish_reason": last["finish_reason"]}, self.is_chat_model)

    def _stream_deltas(self, body: dict, primitive: str, last: dict) -> Iterator[str]:
        """The text increments of a streamed request; `last` collects the finish reason, usage, id."""
        try:
            for event in self.http.stream(self._path, body):
                last["id"] = event.get("id") or last["id"]
                last["usage"] = event.get("usage") or last["usage"]
                for choice in event.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    last["finish_reason"] = choice.get("finish_reason") or last["finish_reason"]
                    delta = (choice.get("delta") or {}).get("content") if self.is_chat_model else choice.get("text")
                    if delta:
                        yield delta
        except RuntimeError as e:
            raise RuntimeError(f"{primitive}: {self.server}: {e}") from e

    def _gen_request(self, context: Context, params: GenParams) -> "_GenRequest":
        self._refuse_images(context, "gen")
        prefix = self._assistant_prefix(context, "gen")
        fields, check = constraint_fields(params, self.constraints, self.is_chat_model, prefix)
        if prefix and not fields:
            if self.server_kind == "langrt or SGLang":
                return self._continue_request(context, params, prefix, check)
            raise self.constraints.refuse(
                "gen",
                f"the chat API cannot continue an assistant message already begun ({prefix!r}): "
                "put gen first in the assistant block, or use a completion model (is_chat_model=False)",
            )
        sampling = sampling_fields(params, self.constraints)
        stops: list[str] = []
        if prefix:  # the server would also stop inside the repeated text: stops are applied here
            sampling["max_tokens"] = (sampling["max_tokens"] or 0) + _token_budget(prefix)
            stops = sampling.pop("stop", [])
        body = {"model": self.model, **self._prompt(context), **sampling}
        body.update(logprob_fields(params, self.is_chat_model, self.constraints), **fields)
        return _GenRequest(body, check, prefix, stops)

    def _continue_request(self, context: Context, params: GenParams, prefix: str, check: Check) -> "_GenRequest":
        """langrt's and SGLang's chat API continue the begun assistant message itself
        (`continue_final_message`): the server's prompt ends with `prefix`, as the native text does,
        and the output is what follows it."""
        messages = [dict(m) for m in context.messages] + [{"role": "assistant", "content": prefix}]
        body = {"model": self.model, "messages": messages, "continue_final_message": True}
        body.update(sampling_fields(params, self.constraints), **logprob_fields(params, True, self.constraints))
        return _GenRequest(body, check, "", [])

    # ---- select -------------------------------------------------------------------------------

    def select(self, context: Context, choices: Sequence[str], method) -> tuple[str, dict]:
        self._refuse_images(context, "select")
        if not self.is_chat_model and self.constraints.scores_choices:
            return self._score(context.text, choices, method)
        prefix = self._assistant_prefix(context, "select")
        fields = self.constraints.choice(choices, prefix)
        body = {"model": self.model, **self._prompt(context), "temperature": 0, **fields}
        body["max_tokens"] = _token_budget(prefix + max(choices, key=len))
        response = self._post(self._path, body, "select")
        choice = (response.get("choices") or [{}])[0]
        text = self._cut(choice_text(choice, self.is_chat_model), prefix, "select")
        if text not in choices:
            raise RuntimeError(
                f"select: {self.server} answered {text!r}, none of {list(choices)} (did it ignore the constraint?)"
            )
        return text, {**meta_info(response, choice, self.is_chat_model), "choices_method": "constrained decoding"}

    def _score(self, prefix: str, choices: Sequence[str], method) -> tuple[str, dict]:
        """select's scoring (docs/programs.md), with the prompt logprobs of one echoed /v1/completions batch."""
        prompts = ([prefix] if prefix else []) + [prefix + c for c in choices]
        if method.requires_unconditional:
            prompts += list(choices)
        body = {"model": self.model, "prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 0}
        response = self._post("/completions", body, "select")
        rows = [echoed_entries(c) for c in sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))]
        if len(rows) != len(prompts) or not all(rows):
            raise RuntimeError(f"select: {self.server} did not echo logprobs for each of the {len(prompts)} prompts")
        prefix_entries = rows.pop(0) if prefix else []
        k = len(choices)
        return decide(choices, method, prefix_entries, rows[:k], rows[k:] or None)

    # ---- shared -------------------------------------------------------------------------------

    def _prompt(self, context: Context) -> dict:
        return {"messages": [dict(m) for m in context.messages]} if self.is_chat_model else {"prompt": context.text}

    def _assistant_prefix(self, context: Context, primitive: str) -> str:
        """For a chat model, the assistant text already written in the open block."""
        if not self.is_chat_model:
            return ""
        if context.role != "assistant":
            where = f"in a {context.role} block" if context.role else "outside any role block"
            raise self.constraints.refuse(
                primitive,
                f"a chat model writes assistant messages and this {primitive} is {where}: put it in "
                "sgl.assistant(...), or use a completion model (is_chat_model=False)",
            )
        return context.role_text.lstrip()

    def _refuse_images(self, context: Context, primitive: str) -> None:
        if context.images:
            raise self.constraints.refuse(
                "image", f"this backend sends text only, and an image precedes this {primitive}"
            )

    def _cut(self, text: str, prefix: str, primitive: str) -> str:
        if not prefix:
            return text
        if not text.startswith(prefix):
            raise RuntimeError(
                f"{primitive}: {self.server} did not begin its answer with the assistant text {prefix!r}: {text!r}"
            )
        return text[len(prefix) :]

    def _post(self, path: str, body: dict, primitive: str) -> dict:
        try:
            return self.http.json("POST", path, body)
        except RuntimeError as e:
            raise RuntimeError(f"{primitive}: {self.server}: {e}") from e

    def flush_cache(self) -> bool:
        return False  # the OpenAI API has no cache to flush

    def get_server_info(self) -> dict:
        return {
            "base_url": self.base_url,
            "model": self.model,
            "server": self.server_kind,
            "constraints": self.constraints.name,
            "is_chat_model": self.is_chat_model,
        }

    def __repr__(self) -> str:
        return f"OpenAI({self.model!r}, base_url={self.base_url!r})"


@dataclass(frozen=True)
class _GenRequest:
    body: dict
    check: Check  # what the output must be
    prefix: str  # the assistant text the output repeats first (a chat message already begun)
    stops: list  # stop strings applied here rather than by the server


def _cut_at_stops(text: str, stops: list) -> str:
    """The text before the first match of any stop string (docs/programs.md, gen)."""
    ends = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return text[: min(ends)] if ends else text


def _token_budget(text: str) -> int:
    """Tokens enough for `text` and an end of sequence: a token holds at least one byte."""
    return len(text.encode()) + 2


def _template(name: str | None, is_chat_model: bool, model_info: dict | None) -> ChatTemplate:
    """The named template; else, for a completion model on a server that reports its model's
    template (langrt, SGLang), that one; else `default` (a chat model's text is not sent)."""
    if name is not None:
        return get_chat_template(name)
    if not is_chat_model and model_info is not None:
        return resolve_chat_template(model_info)
    return get_chat_template("default")


def _probe(base_url: str, api_key: str | None) -> tuple[str, dict | None]:
    """What kind of server this is ('langrt or SGLang', 'llama.cpp' or ''), and its
    /get_model_info. Cheap GETs: the native API's model info, llama-server's /props, and
    llama-cpp-python's OpenAPI title."""
    root = HttpClient(base_url.removesuffix("/v1"), api_key=api_key, timeout_s=_PROBE_TIMEOUT_S)
    try:
        status, raw = root.request("GET", "/get_model_info")
        info = _json_object(raw) if status == 200 else None
        if info is not None and "model_path" in info:
            return "langrt or SGLang", info
        if root.request("GET", "/props")[0] == 200:  # llama.cpp's llama-server
            return "llama.cpp", None
        status, raw = root.request("GET", "/openapi.json")
    except RuntimeError as e:
        raise RuntimeError(f"cannot reach an OpenAI-compatible server at {base_url}: {e}") from e
    title = raw[:400].decode(errors="replace") if status == 200 else ""
    return ("llama.cpp", None) if "llama.cpp" in title else ("", None)


def _json_object(raw: bytes) -> dict | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
