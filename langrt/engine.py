"""langrt.Engine: the runtime without HTTP, for offline use and in-process frontends.

    engine = langrt.Engine()                      # the built-in SmolLM2-135M-Instruct
    out = engine.generate("The capital of France is", {"max_new_tokens": 8, "temperature": 0})
    out["text"], out["output_ids"], out["meta_info"]
    for chunk in engine.generate("Once upon a time", {"max_new_tokens": 32}, stream=True):
        chunk["text"]                             # cumulative; the last chunk has the final meta_info
    engine.shutdown()

It starts the same scheduler and detokenizer processes as `langrt launch` and talks to them
through a TokenizerManager on a private event loop thread, so `generate` may be called from many
threads at once (their requests are batched together).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
from typing import Any, AsyncIterator, Iterator, Sequence

from langrt.embeddings.api import create_embeddings
from langrt.mem.host_malloc import release_freed_memory
from langrt.processes.launcher import ChildProcesses
from langrt.server.req_state import merged_snapshots
from langrt.server.generate_input import GenerateCall, make_generate_input
from langrt.server.tokenizer_manager import TokenizerManager
from langrt.model.hf_fallback_config import check_model_servable
from langrt.model.source import ModelSource
from langrt.tokenizer.loader import load_tokenizer
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, model_path: str | None = None, **server_args: Any):
        self.args = ServerArgs(model_path=model_path, **server_args)  # resolved by the scheduler
        if self.args.dp_size != 1:
            raise ValueError(
                "dp_size: an Engine runs one replica; `langrt launch --dp-size N` serves N behind a router"
            )
        logging.basicConfig(level=self.args.log_level.upper(), format="[langrt] %(message)s")
        check_model_servable(self.args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="langrt-engine", daemon=True)
        self._thread.start()
        self.children = ChildProcesses.start(self.args)
        self.manager: TokenizerManager | None = None
        try:
            self.tokenizer = load_tokenizer(self.args.tokenizer_path or ModelSource.resolve(self.args.model_path).path)
            release_freed_memory()  # what building the tokenizer left behind
            self.manager = self._call(self._start())
            self.args = self.manager.ready.args
        except BaseException:
            self.shutdown()
            raise
        atexit.register(self.shutdown)

    async def _start(self) -> TokenizerManager:
        manager = TokenizerManager(self.args, self.tokenizer, self.children)
        try:
            await manager.start()
        except BaseException:
            await manager.close()  # its sockets and context, here on their own loop
            raise
        return manager

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    # ---- generation ----------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[str] | None = None,
        sampling_params: Any = None,
        input_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        return_logprob: bool | list[bool] = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        return_text_in_logprobs: bool = False,
        rid: str | list[str] | None = None,
        stream: bool = False,
        lora_path: str | list[str | None] | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """One prompt (text or token ids) -> one result; a list of prompts, or n > 1 -> a list.

        Each result: {"text", "output_ids", "meta_info"} as the native HTTP API returns it.
        Bad input raises InvalidRequest naming the field; nothing of the call runs then.

        stream=True returns an iterator of results as they grow, as the native API streams
        them: `text` is cumulative, the last result of each request has its final meta_info,
        and results of a batch carry their "index". Closing the iterator early aborts the
        requests. `lora_path` names a loaded LoRA adapter (per prompt or for all; None: the base
        model)."""
        call = _call_of(locals())
        if stream:
            return self._stream_sync(call)
        return self._call(self._generate(call))

    async def async_generate(
        self,
        prompt=None,
        sampling_params=None,
        input_ids=None,
        return_logprob=False,
        logprob_start_len=None,
        top_logprobs_num=None,
        return_text_in_logprobs=False,
        rid=None,
        lora_path=None,
    ) -> dict | list[dict]:
        """`generate` for callers on an event loop (runs on the engine's own loop)."""
        call = _call_of(locals())
        if asyncio.get_running_loop() is not self._loop:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._generate(call), self._loop))
        return await self._generate(call)

    async def async_generate_stream(
        self,
        prompt=None,
        sampling_params=None,
        input_ids=None,
        return_logprob=False,
        logprob_start_len=None,
        top_logprobs_num=None,
        return_text_in_logprobs=False,
        rid=None,
    ) -> AsyncIterator[dict]:
        """`generate(..., stream=True)` as an async iterator, on the engine's own loop."""
        call = _call_of({**locals(), "stream": True})
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("async_generate_stream runs on the engine's loop; use generate(..., stream=True)")
        async for result in self._generate_stream(call):
            yield result

    async def _generate(self, call: GenerateCall) -> dict | list[dict]:
        manager = self.manager
        inp, is_batch = make_generate_input(manager.tokenize, call)
        states = await manager.submit(inp)
        try:
            for state in states:
                await state.wait()
        except asyncio.CancelledError:
            for state in states:
                manager.abort(state)
            raise
        results = [s.response(self.tokenizer) for s in states]
        return results if is_batch else results[0]

    async def _generate_stream(self, call: GenerateCall) -> AsyncIterator[dict]:
        manager = self.manager
        inp, is_batch = make_generate_input(manager.tokenize, call)
        states = await manager.submit(inp)
        try:
            async for i, state in merged_snapshots(states):
                result = state.response(self.tokenizer)
                if is_batch:
                    result["index"] = i
                yield result
        finally:  # finished, failed, or the consumer stopped early
            for state in states:
                if not state.finished:
                    manager.abort(state)

    def _stream_sync(self, call: GenerateCall) -> Iterator[dict]:
        """Bridges async_generate_stream (on the engine's loop) to the calling thread."""
        items: queue.Queue = queue.Queue()
        done = object()

        async def pump():
            try:
                async for result in self._generate_stream(call):
                    items.put(result)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                items.put(e)
            finally:
                items.put(done)

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while (item := items.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            future.cancel()  # a consumer that stops early aborts the requests

    # ---- embeddings (--is-embedding) ------------------------------------------------------

    def encode(
        self, prompt: str | list[int] | list[str] | list[list[int]], dimensions: int | None = None
    ) -> dict | list[dict]:
        """One input (text or token ids) -> {"embedding": [floats], "meta_info": {"prompt_tokens",
        "cached_tokens"}};
        a list of inputs -> a list of those. Bad input raises InvalidRequest naming the field."""
        result = self._call(create_embeddings(self.manager, prompt, dimensions))
        out = [
            {"embedding": v.tolist(), "meta_info": {"prompt_tokens": n, "cached_tokens": c}}
            for v, n, c in zip(result.vectors, result.prompt_tokens, result.cached_tokens)
        ]
        single = isinstance(prompt, str) or bool(prompt) and all(isinstance(t, int) for t in prompt)
        return out[0] if single else out

    # ---- control -------------------------------------------------------------------------

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing changes) while requests are in flight."""
        return self._call(self.manager.control("flush_cache"))

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict:
        """Serve the PEFT adapter directory `lora_path` as `lora_name` -> {name: path} of every
        adapter now loaded; raises LoraError naming what does not fit."""
        return self._lora_reply(self._call(self.manager.lora(lora_name, lora_path)))

    def unload_lora_adapter(self, lora_name: str) -> dict:
        """Stop serving `lora_name` (running requests finish with it) -> the adapters left."""
        return self._lora_reply(self._call(self.manager.lora(lora_name)))

    @staticmethod
    def _lora_reply(reply: dict) -> dict:
        if "error" in reply:
            from langrt.lora.adapter import LoraError

            raise LoraError(reply["error"])
        return reply["adapters"]

    def get_server_info(self) -> dict:
        """Settings and live state: KV pool, prefix cache, queues."""
        stats = self._call(self.manager.server_stats())
        return {**self.args.to_json(), **stats}

    def cache_stats(self) -> dict:
        """KV pool and prefix cache figures: sizes, hit rate, evictions, retractions, queues."""
        return self._call(self.manager.server_stats())

    def shutdown(self) -> None:
        """Stop the child processes and the event loop; the Engine is unusable afterwards."""
        if self.manager is not None:
            self._call(self.manager.close())
            self.manager = None
        if self.children is not None:
            self.children.stop()
            self.children = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _listify(input_ids):
    if input_ids is None or isinstance(input_ids, list):
        return input_ids
    return [list(x) if not isinstance(x, int) else x for x in input_ids]


def _call_of(args: dict) -> GenerateCall:
    """A generate method's arguments (its `locals()`, taken first thing) as one GenerateCall; a
    tuple of prompts becomes a list. Arguments a method does not take keep their defaults."""
    prompt = args["prompt"]
    return GenerateCall(
        text=prompt if isinstance(prompt, (str, list)) or prompt is None else list(prompt),
        input_ids=_listify(args["input_ids"]),
        sampling_params=args["sampling_params"],
        rid=args["rid"],
        return_logprob=args["return_logprob"],
        logprob_start_len=args["logprob_start_len"],
        top_logprobs_num=args["top_logprobs_num"],
        return_text_in_logprobs=args["return_text_in_logprobs"],
        stream=args.get("stream", False),
        lora_path=args.get("lora_path"),
    )
