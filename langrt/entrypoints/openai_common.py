"""What the OpenAI-compatible endpoints share (openai_api.py, openai_completions.py): the request
fields accepted, ignored and refused, sampling parameters out of a body, usage, streaming."""

from __future__ import annotations

from aiohttp import web

from langrt.entrypoints.lora_api import adapter_of_model
from langrt.entrypoints.native_api import send_event, stream_events
from langrt.errors import InvalidRequest
from langrt.server.generate_input import MAX_TOP_LOGPROBS
from langrt.server.req_state import ReqState

# Fields of OpenAI's request types that change nothing on a self-hosted model (the SDK's
# completion_create_params): accepted and ignored.
IGNORED = {
    "model",
    "user",
    "store",
    "metadata",
    "service_tier",
    "stream_options",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "verbosity",
    "prediction",
}
# OpenAI fields langrt cannot honour: accepted only at the values that ask for nothing.
_NEUTRAL = {
    "logit_bias": [{}],
    "suffix": [""],
    "best_of": [1],
    "modalities": [["text"]],
    "audio": [],
    "web_search_options": [],
}
_UNSUPPORTED_WHY = {"functions": "use tools", "function_call": "use tool_choice"}
SAMPLING = {
    # OpenAI name -> langrt sampling parameter
    "temperature": "temperature",
    "top_p": "top_p",
    "n": "n",
    "stop": "stop",
    "seed": "seed",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "regex": "regex",
    "json_schema": "json_schema",
    "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids",
    "min_tokens": "min_new_tokens",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "json_schema_options": "json_schema_options",
    "ebnf": "ebnf",
}


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


def adapter(request: web.Request, body: dict) -> str | None:
    """The LoRA adapter `model` names ("BASE:NAME" or NAME; docs/lora.md), None: the base model."""
    return adapter_of_model(body.get("model"), model_name(request), request.app["manager"].lora_names)


def sampling_dict(body: dict, max_new_tokens: int) -> dict:
    params = {SAMPLING[k]: v for k, v in body.items() if k in SAMPLING and v is not None}
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


def max_tokens_of(body: dict, *names: str, default: int | None) -> int | None:
    for name in names:
        value = body.get(name)
        if value is not None:
            if type(value) is not int or value < 0:
                raise InvalidRequest(f"{name} must be a non-negative integer", param=name)
            return value
    return default


def top_n(value, name: str) -> int:
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}]", param=name)
    return value


async def stream_with_usage(request, manager, states, firsts, render, include_usage, rid, created, name, kind):
    if not include_usage:
        return await stream_events(request, manager, states, render, indexed=False, done=True)
    response = await stream_events(request, manager, states, render, indexed=False, done=False)
    if all(s.finished and s.error is None for s in states):
        await send_event(
            response,
            {
                "id": rid,
                "object": kind,
                "created": created,
                "model": name,
                "choices": [],
                "usage": usage(states, firsts),
            },
        )
    await send_event(response, "[DONE]")
    await response.write_eof()
    return response
