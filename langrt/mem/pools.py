"""The two memory pools behind paged attention (page size 1).

`TokenToKVPool` holds K and V for every cached token in fixed slots; `ReqToTokenPool` maps each
running request's positions to the slots that hold them. Attention reads K/V through that table,
so any run of slots — a cached prefix shared with other requests plus a request's own new tokens —
forms one sequence without copying.
"""

from __future__ import annotations

import math

import torch

from langrt.mem.prefault import Prefaulter

# CPU allocations this large are fresh kernel mappings (glibc's mmap threshold is at most 32 MB),
# hence zero-filled.
_FRESH_MAPPING_BYTES = 64 * 1024 * 1024


class TokenToKVPool:
    """K/V buffers [num_slots, num_kv_heads, head_dim] per layer and a free list of slot ids.

    Invariant: every slot is either on the free list or owned by exactly one holder (a running
    request or the prefix cache); `alloc` and `free` move slots between the two, nothing else.
    """

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        assert size > 0, "the KV pool needs at least one slot"
        self.size = size
        self.dtype = dtype
        self.device = torch.device(device)
        # One block, all zeros: a masked-out stale slot must hold finite values (NaN * 0 attention
        # weight is still NaN). A large CPU block comes straight from the kernel, already zero,
        # and its pages are committed while the scheduler is idle (`prefault`, see prefault.py);
        # a small one may be recycled heap memory and is zeroed here.
        shape = (2, num_layers, size, num_kv_heads, head_dim)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        self.prefault: Prefaulter | None = None
        if self.device.type == "cpu" and nbytes >= _FRESH_MAPPING_BYTES:
            self._buffer = torch.empty(shape, dtype=dtype, device=device)
            self.prefault = Prefaulter(self._buffer)
        else:
            self._buffer = torch.zeros(shape, dtype=dtype, device=device)
        self.k_buffers = list(self._buffer[0])
        self.v_buffers = list(self._buffer[1])
        # A stack: the most recently freed slots are reused first (their pages are warm).
        self._free = torch.arange(size - 1, -1, -1, dtype=torch.int64)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def available_size(self) -> int:
        return int(self._free.numel())

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` free slot ids (int64, on the pool's device), or None when fewer are free."""
        if n > self._free.numel():
            return None
        split = self._free.numel() - n
        slots, self._free = self._free[split:].flip(0), self._free[:split]
        return slots.to(self.device)

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self._free = torch.cat([self._free, slots.to("cpu", torch.int64).flip(0)])

    def write(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K/V ([T, num_kv_heads, head_dim]) of one layer into `slots` ([T])."""
        self.k_buffers[layer_id].index_copy_(0, slots, k.to(self.dtype))
        self.v_buffers[layer_id].index_copy_(0, slots, v.to(self.dtype))

    # ---- sliding-window upkeep (mem/window_pool.py): nothing to do where every layer keeps
    # every token's K/V, as here ----------------------------------------------------------

    window: int | None = None  # the widest sliding window of a pool that drops old window K/V

    @property
    def window_available(self) -> int:
        return self.available_size

    def drop_window(self, slots: torch.Tensor) -> None:
        pass

    def keep_window(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        pass

    def window_prefix_len(self, slots: torch.Tensor) -> int:
        return int(slots.numel())


class ReqToTokenPool:
    """Rows [max_requests, context_len] of int32 slot ids; one row per running request."""

    def __init__(self, max_requests: int, context_len: int, device: torch.device | str):
        assert max_requests > 0 and context_len > 0
        self.size = max_requests
        self.context_len = context_len
        self.req_to_token = torch.zeros((max_requests, context_len), dtype=torch.int32, device=device)
        self._free_rows = list(range(max_requests))

    @property
    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        """A free row index, or None when every row is taken."""
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        assert 0 <= row < self.size and row not in self._free_rows, f"double free of row {row}"
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record that positions [start, start + len(slots)) of request `row` live in `slots`."""
        self.req_to_token[row, start : start + slots.numel()] = slots.to(torch.int32)

    def slots(self, row: int, end: int, start: int = 0) -> torch.Tensor:
        return self.req_to_token[row, start:end].to(torch.int64)
