"""The one grammar compile service, whatever the engine (--grammar-backend): an LRU cache of
futures, a queue, a thread that compiles off the scheduler's path, and the time limit.

The scheduler keeps decoding while a grammar compiles; the request waits in its own queue. A
compile past the time limit fails its request alone, with a 400, and never holds up the grammars
queued behind it. How the limit is kept is the backend's (backends/base.GrammarBackend): langrt's
engine kills its worker process; native engines (xgrammar, llguidance) cannot be stopped, so each
of their compiles runs in a thread of its own that is abandoned at the limit.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest

if TYPE_CHECKING:
    from langrt.constrained.backends.base import GrammarBackend

logger = logging.getLogger(__name__)

# Why 10 s: the worst realistic schema compiles in well under a second; beyond 10 s the automaton
# is exploding and would not finish in useful time (or memory).
COMPILE_TIMEOUT_S = 10.0
# Why 256: a compiled grammar keeps the token masks of the states it reached (~6 KB each); 256
# grammars of a few hundred states stay within a few hundred MB.
CACHE_SIZE = 256


class FutureCache:
    """The futures of the last `size` specs asked for, least recently asked dropped first (touched
    by the scheduler thread and the compile thread, hence the lock)."""

    def __init__(self, size: int):
        self.size = size
        self._futures: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, spec: GrammarSpec) -> tuple[Future, bool]:
        """(`spec`'s future, whether it is new: then the caller must compile it)."""
        with self._lock:
            future = self._futures.get(spec)
            if future is not None:
                self._futures.move_to_end(spec)
                return future, False
            future = self._futures[spec] = Future()
            if len(self._futures) > self.size:
                self._futures.popitem(last=False)
            return future, True

    def forget(self, spec: GrammarSpec) -> None:
        with self._lock:
            self._futures.pop(spec, None)


class GrammarService:
    """`submit(spec) -> Future[grammar]`, shared by every request for the same spec while it is
    cached; the future fails with InvalidRequest (HTTP 400) naming the problem, or when the compile
    runs past `timeout_s`. A failure is not cached: a later request retries. `close()`: stop
    compiling and release the backend."""

    def __init__(self, backend: GrammarBackend, timeout_s: float = COMPILE_TIMEOUT_S, cache_size: int = CACHE_SIZE):
        self.backend = backend
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
        self.backend.close()

    def _run(self) -> None:
        while True:
            spec, future = self._jobs.get()
            if spec is None:
                return
            outcome = _Compile(self.backend.compile, spec, own_thread=not self.backend.stops_itself)
            if outcome.done.wait(self.timeout_s if outcome.own_thread else None):
                error = outcome.error
            else:  # abandoned: whatever it writes later is never read
                error = InvalidRequest(
                    f"grammar compile exceeded the time limit of {self.timeout_s:g} s (simplify the {spec.kind})",
                    param=spec.kind,
                )
            if error is None:
                future.set_result(outcome.grammar)
            else:
                self._cache.forget(spec)  # a later request may retry (e.g. after a timeout)
                future.set_exception(error)


class _Compile:
    """One compile, on the calling thread or (`own_thread`) in a daemon thread of its own; `done`
    is set when it has finished, with `grammar` or `error` (every failure an InvalidRequest)."""

    def __init__(self, compile, spec: GrammarSpec, own_thread: bool):
        self.grammar: Any = None
        self.error: InvalidRequest | None = None
        self.done = threading.Event()
        self.own_thread = own_thread
        if own_thread:
            threading.Thread(target=self._run, args=(compile, spec), name="grammar-compile", daemon=True).start()
        else:
            self._run(compile, spec)

    def _run(self, compile, spec: GrammarSpec) -> None:
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
