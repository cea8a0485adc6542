"""One forward pass's LoRA work: its rows grouped by adapter (Punica / S-LoRA's segments).

It is the model's side of LoRA (the ModelRunner builds it from ForwardBatch.adapters, the layers
call `add`), so it lives in model/; langrt/lora/ loads and names the adapters.

The base projection runs once over every row of the batch; then each row gets its adapter's
low-rank product added: out[rows] += x[rows] @ A^T @ B^T (scaling folded into B). Rows of
requests without an adapter get nothing added.

With several adapters in a pass and few ranks in all (`STACK_MAX_RANKS`), the products of all
of them are two matrix products over every row: x @ A_all^T (the adapters' A stacked, [T, R]),
times a 0/1 mask that keeps each row its own adapter's columns, then @ B_all^T added in place.
Every row also computes the other adapters' R - r shrink columns and multiplies zeros in the
expand: a few per cent of the base product's work, for two calls a projection instead of a
gather, two products and a scatter per adapter. The stacks stay cached across passes for the
last few sets of adapters (decode passes keep the same set for many steps).

Otherwise (one adapter, or many ranks), adapter by adapter: rows of one request are contiguous
in the pass's [T] layout (ForwardBatch), so one adapter's rows are a few runs: an index gathers
them (one copy) and the product goes back run by run (slice adds: torch's index_add_ on CPU
measured many times slower than adding the same rows by slices).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

STACK_MAX_RANKS = 256  # the most stacked rank columns (all adapters of a pass) worth the waste
_STACK_SETS = 2  # sets of adapters whose stacks stay cached
# (id of each adapter, in group order) -> (the adapters, {(layer, projection): _Stack | None})
_stacks: OrderedDict[tuple[int, ...], tuple[tuple, dict]] = OrderedDict()


@dataclass(frozen=True)
class _Stack:
    a: torch.Tensor  # [R, in]: every adapter's A that targets the projection, in group order
    b: torch.Tensor  # [out, R]: their B, columns matching a's rows
    columns: torch.Tensor  # [R] int64: the group each column belongs to
    layout: tuple[tuple[int, int], ...]  # (group, rank) of each part: stacks alike share masks


@dataclass(frozen=True)
class LoraGroup:
    adapter: Any  # a langrt.lora.LoraAdapter: `name`, and `factors` by (layer, projection)
    rows: slice | torch.Tensor  # a slice when its rows are contiguous, else [n] int64 row ids
    runs: tuple[slice, ...]  # the same rows as runs of consecutive rows, in order


@dataclass(frozen=True)
class LoraPass:
    groups: tuple[LoraGroup, ...]
    row_group: torch.Tensor | None = None  # [T] int64: each row's group, -1 for the base model
    _masks: dict = field(default_factory=dict, compare=False)  # stack layout -> [T, R] mask

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
        groups = tuple(LoraGroup(by_id[k], *_as_rows(r, device)) for k, r in rows.items())
        if len(groups) == 1:
            return cls(groups)
        row_group = torch.full((start,), -1, dtype=torch.int64)
        for index, r in enumerate(rows.values()):
            row_group[r] = index
        return cls(groups, row_group.to(device))

    def add(self, out: torch.Tensor, x: torch.Tensor, layer: int, projection: str) -> torch.Tensor:
        """out [T, out_features] (the base projection of x [T, in]) plus each adapter's low-rank
        product on its rows; in place, returned."""
        stack = self._stack(layer, projection) if self.row_group is not None else None
        if stack is not None:
            shrunk = (x @ stack.a.T).mul_(self._mask(stack, x.dtype))
            return out.addmm_(shrunk, stack.b.T)
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

    def _stack(self, layer: int, projection: str) -> "_Stack | None":
        adapters = tuple(g.adapter for g in self.groups)
        key = tuple(map(id, adapters))
        entry = _stacks.get(key)
        if entry is None or any(a is not b for a, b in zip(entry[0], adapters)):
            entry = _stacks[key] = (adapters, {})
            while len(_stacks) > _STACK_SETS:
                _stacks.popitem(last=False)
        _stacks.move_to_end(key)
        by_projection = entry[1]
        if (layer, projection) not in by_projection:
            by_projection[(layer, projection)] = _build_stack(adapters, layer, projection)
        return by_projection[(layer, projection)]

    def _mask(self, stack: _Stack, dtype: torch.dtype) -> torch.Tensor:
        mask = self._masks.get(stack.layout)
        if mask is None:
            mask = self._masks[stack.layout] = (self.row_group[:, None] == stack.columns[None, :]).to(dtype)
        return mask


def _build_stack(adapters: tuple, layer: int, projection: str) -> _Stack | None:
    """The adapters' factors of one projection stacked; None where that does not pay (more
    than STACK_MAX_RANKS columns) or one adapter alone targets it."""
    parts = [(i, a.factors.get((layer, projection))) for i, a in enumerate(adapters)]
    parts = [(i, f) for i, f in parts if f is not None]
    if len(parts) < 2 or sum(f.a.shape[0] for _, f in parts) > STACK_MAX_RANKS:
        return None
    columns = torch.cat([torch.full((f.a.shape[0],), i, dtype=torch.int64) for i, f in parts])
    a = torch.cat([f.a for _, f in parts])
    b = torch.cat([f.b for _, f in parts], dim=1).contiguous()
    return _Stack(a, b, columns.to(a.device), tuple((i, f.a.shape[0]) for i, f in parts))


def _as_rows(rows: list[int], device: torch.device) -> tuple[slice | torch.Tensor, tuple[slice, ...]]:
    """Ascending row ids -> (a slice or an index over them, their runs of consecutive rows)."""
    breaks = [i for i in range(1, len(rows)) if rows[i] != rows[i - 1] + 1]
    starts, ends = [0, *breaks], [*breaks, len(rows)]
    runs = tuple(slice(rows[s], rows[e - 1] + 1) for s, e in zip(starts, ends))
    if len(runs) == 1:
        return runs[0], runs
    return torch.tensor(rows, dtype=torch.int64, device=device), runs
