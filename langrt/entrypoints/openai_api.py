"""The OpenAI-compatible API (docs/serving.md, OpenAI API): /v1/models and /v1/chat/completions here,
/v1/completions in openai_completions.py, what they share in openai_common.py."""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from langrt.entrypoints import chat_reasoning
from langrt.entrypoints.chat_messages import chat_prompt
from langrt.entrypoints.native_api import read_json, wait_all
from langrt.entrypoints.openai_common import (
    IGNORED,
    SAMPLING,
    adapter,
    finish_reason,
    max_tokens_of,
    model_name,
    refuse_unsupported,
    sampling_dict,
    stream_options,
    stream_with_usage,
    top_n,
    usage,
)
from langrt.entrypoints.openai_completions import completions
from langrt.entrypoints.response_format import apply_response_format
from langrt.entrypoints.tool_calls import constraint as tool_constraint
from langrt.entrypoints.tool_calls import parse_tools, syntax_for
from langrt.entrypoints.tool_parser import ToolCallParser
from langrt.errors import InvalidRequest
from langrt.messages import RequestOptions
from langrt.sampling.sampling_params import SamplingParams
from langrt.server.generate_input import GenerateInput
from langrt.server.req_state import ReqState
from langrt.server.tokenizer_manager import TokenizerManager

CHAT_FIELDS = (
    IGNORED
    | set(SAMPLING)
    | {
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "logprobs",
        "top_logprobs",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "logit_bias",
        "modalities",
        "audio",
        "web_search_options",
        "functions",
        "function_call",
        "continue_final_message",
    }
    | chat_reasoning.FIELDS
)


async def list_models(request: web.Request) -> web.Response:
    return web.json_response(
        {
            "object": "list",
            "data": [
                {"id": model_name(request), "object": "model", "created": request.app["started"], "owned_by": "langrt"}
            ],
        }
    )


# ---- /v1/chat/completions -----------------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    manager: TokenizerManager = request.app["manager"]
    body = await read_json(request, CHAT_FIELDS)
    refuse_unsupported(body)
    tools = parse_tools(body)
    template = request.app["chat_template"]
    kwargs = chat_reasoning.template_kwargs(body)
    prompt = chat_prompt(manager, template, body.get("messages"), tools, kwargs, _continue_final(body))
    reasoning = chat_reasoning.reasoning_request(body, request.app.get("reasoning_parser"), kwargs)
    params, syntax = _chat_params(body, manager.ready.context_len - len(prompt), tools, template, reasoning)
    top = top_n(body.get("top_logprobs"), "top_logprobs")
    want_logprobs = bool(body.get("logprobs"))
    options = RequestOptions(
        return_logprob=want_logprobs,
        top_logprobs_num=top if want_logprobs else 0,
        stream=bool(body.get("stream")),
        lora_path=adapter(request, body),
    )
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
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model_name(request),
            "choices": choices,
            "usage": usage(states, states[:1]),
        }
    )


def _continue_final(body: dict) -> bool:
    value = body.get("continue_final_message", False)
    if not isinstance(value, bool):
        raise InvalidRequest("continue_final_message must be true or false", param="continue_final_message")
    return value


def _chat_params(body: dict, room: int, tools, template, reasoning) -> tuple[SamplingParams, Any]:
    """The request's sampling parameters (its grammar: response_format, tool calls, what follows
    the thinking) and the tool-call syntax its output is parsed with (None: no tools). `room`:
    the tokens the context leaves after the prompt, the default max_tokens."""
    max_tokens = max_tokens_of(body, "max_completion_tokens", "max_tokens", default=None)
    sampling = sampling_dict(body, max(0, room) if max_tokens is None else max_tokens)
    apply_response_format(sampling, body.get("response_format"))
    chat_reasoning.apply_reasoning(sampling, reasoning, body)
    syntax = None if tools is None or tools.choice == "none" else syntax_for(template)
    if syntax is not None:
        _constrain_calls(sampling, tool_constraint(tools, syntax))
    return SamplingParams.from_dict(sampling), syntax


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
        return {
            "message": {"role": "assistant", "content": text, **chat_reasoning.message_fields(reasoning, thought)},
            "finish_reason": reason,
        }
    parser = ToolCallParser(syntax)
    parser.feed(text, final=True)
    message = {
        "role": "assistant",
        "content": parser.content or None,
        **chat_reasoning.message_fields(reasoning, thought),
    }
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
            {**item(v, t), "top_logprobs": [item(tv, tt) for tv, tt in (top or [])]}
            for v, t, top in state.output_logprobs
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

    return await stream_with_usage(
        request, manager, states, states[:1], render, include_usage, rid, created, name, "chat.completion.chunk"
    )


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


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
