#!/usr/bin/env bash
# The GPU path on a lent GPU, in one call: run from the repository root of a copy of the tree on
# a machine with python3 (torch with CUDA, triton, transformers, pytest) and no network.
#
#   OUT=/some/dir bash scripts/gpu_check.sh      # results in $OUT (default ./gpu_out)
#
# langrt runs from the tree (PYTHONPATH, no install); wheels in .gpu_wheels/ (pure-Python
# packages the image lacks, if any) go to a private target first. LANGRT_CPU_KERNELS=0: the C++
# CPU kernels are never built here. Each step runs under its own time limit and a failure does
# not stop the next:
#   a  the CUDA-only tests (skipped on CPUs) and the Triton kernels' tests on the GPU
#   b  tests/numerics/test_gpu_model.py: Triton vs torch attention backends, logits vs transformers
#   c  the same file's CUDA graph tests: graphs on vs off, same outputs
#   d  benchmarks/bench_kernels.py: decode attention, a Llama-3-8B-shape decode step, the bitmask kernel
# Out: gpu_check.json (environment, each step's status, counts and failures, the model tests'
# measured differences, the benchmark's headline figures), gpu_check.log (everything printed),
# bench_kernels.json (the benchmark's full results). Without CUDA the steps only collect their
# tests / import the benchmark, and report "skipped: no CUDA" (a dry run of this script).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
LOG="$OUT/gpu_check.log"
: >"$LOG"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 LANGRT_CPU_KERNELS=0 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false LANGRT_GPU_REPORT="$WORK/gpu_model.jsonl"
unset TRITON_INTERPRET

say() { echo "$@" | tee -a "$LOG"; }

if ls .gpu_wheels/*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" .gpu_wheels/*.whl \
        >>"$LOG" 2>&1 && export PYTHONPATH="$PYTHONPATH:$WORK/site" && say "installed: $(ls .gpu_wheels | tr '\n' ' ')" \
        || say "wheel install failed (see gpu_check.log)"
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || echo "nvidia-smi: none"; } | tee -a "$LOG"
"$PYTHON" - >"$WORK/env.json" 2>>"$LOG" <<'EOF'
import json, platform, subprocess
import torch, triton, transformers
env = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
       "transformers": transformers.__version__, "cuda": torch.cuda.is_available()}
if env["cuda"]:
    p = torch.cuda.get_device_properties(0)
    env.update(gpu=p.name, sms=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1), cuda_runtime=torch.version.cuda)
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
env["commit"] = git.stdout.strip() or "unknown (no .git in this copy)"
import langrt.model.model_runner, langrt.model.cuda_graph, kernels.decode_attention  # noqa: F401  (importable without the C++ build)
print(json.dumps(env))
EOF
say "env: $(cat "$WORK/env.json")"
CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>>"$LOG" || echo 0)

# step NAME LIMIT_S COMMAND...: run it (CUDA) or collect only (no CUDA), record rc and seconds.
step() {
    local name=$1 limit=$2; shift 2
    say "=== $name (limit ${limit}s): $*"
    local start=$SECONDS rc
    if [ "$CUDA" = 1 ]; then
        timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
        rc=$?
    else
        "$@" --collect-only -q >>"$LOG" 2>&1
        rc=$?
    fi
    echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - start)), \"cuda\": $CUDA}" >>"$WORK/steps.jsonl"
    say "=== $name: rc=$rc in $((SECONDS - start))s"
}

PYTEST=("$PYTHON" -m pytest -p no:cacheprovider -q -rfE)
step a_cuda_tests 140 "${PYTEST[@]}" --junitxml="$WORK/a_cuda_tests.xml" \
    tests/numerics/test_kernels_attention.py tests/numerics/test_kernels_layers.py \
    tests/numerics/test_grammar_bitmask.py tests/unit/test_sampler.py \
    -k "cuda and not smollm"
step b_gpu_model 120 "${PYTEST[@]}" --junitxml="$WORK/b_gpu_model.xml" tests/numerics/test_gpu_model.py -k "not graph"
step c_cuda_graphs 120 "${PYTEST[@]}" --junitxml="$WORK/c_cuda_graphs.xml" tests/numerics/test_gpu_model.py -k graph
if [ "$CUDA" = 1 ]; then
    say "=== d_bench (limit 180s)"
    start=$SECONDS
    timeout -k 10 180 "$PYTHON" benchmarks/bench_kernels.py --out "$OUT/bench_kernels.json" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
else
    start=$SECONDS
    "$PYTHON" benchmarks/bench_kernels.py --help >>"$LOG" 2>&1
    rc=$?
fi
echo "{\"step\": \"d_bench\", \"rc\": $rc, \"seconds\": $((SECONDS - start)), \"cuda\": $CUDA}" >>"$WORK/steps.jsonl"

"$PYTHON" - "$WORK" "$OUT" <<'EOF' | tee -a "$LOG"
"""Fold the steps' records, junit files, the model tests' measurements and the benchmark's
headline figures into gpu_check.json, and print a compact summary (the end of the output)."""
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

work, out = Path(sys.argv[1]), Path(sys.argv[2])
def lines(p): return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
summary = {"env": json.loads((work / "env.json").read_text() or "{}") if (work / "env.json").exists() else {}, "steps": {}}
for rec in lines(work / "steps.jsonl"):
    name, rc = rec["step"], rec["rc"]
    s = {"rc": rc, "seconds": rec["seconds"]}
    if not rec["cuda"]:
        s["status"] = "skipped: no CUDA" + ("" if rc == 0 else f" (its dry run failed, rc={rc}: see gpu_check.log)")
    else:
        s["status"] = "passed" if rc == 0 else "timed out" if rc in (124, 137) else "failed"
    xml = work / f"{name}.xml"
    if xml.exists():
        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        s.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        s["failed"] = [{"test": f"{c.get('classname')}::{c.get('name')}", "message": (bad.get("message") or "")[:400]}
                       for c in suite.iter("testcase") for bad in list(c) if bad.tag in ("failure", "error")]
    summary["steps"][name] = s
summary["gpu_model_measurements"] = lines(work / "gpu_model.jsonl")
bench = out / "bench_kernels.json"
if bench.exists():
    b = json.loads(bench.read_text())
    summary["bench"] = {"device": b["device"], "copy_gbs": b["copy_gbs"], "peak_gbs": b["peak_gbs"],
        "decode_attention_fraction_of_peak": {f"{r['batch']}x{r['context']}": round(r["fraction_of_peak"], 3) for r in b["decode_attention"]},
        "decode_step": {f"{r['backend']}{'+graphs' if r['cuda_graphs'] else ''}": {"ms": round(r["median_step_ms"], 3),
            "fraction_of_copy_limit": round(r["fraction_of_limit"], 3)} for r in b["decode_step"]},
        "bitmask_64x128k_us": {r["dtype"]: round(r["us"], 1) for r in b["bitmask"]}}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
print("=" * 20, "summary", "=" * 20)
e = summary["env"]
print(f"{e.get('gpu', 'no GPU')} | torch {e.get('torch')} | triton {e.get('triton')} | transformers {e.get('transformers')} | {e.get('commit')}")
for name, s in summary["steps"].items():
    counts = " ".join(f"{k}={s[k]}" for k in ("tests", "failures", "errors", "skipped") if k in s)
    print(f"{name:14} {s['status']:10} {s['seconds']:4d}s {counts}")
    for f in s.get("failed", [])[:8]:
        print(f"    FAIL {f['test']}: {f['message'][:160]}")
for m in summary["gpu_model_measurements"]:
    print("   ", json.dumps(m))
if "bench" in summary:
    print("bench:", json.dumps(summary["bench"]))
EOF
rm -rf "$WORK"
