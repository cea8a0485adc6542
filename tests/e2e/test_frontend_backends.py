"""The backends that own a runtime: `Runtime` (a launched `langrt launch`, stopped on shutdown
and at interpreter exit) and `EngineBackend` (an in-process langrt.Engine)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import langrt_frontend as sgl

pytestmark = pytest.mark.slow


@sgl.function
def capital(s):
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=12))
    s += sgl.user("Is that right?") + sgl.assistant(sgl.select("check", choices=["Yes", "No"]))


def test_runtime_launches_serves_and_shuts_down():
    runtime = sgl.Runtime(num_threads=1, max_total_tokens=16384)
    try:
        assert runtime.url.startswith("http://127.0.0.1:") and isinstance(runtime.endpoint, sgl.RuntimeEndpoint)
        assert runtime.caches_prefixes is True, "a server with its radix cache"
        state = capital.run(temperature=0, backend=runtime)
        assert state.error() is None and "Paris" in state["answer"] and state["check"] in ("Yes", "No")
        assert sgl.get_server_info(runtime)["num_threads"] == 1 and sgl.flush_cache(runtime) is True
    finally:
        runtime.shutdown()
    assert runtime.process.returncode == 0, "SIGTERM ends the server cleanly"
    runtime.shutdown()  # a second call is harmless


def test_runtime_that_cannot_start_raises_with_its_log(tmp_path):
    with pytest.raises(RuntimeError, match="exited with code"):
        sgl.Runtime(model_path=str(tmp_path / "no-such-model"), launch_timeout=120)


def test_runtime_stops_at_interpreter_exit():
    script = textwrap.dedent(
        """
        import langrt_frontend as sgl
        runtime = sgl.Runtime(num_threads=1, max_total_tokens=8192)
        print(runtime.process.pid, flush=True)
        # no shutdown(): the server must not outlive this interpreter
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    pid = int(result.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the launched server outlived the interpreter that started it"


def test_engine_backend_runs_programs_in_process():
    backend = sgl.EngineBackend(log_level="warning", num_threads=1, max_total_tokens=16384)
    try:
        assert backend.chat_template.name == "chatml" and backend.caches_prefixes is True
        state = capital.run(temperature=0, backend=backend)
        assert state.error() is None and "Paris" in state["answer"] and state["check"] in ("Yes", "No")

        @sgl.function
        def forks(s):
            s += "Three colours:"
            f = s.fork(3)
            f += sgl.gen("c", max_tokens=4, temperature=0.8)
            f.join()

        assert len(forks.run(backend=backend)["c"]) == 3

        @sgl.function
        def bad(s):
            s += "Hello" + sgl.gen("a", max_tokens=-1)

        error = bad.run(backend=backend).error()
        assert isinstance(error, RuntimeError) and "max_new_tokens" in str(error)
        streamed = capital.run(temperature=0, stream=True, backend=backend)
        pieces = list(streamed.text_iter("answer"))
        assert len(pieces) > 1, "the Engine streams: the answer arrives in pieces"
        assert "".join(pieces) == streamed["answer"] and "".join(streamed.text_iter()) == streamed.text()
    finally:
        backend.shutdown()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
