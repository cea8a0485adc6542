"""A tensor-parallel rank's slices of GGUF blocks (langrt/parallel/shard.py): rows are whole
rows of blocks, input columns whole blocks of every section of a row, and a cut through a block
falls back to the dequantized values. Each slice must hold exactly the values of the same slice
of the whole matrix, so TP=2 multiplies the weights TP=1 does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_utils import Q, random_k_quant_rows
from langrt_kernels.cpu import quant
from langrt.model.quant import QuantizedWeight
from langrt.parallel.shard import take_columns, take_rows

pytestmark = pytest.mark.skipif(
    not quant.available(), reason="the quantized CPU kernels are off (LANGRT_CPU_KERNELS=0)"
)


def _weight(qtype: str) -> QuantizedWeight:
    if qtype.endswith("_K"):
        raw = random_k_quant_rows(Q[qtype], 6, 512, seed=1)
        return QuantizedWeight.from_gguf(torch.from_numpy(raw), int(Q[qtype]), 512)
    values = torch.from_numpy(np.random.default_rng(1).standard_normal((6, 512)).astype(np.float32))
    return QuantizedWeight.quantize(values, int(Q[qtype]))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_block_slices_hold_the_whole_matrix_values(qtype):
    weight = _weight(qtype)
    whole = weight.dequantize(torch.float32)
    for start, end in [(0, 256), (256, 512), (64, 160)][
        : 2 if qtype in ("Q4_K", "Q6_K") else 3
    ]:  # their super-blocks: 256
        part = take_columns(weight, start, end, torch.float32)
        assert isinstance(part, QuantizedWeight) and part.in_features == end - start
        assert torch.equal(part.dequantize(torch.float32), whole[:, start:end])
        x = torch.randn(3, end - start)
        assert torch.allclose(part.matmul(x), x @ whole[:, start:end].T, rtol=1e-3, atol=1e-3)
    rows = take_rows(weight, torch.tensor([4, 1]))
    assert torch.equal(rows.dequantize(torch.float32), whole[[4, 1]])


def test_a_cut_through_a_q4_k_super_block_dequantizes():
    weight = _weight("Q4_K")
    part = take_columns(weight, 64, 160, torch.float32, "o_proj")
    assert not isinstance(part, QuantizedWeight)
    assert torch.equal(part, weight.dequantize(torch.float32)[:, 64:160])


def test_a_cut_through_a_block_dequantizes():
    weight = _weight("Q4_1")
    part = take_columns(weight, 16, 80, torch.float32, "o_proj")
    assert not isinstance(part, QuantizedWeight)
    assert torch.equal(part, weight.dequantize(torch.float32)[:, 16:80])
