"""langrt's CPU kernels (C++): attention for the rows of a pass, read straight from the paged KV
pool (paged_attention.cpp), and the elementwise parts of a layer, fused (layer_ops.cpp: residual
add + RMSNorm, rotary, SiLU-and-mul).

The sources are written in vec.h's helpers and built once per instruction set: for AVX-512F
(16 floats a vector) where the CPU has it and torch dispatches to it, else for AVX2 + FMA (8; any
x86-64 since 2013-2015), else as plain C++ on 4-float vectors (`scalar`: NEON on ARM, what the
compiler makes of it elsewhere). Each is one library (its sources and flags: build_sources.py).
A package build (`pip install .`, a wheel) compiles all three ahead of time and a process loads
the one its CPU runs. Where none is shipped (a source checkout, an editable install) or it does
not fit this torch, it is compiled on first use with torch's extension builder (g++ and ninja; 20
s to 2 min) and cached under torch's extension directory ($TORCH_EXTENSIONS_DIR, default
~/.cache/torch_extensions) in a directory keyed by the sources' hash, the flags and the
interpreter, under a lock a killed build cannot leave behind (build_cache.py, build_lock.py), so
later processes load it in well under a second; `scripts/install.sh` builds the one this CPU runs. `LANGRT_CPU_ISA=avx2` or
`=scalar` takes a lesser build than the CPU could run (for tests and comparisons). Where none can
be used (no compiler, LANGRT_CPU_KERNELS=0) `paged_attention()` and `layer_ops()` return None and
the reason is logged once; the model then runs in plain torch.
"""

from __future__ import annotations

import functools
import logging
from types import SimpleNamespace

import torch

from langrt_kernels.cpu import build_cache, build_sources
from langrt_kernels.cpu.build_cache import LibrarySpec
from langrt import envs
from langrt.cpu_features import avx2_unavailable_reason, avx512_unavailable_reason

DISABLE_ENV = envs.LANGRT_CPU_KERNELS.name
LAYER_DISABLE_ENV = envs.LANGRT_CPU_LAYER_KERNELS.name
SEGMENTS_ENV = envs.LANGRT_CPU_ATTENTION_SEGMENTS.name
ISA_ENV = envs.LANGRT_CPU_ISA.name
# Per ISA: the library's name, its op namespace and its -m flags (build_sources, which setup.py reads too).
LIBRARIES = build_sources.LAYER_ISAS

logger = logging.getLogger("langrt.kernels.cpu")


def isa() -> str:
    """'avx512', 'avx2' or 'scalar': the library this CPU runs (LANGRT_CPU_ISA caps it)."""
    cap = envs.cpu_isa_cap()
    if cap not in ("scalar", "avx2") and avx512_unavailable_reason() is None:
        return "avx512"
    if cap != "scalar" and avx2_unavailable_reason() is None:
        return "avx2"
    return "scalar"


def available_isas() -> list[str]:
    """Every build this CPU can run, best first (tests run each)."""
    vector = [
        name
        for name, reason in (("avx512", avx512_unavailable_reason()), ("avx2", avx2_unavailable_reason()))
        if reason is None
    ]
    return vector + ["scalar"]


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here, or None."""
    for env in (DISABLE_ENV, LAYER_DISABLE_ENV):
        if not envs.REGISTRY[env].get():
            return f"{env}=0"
    return None


def paged_attention():
    """`torch.ops.langrt_cpu.paged_attention`, building the library on first use; None where it
    cannot be used (the reason is logged once).

    paged_attention(q [T, H, D], k, v [S, Hkv, D], req_to_token [R, C] int32, rows, reqs [N] int64,
    starts, ends [N] int32, out [T, H, D], scale): for each i, row rows[i] of out gets row rows[i]
    of q attending to the keys at req_to_token[reqs[i], starts[i]:ends[i]]."""
    ops = _ops()
    return None if ops is None else ops.paged_attention


def layer_ops() -> SimpleNamespace | None:
    """The fused layer ops, called as langrt.model.layers calls the Triton ones on CUDA, or None
    where the library cannot be used:

    rms_norm(x [N, hidden], weight, eps, residual=None) -> norm(x), or with residual
        (norm(x + residual), x + residual); rotary(x [T, heads, D], None, cos, sin [T, D/2]) rotates
        x in place; silu_and_mul(gate_up [T, 2I]) -> [T, I]."""
    ops = _ops()
    if ops is None:
        return None
    bound = functools.partial
    return SimpleNamespace(
        rms_norm=bound(_rms_norm, ops), rotary=bound(_rotary, ops), silu_and_mul=bound(_silu_and_mul, ops)
    )


def reset() -> None:
    """Forget whether the library could be used (for tests that change LANGRT_CPU_KERNELS)."""
    _library_ready.cache_clear()


def torch_ops():
    """The op namespace of the library this CPU runs (see isa())."""
    return getattr(torch.ops, LIBRARIES[isa()][1])


def _ops():
    """torch_ops() once the library is built and loaded; None where it cannot be used. The ops
    are looked up here, once: the wrappers layer_ops() returns carry them."""
    chosen = isa()
    return getattr(torch.ops, LIBRARIES[chosen][1]) if _library_ready(unavailable_reason(), chosen) else None


@functools.cache
def _library_ready(reason: str | None, chosen: str) -> bool:
    reason = reason or build_failure(lambda: _build(chosen))
    if reason is None:
        return True
    logger.warning("CPU kernels not used: %s; the model runs in plain torch (slower)", reason)
    return False


def build_failure(build) -> str | None:
    """Run `build`; None where it worked, else why not, in one line."""
    try:
        build()
        return None
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, a failed build: the caller falls back, loudly
        last_line = str(exc).strip().splitlines()[-1][:600] if str(exc).strip() else ""
        return f"could not build it ({type(exc).__name__}: {last_line})"


def _rms_norm(ops, x, weight, eps: float, residual=None):
    out = torch.empty(x.shape, dtype=x.dtype)
    summed = None if residual is None else torch.empty(x.shape, dtype=x.dtype)
    ops.rms_norm(x, weight, eps, residual, out, summed)
    return out if residual is None else (out, summed)


def _rotary(ops, x, k, cos, sin) -> None:
    if k is not None:
        raise ValueError("the CPU rotary takes q and k as one tensor (k=None)")
    ops.rotary(x, cos, sin)


def _silu_and_mul(ops, gate_up):
    out = torch.empty((gate_up.shape[0], gate_up.shape[1] // 2), dtype=gate_up.dtype)
    ops.silu_and_mul(gate_up, out)
    return out


def library_spec(chosen: str) -> LibrarySpec:
    """What is built for the ISA `chosen` ('avx512', 'avx2' or 'scalar')."""
    library = build_sources.layer_library(chosen)
    return LibrarySpec(library.name, library.sources, library.cflags, f"CPU kernels ({chosen})")


def _build(chosen: str) -> None:
    build_cache.load(library_spec(chosen))
