"""The KV pool of a model with sliding-window layers: full layers keep every token, window layers
only the last `window` tokens of each sequence (Gemma 3: 5 layers of 6 slide over 512 tokens).

`HybridKVPool` looks like a `TokenToKVPool` to everything that hands out slots (req_to_token, the
radix tree, CacheManager): its slot ids are the full pool's. Each full slot may also own one slot
of a second, smaller pool that holds the window layers' K/V; `full_to_window[slot]` names it
(-1: that token's window K/V is not kept). Attention reads a window layer's keys through
`window_table` (the request rows' full slots mapped to window slots).

Lifetime of a token's window slot: taken with its full slot (`alloc`), so a pass writes every
layer; dropped (`drop_window`) once no window layer will read it again, while the full slot
lives on; freed with the full slot (`free`) at the latest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from langrt.mem.pools import TokenToKVPool


class HybridKVPool:
    """Full-attention layers' K/V in `full` (`size` slots), window layers' in `window_pool`.

    Invariant: every window slot is on the window pool's free list or named by exactly one full
    slot's `full_to_window` entry; a full slot on the free list names none."""

    def __init__(
        self,
        size: int,
        window_size: int,
        layer_windows: tuple[int | None, ...],
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        sliding = [w is not None for w in layer_windows]
        assert any(sliding), "a hybrid pool needs at least one sliding-window layer"
        # The widest window: a token's window K/V is dropped only when no window layer reads it.
        self.window = max(w for w in layer_windows if w is not None)
        self.full = TokenToKVPool(size, sliding.count(False), num_kv_heads, head_dim, dtype, device)
        self.window_pool = TokenToKVPool(window_size, sliding.count(True), num_kv_heads, head_dim, dtype, device)
        self.size, self.dtype, self.device = size, dtype, self.full.device
        self.sliding = tuple(sliding)
        # layer id -> its index inside its own pool
        self._local = [sum(1 for s in sliding[:i] if s == sliding[i]) for i in range(len(sliding))]
        self.k_buffers = [self._pool(i).k_buffers[self._local[i]] for i in range(len(sliding))]
        self.v_buffers = [self._pool(i).v_buffers[self._local[i]] for i in range(len(sliding))]
        self.full_to_window = torch.full((size,), -1, dtype=torch.int64, device=self.device)

    def _pool(self, layer_id: int) -> TokenToKVPool:
        return self.window_pool if self.sliding[layer_id] else self.full

    # ---- what the CacheManager sees (TokenToKVPool's interface) --------------------------

    @property
    def available_size(self) -> int:
        return self.full.available_size

    @property
    def window_available(self) -> int:
        """Window slots free now."""
        return self.window_pool.available_size

    @property
    def prefault(self) -> "_BothPrefaulters | None":
        """Both pools' page prefaulters (mem/prefault.py), one after the other; None where
        neither needs one."""
        parts = [p for p in (self.full.prefault, self.window_pool.prefault) if p is not None]
        return _BothPrefaulters(parts) if parts else None

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` full slots, each with a window slot; None (nothing taken) when either pool is short."""
        if n > self.window_pool.available_size:
            return None
        slots = self.full.alloc(n)
        if slots is None:
            return None
        self.full_to_window.index_copy_(0, slots, self.window_pool.alloc(n))
        return slots

    def free(self, slots: torch.Tensor) -> None:
        self.drop_window(slots)
        self.full.free(slots)

    def drop_window(self, slots: torch.Tensor) -> None:
        """Free the window slots of these full slots (those that have one); the full slots stay."""
        if not slots.numel():
            return
        slots = slots.to(self.device, torch.int64)
        window = self.full_to_window.index_select(0, slots)
        self.window_pool.free(window[window >= 0])
        self.full_to_window.index_fill_(0, slots, -1)

    def keep_window(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Where dst[i] (a cached token's slot) has no window K/V and src[i] (a duplicate of that
        token about to be freed) has, the window slot moves to dst[i]: the K/V are the same."""
        dst, src = dst.to(self.device, torch.int64), src.to(self.device, torch.int64)
        theirs, ours = self.full_to_window.index_select(0, dst), self.full_to_window.index_select(0, src)
        move = (theirs < 0) & (ours >= 0)
        self.full_to_window.index_copy_(0, dst[move], ours[move])
        self.full_to_window.index_fill_(0, src[move], -1)

    def window_prefix_len(self, slots: torch.Tensor) -> int:
        """The longest prefix of this token run (a cached prefix's slots) that a request can
        continue from: the next token, at position m, reads positions (m - window, m) in the
        window layers, so all of those must still have their window K/V."""
        missing = (self.full_to_window.index_select(0, slots.to(self.device)) < 0).to(torch.int64).cpu()
        before = torch.cat([missing.new_zeros(1), missing.cumsum(0)])  # before[j]: missing in [0, j)
        ends = torch.arange(len(before))
        lows = (ends - self.window + 1).clamp_(min=0)
        usable = (before - before[lows] == 0).nonzero()
        return int(usable[-1])

    def write(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K/V of one layer for the tokens in full slots `slots`."""
        if self.sliding[layer_id]:
            slots = self.full_to_window.index_select(0, slots)
        self._pool(layer_id).write(self._local[layer_id], slots, k, v)

    # Reads and writes of full_to_window go through index_select / index_copy_ / index_fill_:
    # torch's advanced indexing (`t[idx]`) measured thousands of times slower here on CPU.

    def window_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """Full slots (any integer dtype and shape) -> window slots (int64). Tokens without
        window K/V get slot 0, a valid slot whose values are finite (attention masks them or
        never reads them)."""
        window = self.full_to_window.index_select(0, slots.reshape(-1).to(torch.int64))
        return window.view(slots.shape).clamp_(min=0)

    def window_table(self, table: torch.Tensor) -> torch.Tensor:
        """`window_slots` as int32, for kernels that take a req_to_token-like table."""
        return self.window_slots(table).to(torch.int32)

    def window_slots_in_use(self) -> int:
        return self.window_pool.size - self.window_pool.available_size


class _BothPrefaulters:
    def __init__(self, parts: list):
        self.parts = parts

    @property
    def done(self) -> bool:
        return all(p.done for p in self.parts)

    def step(self) -> None:
        next(p for p in self.parts if not p.done).step()


# Window slots per full slot where memory sizes the pools. A request holds at most window + one
# pass's tokens of window slots privately (and its prompt's last window tokens in the prefix
# cache), so one 4x the window long or longer uses at most about a quarter; shorter ones use
# more, and admission then waits on the window pool (CacheManager.window_room), never overfills it.
WINDOW_POOL_SHARE = 0.25
# ...and never fewer than this many windows, so a running request's window always fits.
WINDOW_POOL_MIN_WINDOWS = 4
_MAP_BYTES = 8  # one int64 full_to_window entry per full slot


@dataclass(frozen=True)
class KVSplit:
    """What one token costs in each pool: bytes per full slot (full layers' K/V and its map
    entry) and per window slot (window layers' K/V)."""

    full_bytes: int
    window_bytes: int
    window: int

    @classmethod
    def of(
        cls, layer_windows: tuple[int | None, ...], num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> "KVSplit":
        sliding = sum(w is not None for w in layer_windows)
        per_layer = TokenToKVPool.bytes_per_token(1, num_kv_heads, head_dim, dtype)
        window = max(w for w in layer_windows if w is not None)
        return cls((len(layer_windows) - sliding) * per_layer + _MAP_BYTES, sliding * per_layer, window)

    def full_slots(self, memory: int) -> int:
        """Full slots that `memory` bytes hold with their share of window slots."""
        return int(memory // (self.full_bytes + WINDOW_POOL_SHARE * self.window_bytes))

    def window_slots(self, full_slots: int) -> int:
        return min(full_slots, max(math.ceil(WINDOW_POOL_SHARE * full_slots), WINDOW_POOL_MIN_WINDOWS * self.window))


def uses_window_pool(layer_windows: tuple[int | None, ...], context_len: int) -> bool:
    """Whether some layer slides over a window shorter than the context (else nothing to save)."""
    windows = [w for w in layer_windows if w is not None]
    return bool(windows) and max(windows) < context_len
