"""Regex DFAs built by langrt's C++ builder (native/regex_dfa.cpp) vs outlines-core (its Index over
the 256 one-byte tokens, what byte_dfa.py used before and still uses where the C++ library
cannot be built), side by side on the same regexes: the rule bodies and regexes the JSON-schema
compiler writes for a corpus of schemas. Per builder: total build time, states; per regex: the
languages compared (dfa_equivalence.first_difference). Writes results/bench_regex_dfa.json.

Schemas: benchmarks/schemas.py's seeded corpus and the JSON Schema Test Suite's (tests/data),
compiled with open objects in any order (the options that write the most rules); with --data,
also a MaskBench sample (the maskbench/data folder of guidance-ai/jsonschemabench, as
bench_maskbench.py reads it).

    .venv/bin/python benchmarks/bench_regex_dfa.py
    .venv/bin/python benchmarks/bench_regex_dfa.py --data PATH/maskbench/data --sample 300
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_offline import cpu_flags_summary  # noqa: E402
from benchmarks.json_schema_suite import suite_files  # noqa: E402
from benchmarks.schemas import schema_corpus  # noqa: E402
from langrt.builtin import builtin_model_path  # noqa: E402
from langrt.constrained import GrammarCompiler, byte_dfa  # noqa: E402
from langrt.constrained.dfa_equivalence import first_difference  # noqa: E402
from langrt.constrained.native import regex_dfa  # noqa: E402
from results_meta import write_results  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MAX_STATES = 200_000


def schemas(args) -> list:
    found = list(schema_corpus(args.corpus, seed=0))
    for path in suite_files():
        found += [group["schema"] for group in json.loads(path.read_text())]
    if args.data:
        from benchmarks.maskbench.data import sample_cases

        found += [case.schema for case in sample_cases(args.data, args.sample, 0, lambda text: [])]
    return found


def regexes_written(compiler: GrammarCompiler, found: list) -> list[str]:
    """Every regex the compiler asks byte_dfa to build for `found`, once each."""
    seen: dict[str, None] = {}
    built = byte_dfa._built_table

    def record(regex, max_states):
        seen[regex] = None
        return built(regex, max_states)

    byte_dfa._built_table = record
    try:
        for schema in found:
            try:
                compiler.compile_json_schema(schema, any_order=True, open_objects=True)
            except Exception:  # noqa: BLE001 - refused schemas still wrote some regexes
                pass
    finally:
        byte_dfa._built_table = built
    return list(seen)


def timed(build, regex):
    start = time.perf_counter()
    try:
        return build(regex), time.perf_counter() - start
    except ValueError:  # past the state limit
        return None, time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=int, default=200, help="schemas from benchmarks/schemas.py")
    parser.add_argument("--data", type=Path, help="MaskBench's data folder (optional)")
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_regex_dfa.json")
    args = parser.parse_args(argv)
    if not regex_dfa.available():
        raise SystemExit("the C++ regex builder cannot be built here (g++ missing, or LANGRT_CPU_KERNELS=0)")
    regexes = regexes_written(GrammarCompiler.from_pretrained(builtin_model_path()), schemas(args))
    print(f"{len(regexes)} distinct regexes", flush=True)
    totals = {"cpp": [0.0, 0], "outlines-core": [0.0, 0]}
    left, refused, different = 0, 0, []
    for regex in regexes:
        native, native_s = timed(lambda r: regex_dfa.build(r, MAX_STATES), regex)
        if native is None:
            left += 1  # syntax the builder leaves to outlines-core
            continue
        reference, reference_s = timed(lambda r: byte_dfa._marked_table(r, MAX_STATES), regex)
        if reference is None:
            refused += 1
            continue
        for name, parts, seconds in (("cpp", native, native_s), ("outlines-core", reference, reference_s)):
            totals[name][0] += seconds
            totals[name][1] += parts[0].shape[0] - 1
        if (where := first_difference(native, reference)) is not None:
            different.append({"regex": regex[:500], "difference": where})
    result = {
        "cpu_flags": cpu_flags_summary(),
        "regexes": len(regexes),
        "compared": len(regexes) - left - refused,
        "left_to_outlines_core": left,
        "past_the_state_limit": refused,
        "different_languages": len(different),
        "differences": different[:20],
        "seconds": {name: round(t[0], 3) for name, t in totals.items()},
        "states": {name: t[1] for name, t in totals.items()},
        "speedup": round(totals["outlines-core"][0] / max(totals["cpp"][0], 1e-9), 2),
        "state_ratio": round(totals["cpp"][1] / max(totals["outlines-core"][1], 1), 3),
        "with_maskbench": bool(args.data),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "differences"}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
