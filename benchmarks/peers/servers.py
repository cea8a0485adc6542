"""OpenAI-compatible servers for bench_serving.py, started on one model file with the same threads
and KV capacity: langrt (`langrt launch`), llama.cpp's own server (`llama-server`, continuous
batching and parallel slots sharing one KV buffer), and llama-cpp-python's (`python -m
llama_cpp.server`, one request at a time: it has neither).

A ServerProcess measures its start (process start -> the first 200 from its health route) and its
process tree's memory, and stops the whole tree at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from machine_limits import tree_memory  # noqa: E402

SERVERS = ("langrt", "llama-server", "llama-cpp-python")


@dataclass(frozen=True)
class ServerSpec:
    server: str  # one of SERVERS
    model: str
    port: int
    threads: int
    ctx: int  # KV capacity in tokens, all requests together
    parallel: int  # llama-server's slots (requests decoded together at most)
    llama_server_bin: str | None = None
    extra: tuple[str, ...] = ()  # more flags, as the server takes them

    def command(self) -> list[str]:
        if self.server == "langrt":
            return [sys.executable, "-m", "langrt", "launch", "--model-path", self.model, "--port", str(self.port),
                    "--num-threads", str(self.threads), "--max-total-tokens", str(self.ctx), "--log-level", "warning", *self.extra]  # fmt: skip
        if self.server == "llama-server":
            return [self._llama_server_bin(), "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                    "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.ctx), "--parallel", str(self.parallel),
                    "--cont-batching", "--kv-unified", "--no-webui", *self.extra]  # fmt: skip
        from peers.llama_cpp_side import server_command

        return server_command(self.model, self.port, self.threads, self.ctx) + list(self.extra)

    def _llama_server_bin(self) -> str:
        found = self.llama_server_bin or shutil.which("llama-server")
        if not found:
            raise FileNotFoundError(
                "llama-server not found: build it (docs/performance.md says how) and pass --llama-server PATH"
            )
        return found

    @property
    def health_path(self) -> str:
        return "/v1/models" if self.server == "llama-cpp-python" else "/health"


class ServerProcess:
    def __init__(self, spec: ServerSpec, timeout_s: float = 900):
        self.spec = spec
        self.url = f"http://127.0.0.1:{spec.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"serve-{spec.server}-", suffix=".log", delete=False)
        started = time.perf_counter()
        # its own session: stop() signals the whole group (langrt's scheduler and detokenizer too)
        self.proc = subprocess.Popen(spec.command(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_healthy(started + timeout_s)
        self.start_to_health_s = time.perf_counter() - started

    def _wait_healthy(self, deadline: float) -> None:
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.spec.server} exited with code {self.proc.returncode}; its log: {self.log.name}\n{self._tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + self.spec.health_path, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or still loading (llama-server answers 503 then)
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"{self.spec.server} not healthy at {self.url}{self.spec.health_path} in time; its log: {self.log.name}\n{self._tail()}"
        )

    def _tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def memory(self) -> dict:
        return tree_memory(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
