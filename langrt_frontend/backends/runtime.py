"""`Runtime`: start `langrt launch` in a subprocess on a free port and use it as a backend."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from typing import Any

from langrt_frontend.backends.endpoint import RuntimeEndpoint
from langrt_frontend.backends.http import HttpClient

_POLL_S = 0.2
_STOP_TIMEOUT_S = 20.0


class Runtime:
    """A langrt server owned by this process. Stopped by `shutdown()`, by `with`, and at exit.

    Extra keyword arguments become `langrt launch` flags: `chunked_prefill_size=512` ->
    `--chunked-prefill-size 512`; `True` -> a bare flag; `False`/`None` -> omitted."""

    def __init__(
        self,
        model_path: str | None = None,
        port: int | None = None,
        log_level: str = "error",
        launch_timeout: float = 300.0,
        api_key: str | None = None,
        chat_template_name: str | None = None,
        **server_args: Any,
    ):
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "langrt", "launch", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--log-level", log_level]
        if model_path is not None:
            command += ["--model-path", str(model_path)]
        if api_key is not None:
            command += ["--api-key", api_key]
        command += _flags(server_args)
        self._log = tempfile.TemporaryFile(mode="w+", prefix="langrt-runtime-")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # Stops the server on shutdown(), when this object is collected, or at interpreter exit.
        self._finalizer = weakref.finalize(self, _stop, self.process)
        try:
            self._wait_healthy(launch_timeout, api_key)
            self.endpoint = RuntimeEndpoint(self.url, api_key=api_key, chat_template_name=chat_template_name)
        except BaseException:
            self.shutdown()
            raise

    def _wait_healthy(self, timeout_s: float, api_key: str | None) -> None:
        client = HttpClient(self.url, api_key=api_key)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"langrt launch exited with code {self.process.returncode}:\n{self.log_text()}")
            try:
                if client.request("GET", "/health", timeout_s=5.0)[0] == 200:
                    return
            except RuntimeError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"langrt launch was not healthy within {timeout_s:.0f} s:\n{self.log_text()}")
            time.sleep(_POLL_S)

    def log_text(self) -> str:
        """What the server printed so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def shutdown(self) -> None:
        self._finalizer()
        self._log.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- the backend interface, delegated to the endpoint ------------------------------------

    @property
    def chat_template(self):
        return self.endpoint.chat_template

    @property
    def caches_prefixes(self) -> bool:
        return self.endpoint.caches_prefixes

    def get_model_info(self) -> dict:
        return self.endpoint.get_model_info()

    def generate(self, payload: dict):
        return self.endpoint.generate(payload)

    def generate_stream(self, payload: dict):
        return self.endpoint.generate_stream(payload)

    def flush_cache(self) -> bool:
        return self.endpoint.flush_cache()

    def get_server_info(self) -> dict:
        return self.endpoint.get_server_info()

    def __repr__(self) -> str:
        return f"Runtime({self.url!r})"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _flags(server_args: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in server_args.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
