"""Hostile input: fuzzed bodies, grammars built to explode, and the security checks."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

import aiohttp

from benchmarks.stress.client import percentiles
from benchmarks.stress.fuzz import describe, encode
from benchmarks.stress.load import probe_latency, session
from benchmarks.stress.server import Server

# ---- 4. fuzzing -----------------------------------------------------------------------------


async def fuzz_case(
    s: aiohttp.ClientSession, server: Server, path: str, body, timeout_s: float = 60.0
) -> tuple[int, str, int]:
    """Send one fuzzed body; (status, problem or '', retries): see `judge`. A 503 for a full
    queue is retried (it is the answer the API promises under load, not a failure)."""
    for retry in range(30):
        status, problem = await _fuzz_attempt(s, server, path, body, timeout_s)
        if not (status == 503 and "overloaded" in problem):
            return status, problem, retry
        await asyncio.sleep(0.1 * (retry + 1))
    return status, problem, retry


async def _fuzz_attempt(s: aiohttp.ClientSession, server: Server, path: str, body, timeout_s: float) -> tuple[int, str]:
    headers = {**server.headers, "Content-Type": "application/json"}

    async def attempt():
        async with s.post(server.url + path, data=encode(body), headers=headers) as resp:
            raw = await resp.read()
            return resp.status, resp.headers.get("Content-Type", ""), raw

    try:
        status, content_type, raw = await asyncio.wait_for(attempt(), timeout_s)
    except asyncio.TimeoutError:
        return 0, f"no answer within {timeout_s} s"
    except aiohttp.ClientError as e:
        return 0, f"connection failed: {type(e).__name__}: {e}"
    return judge(status, content_type, raw)


def fuzz_case_sync(server: Server, path: str, body, timeout_s: float = 60.0) -> tuple[int, str]:
    """`fuzz_case` on a plain blocking connection (for hypothesis tests, one case at a time)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout_s)
    try:
        conn.request("POST", path, encode(body), {**server.headers, "Content-Type": "application/json"})
        resp = conn.getresponse()
        return judge(resp.status, resp.getheader("Content-Type", ""), resp.read())
    except TimeoutError:
        return 0, f"no answer within {timeout_s} s"
    except (ConnectionError, http.client.HTTPException) as e:
        return 0, f"connection failed: {type(e).__name__}: {e}"
    finally:
        conn.close()


def judge(status: int, content_type: str, raw: bytes) -> tuple[int, str]:
    """(status, problem or ''). A problem is a 5xx (also as an error event inside a stream),
    an error without the API's shape, a stream without [DONE], or a 200 that is not JSON."""
    if status >= 500:
        return status, raw.decode(errors="replace")[:300]
    if status >= 400:
        try:
            error = json.loads(raw).get("error", {})
        except (json.JSONDecodeError, AttributeError):
            error = {}
        ok = isinstance(error.get("message"), str) and error.get("code") == status
        return status, "" if ok else f"error without the API's shape: {raw[:200]!r}"
    if content_type.startswith("text/event-stream"):
        events = [chunk[6:] for chunk in raw.decode().split("\n\n") if chunk.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return status, f"stream without [DONE]: {raw[-200:]!r}"
        for event in events[:-1]:
            error = json.loads(event).get("error")
            if error is not None and error.get("code", 0) >= 500:
                return error["code"], f"error event in the stream: {event[:300]}"
        return status, ""
    try:
        json.loads(raw)
    except json.JSONDecodeError:
        return status, f"a {status} answer that is not JSON: {raw[:200]!r}"
    return status, ""


async def run_fuzz(server: Server, cases: list[tuple[str, object]], concurrency: int = 8) -> dict:
    """Send drawn cases concurrently; count statuses; collect every problem (with its body)."""
    gate = asyncio.Semaphore(concurrency)
    statuses: dict[str, int] = {}
    problems = []
    timings = []
    retried = [0]
    async with session(concurrency) as s:

        async def one(path, body):
            async with gate:
                start = time.monotonic()
                status, problem, retries = await fuzz_case(s, server, path, body)
                took = time.monotonic() - start
            retried[0] += retries > 0
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            timings.append((took, status, f"{path} {describe(body, 300)}"))
            if problem:
                problems.append({"path": path, "status": status, "problem": problem, "body": describe(body)})

        start = time.monotonic()
        await asyncio.gather(*(one(path, body) for path, body in cases))
    healthy = server.get("/health")[0] == 200
    return {
        "cases": len(cases),
        "wall_s": round(time.monotonic() - start, 2),
        "statuses": dict(sorted(statuses.items())),
        "http_5xx": sum(n for code, n in statuses.items() if int(code) >= 500),
        "problems": problems[:50],
        "problem_count": len(problems),
        "retried_after_503": retried[0],
        "server_tracebacks": server.tracebacks(),
        "case_seconds": percentiles([t for t, _, _ in timings]),
        "slowest_cases": [
            {"seconds": round(t, 3), "status": st, "case": c} for t, st, c in sorted(timings, key=lambda x: x[0])[-5:]
        ],
        "healthy_after": healthy,
    }


def draw_cases(count: int, seed: int) -> list[tuple[str, object]]:
    """`count` fuzz cases drawn by hypothesis (drawn up front, so they can be sent concurrently)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    from benchmarks.stress.fuzz import request_bodies

    cases = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(request_bodies())
    def collect(case):
        cases.append(case)

    collect()
    return cases


# ---- 5. hostile grammars --------------------------------------------------------------------

# Each must fail its own request with a 400: an automaton that explodes (compile time limit),
# a regex or schema past the size limits, a schema whose regex is too large.
HOSTILE_GRAMMARS = {
    "exploding_regex": {"regex": "(a|b)*a(a|b){24}"},
    "exploding_regex_hex": {"regex": "[0-9a-f]*0[0-9a-f]{20}"},
    "nested_repeats": {"regex": "((((a{1,9}){1,9}){1,9}){1,9}){1,9}"},
    "huge_regex": {"regex": "a" * 250_000},
    "huge_schema_enum": {"json_schema": json.dumps({"enum": [f"value-{i}" for i in range(40_000)]})},
    "many_optional_properties": {
        "json_schema": json.dumps({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(1500)}})
    },
    "schema_past_size_limit": {"json_schema": json.dumps({"type": "object", "description": "x" * 1_100_000})},
    "choices_past_size_limit": {"choices": [f"choice number {i}" for i in range(80_000)]},
    "deeply_nested_schema": {"json_schema": "[" * 5000 + "]" * 5000},
    "stop_regex_backtracking": None,  # built below: its output is forced to x's
}


def hostile_body(name: str) -> dict:
    if name == "stop_regex_backtracking":  # not a 400: must end (abort) fast instead of hanging
        params = {"regex": "x{40}", "stop_regex": ["(x|x)+y"], "max_new_tokens": 40}
    else:
        params = {**HOSTILE_GRAMMARS[name], "max_new_tokens": 8}
    return {"text": "Write:", "sampling_params": params}


# A hostile request refused as overloaded (503 with Retry-After) is sent again for this long.
RETRY_FOR_S = 60.0


async def run_hostile_grammars(server: Server, rounds: int = 1, baseline_s: float = 4.0, names=None) -> dict:
    """Send each hostile grammar (`rounds` times, concurrently) while probes measure the latency
    of plain requests, and compare with the probes' latency before."""
    names = list(names or HOSTILE_GRAMMARS)
    baseline = await _probe(server, baseline_s)
    stop = asyncio.Event()
    probe = asyncio.create_task(probe_latency(server, stop))
    results = {}
    async with session(16) as s:

        async def one(name: str):
            """The final outcome: a 503 that says when to retry (every grammar check busy in
            the burst) is retried then, as a client should; `seconds` is the last attempt's."""
            first, retried = time.monotonic(), 0
            while True:
                start = time.monotonic()
                async with s.post(server.url + "/generate", json=hostile_body(name), headers=server.headers) as resp:
                    payload = await resp.json(content_type=None)
                    retry_after = resp.headers.get("Retry-After")
                took = time.monotonic() - start
                if resp.status != 503 or retry_after is None or time.monotonic() - first > RETRY_FOR_S:
                    break
                retried += 1
                await asyncio.sleep(float(retry_after))
            message = payload["error"]["message"] if "error" in payload else payload["meta_info"]["finish_reason"]
            return name, {
                "status": resp.status,
                "seconds": round(took, 3),
                "message": str(message)[:200],
                "retried_after_503": retried,
            }

        start = time.monotonic()
        for name, outcome in await asyncio.gather(*(one(n) for n in names for _ in range(rounds))):
            results.setdefault(name, []).append(outcome)
        hostile_s = time.monotonic() - start
    stop.set()
    during = await probe
    return {
        "grammars": {name: outs[0] | {"statuses": [o["status"] for o in outs]} for name, outs in results.items()},
        "hostile_phase_s": round(hostile_s, 2),
        "probe_latency_before_s": percentiles(baseline),
        "probe_latency_during_s": percentiles(during),
        "healthy_after": server.get("/health")[0] == 200,
    }


async def _probe(server: Server, seconds: float) -> list[float]:
    stop = asyncio.Event()
    task = asyncio.create_task(probe_latency(server, stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await task


# ---- 7. security ----------------------------------------------------------------------------

OPEN_ROUTES = {"/health", "/health_generate"}


def app_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the HTTP server registers, from its own route table."""
    from aiohttp import web

    from langrt.entrypoints import native_api, openai_api

    app = web.Application()
    native_api.add_routes(app)
    openai_api.add_routes(app)
    return sorted({(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"})


def run_security(server: Server) -> dict:
    """API key on every route but /health; body limit; private ipc directory; loopback bind;
    nothing read or written at paths a client names."""
    routes = app_routes()
    unauthorized = {}
    for method, path in routes:
        body = b"{}" if method == "POST" else None
        for label, headers in {"none": {}, "wrong": {"Authorization": "Bearer wrong"}, "prefix": {"Authorization": server.headers["Authorization"][:-1]},
                               "longer": {"Authorization": server.headers["Authorization"] + "x"}, "no_bearer": {"Authorization": server.headers["Authorization"][7:]}}.items():  # fmt: skip
            status = _raw(server, method, path, body, headers)
            expected = 200 if path in OPEN_ROUTES else 401
            if status != expected:
                unauthorized[f"{method} {path} ({label} key)"] = status
    keyed = {f"{m} {p}": server.request(m, p, b"{}" if m == "POST" else None)[0] for m, p in routes}
    limit = server.info()["max_request_bytes"]
    too_big = {p: server.post(p, b"{" + b" " * (limit + 10) + b"}")[0] for m, p in routes if m == "POST"}
    too_big["/generate (chunked, no Content-Length)"] = _chunked_post(server, "/generate", limit + 10)
    canary = Path(f"/tmp/langrt-canary-{os.getpid()}-{random.randrange(10**9)}")
    file_probes = _file_probes(server, canary)
    return {
        "routes": [f"{m} {p}" for m, p in routes],
        "auth_failures": unauthorized,  # must be empty
        "with_key_statuses": keyed,  # none may be 401
        "body_limit_bytes": limit,
        "oversized_statuses": too_big,  # all 413
        "ipc_directory_mode": oct(os.stat(server.ipc_directory).st_mode & 0o777),
        "ipc_directory_owner_is_us": os.stat(server.ipc_directory).st_uid == os.getuid(),
        "listening_addresses": listening_addresses(server.port),  # only 127.0.0.1
        "file_probes": file_probes,
        "canary_created": canary.exists(),
    }


def _raw(server: Server, method: str, path: str, body, headers: dict) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def _chunked_post(server: Server, path: str, size: int) -> int:
    import http.client

    def body():
        yield b'{"text": "'
        for _ in range(size // 65536 + 1):
            yield b"x" * 65536
        yield b'"}'

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request("POST", path, body(), {**server.headers, "Content-Type": "application/json"}, encode_chunked=True)
        return conn.getresponse().status
    except (ConnectionError, http.client.HTTPException):
        return 0  # closed on us mid-upload
    finally:
        conn.close()


def _file_probes(server: Server, canary: Path) -> dict:
    """Fields that name files in other servers (or look like paths) must neither read nor write
    them: a 400, or an answer that does not contain the file."""
    secret = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else "localhost"
    bodies = {
        "schema_ref_file": {
            "text": "x",
            "sampling_params": {"max_new_tokens": 2, "json_schema": json.dumps({"$ref": "file:///etc/hostname"})},
        },
        "schema_ref_path": {
            "text": "x",
            "sampling_params": {"max_new_tokens": 2, "json_schema": json.dumps({"$ref": "/etc/hostname"})},
        },
        "image_data": {"text": "x", "image_data": "file:///etc/hostname"},
        "lora_path": {"text": "x", "lora_path": str(canary)},
        "custom_logit_processor": {"text": "x", "custom_logit_processor": "gASVAAAA"},
        "rid_path": {"text": "x", "rid": str(canary), "sampling_params": {"max_new_tokens": 1}},
        "chat_template_field": {
            "messages": [{"role": "user", "content": "x"}],
            "chat_template": str(canary),
            "max_tokens": 1,
        },
        "model_path": {"model": str(canary), "prompt": "x", "max_tokens": 1},
    }
    out = {}
    for name, body in bodies.items():
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions" if "prompt" in body else "/generate"
        status, payload = server.post(path, body)
        out[name] = {"status": status, "leaked": secret in json.dumps(payload)}
    return out


def listening_addresses(port: int) -> list[str]:
    """Local addresses with a TCP socket listening on `port` (from /proc/net/tcp{,6})."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.append(_address(address, width))
    return found


def _address(hex_address: str, width: int) -> str:
    import ipaddress

    raw = bytes.fromhex(hex_address)
    if width == 8:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # host-order 32-bit words
    return str(ipaddress.IPv6Address(words))
