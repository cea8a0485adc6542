"""The OpenAI-compatible API (docs/serving.md, OpenAI API): /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from langrt.entrypoints import chat_reasoning
from langrt.entrypoints.chat_messages import chat_prompt
from langrt.entrypoints.native_api import read_json, send_event, stream_events, wait_all
from langrt.entrypoints.response_format import apply_response_format
from langrt.entrypoints.tool_calls import constraint as tool_constraint
from langrt.entrypoints.tool_calls import parse_tools, syntax_for
from langrt.entrypoints.tool_parser import ToolCallParser
from langrt.errors import InvalidRequest
from langrt.server.req_state import ReqState
from langrt.entrypoints.lora_api import adapter_of_model
from langrt.messages import RequestOptions
from langrt.server.generate_input import MAX_TOP_LOGPROBS, GenerateInput, check_batch_size
from langrt.server.tokenizer_manager import TokenizerManager
from langrt.sampling.sampling_params import SamplingParams

# Fields of OpenAI's request types that change nothing on a self-hosted model (the SDK's
# completion_create_params): accepted and ignored.
_IGNORED = {
    "model", "user", "store", "metadata", "service_tier", "stream_options", "safety_identifier", "prompt_cache_key",
    "prompt_cache_retention", "reasoning_effort", "verbosity", "prediction",
}  # fmt: skip
# OpenAI fields langrt cannot honour: accepted only at the values that ask for nothing.
_NEUTRAL = {"logit_bias": [{}], "suffix": [""], "best_of": [1], "modalities": [["text"]], "audio": [], "web_search_options": []}
_UNSUPPORTED_WHY = {"functions": "use tools", "function_call": "use tool_choice"}
_SAMPLING = {
    # OpenAI name -> langrt sampling parameter
    "temperature": "temperature", "top_p": "top_p", "n": "n", "stop": "stop", "seed": "seed",
    "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
    "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty", "regex": "regex",
    "json_schema": "json_schema", "ignore_eos": "ignore_eos", "stop_token_ids": "stop_token_ids",
    "min_tokens": "min_new_tokens", "skip_special_tokens": "skip_special_tokens", "no_stop_trim": "no_stop_trim",
    "json_schema_options": "json_schema_options", "ebnf": "ebnf",
}  # fmt: skip
COMPLETION_FIELDS = _IGNORED | set(_SAMPLING) | {"prompt", "max_tokens", "stream", "logprobs", "echo", "logit_bias", "suffix", "best_of"}
CHAT_FIELDS = _IGNORED | set(_SAMPLING) | {
    "messages", "max_tokens", "max_completion_tokens", "stream", "logprobs", "top_logprobs", "response_format",
    "tools", "tool_choice", "parallel_tool_calls", "logit_bias", "modalities", "audio", "web_search_options",
    "functions", "function_call",
} | chat_reasoning.FIELDS  # fmt: skip


def refuse_unsupported(body: dict) -> None:
    """OpenAI fields langrt cannot honour are a 400 naming them, unless they ask for nothing."""
    for name, why in _UNSUPPORTED_WHY.items():
        if body.get(name) is not None:
            raise InvalidRequest(f"{name} is not supported ({why})", param=name)
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        if value is not None and value not in neutral and not (name == "best_of" and value == body.get("n")):
            raise InvalidRequest(f"{name} is not supported by this server", param=name)


def model_name(request: web.Request) -> str:
    return request.app["served_model_name"]


def _adapter(request: web.Request, body: dict) -> str | None:
    """The LoRA adapter `model` names ("BASE:NAME" or NAME; docs/lora.md), None: the base model."""
    return adapter_of_model(body.get("model"), model_name(request), request.app["manager"].lora_names)


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
    refuse_unsupported(body)
    prompts = _completion_prompts(manager, body.get("prompt"))
    max_tokens = _max_tokens(body, "max_tokens", default=16)
    logprobs = _top_n(body.get("logprobs"), "logprobs")
    echo = bool(body.get("echo"))
    want_logprobs = body.get("logprobs") is not None
    params = SamplingParams.from_dict(sampling_dict(body, max_tokens))
    options = RequestOptions(
        return_logprob=want_logprobs, logprob_start_len=0 if echo and want_logprobs else -1,
        top_logprobs_num=logprobs, stream=bool(body.get("stream")), lora_path=_adapter(request, body),
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
    refuse_unsupported(body)
    tools = parse_tools(body)
    template = request.app["chat_template"]
    kwargs = chat_reasoning.template_kwargs(body)
    prompt = chat_prompt(manager, template, body.get("messages"), tools, kwargs)
    reasoning = chat_reasoning.reasoning_request(body, request.app.get("reasoning_parser"), kwargs)
    max_tokens = _max_tokens(body, "max_completion_tokens", "max_tokens", default=None)
    if max_tokens is None:  # as much as the context leaves
        max_tokens = max(0, manager.ready.context_len - len(prompt))
    top = _top_n(body.get("top_logprobs"), "top_logprobs")
    want_logprobs = bool(body.get("logprobs"))
    sampling = sampling_dict(body, max_tokens)
    apply_response_format(sampling, body.get("response_format"))
    chat_reasoning.apply_reasoning(sampling, reasoning, body)
    syntax = None if tools is None or tools.choice == "none" else syntax_for(template)
    if syntax is not None:
        _constrain_calls(sampling, tool_constraint(tools, syntax))
    params = SamplingParams.from_dict(sampling)
    options = RequestOptions(
        return_logprob=want_logprobs, top_logprobs_num=top if want_logprobs else 0, stream=bool(body.get("stream")),
        lora_path=_adapter(request, body),
    )  # fmt: skip
    inp = GenerateInput([prompt], [params], [None], [options])
    states = await manager.submit(inp)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if inp.stream:
        return await _stream_chat(request, manager, states, rid, created, stream_options(body), syntax, reasoning)
    await wait_all(manager, states)
    choices = [
        {
            "index": i,
            **_chat_message(s, syntax, reasoning),
            "logprobs": _chat_logprobs(manager.tokenizer, s) if want_logprobs else None,
        }
        for i, s in enumerate(states)
    ]
    return web.json_response(
        {"id": rid, "object": "chat.completion", "created": created, "model": model_name(request), "choices": choices, "usage": usage(states, states[:1])}
    )


def _constrain_calls(sampling: dict, tag: dict) -> None:
    if any(sampling.get(k) is not None for k in ("json_schema", "regex", "ebnf", "structural_tag")):
        raise InvalidRequest(
            "tools with tool_choice auto or required cannot be combined with response_format or another grammar "
            "(the calls' grammar is the output's); use tool_choice none",
            param="tool_choice",
        )
    sampling["structural_tag"] = tag


def _chat_message(state: ReqState, syntax, reasoning=None) -> dict:
    """The choice's message and finish_reason: the thinking split out (with a reasoning parser)
    and the calls parsed out of the answer, if any."""
    reason = finish_reason(state)
    thought, text = chat_reasoning.split_text(reasoning, state.text)
    if syntax is None:
        return {"message": {"role": "assistant", "content": text, **chat_reasoning.message_fields(reasoning, thought)}, "finish_reason": reason}
    parser = ToolCallParser(syntax)
    parser.feed(text, final=True)
    message = {"role": "assistant", "content": parser.content or None, **chat_reasoning.message_fields(reasoning, thought)}
    calls = [c for c in parser.calls if c.complete]  # not one cut short by max_tokens (a stream has sent its start)
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
        reason = "tool_calls" if reason == "stop" else reason
    elif message["content"] is None:
        message["content"] = ""
    return {"message": message, "finish_reason": reason}


def _chat_logprobs(tokenizer, state: ReqState) -> dict:
    def item(value, token_id):
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**item(v, t), "top_logprobs": [item(tv, tt) for tv, tt in (top or [])]} for v, t, top in state.output_logprobs
        ]
    }


async def _stream_chat(request, manager, states, rid, created, include_usage, syntax, reasoning=None):
    role_sent = [False] * len(states)
    sent = [0] * len(states)
    parsers = [None if syntax is None else ToolCallParser(syntax) for _ in states]
    splits = [None if reasoning is None else reasoning.stream() for _ in states]  # thinking apart from the answer
    name = model_name(request)

    def render(i: int, state: ReqState) -> dict | None:
        delta: dict[str, Any] = {}
        if not role_sent[i]:
            delta["role"] = "assistant"
            role_sent[i] = True
        reason = finish_reason(state)
        answer = state.text
        if splits[i] is not None:
            thought = splits[i].feed(state.text, final=state.finish_reason is not None)
            answer = splits[i].content
            if thought:
                delta["reasoning_content"] = thought
        if parsers[i] is None:
            text = answer[sent[i] :]
            sent[i] = len(answer)
        else:
            update = parsers[i].feed(answer, final=state.finish_reason is not None)
            text = update.content
            if update.calls:
                delta["tool_calls"] = [_call_delta(k, part) for k, part in sorted(update.calls.items())]
            if parsers[i].calls and reason == "stop":
                reason = "tool_calls"
        if text:
            delta["content"] = text
        if not delta and state.finish_reason is None:
            return None
        choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [choice]}

    return await _stream_with_usage(request, manager, states, states[:1], render, include_usage, rid, created, name, "chat.completion.chunk")


def _call_delta(index: int, part: dict) -> dict:
    """One call's piece of a chunk, as OpenAI streams it: id, type and name first, then the
    arguments in pieces."""
    delta: dict[str, Any] = {"index": index}
    function: dict[str, str] = {}
    if "id" in part:
        delta.update(id=part["id"], type="function")
        function.update(name=part["name"], arguments="")
    if "arguments" in part:
        function["arguments"] = part["arguments"]
    delta["function"] = function
    return delta


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
