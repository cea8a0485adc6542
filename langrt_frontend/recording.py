"""What a program run sent and got back, for its report (`ProgramState.report`, report.py).

`SglFunction.run` wraps a native backend (docs/serving.md, native API payloads) in a `RecordingBackend`, which
passes every call through unchanged and notes, per request: the thread that sent it (one per
program state: forks run on their own threads), what kind it was (`gen`, `select`, or a
`prefix` cache warm-up), its prompt text, when it started and ended, and the meta info
(prompt, cached and completion tokens). Only the texts and counts are kept.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass
class RecordedCall:
    lane: str  # the sending thread's name: the program body, a state's executor, a fork's
    kind: str  # "gen" | "select" | "prefix"
    prompts: list[str]  # gen / prefix: its prompt; select: the shared prefix, then prefix + each choice
    start: float  # seconds since the log began
    end: float = 0.0
    metas: list[dict] = field(default_factory=list)  # one per response
    outputs: list[str] = field(default_factory=list)

    @property
    def prompt(self) -> str:
        """The text the request continues (a select's shared prefix)."""
        return self.prompts[0]

    @property
    def choices(self) -> list[str]:
        if self.kind != "select":
            return []
        prefix = self.prompt
        return [p[len(prefix) :] for p in self.prompts[1:] if p.startswith(prefix)]


class RunLog:
    def __init__(self):
        self.origin = time.perf_counter()
        self.calls: list[RecordedCall] = []
        self._lock = threading.Lock()

    def begin(self, payload: dict) -> RecordedCall:
        texts = payload.get("text")
        prompts = [texts] if isinstance(texts, str) else list(texts or [])
        params = payload.get("sampling_params") or {}
        params = params[0] if isinstance(params, list) else params
        if params.get("max_new_tokens") == 0:
            kind = "select" if payload.get("return_logprob") and len(prompts) > 1 else "prefix"
        else:
            kind = "gen"
        thread = threading.current_thread()  # forks' executor threads share a name: the id tells them apart
        call = RecordedCall(f"{thread.name}#{thread.ident}", kind, prompts, time.perf_counter() - self.origin)
        with self._lock:
            self.calls.append(call)
        return call

    def finish(self, call: RecordedCall, response) -> None:
        responses = response if isinstance(response, list) else [response]
        call.end = time.perf_counter() - self.origin
        call.metas = [dict(r.get("meta_info") or {}) for r in responses]
        for meta in call.metas:  # logprob lists can be large and are not reported
            for key in [k for k in meta if k.endswith("logprobs")]:
                del meta[key]
        call.outputs = [r.get("text", "") for r in responses]


class RecordingBackend:
    """A native backend that records its calls in `run_log`; everything else is delegated."""

    def __init__(self, backend, run_log: RunLog | None = None):
        self.inner = backend
        self.run_log = run_log or RunLog()

    def generate(self, payload: dict):
        call = self.run_log.begin(payload)
        response = self.inner.generate(payload)
        self.run_log.finish(call, response)
        return response

    def generate_stream(self, payload: dict) -> Iterator[dict]:
        call = self.run_log.begin(payload)
        last = {}
        for event in self.inner.generate_stream(payload):
            last = event
            yield event
        self.run_log.finish(call, last)

    def __getattr__(self, name: str) -> Any:  # chat_template, flush_cache, caches_prefixes, ...
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"RecordingBackend({self.inner!r})"
