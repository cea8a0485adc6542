"""Reliability tests: the stress runs of benchmarks/stress/ at CI scale, on the tiny model.

One shared server (package scope) serves the load, disconnect, fuzz, grammar and security tests;
the KV-pressure and fault tests start their own. Capacity (16 running + 16 queued) sits below
the load test's concurrency of 64, so 503s and their retries are exercised too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.stress.server import Server  # noqa: E402

SHARED_FLAGS = (
    "--max-total-tokens", "8192", "--max-running-requests", "16", "--max-queued-requests", "16",
    "--grammar-compile-timeout", "2",
)  # fmt: skip


@pytest.fixture(scope="package")
def tiny_model(tiny_llama_dir) -> list[str]:
    """Flags that serve the tiny random-weight model (for runs that start their own server). One
    torch thread: on a small shared CPU, two threads spinning for each other's cores made a
    decode step of the tiny model ~40x slower."""
    return ["--model-path", str(tiny_llama_dir), "--dtype", "float32", "--num-threads", "1"]


@pytest.fixture(scope="package")
def server(tiny_model):
    s = Server(*tiny_model, *SHARED_FLAGS)
    yield s
    assert s.stop() == 0, s.log()[-3000:]
