"""The backend contract: a transport for SGLang's native API, plus the chat template.

Everything a program does (gen, select, cache warm-up) is built by the interpreter as native
/generate payloads (API.md §7), so a backend only moves them. Methods are called from many
executor threads at once and must be thread-safe; failures raise (RuntimeError naming the
server's message), and the interpreter records them on the program state.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

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

    def get_server_info(self) -> dict:
        ...

    def get_model_info(self) -> dict:
        ...


def caches_prefixes(backend: Any) -> bool:
    """Whether the backend's runtime reuses K/V across requests. A backend may say it does not
    with a `caches_prefixes = False` attribute (a --disable-radix-cache server); the interpreter
    then sends no per-fork or per-select cache warm-up requests, which there would only repeat
    work (run_batch's one warm-up per batch stays: it also learns the shared prefix's token count)."""
    return getattr(backend, "caches_prefixes", True)
