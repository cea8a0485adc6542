"""/v1/completions (docs/serving.md, OpenAI API): text in, text out, whole or streamed."""

from __future__ import annotations

import time
import uuid

from aiohttp import web

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
from langrt.errors import InvalidRequest
from langrt.messages import RequestOptions
from langrt.sampling.sampling_params import SamplingParams
from langrt.server.generate_input import GenerateInput, check_batch_size
from langrt.server.req_state import ReqState
from langrt.server.tokenizer_manager import TokenizerManager

COMPLETION_FIELDS = (
    IGNORED | set(SAMPLING) | {"prompt", "max_tokens", "stream", "logprobs", "echo", "logit_bias", "suffix", "best_of"}
)


async def completions(request: web.Request) -> web.StreamResponse:
    manager: TokenizerManager = request.app["manager"]
    body = await read_json(request, COMPLETION_FIELDS)
    refuse_unsupported(body)
    prompts = _completion_prompts(manager, body.get("prompt"))
    max_tokens = max_tokens_of(body, "max_tokens", default=16)
    logprobs = top_n(body.get("logprobs"), "logprobs")
    echo = bool(body.get("echo"))
    want_logprobs = body.get("logprobs") is not None
    params = SamplingParams.from_dict(sampling_dict(body, max_tokens))
    options = RequestOptions(
        return_logprob=want_logprobs,
        logprob_start_len=0 if echo and want_logprobs else -1,
        top_logprobs_num=logprobs,
        stream=bool(body.get("stream")),
        lora_path=adapter(request, body),
    )
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
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model_name(request),
            "choices": choices,
            "usage": usage(states, firsts),
        }
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

    return await stream_with_usage(
        request, manager, states, firsts, render, include_usage, rid, created, name, "text_completion"
    )


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
        "top_logprobs": [None if top is None else {tokenizer.decode([t]): v for v, t in top} for _, _, top in entries],
        "text_offset": offsets,
    }
