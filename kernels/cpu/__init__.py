"""langrt's CPU kernel (C++): attention for the decode and draft rows of a pass, read straight
from the paged KV pool (see paged_attention.cpp).

It is compiled on first use with torch's extension builder (g++ and ninja; ~10 s) and cached
under torch's extension directory ($TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), so
later processes load it in well under a second. `scripts/install.sh` builds it once up front.
Where it cannot be used (no AVX-512, no compiler, LANGRT_CPU_KERNELS=0) `paged_attention()`
returns None and says why once; attention then runs in plain torch.
"""

from __future__ import annotations

import functools
import logging
import os
import pathlib
import platform
import sys
import time

SOURCE = pathlib.Path(__file__).with_name("paged_attention.cpp")
DISABLE_ENV = "LANGRT_CPU_KERNELS"
# The instructions the source uses; the build targets exactly these, so it runs on any CPU that has them.
CFLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp"]  # -fopenmp: at::parallel_for is a no-op without it

logger = logging.getLogger("langrt.kernels.cpu")


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here, or None."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return f"{DISABLE_ENV}=0"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"built for Linux on x86-64 only (this is {platform.system()} on {platform.machine()})"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError as exc:
        return f"cannot read /proc/cpuinfo ({exc})"
    if "avx512f" not in flags or "fma" not in flags:
        return "the CPU lacks AVX-512F"
    return None


@functools.cache
def paged_attention():
    """`torch.ops.langrt_cpu.paged_attention`, building it on first use; None where it cannot be
    used (the reason is logged once).

    paged_attention(q [T, H, D], k, v [S, Hkv, D], req_to_token [R, C] int32, rows, reqs [N] int64,
    starts, ends [N] int32, out [T, H, D], scale): for each i, row rows[i] of out gets row rows[i]
    of q attending to the keys at req_to_token[reqs[i], starts[i]:ends[i]]."""
    reason = unavailable_reason()
    if reason is None:
        try:
            return _build()
        except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, a failed build: fall back, loudly
            last_line = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ""
            reason = f"could not build it ({type(exc).__name__}: {last_line})"
    logger.warning("CPU attention kernel not used: %s; attention runs in plain torch (slower decoding)", reason)
    return None


def _build():
    import torch
    from torch.utils import cpp_extension

    # torch's builder runs `ninja` from PATH; the ninja package puts it next to this interpreter,
    # which is not on PATH when the venv is not activated.
    bin_dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja

        bin_dirs.insert(0, ninja.BIN_DIR)
    except ImportError:
        pass
    os.environ["PATH"] = os.pathsep.join(bin_dirs + [os.environ.get("PATH", "")])
    started = time.monotonic()
    cpp_extension.load(
        name="langrt_cpu_attention",
        sources=[str(SOURCE)],
        extra_cflags=CFLAGS,
        is_python_module=False,
        verbose=False,
    )
    took = time.monotonic() - started
    if took > 2:
        logger.info("built the CPU attention kernel in %.0f s (cached for later runs)", took)
    return torch.ops.langrt_cpu.paged_attention

