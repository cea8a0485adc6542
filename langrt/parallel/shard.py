"""A rank's slices of the checkpoint's tensors, taken as they stream from the file (HF names).

Column-parallel matrices (q/k/v, gate/up, the embedding and the LM head) keep whole rows of
their output; row-parallel ones (o, down) keep a range of input columns, and their partial
products are summed over the ranks (langrt.parallel.group). GGUF blocks (langrt.model.quant)
shard too: rows are whole rows of blocks; input columns are cut at the 32-weight block
boundaries, each section of langrt's row layout (quants, scales, minimums) cut alike. A cut
through a block (a head of 16 values, say) dequantizes that matrix to the serving dtype.
"""

from __future__ import annotations

import logging
from typing import Iterable, Iterator

import torch

from langrt.model.config import ModelConfig
from langrt.model.quant import BLOCK, QuantizedWeight
from langrt.parallel.layout import ShardLayout

logger = logging.getLogger(__name__)

_COLUMN = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head"}
_ROW = {"o_proj", "down_proj"}


def shard_weights(
    weights: Iterable[tuple[str, object]], config: ModelConfig, layout: ShardLayout, dtype: torch.dtype
) -> Iterator[tuple[str, object]]:
    """(HF name, tensor or QuantizedWeight) -> the same names with this rank's slices."""
    for name, tensor in weights:
        parts = name.split(".")
        module = parts[-2] if len(parts) >= 2 else ""
        if module in _COLUMN:
            tensor = take_rows(tensor, _rows(module, config, layout))
        elif module in _ROW and parts[-1] == "weight":
            start, end = _columns(module, config, layout)
            tensor = take_columns(tensor, start, end, dtype, name)
        yield name, tensor


def _rows(module: str, c: ModelConfig, layout: ShardLayout) -> torch.Tensor:
    d = c.head_dim
    if module == "q_proj":
        heads = layout.q_heads
    elif module in ("k_proj", "v_proj"):
        heads = layout.kv_heads
    else:
        start, end = layout.ffn if module in ("gate_proj", "up_proj") else layout.vocab
        return torch.arange(start, end)
    return torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads])


def _columns(module: str, c: ModelConfig, layout: ShardLayout) -> tuple[int, int]:
    if module == "o_proj":
        return layout.q_heads[0] * c.head_dim, (layout.q_heads[-1] + 1) * c.head_dim
    return layout.ffn


def take_rows(tensor, rows: torch.Tensor):
    """Rows `rows` of a [out, in] matrix or [out] bias, plain or in blocks."""
    if isinstance(tensor, QuantizedWeight):
        return QuantizedWeight(tensor.data.index_select(0, rows).contiguous(), tensor.ggml_type, tensor.in_features)
    return tensor.index_select(0, rows.to(tensor.device)).contiguous()


def take_columns(tensor, start: int, end: int, dtype: torch.dtype, name: str = ""):
    """Input columns [start, end) of a [out, in] matrix, plain or in blocks."""
    if not isinstance(tensor, QuantizedWeight):
        return tensor[:, start:end].contiguous()
    if start % BLOCK or end % BLOCK and end != tensor.in_features:
        logger.info("%s: columns %d..%d cut through a block of %d; dequantized to %s", name, start, end, BLOCK, dtype)
        return tensor.dequantize(dtype)[:, start:end].contiguous()
    return QuantizedWeight(slice_block_columns(tensor, start // BLOCK, -(-end // BLOCK)), tensor.ggml_type, end - start)


def slice_block_columns(weight: QuantizedWeight, first: int, last: int) -> torch.Tensor:
    """Blocks [first, last) of every row of a weight in langrt's row layout, where a row is its
    blocks' quants, then their scales, then (Q4_1, Q4_K) their minimums (quant_kernels.h)."""
    blocks = -(-weight.in_features // BLOCK)
    pieces, offset = [], 0
    for per_block in SECTION_BYTES[weight.ggml_type]:
        pieces.append(weight.data[:, offset + first * per_block : offset + last * per_block])
        offset += blocks * per_block
    assert offset == weight.data.shape[1], f"rows of GGML type {weight.ggml_type} are not {SECTION_BYTES[weight.ggml_type]}"
    return torch.cat(pieces, dim=1).contiguous()


# Bytes per 32-weight block in each section of a row (quants, scales, minimums), by GGML type:
# Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (fp16 scales; the 5-bit types' fifth bits ride with their nibbles),
# and the K-quants as unpacked at load (langrt.model.kquants): Q2_K (quants, 8-byte scales and
# minimums), Q3_K, Q4_K (float32 scales and minimums), Q5_K, Q6_K (two float32 scales).
SECTION_BYTES = {
    2: (16, 2), 3: (16, 2, 2), 6: (20, 2), 7: (20, 2, 2), 8: (32, 2),
    10: (8, 8, 8), 11: (12, 8), 12: (16, 4, 4), 13: (20, 4, 4), 14: (32, 8),
}  # fmt: skip
