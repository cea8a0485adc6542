"""The worker process per engine, and its handle in the parent.

A worker (`python -m benchmarks.maskbench.worker ENGINE MEMORY_GB VOCAB`) loads the tokenizer and its
engine, says {"ready": True} (or {"init_error": ...}), then answers each job {"schema",
"instances": token lists} with a compile message ({"compile_ms"} or {"refused", "reason"}) and,
when compiled, {"walks": [...]}: messages are langrt.pickle_pipe's, of plain dicts and lists.
The parent waits for each under a time limit and kills a worker that passes it or dies (a hung
compile cannot stall the run); the next job starts a fresh one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.maskbench.data import Case  # noqa: E402
from benchmarks.maskbench.engines import MaskEngine, allowed, make_engine  # noqa: E402
from benchmarks.maskbench.results import EngineResult, judge  # noqa: E402
from langrt import pickle_pipe  # noqa: E402

# One thread per engine: the engines are compared as they run in a large batch, one core each.
WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# Why 300 s: loading a vocabulary into an engine takes seconds; past minutes the worker is stuck.
INIT_TIMEOUT_S = 300.0


def walk(engine: MaskEngine, tokens: list[int], eos: int) -> dict:
    """Walk one instance: {"mask_us": fill times, "stop": index of the first token the mask
    refused (len(tokens) for EOS) or None, "error": what went wrong inside the engine or None}.
    Every token must be in the mask filled before it, and EOS in the one after the last."""
    engine.start()
    mask_us: list[float] = []
    for i, token in enumerate([*tokens, eos]):
        start = time.perf_counter_ns()
        engine.fill()
        mask_us.append((time.perf_counter_ns() - start) / 1000)
        if not allowed(engine.mask, token):
            return {"mask_us": mask_us, "stop": i, "error": None}
        if i < len(tokens) and not engine.accept(token):
            return {"mask_us": mask_us, "stop": i, "error": f"token {i} ({token}) is in the mask but was not accepted"}
    return {"mask_us": mask_us, "stop": None, "error": None}


def compile_step(engine: MaskEngine, schema: Any) -> dict:
    """{"compile_ms": ...}, or {"refused": message, "reason": langrt's error param (the keyword),
    else the exception's type}."""
    start = time.perf_counter()
    try:
        engine.compile(schema)
    except Exception as e:  # noqa: BLE001 - any exception is the engine refusing the schema
        reason = getattr(e, "param", None) or type(e).__name__
        return {"refused": f"{type(e).__name__}: {e}"[:160], "reason": str(reason)}
    return {"compile_ms": 1000 * (time.perf_counter() - start)}


def walk_all(engine: MaskEngine, instances: list[list[int]], eos: int) -> list[dict]:
    walks = []
    for tokens in instances:
        try:
            walks.append(walk(engine, tokens, eos))
        except Exception as e:  # noqa: BLE001 - an engine failing mid-walk rejects the instance
            walks.append({"mask_us": [], "stop": 0, "error": f"{type(e).__name__}: {e}"[:160]})
    return walks


def worker_main(name: str, memory_gb: float, vocab: str) -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the engines print goes to stderr, not into the messages
    if memory_gb > 0:
        import resource

        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        from benchmarks.maskbench.vocabs import load_vocab_tokenizer

        tokenizer = load_vocab_tokenizer(vocab)
        engine = make_engine(name, tokenizer)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which skips the engine
        pickle_pipe.send(out, {"init_error": f"{type(e).__name__}: {e}"})
        return
    pickle_pipe.send(out, {"ready": True})
    for job in pickle_pipe.messages(sys.stdin.buffer):
        compiled = compile_step(engine, job["schema"])
        pickle_pipe.send(out, compiled)
        if "compile_ms" in compiled:
            pickle_pipe.send(out, {"walks": walk_all(engine, job["instances"], tokenizer.eos_token_id)})


@dataclass(frozen=True)
class Limits:
    compile_timeout_s: float  # past it, the schema counts as refused
    walk_timeout_s: float  # for one schema's instances; past it, the schema fails
    memory_gb: float  # address-space limit of a worker (0: none)
    vocab: str = "smollm2"  # maskbench/vocabs.py's name of the tokenizer every engine uses


class EngineUnavailable(Exception):
    """An engine's worker could not start (not installed, or its vocabulary failed to load)."""


class EngineWorker:
    """One engine's worker process, restarted after it passes a time limit or dies."""

    def __init__(self, name: str, limits: Limits, log: BinaryIO):
        self.name, self.limits, self.log, self.process = name, limits, log, None
        self.last_timed_out, self.exit_code = False, None

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "benchmarks.maskbench.worker",
            self.name,
            str(self.limits.memory_gb),
            self.limits.vocab,
        ]
        env = os.environ | WORKER_ENV
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=ROOT
        )
        try:
            hello = pickle_pipe.receive(self.process.stdout, INIT_TIMEOUT_S)
        except (TimeoutError, EOFError):
            hello = {"init_error": f"the worker did not start within {INIT_TIMEOUT_S:.0f} s, or died"}
        if "init_error" in hello:
            self.stop()
            raise EngineUnavailable(hello["init_error"])

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def run(self, case: Case, decode: Callable[[list[int]], str]) -> EngineResult:
        if self.process is None:
            self.start()
        try:
            pickle_pipe.send(
                self.process.stdin, {"schema": case.schema, "instances": [list(i.tokens) for i in case.instances]}
            )
        except BrokenPipeError:
            self.stop()
            return EngineResult.refused("crash", "the worker had died")
        compiled = self._receive(self.limits.compile_timeout_s)
        if compiled is None or "refused" in compiled:
            return self._refusal(compiled)
        walked = self._receive(self.limits.walk_timeout_s)
        if walked is None:
            what = "timeout" if self.last_timed_out else "crash"
            result = EngineResult("fail", compiled["compile_ms"], reason=f"{what} (masks)")
            result.errors.append(f"the instances' walk: {what} (limit {self.limits.walk_timeout_s:.0f} s)")
            return result
        return judge(case, compiled["compile_ms"], walked["walks"], decode)

    def _receive(self, timeout_s: float) -> dict | None:
        """The worker's next message, or None after stopping it (timed out, or it died)."""
        self.last_timed_out = False
        try:
            return pickle_pipe.receive(self.process.stdout, timeout_s)
        except TimeoutError:
            self.last_timed_out = True
        except EOFError:
            self.exit_code = _exit_code(self.process)
        self.stop()
        return None

    def _refusal(self, compiled: dict | None) -> EngineResult:
        if compiled is not None:
            return EngineResult.refused(compiled["reason"], compiled["refused"])
        if self.last_timed_out:
            return EngineResult.refused("timeout", f"compile passed {self.limits.compile_timeout_s:.0f} s")
        return EngineResult.refused("crash", f"the worker died while compiling (exit code {self.exit_code})")


def _exit_code(process: subprocess.Popen) -> int | None:
    """The exit code of a worker whose pipe just closed (None if it lingers)."""
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


if __name__ == "__main__":
    worker_main(sys.argv[1], float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "smollm2")
