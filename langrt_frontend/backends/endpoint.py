"""`RuntimeEndpoint`: a backend for a running langrt (or SGLang) server, over HTTP."""

from __future__ import annotations

from typing import Iterator

from langrt_frontend.backends.http import HttpClient
from langrt_frontend.chat_template import ChatTemplate, resolve_chat_template


class RuntimeEndpoint:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        verify=None,
        chat_template_name: str | None = None,
        timeout_s: float | None = None,
    ):
        self.base_url = base_url
        self.http = HttpClient(base_url, api_key=api_key, verify=verify, timeout_s=timeout_s)
        try:
            self.model_info = self.http.json("GET", "/get_model_info", timeout_s=30.0)
        except RuntimeError as e:
            raise RuntimeError(f"cannot reach a langrt server at {base_url}: {e}") from e
        if not isinstance(self.model_info, dict):
            raise RuntimeError(f"{base_url}/get_model_info did not return a JSON object: {self.model_info!r}")
        self.chat_template: ChatTemplate = resolve_chat_template(self.model_info, chat_template_name)
        self.caches_prefixes = self._caches_prefixes()

    def _caches_prefixes(self) -> bool:
        """False for a server started with --disable-radix-cache (langrt and SGLang both report it)."""
        try:
            info = self.http.json("GET", "/get_server_info", timeout_s=30.0)
        except RuntimeError:
            return True  # unknown: assume the usual
        return not (isinstance(info, dict) and info.get("disable_radix_cache"))

    def get_model_info(self) -> dict:
        return self.model_info

    def generate(self, payload: dict) -> dict | list[dict]:
        return self.http.json("POST", "/generate", payload)

    def generate_stream(self, payload: dict) -> Iterator[dict]:
        return self.http.stream("/generate", {**payload, "stream": True})

    def flush_cache(self) -> bool:
        status, _ = self.http.request("POST", "/flush_cache")
        return status == 200

    def get_server_info(self) -> dict:
        return self.http.json("GET", "/get_server_info")

    def __repr__(self) -> str:
        return f"RuntimeEndpoint({self.base_url!r})"
