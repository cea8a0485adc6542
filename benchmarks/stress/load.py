"""Load, disconnects and KV pressure against a running server (benchmarks/stress/server.py)."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import time

import aiohttp

from benchmarks.stress.client import COMPLETE, RequestSpec, percentiles, send, send_with_retry, tally
from benchmarks.stress.server import Server
from benchmarks.stress.workload import long_request, mixed


def session(concurrency: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 8, force_close=False))


async def run_many(
    server: Server, specs: list[RequestSpec], concurrency: int, retry_for_s: float = 600.0, timeout_s: float = 120.0
):
    """Send `specs` with at most `concurrency` in flight, retrying 503s; (outcomes, wall seconds)."""
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random(0)
    async with session(concurrency) as s:

        async def one(spec):
            async with gate:
                return await send_with_retry(s, server.url, spec, server.headers, retry_for_s, timeout_s, rng)

        start = time.monotonic()
        outcomes = await asyncio.gather(*(one(spec) for spec in specs))
    return outcomes, time.monotonic() - start


def kv_check(server: Server, timeout_s: float = 60.0) -> dict:
    """Once idle: every KV slot free or evictable (no leak), and a plain request still served."""
    info = server.wait_idle(timeout_s)
    status, out = server.post(
        "/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    )
    return {
        "kv_total_tokens": info["kv_total_tokens"],
        "kv_available_tokens": info["kv_available_tokens"],
        "kv_leaked_tokens": info["kv_total_tokens"] - info["kv_available_tokens"],
        "retractions": info["retractions"],
        "served_after": status == 200 and out["meta_info"]["completion_tokens"] == 2,
    }


# ---- 1. load --------------------------------------------------------------------------------


async def run_load(server: Server, requests: int = 1000, concurrency: int = 64, seed: int = 0) -> dict:
    """`requests` mixed requests at `concurrency`; every one must complete, 503s retried."""
    specs = mixed(requests, seed)
    outcomes, wall = await run_many(server, specs, concurrency)
    result = tally(outcomes)
    result.update(
        concurrency=concurrency,
        wall_s=round(wall, 2),
        requests_per_s=round(requests / wall, 2),
        attempt_latency_s=percentiles([o.latency_s for o in outcomes if o.end == COMPLETE]),
        **kv_check(server),
    )
    return result


# ---- 2. disconnects -------------------------------------------------------------------------


async def drop_client(server: Server, spec: RequestSpec, events: int, hard: bool, delay_s: float) -> str:
    """Send `spec` on a raw socket and go away: after `events` SSE events, or after `delay_s`
    when `events` is 0; with an RST when `hard`, else a FIN. Returns how far it got."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    payload = json.dumps(spec.body).encode()
    head = [f"POST {spec.path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}", "Content-Type: application/json",
            f"Content-Length: {len(payload)}", *[f"{k}: {v}" for k, v in server.headers.items()]]  # fmt: skip
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    await writer.drain()
    got = "sent"
    try:
        if events:
            status = (await asyncio.wait_for(reader.readline(), 30)).decode().split(" ")[1]
            got = f"status {status}"
            seen = 0
            while status == "200" and seen < events:  # (a 503 has no events to wait for)
                line = await asyncio.wait_for(reader.readline(), 30)
                if not line:
                    break
                seen += line.startswith(b"data: ")
            got += f", {seen} events"
        else:
            await asyncio.sleep(delay_s)
    except asyncio.TimeoutError:
        got += ", gave up waiting"
    finally:
        if hard:  # RST instead of FIN
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()
    return got


async def probe_latency(server: Server, stop: asyncio.Event, interval_s: float = 0.1) -> list[float]:
    """Short plain requests one after another until `stop`: the latency others see meanwhile."""
    body = {"text": "Count: 1, 2, 3,", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    spec = RequestSpec("/generate", body, "probe")
    latencies = []
    async with session(2) as s:
        while not stop.is_set():
            outcome = await send(s, server.url, spec, server.headers, timeout_s=60)
            assert outcome.end == COMPLETE, f"a probe request failed: {outcome.end} {outcome.status} {outcome.detail}"
            latencies.append(outcome.latency_s)
            await asyncio.sleep(interval_s)
    return latencies


async def run_disconnects(
    server: Server, clients: int = 100, concurrency: int = 32, new_tokens: int = 48, seed: int = 0
) -> dict:
    """`clients` that go away mid-request (streams after a few events, waits after a moment,
    constrained requests still compiling), FIN or RST, while probes measure others' latency;
    then the pool must be whole and the server serving."""
    rng = random.Random(seed)
    baseline = await _probe_for(server, 2.0)
    aborted_before = server.finished_counts().get("abort", 0)
    stop = asyncio.Event()
    probe = asyncio.create_task(probe_latency(server, stop))
    gate = asyncio.Semaphore(concurrency)
    kinds: dict[str, int] = {}

    async def one(i: int):
        roll = rng.random()
        if roll < 0.6:
            kind, spec, events, delay = "stream", long_request(rng, 20, new_tokens, stream=True), rng.randint(1, 4), 0.0
            if rng.random() < 0.3:
                spec = RequestSpec("/v1/chat/completions", {"messages": [{"role": "user", "content": f"story {i}"}],
                                   "max_tokens": new_tokens, "ignore_eos": True, "stream": True}, "stream")  # fmt: skip
        elif roll < 0.85:
            kind, spec, events, delay = "wait", long_request(rng, 20, new_tokens), 0, rng.uniform(0.05, 0.6)
        else:  # a fresh grammar each: the client leaves while it compiles or decodes
            body = {
                "text": f"Pick {i}:",
                "sampling_params": {"max_new_tokens": new_tokens, "regex": f"(item{i}|[a-z]{{{8 + i % 5}}})+"},
            }
            kind, spec, events, delay = (
                "constrained",
                RequestSpec("/generate", body, "constrained"),
                0,
                rng.uniform(0.0, 0.3),
            )
        kinds[kind] = kinds.get(kind, 0) + 1
        async with gate:
            return await drop_client(server, spec, events, hard=rng.random() < 0.5, delay_s=delay)

    start = time.monotonic()
    reached = await asyncio.gather(*(one(i) for i in range(clients)))
    dropped_at = time.monotonic()
    stop.set()
    during = await probe
    info = await asyncio.to_thread(kv_check, server)
    return {
        "clients": clients,
        "aborted_by_server": server.finished_counts().get("abort", 0) - aborted_before,
        "kinds": kinds,
        "reached": {r: reached.count(r) for r in sorted(set(reached))},
        "drop_phase_s": round(dropped_at - start, 2),
        "idle_after_s": round(time.monotonic() - dropped_at, 2),
        "probe_latency_before_s": percentiles(baseline),
        "probe_latency_during_s": percentiles(during),
        **info,
    }


async def _probe_for(server: Server, seconds: float) -> list[float]:
    stop = asyncio.Event()
    task = asyncio.create_task(probe_latency(server, stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await task


# ---- 3. KV pressure -------------------------------------------------------------------------


async def run_kv_pressure(
    server: Server, requests: int = 32, prompt_words: int = 40, new_tokens: int = 128, timeout_s: float = 600
) -> dict:
    """Many long requests at once on a small pool: all must finish (retraction, not deadlock),
    each with exactly `new_tokens` tokens, within `timeout_s`."""
    rng = random.Random(1)
    specs = [long_request(rng, prompt_words, new_tokens) for _ in range(requests)]
    before = server.info()["retractions"]
    outcomes, wall = await run_many(server, specs, concurrency=requests, timeout_s=timeout_s)
    result = tally(outcomes)
    lengths = sorted({o.finish for o in outcomes})
    result.update(wall_s=round(wall, 2), finishes=lengths, **kv_check(server))
    result["retractions"] -= before
    return result
