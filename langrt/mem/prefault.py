"""Committing a large CPU buffer's pages ahead of use (Linux MADV_POPULATE_WRITE).

A fresh multi-GB allocation is mapped lazily: every 4 KB page costs a fault the first time it is
written, paid on the serving path as the KV cache grows into new slots. Zeroing the buffer up
front moves the same faults to start-up, and populating it from a background thread slows the
serving thread (its allocations wait on the mmap lock); figures in benchmarks/README.md. So the
pages are populated a chunk at a time while the scheduler is idle. MADV_POPULATE_WRITE maps pages
writable without touching their contents, so it is safe on slots already holding K/V.
"""

from __future__ import annotations

import ctypes
import logging

import torch

logger = logging.getLogger(__name__)

_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_PAGE = 4096
CHUNK_BYTES = 16 * 1024 * 1024  # ~20 ms of faults here: short enough to keep idle polling responsive


class Prefaulter:
    """Populates a CPU tensor's pages chunk by chunk (`step`), until done or unsupported."""

    def __init__(self, buffer: torch.Tensor):
        self._buffer = buffer  # keeps the memory alive
        self._next = -(-buffer.data_ptr() // _PAGE) * _PAGE
        self._end = (buffer.data_ptr() + buffer.numel() * buffer.element_size()) // _PAGE * _PAGE
        self._madvise = _load_madvise()

    @property
    def done(self) -> bool:
        return self._madvise is None or self._next >= self._end

    def step(self) -> None:
        if self.done:
            return
        size = min(CHUNK_BYTES, self._end - self._next)
        if self._madvise(self._next, size, _MADV_POPULATE_WRITE) != 0:
            logger.debug("MADV_POPULATE_WRITE unavailable (errno %d); KV pages fault lazily", ctypes.get_errno())
            self._madvise = None
            return
        self._next += size


def _load_madvise():
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise
