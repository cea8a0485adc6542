"""What every results JSON records about the run that made it: the commit (and whether the work
tree had uncommitted changes), the CPU model and its flags, the CPU path langrt's kernels take,
the versions of torch, transformers and each peer installed, the load, and the exact command.

    from results_meta import write_results
    write_results(RESULTS / "bench_x.json", results, dtype="bfloat16")

`python -m benchmarks.report` reads `meta.commit` to mark a result older than the code it
measures, so a benchmark that writes JSON any other way leaves its figures unmarked.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The libraries a figure may depend on: langrt's own stack and every peer a benchmark compares
# against (a version absent from the list is a package not installed here).
PACKAGES = (
    "torch", "transformers", "triton", "numpy", "tokenizers", "langrt",
    "xgrammar", "llguidance", "outlines_core", "outlines", "llama_cpp_python", "vllm", "sglang",
)  # fmt: skip
# The flags that decide which path langrt's CPU code takes.
PATH_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_int8",
)


def git(*args: str) -> str | None:
    """`git args` in the repository, its output stripped; None where git or the repository is missing."""
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit_info() -> dict:
    """HEAD's hash and date, and whether tracked files differ from it (a dirty run's figures
    belong to no commit exactly)."""
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "commit_date": git("log", "-1", "--format=%cI", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def cpu_model() -> str:
    """/proc/cpuinfo's `model name` (platform's guess where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_info() -> dict:
    from langrt.cpu_features import cpu_flags

    flags = cpu_flags()
    return {
        "model": cpu_model(),
        "cores": os.cpu_count(),
        "path_flags": sorted(f for f in PATH_FLAGS if f in flags),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def kernel_path(dtype: str) -> dict:
    """The CPU path langrt takes for `dtype` here (what its log line says), and the kernel build."""
    from langrt.cpu_features import describe_path
    from langrt_kernels.cpu import isa, unavailable_reason

    off = unavailable_reason()
    return {"dtype": dtype, "isa": isa(), "kernels_off": off, "describe": describe_path(dtype, off, isa())}


def versions() -> dict[str, str]:
    """Installed versions of PACKAGES (those not installed are left out)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def command() -> dict:
    """The command as typed (sys.argv, relative to the working directory) and the environment
    variables that change what langrt, torch or the BLAS libraries do."""
    prefixes = ("LANGRT_", "ATEN_", "ONEDNN_", "MKL_", "OMP_", "TORCH")
    return {
        "argv": shlex.join([sys.executable, *sys.argv]),
        "cwd": os.getcwd(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)},
    }


def run_meta(dtype: str = "bfloat16") -> dict:
    """Everything above, with the UTC time the results were written."""
    return {
        **commit_info(),
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpu": cpu_info(),
        "kernel_path": kernel_path(dtype),
        "versions": versions(),
        "command": command(),
    }


def write_results(path: Path, results: dict, dtype: str = "bfloat16") -> Path:
    """Write `results` with a `meta` key (run_meta) as indented JSON to `path`; its folder is made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**results, "meta": run_meta(dtype)}, indent=2, default=str))
    return path
