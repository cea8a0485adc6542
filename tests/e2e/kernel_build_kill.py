"""Issue 48, end to end with the real compiler (minutes on 2 cores, so a script, not a test):

    .venv/bin/python tests/e2e/kernel_build_kill.py

1. A process builds the CPU kernels into a fresh TORCH_EXTENSIONS_DIR and is killed (-9) mid-build.
2. A new process builds them again: it must finish within BOUND_S (before the fix it waited for
   ever on the killed build's lock).
3. A second "checkout" (a copy of kernels/cpu with one source changed) builds its own library;
   then the two are loaded alternately, each in a new process: neither rebuilds.
Exits non-zero on any failure; prints the times.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BOUND_S = 900
# Builds the library of `sources_dir` (the kernels/cpu layout) for this CPU; prints "built" if it compiled.
CHILD = """
import logging, pathlib, sys
logging.basicConfig(level=logging.INFO, format="%(message)s")
import langrt_kernels.cpu as cpu
from langrt_kernels.cpu import build_cache
spec = cpu.library_spec(cpu.isa())
folder = pathlib.Path(sys.argv[1])
spec = build_cache.LibrarySpec(spec.name, tuple(folder / p.name for p in spec.sources), spec.cflags, spec.label)
built = []
path = build_cache.ensure_built(spec, lambda s, d: built.append(1) or build_cache._torch_compile(s, d))
build_cache.load(spec)
print("built" if built else "loaded", path, flush=True)
"""


def run_child(sources: pathlib.Path, env: dict, timeout: float) -> tuple[str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(sources)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"child failed ({done.returncode}) after {took:.0f} s:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1], took


def kill_mid_build(sources: pathlib.Path, env: dict, root: pathlib.Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(sources)], env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while not list(root.rglob("build-*/build.ninja")):  # torch has started compiling
        if time.monotonic() > deadline or child.poll() is not None:
            raise SystemExit("the first build did not start")
        time.sleep(0.5)
    time.sleep(5)  # well inside the compile (20 s or more)
    child.send_signal(signal.SIGKILL)
    child.wait()
    print(f"killed the building process (pid {child.pid}); left behind: {sorted(p.name for p in root.rglob('*lock'))}")


def main() -> None:
    work = pathlib.Path(tempfile.mkdtemp(prefix="langrt-kill-build-"))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(work / "ext"), "PYTHONPATH": str(ROOT)}
    first = ROOT / "kernels" / "cpu"
    second = work / "checkout2"
    shutil.copytree(first, second, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    with open(second / "layer_ops.cpp", "a") as source:
        source.write("\n// the second checkout's edit\n")
    kill_mid_build(first, env, work / "ext")
    outcome, took = run_child(first, env, BOUND_S)
    print(f"after the kill: {outcome} in {took:.0f} s")
    assert outcome.startswith("built"), outcome
    outcome, took = run_child(second, env, BOUND_S)
    print(f"second checkout: {outcome} in {took:.0f} s")
    for sources in (first, second, first, second):
        outcome, took = run_child(sources, env, 120)
        print(f"alternating, {sources.name}: {outcome} in {took:.1f} s")
        assert outcome.startswith("loaded"), f"{sources} rebuilt: {outcome}"
    shutil.rmtree(work, ignore_errors=True)
    print("OK")


if __name__ == "__main__":
    main()
