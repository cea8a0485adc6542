"""The main process's grammar check (regex syntax, schema -> regex) in worker processes, under
the compile time limit.

Turning a JSON schema into a regex is plain Python, and some schemas (a 100k-value enum, a
thousand optional properties) take seconds to minutes. On the event loop one such request would
stall every client; in a thread it would still share the GIL with the loop and could not be
stopped. So checks run in small worker processes (`python -m langrt.server.grammar_check`,
length-prefixed pickles over pipes, like the scheduler's grammar compiler), at most `workers`
at once; a check past the limit gets its request a 400 and its worker is killed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import traceback

from langrt import pickle_pipe
from langrt.errors import InvalidRequest, Overloaded, ServerUnavailable, UnsupportedSchema
from langrt.sampling.sampling_params import SamplingParams

# Why 2: a check is one core's work; two let a slow schema not delay the next request's check,
# and the model needs the other cores.
CHECK_WORKERS = 2
_ERRORS = {"InvalidRequest": InvalidRequest, "UnsupportedSchema": UnsupportedSchema}


class _Timeout(Exception):
    pass


class _Worker:
    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "langrt.server.grammar_check", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def check(self, params: SamplingParams, timeout_s: float) -> tuple | None:
        """(Blocking) None if the grammar is fine, else (error class name, message, param).
        Raises _Timeout past `timeout_s`, EOFError if the worker died."""
        pickle_pipe.send(self.process.stdin, params)
        try:
            return pickle_pipe.receive(self.process.stdout, timeout_s)
        except TimeoutError:
            raise _Timeout from None
        except EOFError:
            raise EOFError("the grammar check worker exited") from None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()


class GrammarChecker:
    def __init__(self, timeout_s: float, workers: int = CHECK_WORKERS):
        self.timeout_s = timeout_s
        self.workers = workers
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._slots: asyncio.Semaphore | None = None  # made on the serving loop
        self._lock = threading.Lock()  # the pool is used from check threads and the loop
        self._closed = False

    async def check(self, params: SamplingParams) -> None:
        """Raise InvalidRequest if `params`' grammar is invalid or takes too long to check, and
        Overloaded if every worker stayed busy for a whole time limit."""
        if not params.is_constrained:
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        try:
            await asyncio.wait_for(self._slots.acquire(), self.timeout_s)
        except asyncio.TimeoutError:
            raise Overloaded("the server is overloaded: every grammar check is busy; retry later") from None
        try:
            reply = await asyncio.to_thread(self._run, params)
        finally:
            self._slots.release()
        if reply is not None:
            name, message, param = reply
            raise _ERRORS[name](message, param)

    def _run(self, params: SamplingParams) -> tuple | None:
        """(In a thread.) The worker is killed, never reused, unless it answered in time."""
        worker = self._take()
        try:
            reply = worker.check(params, self.timeout_s)
        except _Timeout:
            self._drop(worker)
            kind = next(
                k
                for k in ("regex", "json_schema", "ebnf", "structural_tag", "choices")
                if getattr(params, k) is not None
            )
            raise InvalidRequest(
                f"grammar compile exceeded the time limit of {self.timeout_s:g} s (the {kind} is too large or "
                "complex; simplify it)",
                param=kind,
            ) from None
        except (EOFError, OSError) as e:  # the worker died mid-check (or was killed by close())
            self._drop(worker)
            if self._closed:
                raise ServerUnavailable("the server is shutting down") from None
            raise InvalidRequest(f"grammar check failed: {e}; simplify the grammar") from None
        with self._lock:
            self._busy.discard(worker)
            keep = not self._closed
            if keep:
                self._idle.append(worker)
        if not keep:
            worker.kill()
        return reply

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise ServerUnavailable("the server is shutting down")
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    break
                worker.kill()  # died while idle
            else:
                worker = _Worker()
            self._busy.add(worker)
            return worker

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
        worker.kill()

    async def close(self) -> None:
        """Kill the workers (a check in progress ends with ServerUnavailable)."""
        with self._lock:
            self._closed = True
            idle, busy = list(self._idle), list(self._busy)
            self._idle.clear()
        for worker in busy:
            worker.process.kill()  # its thread sees EOF, reaps it and closes its pipes
        for worker in idle:
            await asyncio.to_thread(worker.kill)


def _serve(parent_pid: int) -> None:
    """The worker's loop: a pickled SamplingParams in, None or an error tuple out."""
    from langrt.child_setup import exit_with_parent
    from langrt.validation import check_grammar

    exit_with_parent(parent_pid)
    os.nice(10)  # a check, hostile or not, must not take the cores the model decodes on
    for params in pickle_pipe.messages(sys.stdin.buffer):
        try:
            check_grammar(params)
            reply = None
        except InvalidRequest as e:
            reply = (type(e).__name__ if type(e).__name__ in _ERRORS else "InvalidRequest", e.message, e.param)
        except RecursionError:
            reply = ("InvalidRequest", "the grammar nests too deeply to compile", None)
        except Exception as e:  # noqa: BLE001 - a compiler bug: refused like the scheduler refuses it
            traceback.print_exc()
            reply = ("InvalidRequest", f"grammar compile failed: {type(e).__name__}: {e}", None)
        pickle_pipe.send(sys.stdout.buffer, reply)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
