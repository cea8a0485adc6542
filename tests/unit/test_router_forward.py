"""The router's forwarding against fake workers in this process (no model): retries when a
worker dies before answering, none once a stream has begun, none for non-idempotent routes."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from langrt.router.app import RouterArgs
from langrt.router.server import create_app
from langrt.router.workers import HealthSettings


def _fake_worker(behaviour: str, hits: list) -> web.Application:
    async def health(request):
        return web.Response(text="OK")

    async def generate(request):
        hits.append(behaviour)
        body = await request.json()
        if behaviour == "reset":  # dies before any byte of its answer
            request.transport.close()
            await asyncio.sleep(0.1)
            return web.Response()
        if behaviour == "503":
            return web.json_response({"error": {"message": "the runtime died"}}, status=503)
        if not body.get("stream"):
            return web.json_response({"text": "ok from " + behaviour})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"text": "first"}\n\n')
        if behaviour == "dies_mid_stream":
            await asyncio.sleep(0.05)
            request.transport.close()
            return response
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    app.router.add_post("/flush_cache", generate)
    app.router.add_post("/other", generate)
    return app


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def _with_router(behaviours: list[str], policy: str, scenario, api_key=None):
    hits: list = []
    servers = [await _serve(_fake_worker(b, hits)) for b in behaviours]
    args = RouterArgs(tuple(url for _, url in servers), policy, health=HealthSettings(interval_s=60), api_key=api_key)
    router, url = await _serve(create_app(args))
    try:
        async with aiohttp.ClientSession() as client:
            return await scenario(client, url, hits)
    finally:
        for runner, _ in [(router, url), *servers]:
            await runner.cleanup()


def test_a_reset_or_503_before_the_answer_is_retried_on_another_worker():
    async def scenario(client, url, hits):
        statuses, texts = [], []
        for _ in range(4):
            async with client.post(url + "/generate", json={"text": "hi"}) as resp:
                statuses.append(resp.status)
                texts.append((await resp.json())["text"])
        async with client.get(url + "/list_workers") as resp:
            listed = await resp.json()
        async with client.get(url + "/metrics") as resp:
            listed["metrics"] = await resp.text()
        return statuses, texts, hits, listed

    statuses, texts, hits, listed = asyncio.run(_with_router(["reset", "503", "fine"], "round_robin", scenario))
    assert statuses == [200] * 4 and set(texts) == {"ok from fine"}
    assert hits.count("reset") == 1, "the worker that reset is out of rotation after one failure"
    assert listed["retries"] >= 2
    assert [w["healthy"] for w in listed["workers"]] == [False, True, True]
    healthy = [l for l in listed["metrics"].splitlines() if l.startswith("langrt_router_worker_healthy{")]
    assert [l.rsplit(" ", 1)[1] for l in healthy] == ["0", "1", "1"]
    assert f"langrt_router_retries_total {listed['retries']}" in listed["metrics"]


def test_a_stream_that_began_is_ended_with_an_error_not_resent():
    async def scenario(client, url, hits):
        async with client.post(url + "/generate", json={"text": "hi", "stream": True}) as resp:
            raw = (await resp.read()).decode()
        return resp.status, raw, hits

    status, raw, hits = asyncio.run(_with_router(["dies_mid_stream", "fine"], "round_robin", scenario))
    events = [line[len("data: ") :] for line in raw.splitlines() if line.startswith("data: ")]
    assert status == 200 and json.loads(events[0]) == {"text": "first"}
    assert "failed mid-stream" in json.loads(events[1])["error"]["message"] and events[-1] == "[DONE]"
    assert hits == ["dies_mid_stream"]


def test_a_non_idempotent_post_is_sent_once():
    async def scenario(client, url, hits):
        async with client.post(url + "/other", json={}) as resp:
            return resp.status, hits

    status, hits = asyncio.run(_with_router(["503", "fine"], "round_robin", scenario))
    assert status == 503 and hits == ["503"]


def test_no_healthy_worker_is_a_503_naming_the_cause():
    async def scenario(client, url, hits):
        async with client.post(url + "/generate", json={"text": "hi"}) as resp:
            return resp.status, await resp.json()

    status, body = asyncio.run(_with_router(["reset", "reset"], "cache_aware", scenario))
    assert status == 503 and "no worker could serve the request (2 tried)" in body["error"]["message"]


def test_with_an_api_key_only_health_is_open():
    async def scenario(client, url, hits):
        statuses = []
        for path, headers in (("/health", {}), ("/list_workers", {}), ("/list_workers", {"Authorization": "Bearer k"})):
            async with client.get(url + path, headers=headers) as resp:
                statuses.append(resp.status)
        async with client.post(
            url + "/add_worker?url=http://127.0.0.1:9", headers={"Authorization": "Bearer x"}
        ) as resp:
            statuses.append(resp.status)
        return statuses, hits

    statuses, hits = asyncio.run(_with_router(["fine"], "cache_aware", scenario, api_key="k"))
    assert statuses == [200, 401, 200, 401] and hits == []
