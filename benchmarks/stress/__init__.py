"""Stress runs against `langrt launch` (issue 9: load, faults, hostile input).

    .venv/bin/python -m benchmarks.stress all              # every run, full size
    .venv/bin/python -m benchmarks.stress load --requests 1000 --concurrency 64

Each run writes benchmarks/results/stress_<run>.json. tests/reliability/ runs the same code at
a small scale in CI.

    server.py    the server subprocess, its children, waiting for idle
    client.py    one request (plain or SSE), retries on 503, outcome figures
    workload.py  request mixes with short outputs
    load.py      1. load  2. disconnects  3. KV pressure
    fuzz.py      4. hypothesis strategies for hostile bodies
    hostile.py   4. fuzz runner  5. hostile grammars  7. security
    faults.py    6. SIGTERM during load, a killed child, a killed grammar worker
"""
