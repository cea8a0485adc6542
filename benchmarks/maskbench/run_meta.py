"""What a MaskBench results file records about its run: the commit, the CPU and its vector
flags, the load before and after (timings on a shared machine are only as good as its quiet),
and the exact command."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_bf16")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu() -> dict:
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in FLAGS if f in flags]}


def run_meta(load_before: tuple[float, float, float]) -> dict:
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "langrt/constrained", "benchmarks/maskbench")),
        "cpu": _cpu(),
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }
