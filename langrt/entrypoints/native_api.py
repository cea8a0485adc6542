"""SGLang's native HTTP API (docs/serving.md, native API): /generate and the server routes."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from langrt.errors import InvalidRequest
from langrt.server.metrics import RateMeter, sglang_lines
from langrt.server.req_state import ReqState, merged_snapshots
from langrt.server.generate_input import GenerateCall, make_generate_input
from langrt.server.tokenizer_manager import TokenizerManager
from langrt.version import __version__

from langrt.entrypoints.errors import error_body, error_response, status_of

GENERATE_FIELDS = {
    "text",
    "input_ids",
    "sampling_params",
    "rid",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "stream",
    "image_data",
    "lora_path",
}
# Why 64: the deepest legitimate field is a JSON schema, and real ones nest a few levels; much
# deeper structures only exhaust the recursion of schema compilation and of json itself.
MAX_JSON_DEPTH = 64


async def read_json(request: web.Request, allowed: set[str] | None = None) -> dict:
    """The body as a JSON object; unknown fields refused when `allowed` is given. A body that
    takes longer than --body-read-timeout to arrive gets 408."""
    timeout = request.app.get("body_read_timeout")
    try:
        raw = await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout() from None
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if allowed is not None:
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise InvalidRequest(f"unknown field {unknown[0]!r}", param=unknown[0])
    return body


def parse_json(raw: bytes):
    """A client's body, parsed; every way it can be malformed is a 400 (not only syntax errors:
    bytes that are not UTF-8, integers past Python's 4300-digit limit, deep nesting)."""
    too_deep = InvalidRequest(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"the request body is not valid UTF-8: {e}") from None
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise InvalidRequest(f"the request body has a value JSON parsing refuses: {e}") from None
    except RecursionError:
        raise too_deep from None
    if _depth_over(body, MAX_JSON_DEPTH):
        raise too_deep
    return body


def _depth_over(value, limit: int) -> bool:
    """Whether `value` nests lists/objects deeper than `limit` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


async def generate(request: web.Request) -> web.StreamResponse:
    manager: TokenizerManager = request.app["manager"]
    body = await read_json(request, GENERATE_FIELDS)
    if body.pop("image_data", None) is not None:
        raise InvalidRequest("this model is text-only: image_data is not supported", param="image_data")
    inp, is_batch = make_generate_input(manager.tokenize, GenerateCall(**body), max_prompts=manager.capacity)
    states = await manager.submit(inp)
    if inp.stream:
        return await stream_events(
            request, manager, states, lambda i, s: s.response(manager.tokenizer), len(states) > 1
        )
    await wait_all(manager, states)
    results = [s.response(manager.tokenizer) for s in states]
    return web.json_response(results if is_batch else results[0])


async def wait_all(manager: TokenizerManager, states: list[ReqState]) -> None:
    """Wait for every state; if the client goes away (the handler is cancelled), abort them."""
    try:
        for state in states:
            await state.wait()
    except BaseException:
        for state in states:
            manager.abort(state)
        raise


async def start_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


async def send_event(response: web.StreamResponse, payload) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    await response.write(f"data: {data}\n\n".encode())


async def stream_events(
    request, manager: TokenizerManager, states, render, indexed: bool, done: bool = True
) -> web.StreamResponse:
    """SSE: one event per update (render(index, state) -> payload or None to skip), then
    [DONE] (unless `done` is False: the caller adds more). A failure mid-stream becomes an error
    event; a vanished client aborts the requests."""
    try:
        response = await start_sse(request)
    except BaseException:  # the client left before the stream began
        for state in states:
            manager.abort(state)
        raise
    try:
        async for i, state in merged_snapshots(states):
            payload = render(i, state)
            if payload is None:
                continue
            if indexed:
                payload["index"] = i
            await send_event(response, payload)
    except (ConnectionError, asyncio.CancelledError):
        for state in states:
            manager.abort(state)
        raise
    except Exception as e:  # noqa: BLE001
        for state in states:
            manager.abort(state)
        status, message, param = status_of(e)
        await send_event(response, error_body(status, message, param))
    if done:
        await send_event(response, "[DONE]")
        await response.write_eof()
    return response


async def get_model_info(request: web.Request) -> web.Response:
    app = request.app
    tokenizer = app["manager"].tokenizer
    ready = app["manager"].ready
    return web.json_response(
        {
            "model_path": app["model_path"],
            "tokenizer_path": app["tokenizer_path"],
            "is_generation": True,
            "chat_template": getattr(tokenizer, "chat_template", None),
            "stop_strings": [tokenizer.eos_token] if getattr(tokenizer, "eos_token", None) else [],
            "context_length": ready.context_len,
            "vocab_size": ready.vocab_size,
        }
    )


async def get_server_info(request: web.Request) -> web.Response:
    manager: TokenizerManager = request.app["manager"]
    stats = await manager.server_stats()
    return web.json_response(
        {**manager.args.to_json(), "model_path": request.app["model_path"], "version": __version__, **stats}
    )


async def flush_cache(request: web.Request) -> web.Response:
    if request.can_read_body:
        await read_json(request)  # SGLang's frontend sends {"empty_cache": true}; nothing to honour
    if await request.app["manager"].control("flush_cache"):
        return web.Response(text="Cache flushed.\n")
    return error_response(400, "cannot flush the cache while requests are queued or running; retry when idle")


async def health(request: web.Request) -> web.Response:
    manager: TokenizerManager = request.app["manager"]
    if manager.healthy:
        return web.Response(text="ok\n")
    return error_response(503, f"not serving: {manager.failure or 'starting'}")


# Why 5 s / 10 s: output from the runtime within the last 5 s proves it is making progress
# (a busy server answers at once); otherwise a one-token probe must finish within 10 s, which an
# idle or lightly loaded server does in milliseconds and a stuck scheduler never does.
PROGRESS_WINDOW_S = 5.0
HEALTH_PROBE_TIMEOUT_S = 10.0


async def health_generate(request: web.Request) -> web.Response:
    """200 only if the runtime is generating: recent output, or a one-token probe that finishes
    (a scheduler that is alive but stuck passes /health and fails this)."""
    manager: TokenizerManager = request.app["manager"]
    if not manager.healthy:
        return error_response(503, f"not serving: {manager.failure or 'starting'}")
    if time.monotonic() - manager.last_progress < PROGRESS_WINDOW_S:
        return web.Response(text="ok\n")
    probe = GenerateCall(text="ok", sampling_params={"max_new_tokens": 1, "temperature": 0})
    inp, _ = make_generate_input(manager.tokenize, probe)
    try:
        states = await manager.submit(inp)
        await asyncio.wait_for(wait_all(manager, states), HEALTH_PROBE_TIMEOUT_S)  # aborts them on timeout
    except asyncio.TimeoutError:
        return error_response(
            503, f"no generation progress: a one-token probe did not finish within {HEALTH_PROBE_TIMEOUT_S:g} s"
        )
    except Exception as e:  # noqa: BLE001 - any failure of the probe is a failed check
        return error_response(503, f"the generation probe failed: {e}")
    return web.Response(text="ok\n")


async def metrics(request: web.Request) -> web.Response:
    manager: TokenizerManager = request.app["manager"]
    stats = await manager.server_stats()
    total = stats["kv_total_tokens"]
    gauges = {
        "running_requests": stats["running_requests"],
        "waiting_requests": stats["waiting_requests"],
        "cache_hit_rate": stats["cache_hit_rate"],
        "kv_usage": 1 - stats["kv_available_tokens"] / total,
        "kv_cached_tokens": stats["kv_cached_tokens"],
        "kv_total_tokens": total,
        "retractions": stats["retractions"],
        "spec_accept_length": stats["spec_accept_length"],
        "spec_accept_rate": stats["spec_accept_rate"],
        "spec_draft_tokens": stats["spec_draft_tokens"],
        "spec_accepted_tokens": stats["spec_accepted_tokens"],
    }
    now = time.monotonic()
    generated = manager.metrics.generation_tokens + stats["live_output_tokens"]
    sglang = {
        "num_running_reqs": (stats["running_requests"], "The number of running requests."),
        "num_queue_reqs": (stats["waiting_requests"], "The number of requests in the waiting queue."),
        "num_grammar_queue_reqs": (
            stats["grammar_queue_requests"],
            "The number of requests waiting for their grammar.",
        ),
        "num_used_tokens": (total - stats["kv_available_tokens"], "The number of KV slots in use by requests."),
        "token_usage": (gauges["kv_usage"], "The token usage (fraction of the KV pool in use)."),
        "cache_hit_rate": (stats["cache_hit_rate"], "The prefix cache hit rate (cached / prompt tokens)."),
        "gen_throughput": (request.app["gen_rate"].update(generated, now), "The generation throughput (token/s)."),
        "spec_accept_length": (stats["spec_accept_length"], "The average acceptance length of speculative decoding."),
        "spec_accept_rate": (stats["spec_accept_rate"], "The average acceptance rate of speculative decoding."),
    }
    text = (
        manager.metrics.render(gauges)
        + "\n".join(sglang_lines(manager.metrics, sglang, request.app["served_model_name"]))
        + "\n"
    )
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


CONCATE_NOT_IMPLEMENTED = (
    "/concate_and_append_request is not implemented: langrt cannot join requests' KV caches by "
    "request id (the ids SGLang's frontend sends here name no request this server ran). The text "
    "path gives the same output: set sglang.global_config.enable_parallel_encoding = False, or use "
    "langrt_frontend, which appends the text and lets the radix cache reuse the shared prefix."
)


async def concate_and_append_request(request: web.Request) -> web.Response:
    # 501 rather than a success that does nothing: a client told "done" would believe the
    # children's KV was joined onto the parent's. The body is read first, so one past the size
    # limit is a 413 as on every other route.
    await request.read()
    return error_response(501, CONCATE_NOT_IMPLEMENTED)


def add_routes(app: web.Application) -> None:
    app["gen_rate"] = RateMeter()  # sglang:gen_throughput, between scrapes
    app.router.add_post("/generate", generate)
    app.router.add_get("/get_model_info", get_model_info)
    app.router.add_get("/get_server_info", get_server_info)
    app.router.add_get("/server_info", get_server_info)
    app.router.add_route("GET", "/flush_cache", flush_cache)
    app.router.add_route("POST", "/flush_cache", flush_cache)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/concate_and_append_request", concate_and_append_request)
