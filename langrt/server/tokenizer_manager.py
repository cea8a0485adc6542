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
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio

from langrt.errors import CapacityExceeded, InvalidRequest, Overloaded, ServerUnavailable
from langrt.ipc import AsyncPullQueue, PushQueue
from langrt.server.grammar_check import GrammarChecker
from langrt.server.metrics import Metrics
from langrt.processes.launcher import ChildProcesses
from langrt.server.req_state import ReqState
from langrt.validation import Limits, validate_request
from langrt.messages import (
    AbortRequest,
    ControlReply,
    ControlRequest,
    GenerateRequest,
    RequestFailed,
    SchedulerReady,
    TextUpdates,
)
from langrt.sampling.sampling_params import SamplingParams
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Why 20 (vLLM's default limit, and OpenAI's): the top lists cost prompt positions x this many
# entries in every process; 300 positions x the whole vocabulary took 57 s and 11 GB of memory.
MAX_TOP_LOGPROBS = 20


@dataclass
class GenerateInput:
    """One /generate call (or Engine.generate): prompts as token ids, one entry per prompt."""

    input_ids: list[list[int]]
    params: list[SamplingParams]
    rids: list[str | None]
    return_logprob: list[bool]
    logprob_start_len: list[int]
    top_logprobs_num: list[int]
    return_text_in_logprobs: bool = False
    stream: bool = False

    def __post_init__(self):
        n = len(self.input_ids)
        for name in ("params", "rids", "return_logprob", "logprob_start_len", "top_logprobs_num"):
            assert len(getattr(self, name)) == n, f"{name} must have one entry per prompt"


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
        self.grammar_checker = GrammarChecker(args.grammar_compile_timeout)
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
                raise RuntimeError(f"langrt failed to start: {', '.join(self.children.dead())} exited (see its log above)")
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
            raise InvalidRequest(f"{param} is not valid Unicode: {e.reason} at character {e.start}", param=param) from None
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
            state = ReqState(request.rid, request.return_logprob, request.top_logprobs_num, inp.return_text_in_logprobs)
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
                    return_logprob=inp.return_logprob[i],
                    logprob_start_len=inp.logprob_start_len[i],
                    top_logprobs_num=inp.top_logprobs_num[i],
                    stream=inp.stream,
                )
            )
        return out

    def abort(self, state: ReqState, message: str = "aborted by the client") -> None:
        if not state.finished:
            self.to_scheduler.put(AbortRequest(state.rid, message))

    async def control(self, kind: str) -> Any:
        request_id = next(self.request_ids)
        future = asyncio.get_running_loop().create_future()
        self.replies[request_id] = future
        self.to_scheduler.put(ControlRequest(kind, request_id))
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
            elif isinstance(message, ControlReply):
                future = self.replies.get(message.request_id)
                if future is not None and not future.done():
                    future.set_result(message.payload)

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
            "ipc_directory": self.children.endpoints.directory,
        }
        return stats


def make_generate_input(
    tokenize,
    text=None,
    input_ids=None,
    sampling_params=None,
    rid=None,
    return_logprob=False,
    logprob_start_len=None,
    top_logprobs_num=None,
    return_text_in_logprobs=False,
    stream=False,
    max_prompts: int | None = None,
) -> tuple[GenerateInput, bool]:
    """Check and normalize the native API's fields (also Engine.generate's arguments).
    Returns the input and whether the caller asked for a batch (a list answer). A batch of more
    than `max_prompts` is refused before anything is tokenized."""
    prompts, is_batch = _prompts(tokenize, text, input_ids, max_prompts)
    n = len(prompts)
    params = [p if isinstance(p, SamplingParams) else SamplingParams.from_dict(p) for p in _per_item(sampling_params, n, "sampling_params", (dict, SamplingParams, type(None)))]
    inp = GenerateInput(
        input_ids=prompts,
        params=params,
        rids=_per_item(rid, n, "rid", (str, type(None))),
        return_logprob=_per_item(return_logprob, n, "return_logprob", (bool, type(None))),
        logprob_start_len=_per_item(logprob_start_len, n, "logprob_start_len", (int, type(None))),
        top_logprobs_num=_per_item(top_logprobs_num, n, "top_logprobs_num", (int, type(None))),
        return_text_in_logprobs=_flag(return_text_in_logprobs, "return_text_in_logprobs"),
        stream=_flag(stream, "stream"),
    )
    inp.return_logprob = [bool(v) for v in inp.return_logprob]
    inp.top_logprobs_num = [v or 0 for v in inp.top_logprobs_num]
    if any(v is not None and v < -1 for v in inp.logprob_start_len):
        raise InvalidRequest(
            "logprob_start_len must be >= -1 (-1: output logprobs only; the whole prompt for a prefill-only request)",
            param="logprob_start_len",
        )
    inp.logprob_start_len = [_logprob_start(v, p) for v, p in zip(inp.logprob_start_len, params)]
    if any(not 0 <= v <= MAX_TOP_LOGPROBS for v in inp.top_logprobs_num):
        raise InvalidRequest(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs_num")
    return inp, is_batch or any(p.n > 1 for p in params)


def _logprob_start(value: int | None, params: SamplingParams) -> int:
    """The first prompt position whose logprob a request reports. Omitted or -1: none, only the
    output's, except in a prefill-only request (max_new_tokens 0), which has no output: there it
    is the whole prompt from position 0 (whose logprob is null), as SGLang's server answered when
    its frontend's select was written. That frontend scores each choice alone this way (token ids,
    prefill only, return_logprob, no logprob_start_len) and subtracts the entries position by
    position from the choice's conditional ones (unconditional_likelihood_normalized)."""
    if value is None or value == -1:
        return 0 if params.max_new_tokens == 0 else -1
    return value


def check_batch_size(size: int, max_prompts: int | None, param: str) -> None:
    if max_prompts is not None and size > max_prompts:
        raise CapacityExceeded(f"{param} holds {size} prompts; this server holds at most {max_prompts} in flight", param=param)


def _prompts(tokenize, text, input_ids, max_prompts: int | None = None) -> tuple[list[list[int]], bool]:
    if (text is None) == (input_ids is None):
        raise InvalidRequest("give exactly one of text and input_ids", param="text")
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise InvalidRequest("text must be a non-empty string or a non-empty list of them", param="text")
        check_batch_size(len(texts), max_prompts, "text")
        return [tokenize(t) for t in texts], not isinstance(text, str)
    is_batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
    batch = input_ids if is_batch else [input_ids]
    check_batch_size(len(batch), max_prompts, "input_ids")
    if not all(isinstance(ids, list) and ids and all(type(t) is int for t in ids) for ids in batch):
        raise InvalidRequest("input_ids must be a non-empty list of token ids, or a list of them", param="input_ids")
    return [list(ids) for ids in batch], is_batch


def _per_item(value, n: int, name: str, types: tuple) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise InvalidRequest(f"{name} has {len(value)} entries for {n} prompts", param=name)
        items = list(value)
    else:
        items = [value] * n
    for item in items:
        if not isinstance(item, types) or (isinstance(item, bool) and bool not in types):
            raise InvalidRequest(f"{name} has a value of the wrong type: {item!r}", param=name)
    return items


def _flag(value, name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false", param=name)
    return value
