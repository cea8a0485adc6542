"""1-3: load, disconnects, KV pressure, through HTTP on the tiny model."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.stress import load
from benchmarks.stress.server import Server

pytestmark = pytest.mark.slow


def test_mixed_load_loses_nothing(server):
    """150 mixed requests at concurrency 64 against room for 32: each completes, the overflow
    gets a 503 that a retry serves, and the KV pool is whole afterwards."""
    result = asyncio.run(load.run_load(server, requests=150, concurrency=64))
    assert result["lost"] == 0 and result["completed"] == result["sent"] == 150, result["failures"]
    assert result["http_5xx_other"] == 0 and result["http_503_final"] == 0
    assert result["retried"] > 0, "concurrency above capacity must have met 503s"
    assert set(result["by_kind"]) == {"plain", "stream", "constrained"}
    assert result["kv_leaked_tokens"] == 0 and result["served_after"]


def test_dropped_clients_leak_nothing(server):
    """Clients that vanish mid-stream, mid-wait or mid-compile (FIN or RST): once idle, every KV
    slot is back and the server answers; others' requests were served meanwhile."""
    result = asyncio.run(load.run_disconnects(server, clients=60, concurrency=16, new_tokens=1000))
    assert result["kv_leaked_tokens"] == 0 and result["served_after"], result
    assert result["aborted_by_server"] >= 30, f"abandoned requests must be aborted, not run to the end: {result}"
    assert result["idle_after_s"] < 30
    assert any("events" in r for r in result["reached"]), "some clients must have dropped mid-stream"
    assert result["probe_latency_during_s"]["n"] > 0


def test_kv_pressure_finishes_by_retraction(tiny_model):
    """A 1024-slot pool and 24 requests of ~230 tokens each: all finish with their full length
    (retracted and resumed, not deadlocked) within bounded time, and nothing leaks."""
    with Server(*tiny_model, "--max-total-tokens", "1024") as s:
        result = asyncio.run(load.run_kv_pressure(s, requests=24, prompt_words=20, new_tokens=200, timeout_s=120))
    assert result["lost"] == 0 and result["completed"] == 24, result["failures"]
    assert result["finishes"] == ["length"]
    assert result["retractions"] > 0, "the pool was meant to run out"
    assert result["kv_leaked_tokens"] == 0 and result["served_after"]
    assert result["wall_s"] < 120
