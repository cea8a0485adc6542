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
from pathlib import Path

from ab_engines import compare, describe, workloads

import langrt

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller few-shot wave, 1 round")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    common = {"log_level": "warning", "max_total_tokens": 65536}
    results = {"quick": args.quick, "rounds": rounds, "workloads": {}}
    with langrt.Engine(**common, attention_backend="cpu") as cpu, langrt.Engine(**common, attention_backend="torch") as ref:
        engines = {"cpu": cpu, "torch": ref}
        for name, (prompts, params) in workloads(cpu.tokenizer, args.quick, 32, "decode_32", 32).items():
            row = results["workloads"][name] = compare(engines, "cpu", "torch", prompts, params, rounds)
            print(describe(name, row, "cpu", "torch"), flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench_cpu_attention{'_quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
