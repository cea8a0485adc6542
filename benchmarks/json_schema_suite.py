"""langrt's JSON-schema compiler against the official JSON-Schema-Test-Suite (draft 2020-12).

For every group of every file in tests/data/json-schema-test-suite: the schema compiles (to a
regex, or grammar rules) or is refused (UnsupportedSchema, naming a keyword). Over compiled schemas, each test
instance is serialised with json.dumps (default separators) and fullmatched:
  valid accepted   share of "valid": true instances the regex matches (the rest are valid JSON
                   the regex narrows away: fixed property order, no extra properties, ...)
  invalid accepted "valid": false instances the regex matches: must be 0 (soundness)
Writes benchmarks/results/json_schema_suite.json (json_schema_suite_regex.json with
--compiler regex, round 1's compiler: the "before") and prints a table.

    .venv/bin/python benchmarks/json_schema_suite.py [--verbose]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections import Counter
from pathlib import Path

from langrt.constrained.cfg.build import full_match, local_automaton
from langrt.constrained.json_schema import schema_to_grammar, schema_to_regex
from langrt.errors import UnsupportedSchema
from results_meta import write_results  # noqa: E402

MAX_STATES = 200_000  # the runtime's (grammar.MAX_DFA_STATES)

SUITE = Path(__file__).parent.parent / "tests" / "data" / "json-schema-test-suite" / "draft2020-12"
RESULTS = Path(__file__).parent / "results"


def suite_files() -> list[Path]:
    return sorted(SUITE.glob("*.json")) + sorted(SUITE.glob("optional/format/*.json"))


def compile_matcher(schema, compiler: str):
    """A function telling whether a text is accepted: `regex` is the one-regex compiler
    (Python's re), `grammar` the runtime's (rules where the schema recurses or is big, walked
    through the pushdown automaton)."""
    if compiler == "regex":
        return re.compile(schema_to_regex(schema)).fullmatch
    source = schema_to_grammar(schema)
    if isinstance(source, str):
        return re.compile(source).fullmatch
    automaton = local_automaton(source, MAX_STATES)
    return lambda text: full_match(automaton, text)


def run_file(path: Path, verbose: bool = False, compiler: str = "grammar") -> dict:
    row = dict(groups=0, compiled=0, refused=0, refused_keywords=Counter(), valid_total=0, valid_accepted=0,
               invalid_total=0, invalid_accepted=0, invalid_examples=[], compile_ms=[])  # fmt: skip
    for group in json.loads(path.read_text()):
        row["groups"] += 1
        start = time.perf_counter()
        try:
            matches = compile_matcher(group["schema"], compiler)
        except UnsupportedSchema as e:
            row["refused"] += 1
            row["refused_keywords"][e.param] += 1
            if verbose:
                print(f"  refused {path.name} / {group['description']}: {e.param}: {e.message}")
            continue
        row["compile_ms"].append((time.perf_counter() - start) * 1e3)
        row["compiled"] += 1
        for test in group["tests"]:
            matched = bool(matches(json.dumps(test["data"])))
            if test["valid"]:
                row["valid_total"] += 1
                row["valid_accepted"] += matched
                if verbose and not matched:
                    print(
                        f"  narrowed {path.name} / {group['description']} / {test['description']}: {json.dumps(test['data'])[:80]}"
                    )
            else:
                row["invalid_total"] += 1
                row["invalid_accepted"] += matched
                if matched:
                    row["invalid_examples"].append(f"{group['description']} / {test['description']}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verbose", action="store_true", help="list refusals and narrowed valid instances")
    parser.add_argument(
        "--compiler",
        choices=("grammar", "regex"),
        default="grammar",
        help="grammar: the runtime's (rules where needed); regex: round 1's one regex per schema",
    )
    args = parser.parse_args()
    rows = {str(p.relative_to(SUITE)): run_file(p, args.verbose, args.compiler) for p in suite_files()}
    keys = ("groups", "compiled", "refused", "valid_total", "valid_accepted", "invalid_total", "invalid_accepted")
    total = {k: sum(r[k] for r in rows.values()) for k in keys}
    refused = sum((r["refused_keywords"] for r in rows.values()), Counter())
    times = [t for r in rows.values() for t in r["compile_ms"]]
    print(
        f"{'file':40} {'groups':>6} {'compiled':>8} {'refused':>7} {'valid acc':>11} {'invalid acc':>11}  refused keywords"
    )
    for name, r in rows.items():
        share = f"{r['valid_accepted']}/{r['valid_total']}"
        print(f"{name:40} {r['groups']:6} {r['compiled']:8} {r['refused']:7} {share:>11} {r['invalid_accepted']:11}  "
              + ", ".join(f"{k}:{n}" for k, n in r["refused_keywords"].most_common()))  # fmt: skip
    pct = 100 * total["valid_accepted"] / max(total["valid_total"], 1)
    print(f"{'TOTAL':40} {total['groups']:6} {total['compiled']:8} {total['refused']:7} "
          f"{total['valid_accepted']}/{total['valid_total']} ({pct:.1f}%) {total['invalid_accepted']:5}")  # fmt: skip
    print(f"compile time per schema: median {statistics.median(times):.2f} ms, max {max(times):.1f} ms")
    out = {
        "total": {**total, "valid_accepted_pct": round(pct, 2), "refused_keywords": dict(refused.most_common())},
        "compile_ms": {"median": round(statistics.median(times), 3), "max": round(max(times), 2)},
        "files": {
            name: {
                **{k: r[k] for k in keys},
                "refused_keywords": dict(r["refused_keywords"].most_common()),
                "invalid_examples": r["invalid_examples"],
            }  # fmt: skip
            for name, r in rows.items()
        },
    }
    name = "json_schema_suite.json" if args.compiler == "grammar" else "json_schema_suite_regex.json"
    write_results(RESULTS / name, out)


if __name__ == "__main__":
    main()
