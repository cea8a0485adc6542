"""The MaskBench runner's parts; `benchmarks/bench_maskbench.py` drives them.

Module map: data (MaskBench's files as cases: sampling, serialising, tokenizing), engines (one
adapter per grammar engine behind a small protocol), worker (the worker process per engine and
its parent-side handle, with the time limits), results (per-schema verdicts, the summary table).
"""
