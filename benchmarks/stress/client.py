"""The stress runs' HTTP client: send one request (plain or SSE), classify how it ended, retry
what a 503 refused, and sum outcomes into the figures a results file reports."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field

import aiohttp

# How a request ended, from the client's side.
COMPLETE = "complete"  # a full answer with a stop/length finish
ABORTED = "aborted"  # a finish reason of type abort (or an error event naming the shutdown)
REFUSED = "refused"  # an HTTP error status (4xx/5xx) with the JSON error shape
CLOSED = "closed"  # the connection closed or reset before a full answer
TIMED_OUT = "timed_out"  # no end within the client's limit: a hang
MALFORMED = "malformed"  # a 200 whose body breaks the API's contract


@dataclass
class RequestSpec:
    path: str
    body: dict
    kind: str  # plain | stream | constrained (for reports)
    check: str | None = None  # regex a complete output must fully match when it stopped by itself

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


@dataclass
class Outcome:
    spec: RequestSpec
    end: str
    status: int = 0
    latency_s: float = 0.0  # of the last attempt
    total_s: float = 0.0  # from the first attempt's start to the end, retries included
    attempts: int = 1
    started: float = 0.0  # time.monotonic() of the first attempt
    finish: str | None = None  # stop | length | abort
    error_code: int | None = None  # the code of an error event inside a 200 stream
    detail: str = ""
    texts: list[str] = field(default_factory=list)

    @property
    def is_5xx(self) -> bool:
        return self.status >= 500 or (self.error_code or 0) >= 500


async def send(
    session: aiohttp.ClientSession, url: str, spec: RequestSpec, headers: dict, timeout_s: float = 120.0
) -> Outcome:
    """One attempt."""
    start = time.monotonic()
    outcome = Outcome(spec, TIMED_OUT, started=start)

    async def attempt():
        async with session.post(url + spec.path, json=spec.body, headers=headers) as resp:
            outcome.status = resp.status
            if resp.status != 200:
                await _read_error(resp, outcome)
            elif spec.stream:
                await _read_stream(resp, outcome)
            else:
                _read_answer(await resp.json(content_type=None), outcome)

    try:
        await asyncio.wait_for(attempt(), timeout_s)
    except asyncio.TimeoutError:
        outcome.end, outcome.detail = TIMED_OUT, f"no end within {timeout_s} s"
    except (aiohttp.ClientError, ConnectionError) as e:
        outcome.end, outcome.detail = CLOSED, f"{type(e).__name__}: {e}"
    except (json.JSONDecodeError, KeyError, TypeError, IndexError, ValueError) as e:
        outcome.end, outcome.detail = MALFORMED, f"{type(e).__name__}: {e}"
    outcome.latency_s = outcome.total_s = time.monotonic() - start
    if outcome.end == COMPLETE and spec.check and outcome.finish == "stop":
        if not all(re.fullmatch(spec.check, t) for t in outcome.texts):
            outcome.end, outcome.detail = MALFORMED, f"output {outcome.texts!r} does not match {spec.check!r}"
    return outcome


async def send_with_retry(
    session,
    url: str,
    spec: RequestSpec,
    headers: dict,
    retry_for_s: float = 600.0,
    timeout_s: float = 120.0,
    rng: random.Random | None = None,
) -> Outcome:
    """Retry what a 503 refused (an overloaded queue) for up to `retry_for_s`, with jittered
    exponential backoff (at most 1 s apart). Admission is not fair, so under sustained
    overload an unlucky request can need many retries; it must get in eventually."""
    rng = rng or random.Random()
    first = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        outcome = await send(session, url, spec, headers, timeout_s)
        outcome.attempts, outcome.started = attempt, first
        outcome.total_s = time.monotonic() - first
        if outcome.status != 503 or outcome.total_s > retry_for_s:
            return outcome
        await asyncio.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5)) * (0.5 + rng.random()))


async def _read_error(resp, outcome: Outcome) -> None:
    body = await resp.json(content_type=None)
    error = body["error"]
    if not (isinstance(error["message"], str) and error["code"] == resp.status):
        raise ValueError(f"error body without the API's shape: {body}")
    outcome.end, outcome.detail = REFUSED, error["message"]


async def _read_stream(resp, outcome: Outcome) -> None:
    """SSE: data events, then [DONE]. The answer is complete when the last event before [DONE]
    carries a finish reason; an error event names why not."""
    events, done = [], False
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n\n" in buffer:
            raw, buffer = buffer.split(b"\n\n", 1)
            line = raw.decode()
            if not line.startswith("data: "):
                raise ValueError(f"not an SSE data line: {line[:80]!r}")
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
            else:
                events.append(json.loads(data))
    if not done:
        outcome.end, outcome.detail = CLOSED, f"the stream ended after {len(events)} events without [DONE]"
        return
    errors = [e["error"] for e in events if "error" in e]
    if errors:
        outcome.error_code = errors[-1]["code"]
        outcome.end, outcome.detail = (ABORTED if outcome.error_code == 503 else REFUSED), errors[-1]["message"]
        return
    _read_answer(_merge_stream(events, outcome.spec.path), outcome)


def _merge_stream(events: list[dict], path: str) -> dict:
    """The stream's events folded into the shape of the non-streaming answer."""
    if path == "/generate":
        last: dict[int, dict] = {}
        for e in events:
            last[e.get("index", 0)] = e  # native events are cumulative
        return last[0] if len(last) == 1 and "index" not in events[-1] else [last[i] for i in sorted(last)]
    choices: dict[int, dict] = {}
    for e in events:
        for c in e["choices"]:
            merged = choices.setdefault(c["index"], {"index": c["index"], "text": "", "finish_reason": None})
            merged["text"] += c.get("text") or (c.get("delta") or {}).get("content") or ""
            merged["finish_reason"] = c["finish_reason"] or merged["finish_reason"]
    return {"choices": [choices[i] for i in sorted(choices)]}


def _read_answer(body, outcome: Outcome) -> None:
    if outcome.spec.path == "/generate":
        items = body if isinstance(body, list) else [body]
        reasons = [i["meta_info"]["finish_reason"] for i in items]
        finishes = [r["type"] if r else None for r in reasons]
        outcome.detail = "; ".join(sorted({r.get("message") or "" for r in reasons if r and r["type"] == "abort"}))
        outcome.texts = [i["text"] for i in items]
    else:
        finishes = [c["finish_reason"] for c in body["choices"]]
        outcome.texts = [c["text"] if "text" in c else c["message"]["content"] for c in body["choices"]]
    if not finishes or any(f not in ("stop", "length", "abort") for f in finishes):
        outcome.end, outcome.detail = MALFORMED, f"finish reasons {finishes}"
    elif "abort" in finishes:
        outcome.end, outcome.finish = ABORTED, "abort"
    else:
        outcome.end, outcome.finish = COMPLETE, "stop" if all(f == "stop" for f in finishes) else "length"


def percentiles(values: list[float]) -> dict:
    """p50 / p99 / max in seconds (None when there are no values)."""
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)

    return {"p50": at(0.50), "p99": at(0.99), "max": round(ordered[-1], 4), "n": len(ordered)}


def tally(outcomes: list[Outcome], settled: tuple[str, ...] = (COMPLETE,)) -> dict:
    """The figures of a run: requests sent, completed, retried, lost (ended in none of the
    `settled` ways), status counts, latency."""
    ends: dict[str, int] = {}
    for o in outcomes:
        ends[o.end] = ends.get(o.end, 0) + 1
    completed = [o for o in outcomes if o.end == COMPLETE]
    return {
        "sent": len(outcomes),
        "completed": len(completed),
        "retried": sum(o.attempts > 1 for o in outcomes),
        "retries": sum(o.attempts - 1 for o in outcomes),
        "max_attempts": max((o.attempts for o in outcomes), default=0),
        "lost": sum(o.end not in settled for o in outcomes),
        "ends": ends,
        "http_503_final": sum(o.status == 503 for o in outcomes),
        "http_5xx_other": sum(o.is_5xx and o.status != 503 and o.error_code != 503 for o in outcomes),
        "latency_s": percentiles([o.total_s for o in completed]),
        "by_kind": {
            kind: {"sent": len(group), "completed": sum(o.end == COMPLETE for o in group)}
            for kind in sorted({o.spec.kind for o in outcomes})
            for group in [[o for o in outcomes if o.spec.kind == kind]]
        },
        "failures": [
            f"{o.spec.kind} {o.spec.path}: {o.end} {o.status} {o.detail[:200]}"
            for o in outcomes
            if o.end not in settled
        ][:20],
    }
