"""A `langrt launch` subprocess for the stress runs: start on a free port, wait for health, and
look at what it started (child processes, ipc directory) so a run can check they go away."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

API_KEY = "stress-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m langrt launch --api-key stress-key ...` on 127.0.0.1 (the default bind)."""

    def __init__(self, *flags: str, timeout_s: float = 180.0, api_key: str | None = API_KEY):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        key = ["--api-key", api_key] if api_key else []
        command = [
            sys.executable,
            "-m",
            "langrt",
            "launch",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *key,
            *flags,
        ]
        self.log_path = Path(f"/tmp/langrt-stress-{self.port}.log")
        self._log = self.log_path.open("w")
        self._final_log: str | None = None
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout_s
        while self.get("/health")[0] != 200:
            if self.process.poll() is not None:
                raise RuntimeError(f"langrt launch exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError("langrt launch did not become healthy in time")
            time.sleep(0.2)
        info = self.get("/get_server_info")[1]
        self.scheduler_pid = info["processes"]["scheduler"]
        self.detokenizer_pid = info["processes"]["detokenizer"]
        self.tp_worker_pids = info["processes"].get("tp_workers", [])  # ranks 1.. of --tp-size
        self.ipc_directory = info["processes"]["ipc_directory"]

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 60.0):
        """(status, parsed JSON or text); status 0 when the connection fails."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={**self.headers, **(headers or {})}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, None
        try:
            return status, json.loads(raw)
        except json.JSONDecodeError:
            return status, raw

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def post(self, path: str, body, **kw):
        return self.request("POST", path, body, **kw)

    def info(self) -> dict:
        status, info = self.get("/get_server_info")
        assert status == 200, (status, info)
        return info

    def finished_counts(self) -> dict[str, int]:
        """langrt_requests_total by finish reason, from /metrics."""
        status, text = self.get("/metrics")
        assert status == 200, (status, text)
        prefix = 'langrt_requests_total{finish_reason="'
        return {
            line[len(prefix) :].split('"')[0]: int(float(line.split()[-1]))
            for line in text.splitlines()
            if line.startswith(prefix)
        }

    def wait_idle(self, timeout_s: float = 60.0) -> dict:
        """/get_server_info once nothing is queued, running or in flight (raises on timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.info()
            if info["running_requests"] == info["waiting_requests"] == info["in_flight_requests"] == 0:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not become idle: {info}")
            time.sleep(0.1)

    def descendants(self) -> list[int]:
        """Every live process below the server (children, their children: grammar workers)."""
        return _descendants(self.process.pid)

    def log(self) -> str:
        """What the server printed (kept in memory once it stopped; the file is removed)."""
        if self._final_log is not None:
            return self._final_log
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def tracebacks(self, limit: int = 3) -> list[str]:
        """The first tracebacks the server logged (each with the lines just before it)."""
        out, lines = [], self.log().splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Traceback") and len(out) < limit:
                end = next(
                    (j for j in range(i + 1, len(lines)) if lines[j] and not lines[j].startswith((" ", "Traceback"))),
                    len(lines) - 1,
                )
                out.append("\n".join(lines[max(0, i - 2) : end + 1])[-4000:])
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._final_log is None:
            self._final_log = self.log()
            self._log.close()
            self.log_path.unlink(missing_ok=True)
        return self.process.returncode


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
