"""scripts/gpu_check.sh's report: fold its steps' records, the pytest junit file, the GPU model
tests' measurements and the benchmark's headline figures into OUT/gpu_check.json, and print a
compact summary (the end of a device run's output).

    python scripts/gpu_check_summary.py WORK_DIR OUT_DIR [--quiet]

The one pytest run is reported as three steps: a (the CUDA-only tests of the other files),
b (tests/numerics/test_gpu_model.py but its graph tests), c (its graph tests).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PARTS = {"a_cuda_tests": "the CUDA-only kernel, bitmask and sampler tests", "b_gpu_model": "backends and transformers",
         "c_cuda_graphs": "CUDA graphs on vs off"}  # fmt: skip


def json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def part_of(classname: str, name: str) -> str:
    if "test_gpu_model" not in classname:
        return "a_cuda_tests"
    return "c_cuda_graphs" if "graph" in name else "b_gpu_model"


def test_parts(xml: Path) -> dict[str, dict]:
    """Per part: counts of passed / failed / errors / skipped, and each failure's first lines."""
    parts = {name: {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []} for name in PARTS}
    if not xml.exists():
        return parts
    for case in ET.parse(xml).getroot().iter("testcase"):
        part = parts[part_of(case.get("classname", ""), case.get("name", ""))]
        outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            part["passed"] += 1
            continue
        part[{"failure": "failed", "error": "errors", "skipped": "skipped"}[outcome.tag]] += 1
        if outcome.tag != "skipped":
            message = (outcome.get("message") or outcome.text or "").strip()
            part["failures"].append({"test": f"{case.get('classname')}::{case.get('name')}", "message": message[:600]})
    return parts


def step_status(record: dict) -> str:
    if not record["cuda"]:
        return "skipped: no CUDA" + (
            "" if record["rc"] == 0 else f" (its dry run failed, rc={record['rc']}: see gpu_check.log)"
        )
    return {0: "passed", 124: "timed out", 137: "timed out"}.get(record["rc"], "failed")


def bench_headlines(path: Path) -> dict | None:
    if not path.exists():
        return None
    b = json.loads(path.read_text())
    return {
        "device": b["device"], "copy_gbs": round(b["copy_gbs"]), "peak_gbs": round(b["peak_gbs"]),
        "decode_attention_fraction_of_peak": {f"{r['batch']}x{r['context']}": round(r["fraction_of_peak"], 3) for r in b["decode_attention"]},
        "decode_step": {f"{r['backend']}{'+graphs' if r['cuda_graphs'] else ''}": {"ms": round(r["median_step_ms"], 3),
                        "fraction_of_copy_limit": round(r["fraction_of_limit"], 3)} for r in b["decode_step"]},
        "bitmask_64x128k_us": {r["dtype"]: round(r["us"], 1) for r in b["bitmask"]},
    }  # fmt: skip


def build(work: Path, out: Path) -> dict:
    env_file = work / "env.json"
    summary = {"env": json.loads(env_file.read_text() or "{}") if env_file.exists() else {}, "steps": {}}
    for record in json_lines(work / "steps.jsonl"):
        step = {"status": step_status(record), "rc": record["rc"], "seconds": record["seconds"]}
        if record["step"] == "tests":
            for name, counts in test_parts(work / "tests.xml").items():
                summary["steps"][name] = {**step, **counts}
        else:
            summary["steps"][record["step"]] = step
    summary["gpu_model_measurements"] = json_lines(work / "gpu_model.jsonl")
    bench = bench_headlines(out / "bench_kernels.json")
    if bench is not None:
        summary["bench"] = bench
    return summary


def show(summary: dict) -> None:
    env = summary["env"]
    print("=" * 20, "summary", "=" * 20)
    print(
        f"{env.get('gpu', 'no GPU')} | torch {env.get('torch')} | triton {env.get('triton')} | transformers {env.get('transformers')} | {env.get('commit')}"
    )
    for name, s in summary["steps"].items():
        counts = " ".join(f"{k}={s[k]}" for k in ("passed", "failed", "errors", "skipped") if k in s)
        print(f"{name:14} {s['status']:10} {s['seconds']:4d}s {counts}")
        for failure in s.get("failures", [])[:10]:
            print(f"    FAIL {failure['test']}: {failure['message'][:200]}")
    for m in summary["gpu_model_measurements"]:
        print("   ", json.dumps(m))
    if "bench" in summary:
        print("bench:", json.dumps(summary["bench"]))


def main() -> None:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    summary = build(work, out)
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    if "--quiet" not in sys.argv[3:]:
        show(summary)


if __name__ == "__main__":
    main()
