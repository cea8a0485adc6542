"""The backend contracts. Two kinds, told apart by the methods they have:

- `Backend`, a transport for SGLang's native API (RuntimeEndpoint, Runtime, EngineBackend):
  everything a program does (gen, select, cache warm-up) is built by the interpreter as native
  /generate payloads (docs/serving.md, native API), and the backend only moves them.
- `PrimitiveBackend`, for an API that is not the native one (OpenAI's): the interpreter hands
  it whole primitives, a `gen` or a `select` with the program's `Context`, and the backend
  builds its own requests.

Either kind is called from many executor threads at once and must be thread-safe; failures
raise (RuntimeError naming the server's message), and the interpreter records them on the
program state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence, runtime_checkable

from langrt_frontend.chat_template import ChatTemplate


@runtime_checkable
class Backend(Protocol):
    chat_template: ChatTemplate

    def generate(self, payload: dict) -> dict | list[dict]:
        """POST /generate with `payload` (without `stream`); the parsed response."""

    def generate_stream(self, payload: dict) -> Iterator[dict]:
        """Streaming /generate: each yielded response's `text` is cumulative; the last one has
        the final meta info. A mid-stream error raises."""

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False when the runtime refuses (requests in flight)."""

    def get_server_info(self) -> dict: ...

    def get_model_info(self) -> dict: ...


@dataclass(frozen=True)
class Context:
    """What a primitive sees of its program state when it runs."""

    text: str  # the whole text so far, the chat template's role markers included
    messages: tuple[dict, ...]  # the finished role blocks, {"role", "content"}
    role: str | None  # the role block still open, if any
    role_text: str  # the open role block's text so far ("" when none is open)
    images: tuple[str, ...] = ()  # image inputs added so far (paths read as base64, or URLs)


@runtime_checkable
class PrimitiveBackend(Protocol):
    chat_template: ChatTemplate

    def gen(self, context: Context, params: Any) -> tuple[Any, Any]:
        """Run a `gen` with these `GenParams` (run defaults and template stops applied): its
        value (a str, or a list of n strings) and meta info (a dict, or a list of n)."""

    def gen_stream(self, context: Context, params: Any) -> Iterator[tuple[str, dict | None]]:
        """A `gen` (n = 1) as (text increment, meta info or None) pairs; the increments
        concatenate to the value and the last pair carries the final meta info."""

    def select(self, context: Context, choices: Sequence[str], method: Any) -> tuple[str, dict]:
        """The chosen one of `choices` (a `choices` method of docs/programs.md's select, which the backend may
        not be able to apply; it says so in the meta info) and the select's meta info."""

    def flush_cache(self) -> bool: ...

    def get_server_info(self) -> dict: ...


def stream_increments(events: Iterator[dict]) -> Iterator[tuple[str, dict | None]]:
    """A Backend's streaming events (cumulative text) as (text increment, meta info) pairs."""
    value = ""
    for event in events:
        text = event["text"]
        delta = text[len(value) :] if text.startswith(value) else text
        value += delta
        yield delta, event.get("meta_info")


def takes_native_payloads(backend: Any) -> bool:
    """Whether the interpreter builds /generate payloads for this backend (else it hands it
    whole primitives: a PrimitiveBackend)."""
    return not isinstance(backend, PrimitiveBackend)


def caches_prefixes(backend: Any) -> bool:
    """Whether the backend's runtime reuses K/V across requests. A backend may say it does not
    with a `caches_prefixes = False` attribute (a --disable-radix-cache server); the interpreter
    then sends no per-fork or per-select cache warm-up requests, which there would only repeat
    work (run_batch's one warm-up per batch stays: it also learns the shared prefix's token count)."""
    return getattr(backend, "caches_prefixes", True)
