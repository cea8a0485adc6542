"""`SglFunction`: what `@function` makes. `run` executes one program, `run_batch` many on a
thread pool (after warming the runtime's cache with their shared prefix), `bind` fixes
arguments."""

from __future__ import annotations

import inspect
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from langrt_frontend.backends.base import Backend, PrimitiveBackend, takes_native_payloads
from langrt_frontend.config import global_config
from langrt_frontend.executor import Executor
from langrt_frontend.recording import RecordingBackend
from langrt_frontend.params import RUN_DEFAULTS, GenParams
from langrt_frontend.state import ProgramState
from langrt_frontend.tracing import shared_prefix


class SglFunction:
    def __init__(self, func: Callable, num_api_spec_tokens: int | None = None, bind_arguments: dict | None = None):
        params = list(inspect.signature(func).parameters)
        assert params and params[0] == "s", (
            f'the first parameter of an @function program must be named "s", got {params[:1]}'
        )
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens  # accepted for SGLang compatibility
        self.arg_names = params[1:]
        self.bind_arguments = dict(bind_arguments or {})
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs) -> "SglFunction":
        """A new function with these arguments fixed."""
        unknown = [k for k in kwargs if k not in self.arg_names]
        assert not unknown, f"{self.__name__} has no parameter(s) {unknown}; parameters: {self.arg_names}"
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    # ---- one program ---------------------------------------------------------------------------

    def run(self, *args, stream: bool = False, backend=None, **kwargs) -> ProgramState:
        """Run the program; returns its state, possibly before queued work ends (accessors wait).
        Keyword arguments named like run's sampling settings (max_new_tokens, temperature, ...)
        set defaults for every gen; the rest go to the program."""
        defaults, program_kwargs = _split_kwargs(kwargs)
        backend = _backend(backend)
        if takes_native_payloads(backend):  # its requests are recorded for state.report()
            backend = RecordingBackend(backend)
        state = ProgramState(Executor(backend, defaults, stream))
        if stream:
            # The body runs on its own thread so that the caller can iterate the text now;
            # an exception there is recorded on the state.
            threading.Thread(
                target=self._run_body,
                args=(state, args, program_kwargs, True),
                name="langrt-frontend-body",
                daemon=True,
            ).start()
            return state
        return self._run_body(state, args, program_kwargs, False)

    __call__ = run

    def _run_body(self, state: ProgramState, args, kwargs, record_errors: bool) -> ProgramState:
        try:
            state.ret_value = self.func(state, *args, **{**self.bind_arguments, **kwargs})
        except Exception as e:
            if not record_errors:
                raise
            state.executor.sync()
            if state.executor.error is None:
                state.executor.error = e
        finally:
            state.executor.end()
        if global_config.verbosity >= 2:
            print(state.text())
        return state

    # ---- many programs -------------------------------------------------------------------------

    def run_batch(
        self,
        batch,
        *,
        backend=None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **sampling,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per item (a dict of keyword arguments or a tuple of positional
        ones) on a thread pool; states in input order. Sampling settings as in `run`."""
        defaults, extra = _split_kwargs(sampling)
        if extra:
            raise TypeError(f"run_batch got unexpected keyword argument(s) {sorted(extra)}")
        items = [_as_call(item) for item in batch]
        if not items:
            return (state for state in ()) if generator_style else []
        backend = _backend(backend)
        seed = self._warm_up(backend, items) if len(items) > 1 else None
        threads = _thread_count(num_threads, len(items))
        generator = self._run_many(backend, defaults, items, threads, progress_bar, seed)
        return generator if generator_style else list(generator)

    def _run_many(self, backend, defaults, items, threads, progress_bar, seed) -> Iterator[ProgramState]:
        def run_one(call):
            args, kwargs = call
            executor = Executor(backend, defaults)
            executor.token_mark = seed
            state = self._run_body(ProgramState(executor), args, kwargs, False)
            state.executor.sync()
            return state

        progress = _progress(progress_bar, len(items))
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="langrt-frontend-batch") as pool:
            futures = [pool.submit(run_one, call) for call in items]
            for future in futures:
                future.add_done_callback(lambda _: progress.update(1))
            try:
                for future in futures:
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()
                progress.close()

    def _warm_up(self, backend, items) -> tuple[str, int] | None:
        """Prefill the programs' shared prefix once, so every item finds it cached; returns
        (prefix, its token count) for select to start its logprobs there."""
        # Sent even to a runtime without a prefix cache: one request per batch, and the token
        # count it returns lets every item's select start its logprobs at the shared prefix's end.
        if not global_config.enable_precache_with_tracing or not takes_native_payloads(backend):
            return None
        prefix = shared_prefix(self, backend.chat_template, items)
        if len(prefix) < global_config.precache_min_chars:
            return None
        try:
            response = backend.generate({"text": prefix, "sampling_params": {"max_new_tokens": 0}})
        except RuntimeError:
            return None  # the warm-up only saves time; the programs will report real failures
        return prefix, response["meta_info"]["prompt_tokens"]

    def __repr__(self) -> str:
        return f"SglFunction({self.__name__})"


def _split_kwargs(kwargs: dict) -> tuple[GenParams, dict]:
    sampling = {k: kwargs[k] for k in kwargs if k in RUN_DEFAULTS}
    program = {k: v for k, v in kwargs.items() if k not in RUN_DEFAULTS}
    return GenParams.run_defaults(**{k: v for k, v in sampling.items() if v is not None}), program


def _backend(backend):
    backend = backend or global_config.default_backend
    if backend is None:
        raise RuntimeError("no backend: pass backend=... or call set_default_backend(RuntimeEndpoint(url))")
    if not isinstance(backend, (Backend, PrimitiveBackend)):
        raise TypeError(
            f"not a backend: {backend!r}; use RuntimeEndpoint(url), Runtime(...), EngineBackend(...) or OpenAI(model)"
        )
    return backend


def _as_call(item) -> tuple[tuple, dict]:
    if isinstance(item, dict):
        return (), item
    if isinstance(item, (tuple, list)):
        return tuple(item), {}
    return (item,), {}


def _thread_count(num_threads: int | str, n: int) -> int:
    if num_threads == "auto":
        num_threads = max(96, (os.cpu_count() or 1) * 16)
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be 'auto' or a positive integer, got {num_threads!r}")
    return min(num_threads, n)


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool, total: int):
    if not enabled:
        return _NoProgress()
    from tqdm.auto import tqdm  # only when a progress bar is asked for

    return tqdm(total=total)
