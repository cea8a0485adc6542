"""What this CPU runs fast, asked once and answered in one place.

langrt takes one of three CPU paths:

- AVX-512 (with AVX512-BF16 or AMX for bfloat16): the C++ kernels (kernels/cpu) built for
  AVX-512, bfloat16 by default, bf16 weights packed once into oneDNN's blocked layout.
- AVX2 (most laptops, AMD EPYC/Ryzen before Zen 4): the same kernels built for AVX2 + FMA,
  float32 by default; bfloat16 and float16 still run (torch's generic GEMMs, slower than float32
  there).
- Neither (ARM, x86 before 2013): the same kernels as plain C++ on 4-float vectors (NEON on ARM),
  float32 by default.

The answers follow torch's own dispatch, so `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`
makes an AVX-512 machine take exactly the AVX2 path (the test suite runs it that way in CI).
"""

from __future__ import annotations

import functools
import platform

from langrt import envs


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The `flags` of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def avx512_unavailable_reason() -> str | None:
    """Why AVX-512 code (the C++ kernels) cannot run here, or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"built for Linux on x86-64 only (this is {platform.system()} on {platform.machine()})"
    flags = cpu_flags()
    if "avx512f" not in flags or "fma" not in flags:
        return "the CPU lacks AVX-512F"
    capability = torch_cpu_capability()
    if not capability.startswith("AVX512"):
        return f"torch dispatches to {capability} here (ATEN_CPU_CAPABILITY)"
    return None


def avx2_unavailable_reason() -> str | None:
    """Why AVX2 + FMA code (the C++ kernels' AVX2 build) cannot run here, or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"built for Linux on x86-64 only (this is {platform.system()} on {platform.machine()})"
    if not {"avx2", "fma"} <= cpu_flags():
        return "the CPU lacks AVX2 and FMA"
    capability = torch_cpu_capability()
    if not capability.startswith(("AVX2", "AVX512")):
        return f"torch dispatches to {capability} here (ATEN_CPU_CAPABILITY)"
    return None


@functools.cache
def torch_cpu_capability() -> str:
    """torch's vector ISA on this CPU: 'AVX512', 'AVX2', 'DEFAULT', ... (ATEN_CPU_CAPABILITY caps it)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


@functools.cache
def bf16_gemm_packing() -> bool:
    """Whether oneDNN can reorder bf16 weights into its blocked layout here (AVX-512BW or
    AVX-NE-CONVERT; ONEDNN_MAX_CPU_ISA caps it)."""
    import torch

    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def fast_bf16() -> bool:
    """bfloat16 matmuls run natively (AVX512-BF16 or AMX) on the path langrt takes here."""
    flags = cpu_flags()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    return native and avx512_unavailable_reason() is None and bf16_gemm_packing()


def describe_path(dtype: str, kernels_off: str | None, kernels_isa: str | None = None) -> str:
    """One line for the log: which CPU path serves `dtype` here (`kernels_off`: why the C++
    kernels are not used, or None; `kernels_isa`: the build they run, 'avx512' or 'avx2')."""
    reason, avx2_reason = avx512_unavailable_reason(), avx2_unavailable_reason()
    if reason is None:
        line = "CPU path: AVX-512"
    else:
        line = f"CPU path: AVX2 ({reason})" if avx2_reason is None else f"CPU path: plain C++ ({avx2_reason})"
    if dtype == "float16":
        return (
            line
            + ": float16 in plain torch ops (the C++ kernels take bfloat16 and float32; --dtype float32 is faster on a CPU)"
        )
    line += (
        f": C++ kernels on ({kernels_isa})"
        if kernels_off is None
        else f": C++ kernels off ({kernels_off}), plain torch ops"
    )
    if dtype == "bfloat16":
        if bf16_gemm_packing():
            line += ", bfloat16 weights packed for oneDNN"
        else:
            line += ", bfloat16 GEMMs in torch's generic kernels (no AVX-512 bf16 here: --dtype float32 is faster)"
    return line


def separate_compile_cache() -> None:
    """Give torch.compile a cache of its own for an ISA chosen by ATEN_CPU_CAPABILITY.

    Inductor's on-disk cache is not keyed on that variable: code cached on the AVX2 path and
    loaded again on the AVX-512 one aborts the process. A cache directory the user chose
    (TORCHINDUCTOR_CACHE_DIR) is left alone; inductor's own default, which it writes into the
    environment once used, is not a choice."""
    import os

    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability = envs.ATEN_CPU_CAPABILITY.get()
    chosen = envs.TORCHINDUCTOR_CACHE_DIR.get()
    if not capability or (chosen is not None and os.path.abspath(chosen) != os.path.abspath(default_cache_dir())):
        return
    envs.TORCHINDUCTOR_CACHE_DIR.set(f"{default_cache_dir()}-{str(capability).lower()}")
