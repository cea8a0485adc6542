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
from langrt.model.kquants import SUPER_BLOCK
from langrt.model.quant import BLOCK, REPACKED_K_QUANTS, QuantizedWeight
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
    unit = SUPER_BLOCK if tensor.ggml_type in REPACKED_K_QUANTS else BLOCK  # Q4_K, Q6_K: kept in super-blocks
    if start % unit or end % unit and end != tensor.in_features:
        logger.info("%s: columns %d..%d cut through a block of %d; dequantized to %s", name, start, end, unit, dtype)
        return tensor.dequantize(dtype)[:, start:end].contiguous()
    return QuantizedWeight(slice_block_columns(tensor, start // BLOCK, -(-end // BLOCK)), tensor.ggml_type, end - start)


def slice_block_columns(weight: QuantizedWeight, first: int, last: int) -> torch.Tensor:
    """Blocks [first, last) of every row of a weight in langrt's row layout, where a row is its
    blocks' quants, then their scales, then (Q4_1, Q4_K) their minimums (quant_kernels.h)."""
    blocks = -(-weight.in_features // BLOCK)
    pieces, offset = [], 0
    for per_8 in SECTION_BYTES[weight.ggml_type]:  # first, last: multiples of 8 where a section has fewer
        pieces.append(weight.data[:, offset + first * per_8 // 8 : offset + last * per_8 // 8])
        offset += blocks * per_8 // 8
    assert offset == weight.data.shape[1], (
        f"rows of GGML type {weight.ggml_type} are not {SECTION_BYTES[weight.ggml_type]}"
    )
    return torch.cat(pieces, dim=1).contiguous()


# Bytes per 8 blocks of 32 weights in each section of a row (quants, scales, minimums), by GGML
# type: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (fp16 scales; the 5-bit types' fifth bits ride with their
# nibbles); Q2_K (quants, float32 scales and minimums per 16 weights), Q3_K, Q5_K as unpacked at
# load (langrt.model.kquants); Q4_K and Q6_K in super-blocks of 8 blocks (quant_kernels.h: quants,
# fp16 d per super-block, Q4_K's fp16 dmin, then a byte per block (Q6_K: per 16 weights) of
# scales and Q4_K's of minimums).
SECTION_BYTES = {
    2: (128, 16),
    3: (128, 16, 16),
    6: (160, 16),
    7: (160, 16, 16),
    8: (256, 16),
    10: (64, 64, 64),
    11: (96, 64),
    12: (128, 2, 2, 8, 8),
    13: (160, 32, 32),
    14: (192, 2, 16),
}
