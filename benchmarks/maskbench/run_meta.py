"""What a MaskBench results file records about its run: everything every results file records
(benchmarks/results_meta.py: commit, CPU and flags, kernel path, versions, command), plus the load
before and after, since timings on a shared machine are only as good as its quiet."""

from __future__ import annotations

import os

from benchmarks.results_meta import run_meta as shared_run_meta


def run_meta(load_before: tuple[float, float, float]) -> dict:
    return {**shared_run_meta(), "load_before": list(load_before), "load_after": list(os.getloadavg())}
