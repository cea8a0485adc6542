"""The main process's side of the runtime: tokenize, validate, send; gather replies.

Used by both the HTTP server and `langrt.Engine`, on an asyncio loop. A request becomes one or
more `GenerateRequest`s (n > 1 fans out) sent to the scheduler; the detokenizer's `TextUpdates`
come back through one receive task that updates each request's `ReqState`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
import uuid
from typing import Any

import zmq
import zmq.asyncio

from langrt.constrained.backends.base import prechecked
from langrt.errors import CapacityExceeded, InvalidRequest, Overloaded, ServerUnavailable
from langrt.ipc import AsyncPullQueue, PushQueue
from langrt.server.generate_input import GenerateInput
from langrt.server.grammar_check import GrammarChecker
from langrt.server.metrics import Metrics
from langrt.processes.launcher import ChildProcesses
from langrt.server.req_state import ReqState
from langrt.validation import Limits, validate_request
from langrt.messages import (
    AbortRequest,
    ControlReply,
    LoraRequest,
    ControlRequest,
    EmbedRequest,
    GenerateRequest,
    RequestFailed,
    SchedulerReady,
    SnapshotReply,
    SnapshotRequest,
    TextUpdates,
)
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class CompiledOnly:
    """The grammar check of an engine whose compile is its check (backends/base.prechecked): none
    here; the scheduler's compile refuses a bad grammar with a 400."""

    async def check(self, params) -> None:
        return None

    async def close(self) -> None:
        return None


class TokenizerManager:
    def __init__(self, args: ServerArgs, tokenizer, children: ChildProcesses):
        self.args = args
        self.tokenizer = tokenizer
        self.children = children
        self.context = zmq.asyncio.Context()
        self.to_scheduler: PushQueue = PushQueue(zmq.Context.instance(), children.endpoints.scheduler)
        self.inbox: AsyncPullQueue = AsyncPullQueue(self.context, children.endpoints.main)
        self.states: dict[str, ReqState] = {}
        self.replies: dict[int, asyncio.Future] = {}
        self.request_ids = itertools.count()
        self.metrics = Metrics()
        self.ready: SchedulerReady | None = None
        self.limits: Limits | None = None
        self.failure: str | None = None  # why the runtime stopped serving
        self.grammar_checker = (
            GrammarChecker(args.grammar_compile_timeout) if prechecked(args.grammar_backend) else CompiledOnly()
        )
        # No token spells more characters than the longest vocabulary entry (byte-level entries
        # have one character per byte), so a text longer than context x this cannot fit: it is
        # refused before tokenizing, which runs on the event loop (~1 s per MB).
        self.max_token_chars = max(map(len, tokenizer.get_vocab()), default=1)
        self._tasks: list[asyncio.Task] = []
        self.last_progress = float("-inf")  # monotonic time of the last output from the runtime

    # ---- life cycle ----------------------------------------------------------------------

    async def start(self, timeout_s: float = 600.0) -> None:
        """Wait for the scheduler to load the model, then serve replies and watch the children."""
        deadline = time.monotonic() + timeout_s
        while self.ready is None:
            if self.children.dead():
                raise RuntimeError(
                    f"langrt failed to start: {', '.join(self.children.dead())} exited (see its log above)"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the model did not load within {timeout_s:.0f} s")
            try:
                message = await asyncio.wait_for(self.inbox.get(), timeout=0.2)
            except asyncio.TimeoutError:
                continue
            if isinstance(message, SchedulerReady):
                self.ready = message
        self.limits = Limits(self.ready.context_len, self.ready.vocab_size, self.ready.max_total_tokens)
        self.args = self.ready.args
        self.lora_names = {name for name, _ in self.args.lora_adapters}  # adapters served now
        self._tasks = [asyncio.create_task(self._receive_loop()), asyncio.create_task(self._watch_children())]

    @property
    def capacity(self) -> int:
        """Sequences in flight at most (running + queued)."""
        return self.ready.max_running_requests + self.args.max_queued_requests

    @property
    def max_prompt_chars(self) -> int:
        return self.ready.context_len * self.max_token_chars

    @property
    def healthy(self) -> bool:
        return self.ready is not None and self.failure is None

    async def abort_all(self, message: str, grace_s: float) -> None:
        """Abort every request in flight and give them `grace_s` to receive that status."""
        states = list(self.states.values())
        for state in states:
            self.abort(state, message)
        deadline = time.monotonic() + grace_s
        while self.states and time.monotonic() < deadline and self.failure is None:
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.grammar_checker.close()
        self._fail_all(ServerUnavailable(self.failure or "the server is shutting down"))
        self.inbox.close()
        self.to_scheduler.close()
        # Ended here, not left to the garbage collector: a zmq context collected later, on
        # another thread, can block for ever in its term() (seen in a test process whose
        # Engine failed to start: the next Engine's start hung).
        self.context.destroy(linger=0)

    async def _watch_children(self) -> None:
        while self.failure is None:
            dead = self.children.dead()
            if dead:
                self.failure = f"{', '.join(dead)} exited"
                logger.error("langrt runtime failure: %s", self.failure)
                self._fail_all(ServerUnavailable(f"the runtime stopped: {self.failure}"))
                return
            await asyncio.sleep(0.1)

    def _fail_all(self, error: Exception) -> None:
        for state in self.states.values():
            state.fail(error)
        self.states.clear()
        for future in self.replies.values():
            if not future.done():
                future.set_exception(error)

    # ---- requests ------------------------------------------------------------------------

    def tokenize(self, text: str, add_special_tokens: bool = True, param: str = "text") -> list[int]:
        if self.ready is not None and len(text) > self.max_prompt_chars:
            raise InvalidRequest(
                f"the {param} is {len(text)} characters, longer than any prompt the context of "
                f"{self.ready.context_len} tokens can hold",
                param=param,
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # JSON may carry lone surrogates ("\ud800"); tokenizers refuse them
            raise InvalidRequest(
                f"{param} is not valid Unicode: {e.reason} at character {e.start}", param=param
            ) from None
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    async def submit(self, inp: GenerateInput) -> list[ReqState]:
        """Validate every prompt, then send them all (n > 1 fans out); nothing is sent if any
        prompt is invalid. Returns one state per generated sequence, in order."""
        if not self.healthy:
            raise ServerUnavailable(f"the runtime is not serving: {self.failure or 'still starting'}")
        for ids, params in zip(inp.input_ids, inp.params):
            validate_request(ids, params, self.limits, grammar=False)  # once per prompt: its n copies share it
        capacity = self.capacity
        count = sum(p.n for p in inp.params)
        if count > capacity:  # checked before expanding: n may be huge
            raise CapacityExceeded(
                f"the request asks for {count} sequences (prompts x n); this server holds at most {capacity} "
                "in flight (--max-running-requests + --max-queued-requests)",
                param="n",
            )
        for params in set(inp.params):
            await self.grammar_checker.check(params)
        if not self.healthy:  # it may have stopped while the grammars were checked
            raise ServerUnavailable(f"the runtime is not serving: {self.failure}")
        if len(self.states) + count > capacity:
            raise Overloaded(
                f"the server is overloaded: {len(self.states)} requests in flight (limit {capacity}); retry later"
            )
        requests = [r for i in range(len(inp.input_ids)) for r in self._expand(inp, i)]
        rids = [r.rid for r in requests]
        if len(set(rids)) < len(rids) or any(rid in self.states for rid in rids):
            raise InvalidRequest("request ids must be unique among requests in flight", param="rid")
        states = []
        for request in requests:
            state = ReqState(request.rid, request.options)
            self.states[request.rid] = state
            states.append(state)
            self.to_scheduler.put(request)
        return states

    def _expand(self, inp: GenerateInput, i: int) -> list[GenerateRequest]:
        params = inp.params[i]
        base = inp.rids[i] or uuid.uuid4().hex
        out = []
        for j in range(params.n):
            p = params if params.seed is None or j == 0 else dataclasses.replace(params, seed=params.seed + j)
            out.append(
                GenerateRequest(
                    rid=base if params.n == 1 else f"{base}-{j}",
                    input_ids=inp.input_ids[i],
                    params=p,
                    options=inp.options[i],
                )
            )
        return out

    def abort(self, state: ReqState, message: str = "aborted by the client") -> None:
        if not state.finished:
            self.to_scheduler.put(AbortRequest(state.rid, message))

    async def control(self, kind: str) -> Any:
        return await self._ask(ControlRequest(kind, next(self.request_ids)))

    async def lora(self, name: str, path: str | None = None) -> dict:
        """Load (with `path`) or unload adapter `name` in the scheduler -> {"adapters": {name:
        path}} or {"error": why}. `lora_names` follows what is loaded (OpenAI's model= reads it)."""
        reply = await self._ask(LoraRequest(next(self.request_ids), name, path))
        if "adapters" in reply:
            self.lora_names = set(reply["adapters"])
        return reply

    async def embed(self, inputs: list[list[int]]) -> dict:
        """Embed token id lists with the --is-embedding model (messages.EmbedRequest's reply)."""
        reply = await self._ask(EmbedRequest(next(self.request_ids), inputs))
        if "error" in reply:
            raise InvalidRequest(reply["error"], "input")
        return reply

    async def _ask(self, message) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.replies[message.request_id] = future
        self.to_scheduler.put(message)
        try:
            return await future
        finally:
            self.replies.pop(message.request_id, None)

    async def snapshot(self, **bounds) -> SnapshotReply:
        """The scheduler's state for the dashboard (messages.SnapshotRequest's bounds)."""
        request_id = next(self.request_ids)
        future = asyncio.get_running_loop().create_future()
        self.replies[request_id] = future
        self.to_scheduler.put(SnapshotRequest(request_id, **bounds))
        try:
            return await future
        finally:
            self.replies.pop(request_id, None)

    # ---- replies -------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            message = await self.inbox.get()
            if isinstance(message, TextUpdates):
                self.last_progress = time.monotonic()
                for update in message.updates:
                    self._on_update(update)
            elif isinstance(message, RequestFailed):
                self._on_failed(message)
            elif isinstance(message, (ControlReply, SnapshotReply)):
                future = self.replies.get(message.request_id)
                if future is not None and not future.done():
                    future.set_result(message.payload if isinstance(message, ControlReply) else message)

    def _on_update(self, update) -> None:
        state = self.states.get(update.token.rid)
        if state is None:
            return  # the client is gone
        state.apply(update)
        if state.finished:
            self._retire(state)

    def _on_failed(self, message: RequestFailed) -> None:
        state = self.states.get(message.rid)
        if state is not None:
            if message.status == 400:
                state.fail(InvalidRequest(message.message, message.param))
            else:
                state.fail(ServerUnavailable(message.message))
            self._retire(state)

    def _retire(self, state: ReqState) -> None:
        self.states.pop(state.rid, None)
        self.metrics.on_finish(state)

    async def server_stats(self) -> dict[str, Any]:
        stats = await self.control("server_info")
        stats["in_flight_requests"] = len(self.states)
        stats["processes"] = {
            "scheduler": self.children.scheduler.pid,
            "detokenizer": self.children.detokenizer.pid,
            "tp_workers": [p.pid for p in self.children.tp_workers],
            "ipc_directory": self.children.endpoints.directory,
        }
        return stats
