"""Start `langrt launch` as a subprocess on a free port for tests, and stop it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchedServer:
    def __init__(self, *flags: str, timeout_s: float = 120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "langrt", "launch", "--port", str(self.port), "--log-level", "warning", *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"langrt launch exited with {self.process.returncode}:\n{self.process.stdout.read()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError("langrt launch did not become healthy in time")
            if self.get("/health", check=False)[0] == 200:
                return
            time.sleep(0.2)

    def request(self, method: str, path: str, body=None, headers=None, check: bool = True, timeout: float = 60.0):
        """(status, parsed JSON or text); the response's headers are kept in `last_headers`."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw, self.last_headers = resp.status, resp.read().decode(), dict(resp.headers)
        except urllib.error.HTTPError as e:
            status, raw, self.last_headers = e.code, e.read().decode(), dict(e.headers)
        except (urllib.error.URLError, ConnectionError):
            if check:
                raise
            return 0, None
        try:
            payload = json.loads(raw)
        except json.JSONDecodeError:
            payload = raw
        if check and status >= 400:
            raise AssertionError(f"{method} {path} -> {status}: {payload}")
        return status, payload

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def post(self, path: str, body, **kw):
        return self.request("POST", path, body, **kw)

    def stream(self, path: str, body, headers=None) -> list:
        """The SSE events of a streaming POST, parsed (the final [DONE] kept as a string)."""
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), method="POST", headers=headers or {}
        )
        events = []
        with urllib.request.urlopen(req, timeout=120) as resp:
            for line in resp:
                line = line.decode().strip()
                if line.startswith("data: "):
                    data = line[len("data: ") :]
                    events.append(data if data == "[DONE]" else json.loads(data))
        return events

    def stop(self, sig=signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class LaunchedRouter(LaunchedServer):
    """`langrt router` as a subprocess on a free port; healthy once a worker is."""

    def __init__(self, *flags: str, timeout_s: float = 30.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "langrt", "router", "--port", str(self.port), "--log-level", "warning", *flags]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout_s
        while self.get("/health", check=False)[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"langrt router did not start:\n{self.process.stdout.read()}")
            time.sleep(0.1)
