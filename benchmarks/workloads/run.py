"""Structured-program workloads: langrt with its radix cache, langrt with --disable-radix-cache,
and HF transformers `generate`, side by side in one invocation.

Every workload is an SGLang program (langrt_frontend) run with `run_batch`; the three systems run
the same program code (the HF baseline is a frontend backend: hf_backend.py). Reported per
workload and system: programs/s, output tok/s, the cache hit rate and its fraction of the
offline optimum (recording.py), and the ratios between the systems, checked against the targets
of issue 8. Both servers run with one torch thread (steadier on a shared 2-core machine), and so
does the baseline.

    .venv/bin/python benchmarks/workloads/run.py --quick             # CI scale, a few minutes
    .venv/bin/python benchmarks/workloads/run.py --report            # the figures (~13 min), README table, chart
    .venv/bin/python benchmarks/workloads/run.py --only hellaswag --systems langrt hf
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

import langrt_frontend as sgl  # noqa: E402
from benchmarks.workloads import ALL  # noqa: E402
from benchmarks.workloads.base import run_workload  # noqa: E402
from benchmarks.workloads.hf_backend import HFBackend  # noqa: E402
from benchmarks.workloads.recording import optimal_hit_rate  # noqa: E402
from benchmarks.results_meta import write_results  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SYSTEMS = ("langrt", "langrt_no_cache", "hf")
KV_POOL_TOKENS = 65536  # ~1.5 GB of bf16 K/V: no workload here needs to evict
THREADS = 1
TARGETS = {  # issue 8: (figure, minimum) per workload group
    "few_shot": (("langrt_vs_hf", 8.0), ("cache_on_vs_off", 4.0), ("fraction_of_optimum", 0.95)),
    "branching": (("cache_on_vs_off", 2.0), ("fraction_of_optimum", 0.95)),
    "other": (("fraction_of_optimum", 0.95),),
}
# Below this optimal hit rate the hit-rate target does not apply: a few shared template tokens
# (json_schema's programs share only "<|im_start|>user\nDocument:") are below what langrt
# deliberately shares (run_batch warm-ups from 32 characters, in-batch waits from 32 tokens).
MIN_OPTIMUM = 0.10
_SERVER_COUNTERS = ("prompt_tokens", "cached_prompt_tokens", "evicted_tokens", "retractions", "forward_passes",
                    "jump_forward_tokens")  # fmt: skip


def start_systems(names: list[str]) -> dict:
    systems = {}
    try:
        for name in names:
            if name == "hf":
                systems[name] = HFBackend(num_threads=THREADS)
            else:
                systems[name] = sgl.Runtime(
                    num_threads=THREADS, max_total_tokens=KV_POOL_TOKENS, disable_radix_cache=name == "langrt_no_cache"
                )
            warm_up(systems[name])
        templates = [s.chat_template for s in systems.values()]
        if any(t != templates[0] for t in templates):
            raise RuntimeError(f"the systems would build different prompts: chat templates differ: {templates}")
    except BaseException:
        stop_systems(systems)
        raise
    return systems


def warm_up(backend) -> None:
    """First-call costs (kernel selection, allocator growth) out of the timed runs."""
    backend.generate(
        {"text": "Warm up: " + "one two three " * 40, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    )


def stop_systems(systems: dict) -> None:
    for backend in systems.values():
        backend.shutdown()


def measure(workload, systems: dict, quick: bool, tokenizer) -> dict:
    row = {"name": workload.name, "title": workload.title, "group": workload.group}
    for name, backend in systems.items():
        if not backend.flush_cache():
            raise RuntimeError(f"{name}: could not flush the cache before {workload.name}")
        before = counters(backend)
        run = run_workload(workload, backend, quick)
        figures = run.figures()
        figures.update(cache_figures(run.recording, tokenizer))
        after = counters(backend)
        if before is not None:
            figures["server"] = {k: after[k] - before[k] for k in _SERVER_COUNTERS}
        row[name] = figures
        print(f"  {name:16} {figures['programs_s']:7.3f} programs/s {figures['output_tok_s']:7.1f} out tok/s "
              f"hit {figures['cache_hit_rate']:6.1%} of optimum {figures['optimal_hit_rate']:6.1%} "
              f"({figures['seconds']:.1f} s, {figures['requests']} requests, {figures['errors']} errors)", flush=True)  # fmt: skip
    row["ratios"] = ratios(row)
    row["targets"] = targets(row)
    return row


def counters(backend) -> dict | None:
    info = backend.get_server_info()
    return info if "forward_passes" in info else None


def cache_figures(recording, tokenizer) -> dict:
    """The optimum for this run's own token sequences (prompts re-tokenized here; the count of
    prompts whose length differs from the runtime's prompt_tokens is reported)."""
    sequences, mismatched = [], 0
    for exchange in recording.exchanges:
        ids = tokenizer.encode(exchange.prompt, add_special_tokens=False)
        mismatched += len(ids) != exchange.meta["prompt_tokens"]
        sequences.append((ids, exchange.response.get("output_ids") or []))
    optimum = optimal_hit_rate(sequences)
    hit = recording.totals()["cache_hit_rate"]
    return {"optimal_hit_rate": optimum, "fraction_of_optimum": hit / optimum if optimum else None,
            "tokenization_mismatches": mismatched}  # fmt: skip


def ratios(row: dict) -> dict:
    out = {}
    for a, b, label in (("langrt", "hf", "langrt_vs_hf"), ("langrt", "langrt_no_cache", "cache_on_vs_off"),
                        ("langrt_no_cache", "hf", "no_cache_vs_hf")):  # fmt: skip
        if a in row and b in row:
            out[label] = row[a]["programs_s"] / row[b]["programs_s"]
            out[label + "_output_tok_s"] = row[a]["output_tok_s"] / max(row[b]["output_tok_s"], 1e-9)
    if "langrt" in row:
        out["fraction_of_optimum"] = row["langrt"]["fraction_of_optimum"]
    return out


def targets(row: dict) -> dict:
    out = {}
    for figure, minimum in TARGETS[row["group"]]:
        value = row["ratios"].get(figure)
        if figure == "fraction_of_optimum" and row.get("langrt", {}).get("optimal_hit_rate", 0) < MIN_OPTIMUM:
            continue  # nothing worth sharing: a ratio of two near-zero rates says nothing
        if value is not None:
            out[figure] = {"value": value, "target": minimum, "met": value >= minimum}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI scale: a few programs per workload")
    parser.add_argument("--only", nargs="+", choices=[w.name for w in ALL], help="run these workloads only")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--out", type=Path, help="results JSON (default: benchmarks/results/workloads[_quick].json)")
    parser.add_argument("--report", action="store_true", help="also write the README table and the chart")
    args = parser.parse_args(argv)
    workloads = [w for w in ALL if not args.only or w.name in args.only]
    results = {
        "model": "SmolLM2-135M-Instruct (built-in), bfloat16",
        "quick": args.quick,
        "threads": THREADS,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
        "load_average_start": os.getloadavg(),
        "workloads": [],
    }
    started = time.perf_counter()
    systems = start_systems(args.systems)
    tokenizer = systems["hf"].tokenizer if "hf" in systems else _tokenizer()
    try:
        for workload in workloads:
            print(f"{workload.name}: {workload.title}", flush=True)
            results["workloads"].append(measure(workload, systems, args.quick, tokenizer))
    finally:
        stop_systems(systems)
    results["load_average_end"] = os.getloadavg()
    results["wall_seconds"] = time.perf_counter() - started
    out = args.out or RESULTS / f"workloads{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out, results)
    print(f"wrote {out} ({results['wall_seconds']:.0f} s)")
    if args.report:
        from benchmarks.workloads.report import write_chart, write_readme_table

        print(f"wrote {write_readme_table(results)} and {write_chart(results, out.with_suffix('.png'))}")
    return results


def _tokenizer():
    from transformers import AutoTokenizer

    from langrt.builtin import builtin_model_path

    path = builtin_model_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


if __name__ == "__main__":
    main()
