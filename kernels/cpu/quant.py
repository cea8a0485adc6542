"""langrt's quantized matrix products on CPU: y = x W^T with W kept in GGUF's Q4_0 / Q4_1 / Q5_0 /
Q5_1 / Q8_0 blocks (and the K-quants Q2_K / Q3_K / Q4_K / Q5_K / Q6_K, unpacked at load into
blocks of 32 with float32 scales: langrt.model.kquants), by quant_linear.cpp over quant_avx2.cpp and quant_scalar.cpp: each 32
activations are quantized to int16 with one scale and multiplied with a weight block in integers.

Unlike the other CPU kernels this library is built without -m flags: its AVX2 functions carry
their instruction set themselves and are called only where /proc/cpuinfo lists avx2, fma and
f16c (and, for 4- and 5-bit blocks 16 weight rows at a time, avx512_vnni: quant_vnni.cpp), so it loads
on any CPU; elsewhere the plain C++ loops run. `LANGRT_CPU_ISA=scalar` forces
those (tests run both); `LANGRT_CPU_KERNELS=0` turns the library off, and GGUF weights are then
dequantized at load as before.
"""

from __future__ import annotations

import functools
import logging
import platform

import torch

from langrt import envs
from langrt.cpu_features import avx512_unavailable_reason, cpu_flags
from langrt_kernels.cpu.build_sources import quant_library

SOURCES = list(quant_library().sources)  # every quant*.cpp: build_sources.py, which setup.py reads too
DISABLE_ENV = envs.LANGRT_CPU_KERNELS.name
ISA_ENV = envs.LANGRT_CPU_ISA.name
# No -m flags (see above); -ffp-contract=off keeps the scalar path's products and sums apart.
CFLAGS = list(quant_library().cflags)
# GGML type numbers of the block types the kernels take.
GGML_TYPES = {
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
}

logger = logging.getLogger("langrt.kernels.cpu")


def isa() -> str:
    """'avx2' or 'scalar': the implementation this CPU gets (LANGRT_CPU_ISA=scalar forces the latter)."""
    if envs.cpu_isa_cap() == "scalar":
        return "scalar"
    x86 = platform.machine() in ("x86_64", "AMD64")
    return "avx2" if x86 and {"avx2", "fma", "f16c"} <= cpu_flags() else "scalar"


def unavailable_reason() -> str | None:
    if not envs.LANGRT_CPU_KERNELS.get():
        return f"{DISABLE_ENV}=0"
    return None


def available() -> bool:
    """Whether the quantized kernels can run here (building them on first use)."""
    return _library_ready()


def repack(gguf_rows: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """GGUF's blocks, uint8 [N, K / 32 * block bytes] -> the same rows in the layout the kernels
    read (each row's quants, then its scales: see quant_kernels.h)."""
    return _ops().repack(gguf_rows.contiguous(), ggml_type)


def quant_linear(x: torch.Tensor, weight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """x [M, K] float32 or bfloat16 -> [M, N] in x's dtype; weight: `repack`'s rows."""
    return _ops().quant_linear(x, weight, ggml_type, op_isa())


def tile_linear(x: torch.Tensor, weight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """x [M, K] float32 or bfloat16 -> [M, N] in x's dtype, for passes of many rows: W's exact
    values dequantized 16 rows at a time into float32 panels and multiplied there with FMAs
    (quant_gemm.cpp), no copy of W kept; products within float32 rounding of the dequantized
    reference's, each row's independent of the other rows."""
    return _ops().tile_linear(x, weight, ggml_type, 1 if isa() == "avx2" else 0)


def describe_isa() -> str:
    """The kernels this CPU runs, for the log."""
    return f"{isa()} (4- and 5-bit blocks: AVX512-VNNI)" if vnni_rows() else isa()


def op_isa() -> int:
    """The quant_linear op's implementation flag: 2 = AVX512-VNNI for 4- and 5-bit blocks and AVX2 for
    the others (vnni_rows()), 1 = AVX2 + FMA + F16C, 0 = plain C++."""
    return 2 if vnni_rows() else 1 if isa() == "avx2" else 0


def vnni_rows() -> bool:
    """Whether 4- and 5-bit blocks (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K) multiply 16 weight rows at a time with AVX512-VNNI
    here (quant_vnni.cpp): x86-64 with AVX512-VNNI, not forced to AVX2 or plain C++. Their
    integer sums are the AVX2 kernel's, scaled in another order; SmolLM2's 120 Q4_1 layer
    matrices read from memory, 2 threads, 2-core Zen 4: 1 row 3.2 ms (AVX2 3.9), 4 rows 5.2 (10.5)."""
    if envs.cpu_isa_cap() in ("scalar", "avx2") or isa() != "avx2":
        return False
    return (
        avx512_unavailable_reason() is None
        and {"avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "f16c"} <= cpu_flags()
    )


def dense_linear(x: torch.Tensor, weight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """x [M, K] bfloat16 -> [M, N] bfloat16, x times W's values rounded to bfloat16 (the packed
    copy's), dequantized tile by tile; only where `bf16_rows()`."""
    return _ops().dense_linear(x, weight, ggml_type)


def bf16_rows() -> bool:
    """Whether dense_linear runs here: x86-64 with AVX512-BF16 (and not forced to AVX2 or plain C++)."""
    if envs.cpu_isa_cap() in ("scalar", "avx2") or isa() != "avx2":
        return False
    return avx512_unavailable_reason() is None and {"avx512bw", "avx512vl", "avx512_bf16"} <= cpu_flags()


def dequantize(weight: torch.Tensor, ggml_type: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """`repack`'s rows -> [N, k] values in float32 or bfloat16 (rounded once)."""
    return _ops().dequantize(weight, ggml_type, k, dtype)


def _ops():
    if not _library_ready():
        raise RuntimeError(f"the quantized CPU kernels cannot be used here ({unavailable_reason() or 'build failed'})")
    return torch.ops.langrt_quant


def reset() -> None:
    """Forget whether the library could be used (tests that change LANGRT_CPU_KERNELS)."""
    _library_ready.cache_clear()


@functools.cache
def _library_ready() -> bool:
    from langrt_kernels.cpu import build_failure

    reason = unavailable_reason() or build_failure(_build)
    if reason is None:
        return True
    logger.warning("quantized CPU kernels not used: %s; GGUF weights are dequantized at load", reason)
    return False


def library_spec():
    """What is built: one library for every CPU (see above)."""
    from langrt_kernels.cpu.build_cache import LibrarySpec

    library = quant_library()
    return LibrarySpec(library.name, library.sources, library.cflags, "quantized CPU kernels")


def _build() -> None:
    from langrt_kernels.cpu import build_cache

    build_cache.load(library_spec())
