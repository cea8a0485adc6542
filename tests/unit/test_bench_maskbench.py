"""benchmarks/bench_maskbench.py on a tiny MaskBench-format data set, langrt only: the counts it
reports follow from schemas whose verdicts are known (one langrt worker process; ~10 s)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_maskbench as bench  # noqa: E402
from benchmarks.maskbench.data import quotas, serialise, source_of  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
# Each file: (schema, [(valid, instance), ...]), in MaskBench's layout.
FILES = {
    "Github_easy---person.json": (PERSON, [(True, {"name": "Ann", "age": 3}), (False, {"name": "Ann", "age": "3"})]),
    "Glaiveai2K---colour.json": ({"enum": ["red", "green"]}, [(True, "red"), (False, "blue")]),
    # "1" is a prefix of "10": only the EOS check at the end rejects it
    "BFCL_simple_1.json": ({"enum": [10, 20]}, [(True, 20), (False, 1)]),
    # not a valid schema: refused (UnsupportedSchema, param "type")
    "Handwritten---bad_type.json": ({"type": "frobnicate"}, [(True, 5), (False, "x")]),
    # labels swapped on purpose: the valid one is labelled invalid (accepted), and back
    "Synthesized---mislabelled.json": (PERSON, [(False, {"name": "Bo", "age": 1}), (True, {"name": "Bo"})]),
    # no instances: never sampled
    "Handwritten---untested.json": ({"type": "string"}, []),
}


def write_dataset(folder: Path) -> None:
    for name, (schema, tests) in FILES.items():
        tests = [{"description": "", "valid": valid, "data": data} for valid, data in tests]
        (folder / name).write_text(json.dumps({"description": name, "meta": {}, "schema": schema, "tests": tests}))


def test_sources_and_quotas_spread_the_sample():
    assert source_of(Path("Github_easy---o10008.json")) == "Github_easy"
    assert source_of(Path("BFCL_parallel_multiple_12.json")) == "BFCL_parallel_multiple"
    sizes = {"a": 1000, "b": 100, "c": 3}
    counts = quotas(sizes, 30, random.Random(0))
    assert sum(counts.values()) == 30 and min(counts.values()) >= 1 and counts["a"] > counts["b"]
    assert sum(quotas(sizes, 2, random.Random(0)).values()) == 2


def test_serialises_as_maskbench_runner():
    assert serialise({"b": [1, 2], "a": "é"}) == '{"b": [1, 2], "a": "é"}'


def test_langrt_counts_on_a_tiny_dataset(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_dataset(data)
    out = tmp_path / "result.json"
    report = bench.run(bench.parse_args(["--data", str(data), "--engines", "langrt", "--out", str(out)]))

    assert json.loads(out.read_text()) == report
    summary = report["engines"]["langrt"]
    assert summary["schemas"] == 5  # the untested schema is not sampled
    assert (summary["passing"], summary["refused"]) == (3, 1)
    assert (summary["valid_rejected"], summary["invalid_accepted"]) == (1, 1)
    assert summary["refusal_reasons"] == {"type": 1}
    assert summary["masks"] > 0 and summary["mask_us_p50"] > 0

    rows = {row["id"]: row["engines"]["langrt"] for row in report["schemas"]}
    assert rows["Handwritten---bad_type"]["status"] == "refused" and rows["Handwritten---bad_type"]["masks"] == 0
    assert rows["Github_easy---person"]["status"] == "pass" and rows["Github_easy---person"]["compile_ms"] > 0
    assert rows["BFCL_simple_1"]["status"] == "pass"  # the invalid 1 was refused at EOS
    mislabelled = rows["Synthesized---mislabelled"]
    assert mislabelled["status"] == "fail" and (mislabelled["valid_rejected"], mislabelled["invalid_accepted"]) == (
        1,
        1,
    )
    assert any(e.startswith("valid #1 rejected at token") for e in mislabelled["errors"])


def test_like_for_like_pairs_only_where_both_engines_ran():
    from benchmarks.maskbench.results import format_pairs, pair_rows

    summary = {
        "passing_pct": 90.0,
        "invalid_accepted": 0,
        "compile_ms_p50": 1.0,
        "compile_ms_p99": 9.0,
        "mask_us_p99": 50.0,
    }
    both = {"langrt": summary, "xgrammar": summary | {"invalid_accepted": 4}, "langrt-any": summary}
    rows = pair_rows(both)
    assert [(r["langrt"], r["peer"]) for r in rows] == [("langrt", "xgrammar")], (
        "langrt-any has no xgrammar-compliant beside it"
    )
    assert rows[0]["invalid_accepted"] == [0, 4]
    assert "invalid accepted 0 vs 4" in format_pairs(both)
