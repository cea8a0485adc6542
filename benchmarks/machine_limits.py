"""What this machine can do at most, measured in the run, and what a benchmark records about it.

- read bandwidth (a batch-1 decode step reads every weight once, so bytes per step / bandwidth
  is the fastest a step can be) and copy bandwidth, both from large torch tensors;
- peak GEMM FLOP/s from a large torch matmul (float32, and bfloat16 where the CPU runs it fast),
  the yardstick for prompt processing and batched decode;
- resident memory of a process and all its descendants (RSS summed, and PSS, which splits the
  pages they share, such as a model file both map);
- the CPU, its flags, the load, the versions and the commit a result came from.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

FLAGS_OF_INTEREST = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_int8",
)


def _best_seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def read_bandwidth_gbs(megabytes: int = 512, repeats: int = 5) -> float:
    """Summing a tensor far larger than the caches, best of `repeats` (torch's threads)."""
    x = torch.ones(megabytes * 1024 * 1024 // 4, dtype=torch.float32)
    x.sum()
    return x.numel() * 4 / _best_seconds(x.sum, repeats) / 1e9


def copy_bandwidth_gbs(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes moved (read + written) by a large tensor copy, best of `repeats`."""
    src = torch.ones(megabytes * 1024 * 1024 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), repeats) / 1e9


def gemm_peak_gflops(dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (2 n^3 flops), best of `repeats`."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    return 2 * n**3 / _best_seconds(lambda: torch.mm(a, b), repeats) / 1e9


def machine_limits() -> dict:
    """Bandwidths and GEMM peaks measured now, with torch's thread count."""
    from langrt.cpu_features import fast_bf16

    limits = {
        "threads": torch.get_num_threads(), "read_bandwidth_gbs": read_bandwidth_gbs(),
        "copy_bandwidth_gbs": copy_bandwidth_gbs(), "gemm_float32_gflops": gemm_peak_gflops(torch.float32),
    }  # fmt: skip
    if fast_bf16():
        limits["gemm_bfloat16_gflops"] = gemm_peak_gflops(torch.bfloat16)
    limits["gemm_peak_gflops"] = max(v for k, v in limits.items() if k.startswith("gemm_"))
    return limits


def tree_memory(pid: int) -> dict:
    """RSS and PSS (bytes) of process `pid` and every descendant, summed, and how many processes.
    PSS counts a page shared by n processes as 1/n, so it does not count a mapped file twice."""
    import psutil

    root = psutil.Process(pid)
    rss = pss = count = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a process that ended between the listing and the reading holds nothing
        rss, pss, count = rss + info.rss, pss + getattr(info, "pss", info.rss), count + 1
    return {"rss_bytes": rss, "pss_bytes": pss, "processes": count}


def cpu_description() -> dict:
    """The CPU's model name, its flags that decide the kernels' paths, and the load now."""
    model, flags = "unknown", set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return {"cpu_model": model, "cpu_flags": sorted(f for f in FLAGS_OF_INTEREST if f in flags),
            "cpus": os.cpu_count(), "load_average": list(os.getloadavg())}  # fmt: skip


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance() -> dict:
    """The commit (and whether the tree had changes), the versions and the command of this run."""
    root = Path(__file__).resolve().parents[1]
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {
        "commit": git("rev-parse", "HEAD"), "tree_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0], "torch": torch.__version__, "transformers": _version("transformers"),
        "llama_cpp_python": _version("llama_cpp_python"),
    }  # fmt: skip
