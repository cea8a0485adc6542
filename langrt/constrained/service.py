"""Compiling grammars off the scheduler's path: an LRU cache, and a worker process under a time
limit.

Building a regex's automaton is usually milliseconds, but a pathological regex (`(a|b)*a(a|b){20}`)
takes minutes and gigabytes. So automata are built in a separate process that is killed when it
runs past the limit; only the request that asked for that grammar fails, and nothing holds the
scheduler thread meanwhile (the scheduler keeps decoding; the request waits in its own queue).
"""

from __future__ import annotations

import logging
import queue
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

from langrt import pickle_pipe
from langrt.constrained.byte_dfa import ByteDFA
from langrt.constrained.cfg.build import RuleCache
from langrt.constrained.cfg.walk_cache import RuleWalks
from langrt.constrained.grammar import MAX_DFA_STATES, Grammar
from langrt.constrained.spec import GrammarSpec
from langrt.constrained.vocab import TokenVocabulary
from langrt.errors import InvalidRequest

logger = logging.getLogger(__name__)

# Why 10 s: the worst realistic schema compiles in well under a second; beyond 10 s the automaton
# is exploding and would not finish in useful time (or memory).
COMPILE_TIMEOUT_S = 10.0
# Why 256: a compiled grammar keeps the token masks of the states it reached (~6 KB each); 256
# grammars of a few hundred states stay within a few hundred MB.
CACHE_SIZE = 256


class _Worker:
    """`python -m langrt.constrained.byte_dfa` with length-prefixed pickles over its pipes
    (a plain subprocess: the scheduler is itself a daemonic child, which may not fork others
    through multiprocessing)."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "langrt.constrained.byte_dfa"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def build(self, regex: str, timeout_s: float, is_rule: bool) -> tuple[ByteDFA, dict | None]:
        """The regex's DFA; for a grammar rule's body, also its calls (byte_dfa.build_rule_dfa)."""
        pickle_pipe.send(self.process.stdin, (regex, MAX_DFA_STATES, is_rule))
        try:
            ok, payload = pickle_pipe.receive(self.process.stdout, timeout_s)
        except EOFError:
            raise ValueError("the grammar worker exited") from None
        if not ok:
            raise ValueError(payload)
        *parts, calls = payload
        return ByteDFA(*parts), calls

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(5)


class FutureCache:
    """The futures of the last `size` specs asked for, least recently asked dropped first (touched
    by the scheduler thread and a compile thread, hence the lock)."""

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
    def __init__(self, vocab: TokenVocabulary, timeout_s: float = COMPILE_TIMEOUT_S, cache_size: int = CACHE_SIZE):
        self.vocab = vocab
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self._cache = FutureCache(cache_size)
        self._jobs: queue.Queue = queue.Queue()
        self._worker: _Worker | None = None
        self._rules = RuleCache()  # touched by the compile thread only
        self._walks = RuleWalks()  # rule masks the grammars share (mask fills and compiles)
        self._thread = threading.Thread(target=self._run, name="grammar-compiler", daemon=True)
        self._thread.start()

    def submit(self, spec: GrammarSpec) -> Future:
        """A future Grammar for `spec` (shared with every earlier request for the same spec)."""
        future, new = self._cache.get(spec)
        if new:
            self._jobs.put((spec, future))
        return future

    def _run(self) -> None:
        while True:
            spec, future = self._jobs.get()
            if spec is None:
                return
            try:
                future.set_result(self._grammar(spec))
            except InvalidRequest as e:
                future.set_exception(e)
            except Exception as e:  # noqa: BLE001 - reported to the request, never kills the thread
                logger.exception("grammar compile failed")
                future.set_exception(InvalidRequest(f"grammar compile failed: {e}", param="regex"))
            if future.exception() is not None:
                self._cache.forget(spec)  # a later request may retry (e.g. after a timeout)

    def _grammar(self, spec: GrammarSpec) -> Grammar:
        source = spec.translate()
        if isinstance(source, str):
            return Grammar(self._build(source, False, "regex")[0], self.vocab, source)
        from langrt.constrained.cfg.build import build_automaton

        deadline = time.monotonic() + self.timeout_s
        try:
            build = self._rules.wrap(lambda body: self._build(body, True, spec.kind, deadline))
            pda = build_automaton(source, build, MAX_DFA_STATES)
        except ValueError as e:
            raise InvalidRequest(f"{spec.kind} not supported: {e}", param=spec.kind) from None
        return Grammar(pda, self.vocab, spec.text, self._walks)

    def _build(self, regex: str, is_rule: bool, param: str, deadline: float | None = None):
        """(DFA, calls) built by the worker, within the time left (a grammar's rules share one
        time limit)."""
        if self._worker is None or not self._worker.alive:
            self._worker = _Worker()
        timeout_s = self.timeout_s if deadline is None else max(deadline - time.monotonic(), 0.001)
        try:
            return self._worker.build(regex, timeout_s, is_rule)
        except TimeoutError:
            self._worker.kill()
            self._worker = None
            raise InvalidRequest(
                f"grammar compile exceeded the time limit of {self.timeout_s:g} s (the {param}'s automaton "
                "explodes; simplify it)",
                param=param,
            ) from None
        except ValueError as e:
            if is_rule:
                raise
            raise InvalidRequest(f"regex not supported: {e}", param="regex") from None

    def close(self) -> None:
        self._jobs.put((None, None))
        if self._worker is not None:
            self._worker.kill()
