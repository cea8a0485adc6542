"""One forward pass's LoRA work: its rows grouped by adapter (Punica / S-LoRA's segments).

It is the model's side of LoRA (the ModelRunner builds it from ForwardBatch.adapters, the layers
call `add`), so it lives in model/; langrt/lora/ loads and names the adapters.

The base projection runs once over every row of the batch; then, for each adapter present, its
rows' low-rank product is added to theirs: out[rows] += x[rows] @ A^T @ B^T (scaling folded
into B). Rows of requests without an adapter get nothing added. Rows of one request are
contiguous in the pass's [T] layout (ForwardBatch), so one adapter's rows are a few runs: an
index gathers them (one copy) and the product goes back run by run (slice adds: torch's
index_add_ on CPU measured many times slower than adding the same rows by slices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class LoraGroup:
    adapter: Any  # a langrt.lora.LoraAdapter: `name`, and `factors` by (layer, projection)
    rows: slice | torch.Tensor  # a slice when its rows are contiguous, else [n] int64 row ids
    runs: tuple[slice, ...]  # the same rows as runs of consecutive rows, in order


@dataclass(frozen=True)
class LoraPass:
    groups: tuple[LoraGroup, ...]

    def __post_init__(self):
        names = [g.adapter.name for g in self.groups]
        assert len(set(names)) == len(names), "one group per adapter"

    @classmethod
    def build(cls, adapters: Sequence[Any], extend_lens: Sequence[int], device: torch.device) -> "LoraPass | None":
        """Request i (with `adapters[i]`, None: the base model) owns the next extend_lens[i]
        rows (adapters: langrt.lora.LoraAdapter). None when no request has an adapter: the pass runs the plain model."""
        rows: dict[int, list[int]] = {}
        by_id: dict[int, Any] = {}
        start = 0
        for adapter, n in zip(adapters, extend_lens):
            if adapter is not None:
                rows.setdefault(id(adapter), []).extend(range(start, start + n))
                by_id[id(adapter)] = adapter
            start += n
        if not rows:
            return None
        return cls(tuple(LoraGroup(by_id[k], *_as_rows(r, device)) for k, r in rows.items()))

    def add(self, out: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> torch.Tensor:
        """out [T, out_features] (the base projection of x [T, in]) plus each adapter's low-rank
        product on its rows; in place, returned."""
        for group in self.groups:
            factors = group.adapter.factors.get((layer, projection))
            if factors is None:  # the adapter does not target this projection
                continue
            if isinstance(group.rows, slice):
                out[group.rows] += (x[group.rows] @ factors.a.T) @ factors.b.T
            else:
                delta = (x.index_select(0, group.rows) @ factors.a.T) @ factors.b.T
                start = 0
                for run in group.runs:
                    end = start + run.stop - run.start
                    out[run] += delta[start:end]
                    start = end
        return out


def _as_rows(rows: list[int], device: torch.device) -> tuple[slice | torch.Tensor, tuple[slice, ...]]:
    """Ascending row ids -> (a slice or an index over them, their runs of consecutive rows)."""
    breaks = [i for i in range(1, len(rows)) if rows[i] != rows[i - 1] + 1]
    starts, ends = [0, *breaks], [*breaks, len(rows)]
    runs = tuple(slice(rows[s], rows[e - 1] + 1) for s, e in zip(starts, ends))
    if len(runs) == 1:
        return runs[0], runs
    return torch.tensor(rows, dtype=torch.int64, device=device), runs
