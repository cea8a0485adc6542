"""The host-memory tier: evicted K/V blocks in one preallocated host buffer, least recently used
dropped first (to the disk tier, which already holds them when there is one: writes go through).

The buffer is allocated once at its full size so the tier's memory is bounded and never
fragments; where the KV pool is on a GPU it is pinned, so blocks copy to and from the device at
full bandwidth. On a CPU the pool is host memory too: the tier is still a separate, bounded
store, so what the radix tree evicts leaves the pool's budget.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class HostTier:
    def __init__(self, capacity_blocks: int, block_shape: tuple[int, ...], dtype: torch.dtype, pin: bool):
        assert capacity_blocks > 0, "a host tier needs room for at least one block"
        self.capacity = capacity_blocks
        self.buffer = torch.empty((capacity_blocks, *block_shape), dtype=dtype, pin_memory=pin)
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> buffer row, LRU first
        self._free = list(range(capacity_blocks - 1, -1, -1))

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def put(self, key: bytes, data: torch.Tensor) -> None:
        """Store a block (copied), dropping the least recently used one when full."""
        if key in self._index:
            self._index.move_to_end(key)
            return
        row = self._free.pop() if self._free else self._index.popitem(last=False)[1]
        self.buffer[row].copy_(data)
        self._index[key] = row

    def get(self, key: bytes) -> torch.Tensor | None:
        """A view of the stored block (valid until the next `put`), or None."""
        row = self._index.get(key)
        if row is None:
            return None
        self._index.move_to_end(key)
        return self.buffer[row]
