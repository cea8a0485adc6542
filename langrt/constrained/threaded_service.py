"""Compiling grammars off the scheduler's path for the engines that compile in this process
(xgrammar, llguidance): GrammarService's contract, with threads where langrt uses a worker
process.

langrt's own automaton is built in Python, so a runaway build would hold the GIL: it runs in a
process that can be killed. xgrammar and llguidance compile in native code that releases the GIL,
so a thread is enough to keep the scheduler decoding; but native code cannot be stopped. So each
compile runs in a thread of its own, waited for up to the time limit: past it the request fails
with a 400 and the compile is abandoned (it runs on to its end in the background, and nothing
reads its result), so the grammars queued behind it are not held up.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from langrt.constrained.service import CACHE_SIZE, COMPILE_TIMEOUT_S, FutureCache
from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest

logger = logging.getLogger(__name__)


class ThreadedGrammarService:
    """`submit(spec) -> Future[grammar]` (shared by every request for the same spec, the last
    `cache_size` specs kept) and `close()`, like service.GrammarService. `compile(spec)` returns
    the grammar (anything with `matcher()`) or raises InvalidRequest naming the problem; any
    other exception is a bug in the engine or its adapter, refused with its message."""

    def __init__(
        self, compile: Callable[[GrammarSpec], Any], timeout_s: float = COMPILE_TIMEOUT_S, cache_size: int = CACHE_SIZE
    ):
        self.compile = compile
        self.timeout_s = timeout_s
        self._cache = FutureCache(cache_size)
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="grammar-compiler", daemon=True)
        self._thread.start()

    def submit(self, spec: GrammarSpec) -> Future:
        future, new = self._cache.get(spec)
        if new:
            self._jobs.put((spec, future))
        return future

    def close(self) -> None:
        self._jobs.put((None, None))

    def _run(self) -> None:
        while True:
            spec, future = self._jobs.get()
            if spec is None:
                return
            outcome = _Compile(self.compile, spec)
            if outcome.done.wait(self.timeout_s):
                error = outcome.error
            else:  # abandoned: whatever it writes later is never read
                error = InvalidRequest(
                    f"grammar compile exceeded the time limit of {self.timeout_s:g} s (simplify the {spec.kind})",
                    param=spec.kind,
                )
            if error is None:
                future.set_result(outcome.grammar)
            else:
                self._cache.forget(spec)  # a later request may retry
                future.set_exception(error)


class _Compile:
    """One compile in a daemon thread of its own; `done` is set when it has finished."""

    def __init__(self, compile: Callable[[GrammarSpec], Any], spec: GrammarSpec):
        self.grammar: Any = None
        self.error: InvalidRequest | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(compile, spec), name="grammar-compile", daemon=True).start()

    def _run(self, compile: Callable[[GrammarSpec], Any], spec: GrammarSpec) -> None:
        try:
            self.grammar = compile(spec)
        except InvalidRequest as e:
            self.error = e
        except RecursionError:
            self.error = InvalidRequest(f"the {spec.kind} nests too deeply to compile", param=spec.kind)
        except Exception as e:  # noqa: BLE001 - reported to the request, never kills the service
            logger.exception("grammar compile failed")
            self.error = InvalidRequest(f"grammar compile failed: {type(e).__name__}: {e}", param=spec.kind)
        self.done.set()
