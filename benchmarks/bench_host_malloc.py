"""The model process's C allocator tuned (the default) vs glibc's defaults (--disable-malloc-tuning),
side by side on the built-in model (see langrt/mem/host_malloc.py).

Both engines up at once, rounds alternating which goes first; each side's median round.
Workloads: bench_prefix's few-shot wave (64 questions after one 1,205-token preamble: large
activations and K/V gathers), bench_json's 16-request extraction wave (short contexts), and 8
random prompts decoding 64 tokens each (no shared prefix).

    .venv/bin/python benchmarks/bench_host_malloc.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from bench_json import SCHEMA, documents
from bench_prefix import chat, few_shot_prompts, random_text

import langrt

RESULTS = Path(__file__).parent / "results"


def workloads(tokenizer, quick: bool) -> dict[str, tuple[list[str], dict]]:
    rng = random.Random(0)
    extraction = [chat(tokenizer, [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{d}"}]) for d in documents(16)]
    return {
        "few_shot": (few_shot_prompts(tokenizer, 16 if quick else 64), {"max_new_tokens": 8, "temperature": 0}),
        "json_extraction": (extraction, {"json_schema": SCHEMA, "max_new_tokens": 160, "temperature": 0}),
        "no_reuse": ([chat(tokenizer, [{"role": "user", "content": random_text(rng, 60)}]) for _ in range(8)],
                     {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller few-shot wave, 1 round")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    common = {"log_level": "warning", "max_total_tokens": 65536}
    results = {"quick": args.quick, "rounds": rounds, "workloads": {}}
    with langrt.Engine(**common) as tuned, langrt.Engine(**common, disable_malloc_tuning=True) as default:
        engines = {"tuned": tuned, "glibc_default": default}
        for name, (prompts, params) in workloads(tuned.tokenizer, args.quick).items():
            for engine in engines.values():  # warm-up: grammar compiled, first allocations made
                engine.generate(prompts[:2], params)
            seconds = {side: [] for side in engines}
            for r in range(rounds):
                for side in (("tuned", "glibc_default") if r % 2 == 0 else ("glibc_default", "tuned")):
                    engines[side].flush_cache()
                    start = time.perf_counter()
                    engines[side].generate(prompts, params)
                    seconds[side].append(time.perf_counter() - start)
            row = {side: {"seconds": s, "median_s": statistics.median(s)} for side, s in seconds.items()}
            row["speedup"] = row["glibc_default"]["median_s"] / row["tuned"]["median_s"]
            results["workloads"][name] = row
            print(f"{name:16s} ({len(prompts)} requests): tuned {row['tuned']['median_s']:.2f} s, glibc defaults "
                  f"{row['glibc_default']['median_s']:.2f} s -> {row['speedup']:.2f}x", flush=True)  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench_host_malloc{'_quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
