"""A GGUF file's embedding table kept in its blocks: the rows a pass looks up are the rows the
whole table dequantized gives, bit for bit, and the table costs the blocks' bytes, not floats'."""

from __future__ import annotations

import pytest
import torch
from gguf_utils import Q, random_k_quant_rows

from langrt.errors import ModelLoadError
from langrt.model.layers import Embedding
from langrt.model.quant import Q4_1, Q8_0, QuantizedWeight

Q4_K, Q6_K = int(Q.Q4_K), int(Q.Q6_K)


def blocks_of(ggml_type: int, rows: int, k: int) -> QuantizedWeight:
    """Rows of blocks: gguf-py's rounding of random values, or random super-blocks for the
    K-quants (gguf-py has no quantizer for them)."""
    if ggml_type in (Q4_K, Q6_K):
        return QuantizedWeight.from_gguf(torch.from_numpy(random_k_quant_rows(Q(ggml_type), rows, k, 0)), ggml_type, k)
    return QuantizedWeight.quantize(torch.randn(rows, k), ggml_type)


@pytest.mark.parametrize("ggml_type", [Q4_1, Q8_0, Q4_K, Q6_K])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_looked_up_rows_are_the_dequantized_tables(ggml_type, dtype):
    torch.manual_seed(ggml_type)
    blocks = blocks_of(ggml_type, 300, 512)
    table = Embedding(300, 512).to(dtype)
    table.fill_quantized(blocks)
    ids = torch.tensor([[0, 299, 17, 17], [5, 4, 3, 2]])
    assert torch.equal(table(ids), blocks.dequantize(dtype)[ids])
    assert table(ids).dtype == dtype and table.weight.numel() == 0
    assert sum(p.numel() for p in table.parameters()) == 0


def test_blocks_of_another_shape_are_refused():
    blocks = QuantizedWeight.quantize(torch.randn(64, 64), Q8_0)
    with pytest.raises(ModelLoadError, match="embedding blocks of shape"):
        Embedding(65, 64).fill_quantized(blocks)


def test_the_built_in_model_keeps_its_embedding_in_blocks(smollm_path):
    from runner_driver import make_runner

    runner = make_runner(smollm_path, max_total_tokens=1024)
    table = runner.model.embed_tokens
    assert table.quantized is not None and table.weight.numel() == 0
    ids = torch.tensor([1, 42, 49151])
    assert torch.equal(table(ids), table.quantized.dequantize(torch.float32)[ids])
    # tied: the LM head multiplies the same blocks
    assert runner.model.lm_head_packed is table.quantized
