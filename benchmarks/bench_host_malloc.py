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
    with langrt.Engine(**common) as tuned, langrt.Engine(**common, disable_malloc_tuning=True) as default:
        engines = {"tuned": tuned, "glibc_default": default}
        for name, (prompts, params) in workloads(tuned.tokenizer, args.quick, 8, "no_reuse", 8).items():
            row = results["workloads"][name] = compare(engines, "tuned", "glibc_default", prompts, params, rounds)
            print(describe(name, row, "tuned", "glibc_default"), flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bench_host_malloc{'_quick' if args.quick else ''}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
