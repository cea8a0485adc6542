"""Starts a worker.py process for one engine and talks to it; measures what only the outside can:
the time from process start to its first answer, and the memory of its whole process tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from machine_limits import tree_memory  # noqa: E402

WORKER = Path(__file__).parent / "worker.py"


@dataclass(frozen=True)
class EngineSpec:
    """One engine configuration: which engine, its langrt settings, and environment added to its
    process (a langrt variant's switches, or PYTHONPATH for a llama-cpp-python built elsewhere)."""

    engine: str  # "langrt" or "llama_cpp"
    name: str
    dtype: str = "auto"
    quantization: str = "auto"
    env: dict[str, str] = field(default_factory=dict)


class Worker:
    def __init__(self, spec: EngineSpec, model: str | None, threads: int, ctx: int):
        self.spec = spec
        command = [sys.executable, str(WORKER), "--engine", spec.engine, "--threads", str(threads), "--ctx", str(ctx),
                   "--dtype", spec.dtype, "--quantization", spec.quantization]  # fmt: skip
        if model is not None:
            command += ["--model", model]
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{spec.name}-", suffix=".log", delete=False)
        started = time.perf_counter()
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env={**os.environ, **spec.env})  # fmt: skip
        ready = self._read()
        self.start_to_first_answer_s = time.perf_counter() - started
        self.system_info, self.version = ready["system_info"], ready["version"]
        self.kv_value_bytes = ready["kv_value_bytes"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        answer = json.loads(line) if line else {"error": f"worker exited (code {self.proc.poll()})"}
        if "error" in answer:
            self.close()
            raise RuntimeError(
                f"{self.spec.name} worker failed: {answer['error']}\n--- its log ({self.log.name}) ---\n{self.log_tail()}"
            )
        return answer

    def log_tail(self, chars: int = 3000) -> str:
        """The end of what the engine printed (a wait for a kernel build, say, shows there)."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def memory(self) -> dict:
        return tree_memory(self.proc.pid)

    def close(self) -> None:
        """Closing stdin ends the worker's loop; it exits, and langrt's Engine stops its children."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
