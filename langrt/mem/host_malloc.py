"""The scheduler process's C allocator: keep freed tensor memory for the next pass.

On CPU every forward pass allocates and frees the same large activations, K/V gathers and
attention buffers. glibc's malloc by default serves blocks over a moving threshold with fresh
mmaps and hands a heap top over 128 KiB of free space back to the kernel, so a pass keeps
faulting in zeroed pages that the previous pass just released (figures: benchmarks/README.md,
bench_host_malloc.py). vLLM's CPU backend asks users to preload tcmalloc for the same reason;
this needs no extra library. The cost: the process keeps its peak heap.
"""

from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
# Why these: blocks up to 32 MiB (glibc's ceiling for the mmap threshold) come from the heap and
# are reused; the heap is never trimmed below 1 GiB of free space; it grows 64 MiB at a time.
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 1 << 30
_TOP_PAD = 64 << 20


def _glibc():
    """The C library where it is glibc (mallopt and malloc_trim are glibc's), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # musl has neither
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_memory() -> None:
    """Hand the pages malloc holds free back to the kernel (glibc's malloc_trim): once, after a
    process's start-up, whose parsing and building (the tokenizer's vocabulary as Python strings,
    its JSON) leave tens to hundreds of MB freed but resident. A no-op elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.malloc_trim(0)


def keep_freed_memory() -> bool:
    """Applies the settings above to this process's malloc; False (nothing changed) where the C
    library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = all(
        mallopt(param, value)
        for param, value in (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
            (_M_TOP_PAD, _TOP_PAD),
        )
    )
    logger.debug("malloc keeps freed memory: %s", applied)
    return applied
