"""A request as the main process sees it: accumulated text, ids and meta info, and the
native API response built from them (docs/serving.md, native API)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from langrt.messages import RequestOptions, TextUpdate


@dataclass
class ReqState:
    rid: str
    options: RequestOptions
    created: float = field(default_factory=time.perf_counter)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    spec_accepted_tokens: int | None = None  # reported only with speculative decoding on
    finish_reason: dict | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    error: Exception | None = None
    input_logprobs: list = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def apply(self, update: TextUpdate) -> None:
        t = update.token
        self.text += update.text_delta
        self.output_ids += t.new_ids
        self.prompt_tokens = t.prompt_tokens
        self.cached_tokens = t.cached_tokens
        self.completion_tokens = t.completion_tokens
        self.spec_accepted_tokens = t.spec_accepted_tokens
        self.input_logprobs += t.input_logprobs
        self.output_logprobs += t.output_logprobs
        if t.new_ids and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if t.finish_reason is not None:
            self.finish_reason = t.finish_reason
            self.finished_at = time.perf_counter()
        self.changed.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.finished_at = time.perf_counter()
        self.changed.set()

    async def wait(self) -> None:
        """Until finished; raises the request's error if it failed."""
        while not self.finished:
            await self.changed.wait()
            self.changed.clear()
        if self.error is not None:
            raise self.error

    async def snapshots(self):
        """Yields after each update (the state is cumulative) until finished; raises on error."""
        while True:
            await self.changed.wait()
            self.changed.clear()
            if self.error is not None:
                raise self.error
            yield self
            if self.finished:
                return

    def response(self, tokenizer) -> dict[str, Any]:
        end = self.finished_at or time.perf_counter()
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "e2e_latency": end - self.created,
        }
        if self.spec_accepted_tokens is not None:
            meta["spec_accepted_tokens"] = self.spec_accepted_tokens
        if self.options.return_logprob:
            with_text = self.options.return_text_in_logprobs
            meta["input_token_logprobs"] = [_entry(v, t, tokenizer, with_text) for v, t, _ in self.input_logprobs]
            meta["output_token_logprobs"] = [_entry(v, t, tokenizer, with_text) for v, t, _ in self.output_logprobs]
            if self.options.top_logprobs_num:
                meta["input_top_logprobs"] = [_top(top, tokenizer, with_text) for *_, top in self.input_logprobs]
                meta["output_top_logprobs"] = [_top(top, tokenizer, with_text) for *_, top in self.output_logprobs]
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": meta}


def _entry(value, token_id: int, tokenizer, with_text: bool) -> list:
    return [value, token_id, tokenizer.decode([token_id]) if with_text else None]


def _top(top, tokenizer, with_text: bool):
    return None if top is None else [_entry(v, t, tokenizer, with_text) for v, t in top]


async def merged_snapshots(states: list[ReqState]) -> AsyncIterator[tuple[int, ReqState]]:
    """(index, state) after every update of any of the states, until all finish."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, state: ReqState):
        try:
            async for snapshot in state.snapshots():
                await queue.put((i, snapshot, None))
        except Exception as e:  # noqa: BLE001 - forwarded to the consumer
            await queue.put((i, state, e))
        await queue.put(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(states)]
    try:
        remaining = len(states)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            i, state, error = item
            if error is not None:
                raise error
            yield i, state
    finally:
        for task in tasks:
            task.cancel()
