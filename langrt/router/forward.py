"""Sending one client request to a worker, and again to another when the first dies.

A request is retried only while nothing of its answer has reached the client, and only if it
is idempotent (generation has no effect on a worker but its cache; `/flush_cache` or an unknown
POST are sent once). What counts as the worker dying: the connection refused, reset or closed
before the answer was complete, or a 502/503/504 (a replica whose runtime died answers 503
before it exits). A streamed answer is committed once its first bytes are written: a failure
after that ends the stream with an error event, as a worker's own mid-stream failure does.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from langrt.router.policies import Worker
from langrt.router.workers import WorkerSet

RETRY_STATUSES = frozenset({502, 503, 504})
FORWARDED_HEADERS = ("Authorization", "Content-Type", "Accept")


@dataclass
class Outgoing:
    """What is sent to a worker: method, path with query, headers, body, and routing text."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    text: str = ""
    stream: bool = False
    retryable: bool = True


class WorkerDied(Exception):
    """The worker failed before any of its answer reached the client: try another."""


class NoWorker(Exception):
    pass


class Forwarder:
    def __init__(self, workers: WorkerSet, session: aiohttp.ClientSession, max_attempts: int = 3):
        self.workers = workers
        self.session = session
        self.max_attempts = max_attempts
        self.retries = 0  # requests sent again after a worker died

    async def send(self, request: web.Request, out: Outgoing) -> web.StreamResponse:
        tried: set[str] = set()
        last_error = "no healthy worker"
        attempts = self.max_attempts if out.retryable else 1
        for attempt in range(attempts):
            candidates = self.workers.healthy(excluding=tried)
            if not candidates:
                break
            worker = self.workers.policy.choose(out.text, candidates)
            tried.add(worker.url)
            if attempt > 0:
                self.retries += 1
            try:
                return await self._send_once(request, out, worker)
            except WorkerDied as e:
                last_error = str(e)
        raise NoWorker(f"no worker could serve the request ({len(tried)} tried): {last_error}")

    async def _send_once(self, request: web.Request, out: Outgoing, worker: Worker) -> web.StreamResponse:
        worker.in_flight += 1
        worker.sent += 1
        try:
            async with self.session.request(
                out.method, worker.url + out.path, headers=out.headers, data=out.body
            ) as upstream:
                if out.stream and upstream.status == 200:
                    return await self._relay_stream(request, upstream, worker)
                body = await upstream.read()
                if upstream.status in RETRY_STATUSES and out.retryable:
                    raise WorkerDied(f"{worker.url} answered {upstream.status}: {body[:200].decode(errors='replace')}")
                return _plain_response(upstream, body)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as e:
            self.workers.mark_down(worker, f"{type(e).__name__}: {e}")
            raise WorkerDied(f"{worker.url}: {type(e).__name__}: {e}") from e
        finally:
            worker.in_flight -= 1

    async def _relay_stream(self, request: web.Request, upstream, worker: Worker) -> web.StreamResponse:
        first = await upstream.content.readany()  # a worker that dies now has sent nothing on
        if not first:
            raise WorkerDied(f"{worker.url} closed the stream before its first event")
        response = web.StreamResponse(
            status=200, headers={"Content-Type": upstream.headers.get("Content-Type", "text/event-stream")}
        )
        await response.prepare(request)
        await response.write(first)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as e:
            self.workers.mark_down(worker, f"{type(e).__name__} mid-stream")
            message = f"worker {worker.url} failed mid-stream ({type(e).__name__}); the answer is incomplete"
            await response.write(f"data: {json.dumps({'error': {'message': message}})}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response


def _plain_response(upstream, body: bytes) -> web.Response:
    headers = {"Content-Type": upstream.headers.get("Content-Type", "application/json")}
    return web.Response(status=upstream.status, body=body, headers=headers)


def forwarded_headers(request: web.Request) -> dict[str, str]:
    return {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
