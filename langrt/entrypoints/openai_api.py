"""The OpenAI-compatible API (API.md §8): /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from langrt.entrypoints.native_api import read_json, send_event, stream_events, wait_all
from langrt.errors import InvalidRequest
from langrt.server.req_state import ReqState
from langrt.messages import RequestOptions
from langrt.server.generate_input import MAX_TOP_LOGPROBS, GenerateInput, check_batch_size
from langrt.server.tokenizer_manager import TokenizerManager
from langrt.sampling.sampling_params import SamplingParams

# Fields every OpenAI request may carry that change nothing here.
_IGNORED = {"model", "user", "store", "metadata", "service_tier", "stream_options"}
_SAMPLING = {
    # OpenAI name -> langrt sampling parameter
    "temperature": "temperature", "top_p": "top_p", "n": "n", "stop": "stop", "seed": "seed",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty", "regex": "regex",
    "json_schema": "json_schema", "ignore_eos": "ignore_eos", "stop_token_ids": "stop_token_ids",
    "min_tokens": "min_new_tokens", "skip_special_tokens": "skip_special_tokens", "no_stop_trim": "no_stop_trim",
    "json_schema_options": "json_schema_options",
}  # fmt: skip
COMPLETION_FIELDS = _IGNORED | set(_SAMPLING) | {"prompt", "max_tokens", "stream", "logprobs", "echo"}
CHAT_FIELDS = _IGNORED | set(_SAMPLING) | {
    "messages", "max_tokens", "max_completion_tokens", "stream", "logprobs", "top_logprobs", "response_format",
}  # fmt: skip


def model_name(request: web.Request) -> str:
    return request.app["served_model_name"]


async def list_models(request: web.Request) -> web.Response:
    return web.json_response(
        {"object": "list", "data": [{"id": model_name(request), "object": "model", "created": request.app["started"], "owned_by": "langrt"}]}
    )


def sampling_dict(body: dict, max_new_tokens: int) -> dict:
    params = {_SAMPLING[k]: v for k, v in body.items() if k in _SAMPLING and v is not None}
    params["max_new_tokens"] = max_new_tokens
    return params


def finish_reason(state: ReqState) -> str | None:
    if state.finish_reason is None:
        return None
    return {"stop": "stop", "length": "length"}.get(state.finish_reason["type"], state.finish_reason["type"])


def usage(states: list[ReqState], prompt_states: list[ReqState]) -> dict:
    prompt = sum(s.prompt_tokens for s in prompt_states)
    completion = sum(s.completion_tokens for s in states)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def stream_options(body: dict) -> bool:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("stream_options must be an object", param="stream_options")
    return bool(options.get("include_usage"))


def _max_tokens(body: dict, *names: str, default: int | None) -> int | None:
    for name in names:
        value = body.get(name)
        if value is not None:
            if type(value) is not int or value < 0:
                raise InvalidRequest(f"{name} must be a non-negative integer", param=name)
            return value
    return default


def _top_n(value, name: str) -> int:
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}]", param=name)
    return value


# ---- /v1/completions ----------------------------------------------------------------------------


async def completions(request: web.Request) -> web.StreamResponse:
    manager: TokenizerManager = request.app["manager"]
    body = await read_json(request, COMPLETION_FIELDS)
    prompts = _completion_prompts(manager, body.get("prompt"))
    max_tokens = _max_tokens(body, "max_tokens", default=16)
    logprobs = _top_n(body.get("logprobs"), "logprobs")
    echo = bool(body.get("echo"))
    want_logprobs = body.get("logprobs") is not None
    params = SamplingParams.from_dict(sampling_dict(body, max_tokens))
    options = RequestOptions(
        return_logprob=want_logprobs, logprob_start_len=0 if echo and want_logprobs else -1,
        top_logprobs_num=logprobs, stream=bool(body.get("stream")),
    )  # fmt: skip
    inp = GenerateInput(prompts, [params] * len(prompts), [None] * len(prompts), [options] * len(prompts))
    states = await manager.submit(inp)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    echoes = [manager.tokenizer.decode(p) if echo else "" for p in prompts for _ in range(params.n)]
    firsts = states[:: params.n]  # one state per prompt, for prompt token counts
    if inp.stream:
        return await _stream_completion(request, manager, states, firsts, rid, created, echoes, stream_options(body))
    await wait_all(manager, states)
    choices = [
        {
            "index": i,
            "text": echoes[i] + s.text,
            "logprobs": _completion_logprobs(manager.tokenizer, s, echo) if want_logprobs else None,
            "finish_reason": finish_reason(s),
        }
        for i, s in enumerate(states)
    ]
    return web.json_response(
        {"id": rid, "object": "text_completion", "created": created, "model": model_name(request), "choices": choices, "usage": usage(states, firsts)}
    )


def _completion_prompts(manager: TokenizerManager, prompt) -> list[list[int]]:
    if isinstance(prompt, str) and prompt:
        return [manager.tokenize(prompt, param="prompt")]
    if isinstance(prompt, list) and prompt:
        if not all(type(t) is int for t in prompt):  # a batch: bounded before tokenizing
            check_batch_size(len(prompt), manager.capacity, "prompt")
        if all(isinstance(p, str) and p for p in prompt):
            return [manager.tokenize(p, param="prompt") for p in prompt]
        if all(type(t) is int for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(type(t) is int for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise InvalidRequest("prompt must be a non-empty string, list of strings, or token ids", param="prompt")


async def _stream_completion(request, manager, states, firsts, rid, created, echoes, include_usage):
    sent = [0] * len(states)
    name = model_name(request)

    def render(i: int, state: ReqState) -> dict | None:
        text = state.text[sent[i] :]
        if sent[i] == 0:
            text = echoes[i] + text
        sent[i] = len(state.text)
        if not text and state.finish_reason is None:
            return None
        choice = {"index": i, "text": text, "logprobs": None, "finish_reason": finish_reason(state)}
        return {"id": rid, "object": "text_completion", "created": created, "model": name, "choices": [choice]}

    return await _stream_with_usage(request, manager, states, firsts, render, include_usage, rid, created, name, "text_completion")


def _completion_logprobs(tokenizer, state: ReqState, echo: bool) -> dict:
    entries = (state.input_logprobs if echo else []) + state.output_logprobs
    tokens = [tokenizer.decode([t]) for _, t, _ in entries]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [v for v, _, _ in entries],
        "top_logprobs": [
            None if top is None else {tokenizer.decode([t]): v for v, t in top} for _, _, top in entries
        ],
        "text_offset": offsets,
    }


# ---- /v1/chat/completions -----------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    manager: TokenizerManager = request.app["manager"]
    body = await read_json(request, CHAT_FIELDS)
    prompt = _chat_prompt(request, body.get("messages"))
    max_tokens = _max_tokens(body, "max_completion_tokens", "max_tokens", default=None)
    if max_tokens is None:  # as much as the context leaves
        max_tokens = max(0, manager.ready.context_len - len(prompt))
    top = _top_n(body.get("top_logprobs"), "top_logprobs")
    want_logprobs = bool(body.get("logprobs"))
    sampling = sampling_dict(body, max_tokens)
    _apply_response_format(sampling, body.get("response_format"))
    params = SamplingParams.from_dict(sampling)
    options = RequestOptions(
        return_logprob=want_logprobs, top_logprobs_num=top if want_logprobs else 0, stream=bool(body.get("stream"))
    )
    inp = GenerateInput([prompt], [params], [None], [options])
    states = await manager.submit(inp)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if inp.stream:
        return await _stream_chat(request, manager, states, rid, created, stream_options(body))
    await wait_all(manager, states)
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": s.text},
            "logprobs": _chat_logprobs(manager.tokenizer, s) if want_logprobs else None,
            "finish_reason": finish_reason(s),
        }
        for i, s in enumerate(states)
    ]
    return web.json_response(
        {"id": rid, "object": "chat.completion", "created": created, "model": model_name(request), "choices": choices, "usage": usage(states, states[:1])}
    )


def _chat_prompt(request: web.Request, messages) -> list[int]:
    manager: TokenizerManager = request.app["manager"]
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    if len(messages) >= manager.ready.context_len:  # each message is at least one token
        raise InvalidRequest(f"{len(messages)} messages cannot fit the context of {manager.ready.context_len} tokens", param="messages")
    normalized = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise InvalidRequest("each message needs a role of system, developer, user or assistant", param="messages")
        normalized.append({"role": "system" if m["role"] == "developer" else m["role"], "content": _content(m.get("content"))})
    chars = sum(len(m["content"]) for m in normalized)
    if chars > manager.max_prompt_chars:  # before the template renders and the tokenizer runs
        raise InvalidRequest(f"the messages hold {chars} characters, more than the context can hold", param="messages")
    template = request.app["chat_template"]
    tokenizer = manager.tokenizer
    if template is None:
        raise InvalidRequest("this model has no chat template; use /v1/completions or --chat-template", param="messages")
    try:
        text = tokenizer.apply_chat_template(normalized, chat_template=template, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # jinja errors: the template refused these messages
        raise InvalidRequest(f"the chat template rejected the messages: {e}", param="messages") from e
    return manager.tokenize(text, add_special_tokens=False, param="messages")


def _content(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise InvalidRequest("message content must be a string or a list of text parts (this model is text-only)", param="messages")


def _apply_response_format(sampling: dict, response_format) -> None:
    if response_format is None:
        return
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        sampling["json_schema"] = json.dumps({"type": "object"})
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidRequest("response_format.json_schema.schema must be a JSON schema object", param="response_format")
        sampling["json_schema"] = json.dumps(spec["schema"])
    else:
        raise InvalidRequest("response_format.type must be text, json_object or json_schema", param="response_format")


def _chat_logprobs(tokenizer, state: ReqState) -> dict:
    def item(value, token_id):
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**item(v, t), "top_logprobs": [item(tv, tt) for tv, tt in (top or [])]} for v, t, top in state.output_logprobs
        ]
    }


async def _stream_chat(request, manager, states, rid, created, include_usage):
    sent = [0] * len(states)
    role_sent = [False] * len(states)
    name = model_name(request)

    def render(i: int, state: ReqState) -> dict | None:
        delta: dict[str, Any] = {}
        if not role_sent[i]:
            delta["role"] = "assistant"
            role_sent[i] = True
        text = state.text[sent[i] :]
        if text:
            delta["content"] = text
        sent[i] = len(state.text)
        if not delta and state.finish_reason is None:
            return None
        choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish_reason(state)}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [choice]}

    return await _stream_with_usage(request, manager, states, states[:1], render, include_usage, rid, created, name, "chat.completion.chunk")


async def _stream_with_usage(request, manager, states, firsts, render, include_usage, rid, created, name, kind):
    if not include_usage:
        return await stream_events(request, manager, states, render, indexed=False, done=True)
    response = await stream_events(request, manager, states, render, indexed=False, done=False)
    if all(s.finished and s.error is None for s in states):
        await send_event(response, {"id": rid, "object": kind, "created": created, "model": name, "choices": [], "usage": usage(states, firsts)})
    await send_event(response, "[DONE]")
    await response.write_eof()
    return response


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
