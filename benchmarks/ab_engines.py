"""Two engine configurations side by side on the same waves: bench_host_malloc.py and
bench_cpu_attention.py are each one call of `main`.

Both engines stay up; each workload is warmed up on both, then run `rounds` times with the side
that goes first alternating; each side's median round is reported, with the speed-up of the
candidate over the baseline and how many outputs the two sides agree on. In bfloat16 that count
is not the compared feature's doing alone: CPU bf16 GEMMs round a row differently with the
number of rows beside it, and which requests share a pass depends on arrival timing, so even
one engine run twice does not always repeat itself (measured: 8 greedy 64-token answers, 0-8 of
8 repeated across three runs of one engine). Compare outputs in float32.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from bench_json import SCHEMA, documents
from bench_prefix import chat, few_shot_prompts, random_text

import langrt
from results_meta import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def workloads(
    tokenizer, quick: bool, few_shot_tokens: int, decode_name: str, decode_prompts: int
) -> dict[str, tuple[list[str], dict]]:
    """bench_prefix's few-shot wave (64 questions after a 1,205-token preamble; 16 with --quick),
    bench_json's 16-request extraction wave, and `decode_prompts` random prompts x 64 tokens."""
    rng = random.Random(0)
    extraction = [
        chat(tokenizer, [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{d}"}])
        for d in documents(16)
    ]
    return {
        "few_shot": (few_shot_prompts(tokenizer, 16 if quick else 64), {"max_new_tokens": few_shot_tokens, "temperature": 0}),
        "json_extraction": (extraction, {"json_schema": SCHEMA, "max_new_tokens": 160, "temperature": 0}),
        decode_name: ([chat(tokenizer, [{"role": "user", "content": random_text(rng, 60)}]) for _ in range(decode_prompts)],
                      {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}),
    }  # fmt: skip


def compare(engines: dict, candidate: str, baseline: str, prompts: list[str], params: dict, rounds: int) -> dict:
    """One workload on both engines ({name: Engine}); the row that goes into the results JSON."""
    sides = (candidate, baseline)
    for engine in engines.values():  # warm-up: grammar compiled, first allocations made
        engine.generate(prompts[:2], params)
    seconds = {side: [] for side in sides}
    outputs = {}
    for r in range(rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            engines[side].flush_cache()
            start = time.perf_counter()
            outputs[side] = engines[side].generate(prompts, params)
            seconds[side].append(time.perf_counter() - start)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs[candidate])
    row = {
        side: {"seconds": s, "median_s": statistics.median(s), "output_tok_s": tokens / statistics.median(s)}
        for side, s in seconds.items()
    }
    row["requests"], row["output_tokens"] = len(prompts), tokens
    row["speedup"] = row[baseline]["median_s"] / row[candidate]["median_s"]
    row["identical_outputs"] = sum(a["text"] == b["text"] for a, b in zip(outputs[candidate], outputs[baseline]))
    return row


def describe(name: str, row: dict, candidate: str, baseline: str) -> str:
    return (f"{name:16s} ({row['requests']} requests, {row['output_tokens']} tokens): {candidate} {row[candidate]['median_s']:.2f} s, "
            f"{baseline} {row[baseline]['median_s']:.2f} s -> {row['speedup']:.2f}x; identical outputs "
            f"{row['identical_outputs']}/{row['requests']}")  # fmt: skip


def main(
    doc: str, name: str, sides: dict[str, dict], few_shot_tokens: int, decode_name: str, decode_prompts: int
) -> None:
    """A benchmark's whole run: `sides` is {label: Engine options}, candidate first, baseline
    second; results/<name>[_quick].json."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller few-shot wave, 1 round")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    (candidate, candidate_options), (baseline, baseline_options) = sides.items()
    common = {"log_level": "warning", "max_total_tokens": 65536}
    results = {"quick": args.quick, "rounds": rounds, "workloads": {}}
    with langrt.Engine(**common, **candidate_options) as first, langrt.Engine(**common, **baseline_options) as second:
        engines = {candidate: first, baseline: second}
        for workload, (prompts, params) in workloads(
            first.tokenizer, args.quick, few_shot_tokens, decode_name, decode_prompts
        ).items():
            row = results["workloads"][workload] = compare(engines, candidate, baseline, prompts, params, rounds)
            print(describe(workload, row, candidate, baseline), flush=True)
    out = RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    write_results(out, results)
    print(f"wrote {out}")
