"""The stress runs' command line: launch langrt, run, write benchmarks/results/stress_<run>.json.

    .venv/bin/python -m benchmarks.stress all
    .venv/bin/python -m benchmarks.stress load fuzz --requests 1000 --fuzz-cases 10000
    .venv/bin/python -m benchmarks.stress sigterm --model-path /tmp/tiny-model

Runs on one shared server, in this order: load, disconnects, fuzz, grammars, security,
grammar_worker. kv_pressure, sigterm and kill_child start their own (the fault ends it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path

from benchmarks.stress import faults, hostile, load
from benchmarks.stress.server import Server
from benchmarks.results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
SHARED_RUNS = ("load", "disconnects", "fuzz", "grammars", "security", "grammar_worker")
OWN_RUNS = ("kv_pressure", "sigterm", "kill_child")
RUNS = SHARED_RUNS + OWN_RUNS


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.stress", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("runs", nargs="+", choices=(*RUNS, "all"))
    p.add_argument("--model-path", default=None, help="default: the built-in model")
    p.add_argument(
        "--num-threads", default="1", help="torch threads of the model process (1: see the report on CPU contention)"
    )
    p.add_argument("--requests", type=int, default=1000, help="load: requests sent")
    p.add_argument("--concurrency", type=int, default=64, help="load: requests in flight")
    p.add_argument("--max-running", type=int, default=32, help="shared server: --max-running-requests")
    p.add_argument(
        "--max-queued",
        type=int,
        default=16,
        help="shared server: --max-queued-requests (with --max-running below --concurrency, 503s and retries happen)",
    )
    p.add_argument("--clients", type=int, default=100, help="disconnects: clients that drop")
    p.add_argument("--fuzz-cases", type=int, default=10_000)
    p.add_argument("--fuzz-concurrency", type=int, default=8)
    p.add_argument("--kv-pool", type=int, default=2048, help="kv_pressure: --max-total-tokens")
    p.add_argument("--kv-requests", type=int, default=48)
    p.add_argument("--kv-new-tokens", type=int, default=256)
    p.add_argument("--grammar-timeout", type=float, default=5.0, help="--grammar-compile-timeout of the servers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    return p.parse_args(argv)


def model_flags(args) -> list[str]:
    flags = ["--num-threads", args.num_threads, "--grammar-compile-timeout", str(args.grammar_timeout)]
    return flags + (["--model-path", args.model_path] if args.model_path else [])


def write(args, run: str, flags: list[str], result: dict, seconds: float) -> None:
    record = {
        "run": run,
        "model": args.model_path or "built-in (SmolLM2-135M-Instruct)",
        "server_flags": flags,
        "machine": {"cpus": _cpus(), "platform": platform.platform(), "python": platform.python_version()},
        "seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "result": result,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"stress_{run}.json"
    write_results(path, record)
    print(f"stress {run}: {seconds:.1f} s -> {path}", flush=True)
    print(json.dumps(_headline(result)), flush=True)


def _headline(result: dict) -> dict:
    keys = ("sent", "completed", "retried", "lost", "http_503_final", "http_5xx_other", "http_5xx", "cases", "latency_s",
            "kv_leaked_tokens", "retractions", "exit_code", "exit_after_signal_s", "exit_after_kill_s", "problem_count",
            "probe_latency_before_s", "probe_latency_during_s", "end_after_signal_s", "end_after_kill_s")  # fmt: skip
    return {k: result[k] for k in keys if k in result}


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def run_shared(args, runs: list[str]) -> None:
    flags = [*model_flags(args), "--max-total-tokens", "32768", "--max-running-requests", str(args.max_running),
             "--max-queued-requests", str(args.max_queued)]  # fmt: skip
    with Server(*flags) as server:
        for run in runs:
            start = time.monotonic()
            if run == "load":
                result = asyncio.run(load.run_load(server, args.requests, args.concurrency, args.seed))
            elif run == "disconnects":
                result = asyncio.run(
                    load.run_disconnects(server, args.clients, concurrency=32, new_tokens=200, seed=args.seed)
                )
            elif run == "fuzz":
                cases = hostile.draw_cases(args.fuzz_cases, args.seed)
                result = asyncio.run(hostile.run_fuzz(server, cases, args.fuzz_concurrency))
            elif run == "grammars":
                result = asyncio.run(hostile.run_hostile_grammars(server, rounds=2, baseline_s=10.0))
            elif run == "security":
                result = hostile.run_security(server)
            else:
                result = asyncio.run(faults.run_kill_grammar_worker(server))
            write(args, run, flags, result, time.monotonic() - start)


def run_own(args, run: str) -> None:
    start = time.monotonic()
    if run == "kv_pressure":
        flags = [*model_flags(args), "--max-total-tokens", str(args.kv_pool)]
        with Server(*flags) as server:
            result = asyncio.run(
                load.run_kv_pressure(server, args.kv_requests, prompt_words=60, new_tokens=args.kv_new_tokens)
            )
    elif run == "sigterm":
        flags = [*model_flags(args), "--max-total-tokens", "32768"]
        result = asyncio.run(faults.run_sigterm(flags, requests=32, new_tokens=1000, late=16))
    else:
        flags = [*model_flags(args), "--max-total-tokens", "32768"]
        result = {
            child: asyncio.run(faults.run_kill_child(flags, child=child, requests=16, new_tokens=1000))
            for child in ("scheduler", "detokenizer", "main")
        }
    write(args, run, flags, result, time.monotonic() - start)


def main(argv=None) -> int:
    args = parse_args(argv)
    runs = list(RUNS) if "all" in args.runs else list(dict.fromkeys(args.runs))
    shared = [r for r in SHARED_RUNS if r in runs]
    if shared:
        run_shared(args, shared)
    for run in OWN_RUNS:
        if run in runs:
            run_own(args, run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
