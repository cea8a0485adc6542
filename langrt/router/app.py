"""`langrt router`: an aiohttp server in front of langrt (or SGLang) workers.

Generation routes (`/generate`, `/v1/completions`, `/v1/chat/completions`) go to the worker
the policy picks and are retried elsewhere when it dies (`forward.py`); `/get_model_info` and
`/v1/models` to any healthy worker; `/flush_cache` to all of them; `/get_server_info` gathers
every worker's. `/add_worker?url=` and `/remove_worker?url=` change the set at run time,
`/list_workers` shows it. Any other path is passed to one worker, unretried.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from langrt.router.forward import Forwarder, NoWorker, Outgoing, forwarded_headers
from langrt.router.policies import POLICIES
from langrt.router.routing_text import is_stream, routing_text
from langrt.router.workers import HealthSettings, UnknownWorker, WorkerSet

logger = logging.getLogger(__name__)

GENERATION_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
WORKERS = web.AppKey("workers", WorkerSet)
FORWARDER = web.AppKey("forwarder", Forwarder)
SESSION = web.AppKey("session", aiohttp.ClientSession)
MAX_ATTEMPTS = web.AppKey("max_attempts", int)


@dataclass(frozen=True)
class RouterArgs:
    worker_urls: tuple[str, ...] = ()
    policy: str = "cache_aware"
    host: str = "127.0.0.1"
    port: int = 30000
    health: HealthSettings = field(default_factory=HealthSettings)
    max_attempts: int = 3  # workers tried per request at most
    max_request_bytes: int = 16 * 1024 * 1024
    log_level: str = "info"
    # Every route but /health needs 'Authorization: Bearer KEY' (it is passed on to the workers,
    # which may check the same key); without it anyone who reaches the port could add a worker.
    api_key: str | None = None

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}; got {self.policy!r}")
        if self.max_attempts < 1:
            raise ValueError(f"--max-attempts must be positive; got {self.max_attempts}")


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "router_error", "param": None, "code": status}}
    return web.json_response(body, status=status)


async def _forward(request: web.Request, retryable: bool, text: str = "", stream: bool = False) -> web.StreamResponse:
    out = Outgoing(
        request.method, request.path_qs, forwarded_headers(request), await request.read(), text, stream, retryable
    )
    try:
        return await request.app[FORWARDER].send(request, out)
    except NoWorker as e:
        return _error(503, str(e))


async def generation(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None  # the worker answers the 400
    return await _forward(request, True, routing_text(request.path, body), is_stream(body))


async def any_worker(request: web.Request) -> web.StreamResponse:
    return await _forward(request, retryable=request.method in ("GET", "HEAD"))


async def health(request: web.Request) -> web.Response:
    workers = request.app[WORKERS]
    if workers.healthy():
        return web.Response(text="OK")
    return _error(503, f"no healthy worker among {len(workers.all)}")


def _worker_view(w) -> dict:
    return {"url": w.url, "healthy": w.healthy, "in_flight": w.in_flight, "sent": w.sent}


async def list_workers(request: web.Request) -> web.Response:
    workers = request.app[WORKERS]
    body = {
        "policy": workers.policy.name,
        "urls": [w.url for w in workers.all],
        "workers": [_worker_view(w) for w in workers.all],
        "retries": request.app[FORWARDER].retries,
    }
    return web.json_response(body)


async def add_worker(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        return _error(400, "add_worker needs ?url=http://host:port")
    workers = request.app[WORKERS]
    try:
        worker = workers.add(url)
    except ValueError as e:
        return _error(400, str(e))
    worker.healthy = False  # in rotation once its /health answers 200
    healthy = await workers.check(request.app[SESSION], worker)
    return web.json_response({"added": worker.url, "healthy": healthy})


async def remove_worker(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if not url:
        return _error(400, "remove_worker needs ?url=http://host:port")
    try:
        worker = request.app[WORKERS].remove(url)
    except UnknownWorker as e:
        return _error(404, str(e.args[0]))
    return web.json_response({"removed": worker.url})


async def _each_worker(request: web.Request, method: str, path: str) -> list[dict]:
    session = request.app[SESSION]
    headers = forwarded_headers(request)

    async def one(worker) -> dict:
        try:
            async with session.request(method, worker.url + path, headers=headers) as resp:
                text = await resp.text()
                try:
                    payload = json.loads(text)
                except json.JSONDecodeError:
                    payload = text
                return {"url": worker.url, "status": resp.status, "body": payload}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return {"url": worker.url, "status": 0, "body": f"{type(e).__name__}: {e}"}

    return list(await asyncio.gather(*(one(w) for w in request.app[WORKERS].healthy())))


async def flush_cache(request: web.Request) -> web.Response:
    replies = await _each_worker(request, "POST", "/flush_cache")
    for reply in replies:
        request.app[WORKERS].policy.forget(reply["url"])
    status = max((r["status"] for r in replies), default=503)
    status = 200 if replies and all(r["status"] == 200 for r in replies) else (status if status >= 400 else 503)
    lines = [f"{r['url']}: {r['status']} {r['body']}" for r in replies] or ["no healthy worker"]
    return web.Response(status=status, text="\n".join(lines))


# Counts that add up over replicas; the settings (model, dtype, ...) are the first replica's.
SUMMED_INFO = (
    "kv_total_tokens",
    "kv_available_tokens",
    "kv_free_tokens",
    "kv_cached_tokens",
    "running_requests",
    "waiting_requests",
    "grammar_queue_requests",
    "in_flight_requests",
    "prompt_tokens",
    "cached_prompt_tokens",
    "evicted_tokens",
    "retractions",
    "forward_passes",
)


async def server_info(request: web.Request) -> web.Response:
    replies = await _each_worker(request, "GET", "/get_server_info")
    infos = [r["body"] for r in replies if r["status"] == 200 and isinstance(r["body"], dict)]
    if not infos:
        return _error(503, "no healthy worker answered /get_server_info")
    body = dict(infos[0])
    for key in SUMMED_INFO:
        if all(isinstance(info.get(key), int) for info in infos):
            body[key] = sum(info[key] for info in infos)
    if isinstance(body.get("prompt_tokens"), int) and isinstance(body.get("cached_prompt_tokens"), int):
        body["cache_hit_rate"] = body["cached_prompt_tokens"] / body["prompt_tokens"] if body["prompt_tokens"] else 0.0
    body["dp_size"] = len(infos)
    body["router"] = {"policy": request.app[WORKERS].policy.name, "retries": request.app[FORWARDER].retries}
    body["workers"] = [{"url": r["url"], "status": r["status"], "server_info": r["body"]} for r in replies]
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    """The router's own series (Prometheus text); each worker's are on its own /metrics."""
    workers, lines = request.app[WORKERS].all, []
    for name, kind, help_text, value in (
        (
            "langrt_router_requests_total",
            "counter",
            "Requests routed to the worker (retries included).",
            lambda w: w.sent,
        ),
        ("langrt_router_in_flight_requests", "gauge", "Requests in flight at the worker.", lambda w: w.in_flight),
        ("langrt_router_worker_healthy", "gauge", "1 while the worker is in rotation.", lambda w: int(w.healthy)),
    ):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{worker="{w.url}"}} {value(w)}' for w in workers]
    lines += [
        "# HELP langrt_router_retries_total Requests sent again after a worker died.",
        "# TYPE langrt_router_retries_total counter",
    ]
    lines.append(f"langrt_router_retries_total {request.app[FORWARDER].retries}")
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
