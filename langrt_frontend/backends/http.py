"""A minimal JSON-over-HTTP client (stdlib only, so `import langrt_frontend` stays light).

One connection per call: calls come from many executor threads at once, and a local
connect costs far less than a generation."""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Any, Iterator
from urllib.parse import urlsplit


class HttpClient:
    def __init__(self, base_url: str, api_key: str | None = None, verify=None, timeout_s: float | None = None):
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self._scheme, self._netloc, self._root = parts.scheme, parts.netloc, parts.path.rstrip("/")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._ssl = _ssl_context(verify) if parts.scheme == "https" else None
        self.timeout_s = timeout_s

    def _connect(self, timeout_s: float | None) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._netloc, timeout=timeout_s, context=self._ssl)
        return http.client.HTTPConnection(self._netloc, timeout=timeout_s)

    def request(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> tuple[int, bytes]:
        """(status, raw body). Connection failures raise RuntimeError naming the URL."""
        conn = self._connect(timeout_s or self.timeout_s)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, self._root + path, body=data, headers=self._headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as e:
            raise RuntimeError(f"{method} {self.base_url}{path} failed: {e}") from e
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        status, raw = self.request(method, path, body, timeout_s)
        if status >= 400:
            raise RuntimeError(f"{method} {path} failed with HTTP {status}: {_error_message(raw)}")
        return json.loads(raw) if raw.strip()[:1] in (b"{", b"[") else raw.decode()

    def stream(self, path: str, body: Any) -> Iterator[dict]:
        """POST and yield the JSON of each server-sent event until [DONE]."""
        conn = self._connect(self.timeout_s)
        try:
            try:
                conn.request("POST", self._root + path, body=json.dumps(body).encode(), headers=self._headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise RuntimeError(f"POST {self.base_url}{path} failed: {e}") from e
            if response.status >= 400:
                raise RuntimeError(f"POST {path} failed with HTTP {response.status}: {_error_message(response.read())}")
            for line in response:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[len(b"data:") :].strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if isinstance(event, dict) and "error" in event:
                    raise RuntimeError(f"POST {path} failed mid-stream: {_error_message(data)}")
                yield event
        finally:
            conn.close()


def _error_message(raw: bytes) -> str:
    """The server's error message (docs/serving.md, native API error shape), else the raw body."""
    text = raw.decode(errors="replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        return text
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return str(payload["error"].get("message", text))
    return text


def _ssl_context(verify) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()
