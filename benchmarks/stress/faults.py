"""Faults: SIGTERM during load, a child process killed. Each run starts its own server (the
fault ends it) and checks what it leaves behind: ipc files and processes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

from benchmarks.stress.client import ABORTED, CLOSED, COMPLETE, REFUSED, RequestSpec, percentiles, send, tally
from benchmarks.stress.load import session
from benchmarks.stress.server import Server, alive
from benchmarks.stress.workload import long_request

# How an in-flight request may end when the server stops: finished just before, an abort
# status, a 503, or the connection closed. Anything else (a hang, a broken answer) is lost.
SETTLED_ON_STOP = (COMPLETE, ABORTED, REFUSED, CLOSED)


def in_flight_specs(count: int, new_tokens: int, seed: int = 0) -> list[RequestSpec]:
    """Long requests of every shape, to be in flight when the fault comes."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            specs.append(long_request(rng, 20, new_tokens, stream=True))
        elif kind == 1:
            specs.append(long_request(rng, 20, new_tokens))
        elif kind == 2:
            body = {
                "messages": [{"role": "user", "content": f"Tell story {i}"}],
                "max_tokens": new_tokens,
                "ignore_eos": True,
                "stream": i % 8 == 2,
            }
            specs.append(RequestSpec("/v1/chat/completions", body, "stream" if body["stream"] else "plain"))
        else:
            body = {"text": f"Digits {i}:", "sampling_params": {"max_new_tokens": new_tokens, "regex": "[0-9]{200}"}}
            specs.append(RequestSpec("/generate", body, "constrained"))
    return specs


async def _wait_in_flight(server: Server, s, at_least: int, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with s.get(server.url + "/get_server_info", headers=server.headers) as resp:
            info = await resp.json()
        if info["in_flight_requests"] >= at_least and info["running_requests"] >= 1:
            return info["in_flight_requests"]
        await asyncio.sleep(0.05)
    raise TimeoutError("the requests did not get in flight")


# Children notice their parent's exit by polling (every 0.5 s): on a loaded machine one can
# outlive the server by a moment. Left behind means still alive after this grace.
LEFTOVER_GRACE_S = 5.0


def _leftovers(server: Server, descendants: list[int]) -> dict:
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while alive(descendants) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {
        "ipc_directory_removed": not Path(server.ipc_directory).exists(),
        "processes_left": alive(descendants),
    }


async def run_sigterm(flags: list[str], requests: int = 24, new_tokens: int = 200, late: int = 8) -> dict:
    """SIGTERM while `requests` long requests are in flight (and `late` more arrive just after):
    each must end with an abort status, a 503 or a closed connection, never hang; the server
    exits 0 and removes its ipc files and child processes."""
    server = Server(*flags)
    try:
        specs = in_flight_specs(requests, new_tokens)
        async with session(requests + late) as s:
            tasks = [asyncio.create_task(send(s, server.url, spec, server.headers, timeout_s=60)) for spec in specs]
            in_flight = await _wait_in_flight(server, s, requests)
            descendants = server.descendants()
            signalled = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.05)
            late_specs = in_flight_specs(late, 4, seed=1)
            late_tasks = [
                asyncio.create_task(send(s, server.url, spec, server.headers, timeout_s=60)) for spec in late_specs
            ]
            outcomes = await asyncio.gather(*tasks)
            late_outcomes = await asyncio.gather(*late_tasks)
        code = await asyncio.to_thread(server.process.wait, 60)
        exited = time.monotonic() - signalled
    finally:
        server.stop()
    ends_after = [o.started + o.latency_s - signalled for o in outcomes]
    result = tally(outcomes, settled=SETTLED_ON_STOP)
    result.update(
        in_flight_at_signal=in_flight,
        late_arrivals=tally(late_outcomes, settled=SETTLED_ON_STOP),
        exit_code=code,
        exit_after_signal_s=round(exited, 2),
        end_after_signal_s=percentiles(ends_after),
        abort_messages=sorted({o.detail for o in outcomes if o.end == ABORTED and o.detail})[:5],
        **_leftovers(server, descendants),
    )
    return result


async def run_kill_child(
    flags: list[str], child: str = "detokenizer", requests: int = 8, new_tokens: int = 200
) -> dict:
    """SIGKILL the scheduler or the detokenizer while requests run: /health says 503, the
    server exits non-zero within 5 s, in-flight requests end (503 or closed), nothing is left.
    child="main" kills the HTTP process itself: its children must follow and remove the ipc
    directory; child="tp-worker" kills tensor-parallel rank 1 (a server with --tp-size 2)."""
    server = Server(*flags)
    try:
        specs = in_flight_specs(requests, new_tokens)
        health: dict[str, int] = {}
        first_503 = None
        async with session(requests + 2) as s:
            tasks = [asyncio.create_task(send(s, server.url, spec, server.headers, timeout_s=60)) for spec in specs]
            await _wait_in_flight(server, s, requests)
            descendants = server.descendants()
            pids = {
                "scheduler": server.scheduler_pid,
                "detokenizer": server.detokenizer_pid,
                "main": server.process.pid,
            }
            pid = server.tp_worker_pids[0] if child == "tp-worker" else pids[child]
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            while server.process.poll() is None and time.monotonic() - killed < 15:
                try:
                    async with s.get(server.url + "/health") as resp:
                        status = resp.status
                except Exception:  # noqa: BLE001 - the server went away: that is the point
                    status = 0
                health[str(status)] = health.get(str(status), 0) + 1
                if status == 503 and first_503 is None:
                    first_503 = time.monotonic() - killed
                await asyncio.sleep(0.05)
            outcomes = await asyncio.gather(*tasks)
        code = await asyncio.to_thread(server.process.wait, 30)
        exited = time.monotonic() - killed
        while (alive(descendants) or Path(server.ipc_directory).exists()) and time.monotonic() - killed < 10:
            await asyncio.sleep(0.05)
        cleaned = time.monotonic() - killed
    finally:
        server.stop()
    ends_after = [o.started + o.latency_s - killed for o in outcomes]
    result = tally(outcomes, settled=SETTLED_ON_STOP)
    result.update(
        child=child,
        cleaned_up_after_kill_s=round(cleaned, 2),
        health_statuses=health,
        first_503_after_s=None if first_503 is None else round(first_503, 3),
        exit_code=code,
        exit_after_kill_s=round(exited, 2),
        end_after_kill_s=percentiles(ends_after),
        **_leftovers(server, descendants),
    )
    return result


def grammar_worker_pid(server: Server) -> int | None:
    for pid in server.descendants():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"langrt.constrained.byte_dfa" in cmdline:
            return pid
    return None


async def run_kill_grammar_worker(server: Server) -> dict:
    """SIGKILL the grammar compiler while it works on a slow regex: that request fails alone (a
    400), and the next constrained request is served by a new worker."""
    ok = {"text": "Number:", "sampling_params": {"max_new_tokens": 3, "regex": "[0-9]{3}"}}
    assert server.post("/generate", ok)[0] == 200  # starts the worker
    slow = {"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": f"(a|b)*a(a|b){{{random.randint(26, 30)}}}"}}
    async with session(2) as s:
        task = asyncio.create_task(s.post(server.url + "/generate", json=slow, headers=server.headers))
        deadline = time.monotonic() + 20
        while (pid := grammar_worker_pid(server)) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # into the compile
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        resp = await task
        payload = await resp.json()
        slow_status, took = resp.status, time.monotonic() - killed
    after = server.post("/generate", {**ok, "sampling_params": {**ok["sampling_params"], "regex": "[0-9]{4}"}})
    return {
        "killed_worker": pid,
        "slow_request_status": slow_status,
        "slow_request_message": payload.get("error", {}).get("message"),
        "slow_request_end_after_kill_s": round(took, 3),
        "next_constrained_status": after[0],
        "new_worker": grammar_worker_pid(server),
        "healthy": server.get("/health")[0] == 200,
    }
