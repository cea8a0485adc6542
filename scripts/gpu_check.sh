#!/usr/bin/env bash
# The GPU path on a lent GPU, in one call: run from the repository root of a copy of the tree on
# a machine with python3 (torch with CUDA, triton, transformers, pytest) and no network.
#
#   OUT=/some/dir bash scripts/gpu_check.sh                   # results in $OUT (default ./gpu_out)
#   GPU_CHECK_QUICK=1 bash scripts/gpu_check.sh               # ~2.5 minutes: bench_kernels --quick
#
# langrt runs from the tree (PYTHONPATH, no install); wheels in .gpu_wheels/ (pure-Python
# packages the image lacks, if any) go to a private target first. LANGRT_CPU_KERNELS=0: the C++
# CPU kernels are never built here. Two steps, each under its own time limit; a failure does
# not stop the next:
#   tests  one pytest run (parallel over files with pytest-xdist where installed), reported as
#          a  the CUDA-only tests (skipped on CPUs): the Triton kernels, bitmask, sampler
#          b  tests/numerics/test_gpu_model.py: Triton vs torch attention, logits vs transformers
#          c  the same file's CUDA graph tests: graphs on vs off, same outputs
#   d      benchmarks/bench_kernels.py: decode attention, a Llama-3-8B-shape decode step, bitmask
# Out: gpu_check.json (environment, each step's status, counts and failures, the model tests'
# measured differences, the benchmark's headline figures; rewritten after every step, so a run
# cut short still leaves it), gpu_check.log (everything printed), bench_kernels.json (the
# benchmark's full results). Without CUDA the tests are only collected and the benchmark only
# imported, each reported "skipped: no CUDA" (a dry run of this script).
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
if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
    TEST_LIMIT=120 BENCH_LIMIT=80 BENCH_ARGS=(--quick)
else
    TEST_LIMIT=300 BENCH_LIMIT=200 BENCH_ARGS=()
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
import langrt.model.model_runner, langrt.model.cuda_graph, langrt_kernels.decode_attention  # noqa: F401  (importable without the C++ build)
print(json.dumps(env))
EOF
say "env: $(cat "$WORK/env.json")"
CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>>"$LOG" || echo 0)

summarize() {
    "$PYTHON" scripts/gpu_check_summary.py "$WORK" "$OUT" "$@" 2>>"$LOG"
}

# step NAME LIMIT_S COMMAND...: run it (CUDA) or its dry form (no CUDA: pytest collects only);
# record rc and seconds, then rewrite gpu_check.json.
step() {
    local name=$1 limit=$2; shift 2
    say "=== $name (limit ${limit}s): $*"
    local start=$SECONDS rc
    if [ "$CUDA" = 1 ]; then
        timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -n 30
        rc=${PIPESTATUS[0]}
    elif [ "$name" = tests ]; then
        "$@" --collect-only -q >>"$LOG" 2>&1
        rc=$?
    else
        "$PYTHON" benchmarks/bench_kernels.py --help >>"$LOG" 2>&1
        rc=$?
    fi
    echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - start)), \"cuda\": $CUDA}" >>"$WORK/steps.jsonl"
    say "=== $name: rc=$rc in $((SECONDS - start))s"
    summarize --quiet
}

PYTEST=("$PYTHON" -m pytest -p no:cacheprovider -q -rfE --junitxml="$WORK/tests.xml")
if "$PYTHON" -c "import xdist" 2>/dev/null; then
    PYTEST+=(-n 5 --dist loadfile)  # one worker per file: Triton compiles each file's kernels at once
fi
step tests "$TEST_LIMIT" "${PYTEST[@]}" \
    tests/numerics/test_kernels_attention.py tests/numerics/test_kernels_layers.py \
    tests/numerics/test_grammar_bitmask.py tests/unit/test_sampler.py tests/numerics/test_gpu_model.py \
    -k "(cuda or gpu_model) and not smollm"
step d_bench "$BENCH_LIMIT" "$PYTHON" benchmarks/bench_kernels.py ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} --out "$OUT/bench_kernels.json"
summarize | tee -a "$LOG"
rm -rf "$WORK"
