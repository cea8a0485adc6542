"""The cpu attention backend (langrt's C++ kernel for decode and draft rows, the default on CPU)
vs the torch backend (K/V gathered into padded blocks, SDPA), side by side on the built-in model.

Both engines up at once, rounds alternating which goes first; each side's median round.
Workloads: bench_prefix's few-shot wave (64 questions after one 1,205-token preamble, 32 new
tokens each: decode over a long shared prefix), bench_json's 16-request extraction wave
(jump-forward drafts, short contexts), and 32 random prompts decoding 64 tokens each.

    .venv/bin/python benchmarks/bench_cpu_attention.py [--quick]
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
SIDES = ("cpu", "torch")


def workloads(tokenizer, quick: bool) -> dict[str, tuple[list[str], dict]]:
    rng = random.Random(0)
    extraction = [chat(tokenizer, [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{d}"}]) for d in documents(16)]
    return {
        "few_shot": (few_shot_prompts(tokenizer, 16 if quick else 64), {"max_new_tokens": 32, "temperature": 0}),
        "json_extraction": (extraction, {"json_schema": SCHEMA, "max_new_tokens": 160, "temperature": 0}),
        "decode_32": ([chat(tokenizer, [{"role": "user", "content": random_text(rng, 60)}]) for _ in range(32)],
                      {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller few-shot wave, 1 round")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    common = {"log_level": "warning", "max_total_tokens": 65536}
    results = {"quick": args.quick, "rounds": rounds, "workloads": {}}
    with langrt.Engine(**common, attention_backend="cpu") as cpu, langrt.Engine(**common, attention_backend="torch") as ref:
        engines = {"cpu": cpu, "torch": ref}
        for name, (prompts, params) in workloads(cpu.tokenizer, args.quick).items():
            for engine in engines.values():  # warm-up: grammar compiled, first allocations made
                engine.generate(prompts[:2], params)
            seconds = {side: [] for side in SIDES}
            outputs = {}
            for r in range(rounds):
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    engines[side].flush_cache()
                    start = time.perf_counter()
                    out = engines[side].generate(prompts, params)
                    seconds[side].append(time.perf_counter() - start)
                    outputs[side] = out
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs["cpu"])
            row = {side: {"seconds": s, "median_s": statistics.median(s), "output_tok_s": tokens / statistics.median(s)} for side, s in seconds.items()}
            row["requests"], row["output_tokens"] = len(prompts), tokens
            row["speedup"] = row["torch"]["median_s"] / row["cpu"]["median_s"]
            row["identical_outputs"] = sum(a["text"] == b["text"] for a, b in zip(outputs["cpu"], outputs["torch"]))
            results["workloads"][name] = row
            print(f"{name:16s} ({len(prompts)} requests, {tokens} tokens): cpu {row['cpu']['median_s']:.2f} s, torch "
                  f"{row['torch']['median_s']:.2f} s -> {row['speedup']:.2f}x; identical outputs "
                  f"{row['identical_outputs']}/{len(prompts)}", flush=True)  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench_cpu_attention{'_quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
