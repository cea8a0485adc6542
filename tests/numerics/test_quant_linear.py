"""langrt's quantized CPU kernels (kernels/cpu/quant.py) and the model layers that serve GGUF
blocks as stored (langrt/model/quant.py), against the dequantized reference.

Tolerances: the activations are rounded to int16 per block of 32 (relative error <= 2^-16 of the
block's largest value), so a float32 product is within ~1e-4 (relative, over the output) of the
product with the dequantized weights; a bfloat16 one is dominated by rounding its output to
bfloat16 (~4e-3). Through a model the products' errors add up: the tiny random models' logits
(two layers, weights ~N(0, 0.5)) stay within 5e-4.
"""

from __future__ import annotations

import sys

import gguf
import numpy as np
import pytest
import torch

from gguf_utils import Q, random_k_quant_rows, write_gguf, write_q4_k_m_like
from langrt_kernels.cpu import quant
from langrt.model.quant import QuantizedWeight

pytestmark = pytest.mark.skipif(
    not quant.available(), reason="the quantized CPU kernels are off (LANGRT_CPU_KERNELS=0)"
)

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # super-blocks of 256: rows of 512 here
# vnni: 4-bit blocks 16 weight rows at a time (quant_vnni.cpp), where the CPU has AVX512-VNNI
ISAS = (["vnni"] if quant.vnni_rows() else []) + (["avx2", "scalar"] if quant.isa() == "avx2" else ["scalar"])
REL = {torch.float32: 1e-4, torch.bfloat16: 6e-3}
MODEL_REL = 5e-4


def _weights(qtype: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks in the kernels' layout, uint8 [n, row bytes]; their values float32 [n, k], as
    gguf-py dequantizes them), from gguf-py's quantizer, or random super-blocks for the K-quants
    (k then becomes 512)."""
    if qtype in K_QUANTS:
        k = 512
        raw = random_k_quant_rows(Q[qtype], n, k, seed)
        data = QuantizedWeight.from_gguf(torch.from_numpy(raw), int(Q[qtype]), k).data
    else:
        rng = np.random.default_rng(seed)
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), Q[qtype])
        data = quant.repack(torch.from_numpy(raw.reshape(n, -1).copy()), int(Q[qtype]))
    values = gguf.quants.dequantize(raw, Q[qtype]).reshape(n, k)
    return data, torch.from_numpy(values.copy())


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    if request.param == "vnni":
        monkeypatch.delenv(quant.ISA_ENV, raising=False)
        assert quant.op_isa() == 2
    else:
        monkeypatch.setenv(quant.ISA_ENV, request.param)
        assert quant.isa() == request.param and quant.op_isa() < 2
    return request.param


@pytest.mark.skipif(not quant.vnni_rows(), reason="needs AVX512-VNNI (quant_vnni.cpp)")
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K"])
def test_vnni_kernel_takes_the_avx2_kernels_integer_sums(qtype, monkeypatch):
    """Rows of 37 blocks (two of the scales' 16-block transposes, one short) and 37 weight rows
    (two tiles of 16 and a short one): the AVX2 kernel's integer sums, scaled in another order,
    so within float32 rounding of it (K-quants: rows of 512)."""
    blocks, values = _weights(qtype, 37, 37 * 32, seed=5)
    x = torch.randn(9, values.shape[1], generator=torch.Generator().manual_seed(5))
    t = quant.GGML_TYPES[qtype]
    got = quant.quant_linear(x, blocks, t)
    # bf16 rows: the float32 results of the same values, rounded to nearest even
    bf16 = quant.quant_linear(x.bfloat16(), blocks, t)
    assert torch.equal(bf16, quant.quant_linear(x.bfloat16().float(), blocks, t).bfloat16())
    assert _rel(got, x.double() @ values.double().T) < REL[torch.float32]
    monkeypatch.setenv(quant.ISA_ENV, "avx2")
    assert _rel(got, quant.quant_linear(x, blocks, t)) < 1e-6


@pytest.mark.skipif(quant.isa() != "avx2", reason="needs AVX2 (quant_avx2_k.cpp)")
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])  # the byte kernel's groups of 4 activation rows and their tails
# rows of whole groups of 8 blocks (Q4_0 and Q4_1 rows of other widths take quant_avx2.cpp)
@pytest.mark.parametrize("qtype, k", [("Q4_0", 512), ("Q4_1", 1536), ("Q4_K", 1536), ("Q6_K", 1536)])
def test_avx2_blocks_on_bytes_take_the_scalar_kernels_integer_sums(qtype, k, rows, monkeypatch):
    """Q4_0, Q4_1, Q4_K and Q6_K on AVX2 multiply the activations' int16 quants split into bytes
    (quant_avx2_k.cpp, the 4-bit types two blocks to a register): the same integer sums as the
    scalar kernel, so within float32 rounding of it. Activations at the int16 extremes (every
    block's largest value rounds to +-32767: the high byte's -128 and 127, the low byte's 255) and
    one outlier channel."""
    n = 37
    rng = np.random.default_rng(rows)
    if qtype in K_QUANTS:
        raw = random_k_quant_rows(Q[qtype], n, k, seed=rows)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), Q[qtype]).reshape(n, -1)
    blocks = QuantizedWeight.from_gguf(torch.from_numpy(raw.copy()), int(Q[qtype]), k).data
    values = torch.from_numpy(gguf.quants.dequantize(raw, Q[qtype]).reshape(n, k).copy())
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    x[:, 7] = 40.0
    x[:, 32::64] = -x[:, 32::64].abs().amax() * 2  # blocks whose largest value is negative
    t = quant.GGML_TYPES[qtype]
    monkeypatch.setenv(quant.ISA_ENV, "avx2")
    got = quant.quant_linear(x, blocks, t)
    assert _rel(got, x.double() @ values.double().T) < REL[torch.float32]
    monkeypatch.setenv(quant.ISA_ENV, "scalar")
    assert _rel(got, quant.quant_linear(x, blocks, t)) < 1e-6


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_gives_gguf_values_exactly(qtype):
    blocks, values = _weights(qtype, 37, 96, seed=1)
    k = values.shape[1]
    assert torch.equal(quant.dequantize(blocks, quant.GGML_TYPES[qtype], k, torch.float32), values)
    assert torch.equal(quant.dequantize(blocks, quant.GGML_TYPES[qtype], k, torch.bfloat16), values.bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 9, 70])  # the AVX2 tiles (4x1, 2x2-2x5), 64-row chunks
@pytest.mark.parametrize("qtype", TYPES)
def test_quant_linear_matches_the_dequantized_product(qtype, rows, dtype, isa):
    blocks, values = _weights(qtype, 37, 160, seed=rows)
    x = torch.randn(rows, values.shape[1], generator=torch.Generator().manual_seed(rows)).to(dtype)
    got = quant.quant_linear(x, blocks, quant.GGML_TYPES[qtype])
    assert got.dtype == dtype and got.shape == (rows, 37)
    want = x.double() @ values.double().T
    assert _rel(got, want) < REL[dtype]
    # each row alone gives the same values as in the batch (rows never mix)
    alone = torch.cat([quant.quant_linear(x[i : i + 1], blocks, quant.GGML_TYPES[qtype]) for i in range(rows)])
    assert torch.equal(alone, got)


@pytest.mark.parametrize("qtype", TYPES)
def test_long_runs_of_weight_rows_are_taken_in_chunks_with_the_same_values(qtype, isa):
    """501 weight rows of 576 weights (a task's run past 64 KB of blocks on either thread, in
    chunks of whole tiles, the last one short; K-quants: rows of 512) against 9 activation rows:
    every output is the dequantized product's, and a row alone gives the same bits (a single row
    takes its run whole)."""
    blocks, values = _weights(qtype, 501, 576, seed=11)
    assert blocks.shape[1] * 501 > 2 * 64 * 1024  # more than one chunk for each of two tasks
    x = torch.randn(9, values.shape[1], generator=torch.Generator().manual_seed(11))
    got = quant.quant_linear(x, blocks, quant.GGML_TYPES[qtype])
    assert _rel(got, x.double() @ values.double().T) < REL[torch.float32]
    alone = torch.cat([quant.quant_linear(x[i : i + 1], blocks, quant.GGML_TYPES[qtype]) for i in range(9)])
    assert torch.equal(alone, got)


needs_bf16_rows = pytest.mark.skipif(not quant.bf16_rows(), reason="dense_linear needs AVX512-BF16")


@needs_bf16_rows
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 7, 8, 9])  # tiles of 4 activation rows and the tails (3: padded to 4)
@pytest.mark.parametrize("qtype", TYPES)
def test_dense_linear_multiplies_the_bf16_copys_values(qtype, rows):
    """dense_linear's products are x times W's values rounded to bfloat16 (what the packed copy
    holds), summed in float32 and rounded once: within half a bfloat16 step of the exact product,
    for every weight row including a last tile of fewer than 4 (37 rows)."""
    blocks, values = _weights(qtype, 37, 160, seed=rows)
    x = torch.randn(rows, values.shape[1], generator=torch.Generator().manual_seed(rows)).bfloat16()
    got = quant.dense_linear(x, blocks, quant.GGML_TYPES[qtype])
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 37)
    want = x.double() @ values.bfloat16().double().T
    sum_error = 1e-5 * (x.double().abs() @ values.double().abs().T)
    assert ((got.double() - want).abs() <= want.abs() * 2**-8 + sum_error).all()
    alone = torch.cat([quant.dense_linear(x[i : i + 2], blocks, quant.GGML_TYPES[qtype])[:1] for i in range(rows - 1)])
    assert torch.equal(alone, got[: rows - 1])  # rows never mix


@needs_bf16_rows
def test_dense_linear_refuses_float32():
    blocks, values = _weights("Q4_1", 8, 64, seed=2)
    with pytest.raises(RuntimeError, match="bfloat16"):
        quant.dense_linear(torch.randn(3, 64), blocks, quant.GGML_TYPES["Q4_1"])


def test_strided_rows_and_paths_agree(monkeypatch):
    """A row view of a wider tensor reads only its row; AVX2 and plain C++ quantize the same
    activations, so they differ only in the order of float sums."""
    blocks, _ = _weights("Q4_1", 20, 64, seed=3)
    wide = torch.randn(6, 100)
    x = wide[:, 10:74]
    got = quant.quant_linear(x, blocks, 3)
    assert torch.equal(got, quant.quant_linear(x.contiguous(), blocks, 3))
    monkeypatch.setenv(quant.ISA_ENV, "scalar")
    torch.testing.assert_close(quant.quant_linear(x, blocks, 3), got, rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_refused():
    blocks, _ = _weights("Q8_0", 4, 64, seed=0)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        quant.quant_linear(torch.randn(1, 48), blocks, 8)
    with pytest.raises(RuntimeError, match="do not hold"):
        quant.quant_linear(torch.randn(1, 64), blocks, 3)
    with pytest.raises(RuntimeError, match="unsupported GGML type"):
        quant.quant_linear(torch.randn(1, 64), blocks, 9)  # Q8_1: not served as blocks
    with pytest.raises(RuntimeError, match="not one repacked here"):
        quant.repack(torch.zeros(2, 176, dtype=torch.uint8), 13)  # Q5_K: unpacked in Python
    with pytest.raises(RuntimeError, match="whole super-blocks of 144 bytes"):
        quant.repack(torch.zeros(2, 150, dtype=torch.uint8), 12)
    with pytest.raises(RuntimeError, match="do not hold"):
        quant.quant_linear(torch.randn(1, 96), torch.zeros(4, 111, dtype=torch.uint8), 12)  # not whole super-blocks


def test_logits_of_equals_matmul_at_those_places():
    blocks, _ = _weights("Q8_0", 50, 64, seed=4)
    weight = QuantizedWeight(blocks, 8, 64)
    hidden = torch.randn(3, 64)
    rows, ids = torch.tensor([0, 2, 2, 1, 0]), torch.tensor([7, 7, 49, 0, 3])
    assert torch.equal(weight.logits_of(hidden, rows, ids), weight.matmul(hidden)[rows, ids])


# --- the model on quantized GGUF files ------------------------------------------------------------


def _tiny_gguf(tmp_path, kind: str, qtype: str):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "unit"))
    import test_gguf

    config, state = test_gguf.tiny_llama() if kind == "llama" else test_gguf.tiny_qwen2()
    return write_gguf(tmp_path / f"{kind}-{qtype}.gguf", state, config, Q[qtype])


def _assert_logits_agree(blocks, dense) -> None:
    """Two prompts, then three decode steps: logits within MODEL_REL of each other."""
    from runner_driver import RunnerDriver

    prompts = [[5, 9, 17, 33, 2, 101, 64, 8], [70, 3]]
    got, want = RunnerDriver(blocks), RunnerDriver(dense)
    for a, b in zip(got.prefill(prompts), want.prefill(prompts)):
        assert _rel(a, b) < MODEL_REL
    for step in range(3):
        a, b = got.decode([0, 1], [step, 40 + step]), want.decode([0, 1], [step, 40 + step])
        assert _rel(a, b) < MODEL_REL


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # q/k rows permuted and untied; biases and tied
@pytest.mark.parametrize("qtype", [t for t in TYPES if t not in K_QUANTS])  # gguf-py quantizes these
def test_tiny_models_on_blocks_match_the_dequantized_model(tmp_path, kind, qtype):
    from runner_driver import make_runner

    path = _tiny_gguf(tmp_path, kind, qtype)
    blocks = make_runner(path, quantization="auto", max_total_tokens=512)
    dense = make_runner(path, quantization="none", max_total_tokens=512)
    layer = blocks.model.layers[0]
    assert layer.self_attn.qkv_proj.quantized and layer.mlp.down_proj.quantized
    assert layer.self_attn.qkv_proj.weight.numel() == 0  # the dequantized copy is not kept
    assert isinstance(blocks.model.lm_head_packed, QuantizedWeight)
    assert not dense.model.layers[0].self_attn.qkv_proj.quantized
    # every matrix routes its products by its own runner's pass (no state shared between runners)
    packed = [m.packed for m in blocks.model.modules() if isinstance(getattr(m, "packed", None), QuantizedWeight)]
    assert all(w.context is blocks.pass_context for w in [*packed, blocks.model.lm_head_packed])
    assert blocks.pass_context is not dense.pass_context and len(packed) >= 4
    _assert_logits_agree(blocks, dense)


def test_a_q4_k_m_like_file_is_served_as_blocks(tmp_path):
    """Q4_K_M's mix (Q4_K attention and gate/up, Q6_K down projections and output, and in some
    layers a Q6_K v projection beside Q4_K q and k; a Q8_0 embedding) on a tiny Llama (q/k rows
    permuted, as llama.cpp writes them): every matrix served as blocks, and the logits within
    MODEL_REL of the dequantized model's."""
    from runner_driver import make_runner

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "unit"))
    import test_gguf

    config, state = test_gguf.tiny_llama(hidden_size=256, intermediate_size=512)
    path = write_q4_k_m_like(tmp_path / "tiny-q4_k_m.gguf", config, state)
    blocks = make_runner(path, quantization="auto", max_total_tokens=512)
    dense = make_runner(path, quantization="none", max_total_tokens=512)
    layer = blocks.model.layers[1]
    assert layer.self_attn.qkv_proj.packed.type_name == "Q4_K" and layer.mlp.down_proj.packed.type_name == "Q6_K"
    assert blocks.model.layers[0].self_attn.qkv_proj.packed.type_name == "Q4_K+Q6_K"  # q, k | v
    assert blocks.model.lm_head_packed.type_name == "Q6_K"
    _assert_logits_agree(blocks, dense)


def _tiny_llama_256():
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "unit"))
    import test_gguf

    return test_gguf.tiny_llama(hidden_size=256, intermediate_size=512)


def test_a_file_mixing_every_block_type_is_served_as_blocks(tmp_path, caplog):
    """Q5_0 attention and gate/up (as Qwen2.5-0.5B's Q4_K_M file keeps its 896-wide matrices),
    a Q5_1 v projection beside them in layer 0, Q5_K / Q3_K down projections, a Q2_K LM head:
    every matrix served as blocks, the load log says so, and the logits are within MODEL_REL of
    the dequantized model's."""
    from runner_driver import make_runner

    from gguf_utils import write_mixed

    def pick(name: str) -> Q:
        if "down_proj" in name:
            return Q.Q5_K if ".0." in name else Q.Q3_K
        return Q.Q2_K if name == "lm_head.weight" else Q.Q5_1 if "layers.0.self_attn.v_proj" in name else Q.Q5_0

    config, state = _tiny_llama_256()
    path = write_mixed(tmp_path / "mixed.gguf", config, state, pick)
    with caplog.at_level("INFO", logger="langrt.model.gguf_loader"):
        blocks = make_runner(path, quantization="auto", max_total_tokens=512)
    assert (
        "all 16 quantized matrices kept in their stored blocks (1 Q2_K, 1 Q3_K, 11 Q5_0, 1 Q5_1, 1 Q5_K, 1 Q8_0)"
        in caplog.text
    )
    assert "expanded" not in caplog.text
    layers = blocks.model.layers
    assert (
        layers[0].self_attn.qkv_proj.packed.type_name == "Q5_0+Q5_1"
        and layers[1].self_attn.qkv_proj.packed.type_name == "Q5_0"
    )
    assert layers[0].mlp.down_proj.packed.type_name == "Q5_K" and layers[1].mlp.down_proj.packed.type_name == "Q3_K"
    assert blocks.model.lm_head_packed.type_name == "Q2_K"
    _assert_logits_agree(blocks, make_runner(path, quantization="none", max_total_tokens=512))


def test_matrices_expanded_to_floats_are_named_in_the_log(tmp_path, caplog):
    """A v projection stored as F16 takes its q and k (fused with it) to floats, and a TQ2_0 down
    projection (a type the kernels do not take) is dequantized: the load log names each, and why."""
    from runner_driver import make_runner

    from gguf_utils import write_mixed

    def pick(name: str) -> Q:
        if "layers.0.self_attn.v_proj" in name:
            return Q.F16
        return Q.TQ2_0 if "layers.1.mlp.down_proj" in name else Q.Q5_0

    config, state = _tiny_llama_256()
    path = write_mixed(tmp_path / "expanded.gguf", config, state, pick)
    with caplog.at_level("INFO", logger="langrt.model.gguf_loader"):
        blocks = make_runner(path, quantization="auto", max_total_tokens=512)
    line = next(r.getMessage() for r in caplog.records if "expanded to floats" in r.getMessage())
    assert "3 quantized tensors expanded to floats at load" in line
    assert "blk.0.attn_q.weight (fused with blk.0.attn_v.weight, F16, which is not kept as blocks)" in line
    assert "blk.0.attn_k.weight (fused with blk.0.attn_v.weight, F16" in line
    assert "blk.1.ffn_down.weight (stored as TQ2_0, which langrt's block kernels do not take)" in line
    layers = blocks.model.layers
    assert not layers[0].self_attn.qkv_proj.quantized and not layers[1].mlp.down_proj.quantized
    assert layers[1].self_attn.qkv_proj.quantized and layers[0].mlp.down_proj.quantized


@pytest.mark.slow
def test_smollm_on_its_q4_1_blocks_matches_the_dequantized_model(smollm_path):
    """The built-in file (Q4_1 layers, Q8_0 tied embedding) served as stored: logits within 1e-3
    (relative) of the dequantized model's, and the same first answer token where the top two are
    0.09 logit apart (int8 activations, llama.cpp's choice, flip it)."""
    from runner_driver import RunnerDriver, make_runner
    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(smollm_path)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    drivers = [RunnerDriver(make_runner(smollm_path, quantization=q, max_total_tokens=1024)) for q in ("auto", "none")]
    got, want = (d.prefill([prompt])[0] for d in drivers)
    assert drivers[0].runner.model.layers[5].mlp.gate_up_proj.packed.type_name == "Q4_1"
    assert _rel(got, want) < 1e-3
    assert got[-1].argmax() == want[-1].argmax() == tokenizer.encode("The", add_special_tokens=False)[0]
    for token in (504, 3575, 314):
        assert _rel(*(d.decode([0], [token]) for d in drivers)) < 1e-3


@pytest.mark.skipif(
    not __import__("langrt.cpu_features", fromlist=["x"]).bf16_gemm_packing(), reason="oneDNN has no bfloat16 GEMM here"
)
def test_bf16_passes_choose_blocks_tiles_or_the_dense_copy(tmp_path):
    """In bfloat16 on the packed path the blocks keep a packed copy of their values: a decode
    pass's single row multiplies the blocks; a decoding pass (decodes and their drafts) of 2 to
    VNNI_MAX_ROWS rows of 4-bit blocks does too where the CPU has AVX512-VNNI, else (and up to
    FLY_MAX_ROWS rows, FLY_MAX_ROWS_Q8_0 for Q8_0 blocks) dequantizes tiles where it has
    AVX512-BF16 (dense_linear: the copy's values); other passes (prompts, however short, and
    more rows) use the copy, the dequantized model's own GEMM."""
    from langrt.model import quant as model_quant

    from runner_driver import RunnerDriver, make_runner

    path = _tiny_gguf(tmp_path, "llama", "Q4_1")
    blocks = make_runner(path, "bfloat16", quantization="auto", max_total_tokens=512, cpu_dense_copy=True)
    dense = make_runner(path, "bfloat16", quantization="none", max_total_tokens=512)
    weight = blocks.model.layers[1].mlp.gate_up_proj.packed
    assert weight.dense is not None and blocks.model.lm_head_packed.dense is not None
    x = torch.randn(max(model_quant.FLY_MAX_ROWS, model_quant.VNNI_MAX_ROWS) + 1, weight.in_features).bfloat16()
    on_copy = torch.ops.mkldnn._linear_pointwise(x, weight.dense, None, "none", [], "")
    on_blocks = quant.quant_linear(x, weight.data, weight.ggml_type)
    fly = quant.bf16_rows()
    on_tiles = quant.dense_linear(x[:5], weight.data, weight.ggml_type) if fly else on_copy[:5]
    assert 5 <= model_quant.VNNI_MAX_ROWS < x.shape[0]
    few_rows = on_blocks[:5] if quant.vnni_rows() else on_tiles  # a decoding pass's 5 rows
    head = model_quant.QuantizedWeight.quantize(
        torch.randn(96, 64), model_quant.Q8_0
    )  # like llama.cpp's Q4 files' LM head
    head.add_dense_copy()
    assert model_quant.FLY_MAX_ROWS_Q8_0 < 5
    h = torch.randn(model_quant.FLY_MAX_ROWS_Q8_0 + 1, head.in_features).bfloat16()
    head_copy = torch.ops.mkldnn._linear_pointwise(h, head.dense, None, "none", [], "")
    head_tiles = quant.dense_linear(h[:-1], head.data, head.ggml_type) if fly else head_copy[:-1]
    assert weight.context is blocks.pass_context, "the runner's weights route by its passes"
    for decode, decoding in ((True, True), (False, True), (False, False)):
        # what the runner gives its weights before such a pass; the standalone head, its own
        blocks.pass_context.quant = head.context.quant = model_quant.QuantPass.of(decode, decoding)
        assert torch.equal(weight.matmul(x), on_copy)  # more rows than FLY_MAX_ROWS and VNNI_MAX_ROWS
        assert torch.equal(weight.matmul(x[:5]), few_rows if decoding else on_copy[:5])
        assert torch.equal(weight.matmul(x[:1]), on_blocks[:1] if decoding else on_copy[:1])
        # Q8_0 blocks (the LM head) take tiles only up to FLY_MAX_ROWS_Q8_0 rows
        assert torch.equal(head.matmul(h), head_copy)
        assert torch.equal(head.matmul(h[:-1]), head_tiles if decoding else head_copy[:-1])
    prompts = [[5, 9, 17, 33, 2, 101, 64, 8]]
    got, want = RunnerDriver(blocks).prefill(prompts)[0], RunnerDriver(dense).prefill(prompts)[0]
    assert torch.equal(got, want)  # the same GEMM on the same values


def test_tiles_are_only_for_the_types_dequantized_by_vector_code():
    """dense_linear dequantizes Q2_K / Q3_K / 5-bit tiles with the plain C++ loop (slower than
    the bfloat16 copy), so their passes never take tiles; the other types keep their limits."""
    from langrt.model import quant as model_quant

    step = model_quant.QuantPass(decoding=True, fly_max_rows=model_quant.FLY_MAX_ROWS)
    for qtype in ("Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K"):
        assert step.fly_rows(quant.GGML_TYPES[qtype]) == 0
    assert step.fly_rows(quant.GGML_TYPES["Q6_K"]) == 0  # its GGUF-sized layout: no vector dequantization
    assert step.fly_rows(quant.GGML_TYPES["Q4_K"]) == model_quant.FLY_MAX_ROWS
    assert step.fly_rows(quant.GGML_TYPES["Q8_0"]) == model_quant.FLY_MAX_ROWS_Q8_0


@pytest.mark.parametrize("qtype, kept", [("Q4_K", 148), ("Q6_K", 210)])
def test_q4_k_and_q6_k_rows_keep_about_the_files_bytes(qtype, kept):
    """Q4_K_M's two types are repacked into super-blocks near GGUF's size (Q4_K 148 bytes per 256
    weights where the file has 144, Q6_K 210 as the file), not unpacked into 32-weight blocks
    with float32 scales (192 and 320), so a decode step reads about the file's bytes."""
    raw = random_k_quant_rows(Q[qtype], 3, 512, seed=4)
    weight = QuantizedWeight.from_gguf(torch.from_numpy(raw), int(Q[qtype]), 512)
    assert weight.data.shape == (3, 2 * kept) and raw.shape[1] == 2 * {"Q4_K": 144, "Q6_K": 210}[qtype]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("rows", [1, 7, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tile_linear_matches_the_dequantized_product(qtype, rows, dtype, isa):
    """The prompt GEMM on dequantized panels: the blocks' exact values, so a float32 product is
    within float32 rounding of the reference (tighter than the block kernel's REL), a bfloat16 one
    within its output's rounding; 40 weight rows: two whole panels of 16 and a part."""
    blocks, values = _weights(qtype, 40, 96, seed=11)
    x = torch.randn(rows, values.shape[1]).to(dtype)
    want = torch.nn.functional.linear(x.float(), values)
    got = quant.tile_linear(x, blocks, quant.GGML_TYPES[qtype])
    assert got.dtype == dtype and got.shape == want.shape
    assert _rel(got, want) < (1e-6 if dtype == torch.float32 else REL[dtype])


def test_tile_linear_rows_do_not_depend_on_the_other_rows(isa):
    """Each output is one sum in order over k: a prompt's rows give the same bits whole, in chunks,
    or one at a time (a cached prefix's last token computed again matches)."""
    blocks, values = _weights("Q4_K", 33, 512, seed=2)
    x = torch.randn(13, 512)
    whole = quant.tile_linear(x, blocks, quant.GGML_TYPES["Q4_K"])
    for part in (x[:1], x[5:12], x[12:]):
        start = int((x == part[0]).all(dim=1).nonzero()[0])
        assert torch.equal(
            quant.tile_linear(part, blocks, quant.GGML_TYPES["Q4_K"]), whole[start : start + part.shape[0]]
        )


def test_prompts_of_many_rows_multiply_dequantized_panels():
    """A prompt pass of PROMPT_TILE_MIN_ROWS rows or more (float32, or bfloat16 without a copy):
    the panels' GEMM on the exact values; fewer rows, and decoding passes of any size, the blocks."""
    from langrt.model import quant as model_quant

    blocks, values = _weights("Q4_1", 40, 96, seed=5)
    weight = QuantizedWeight(blocks, quant.GGML_TYPES["Q4_1"], 96)
    x = torch.randn(model_quant.PROMPT_TILE_MIN_ROWS, 96)
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        on_panels = quant.tile_linear(xd, blocks, weight.ggml_type)
        on_blocks = quant.quant_linear(xd, blocks, weight.ggml_type)
        weight.context.quant = model_quant.QuantPass.of(False)
        assert torch.equal(weight.matmul(xd), on_panels)
        assert torch.equal(weight.matmul(xd[:-1]), on_blocks[:-1])
        weight.context.quant = model_quant.QuantPass.of(False, decoding=True)
        assert torch.equal(weight.matmul(xd), on_blocks)
    # a weight no runner has given a pass (QuantPass()): the blocks, however many rows
    fresh = QuantizedWeight(blocks, weight.ggml_type, 96)
    assert torch.equal(fresh.matmul(x), quant.quant_linear(x, blocks, weight.ggml_type))


@pytest.mark.parametrize("dense_copy, budget", [(True, 0), (False, 1 << 40)])
def test_no_dense_copy_unless_asked_for_and_within_the_budget(tmp_path, monkeypatch, dense_copy, budget):
    from langrt.model import loader
    from langrt.model.source import ModelSource

    monkeypatch.setattr(loader, "dense_copy_budget", lambda: budget)
    source = ModelSource.resolve(_tiny_gguf(tmp_path, "qwen2", "Q8_0"))
    model = loader.load_model(
        source, source.model_config(), "gguf", torch.bfloat16, torch.device("cpu"), progress=False, gguf_blocks=True,
        dense_copy=dense_copy,
    )  # fmt: skip
    assert model.layers[0].self_attn.qkv_proj.quantized
    assert model.layers[0].self_attn.qkv_proj.packed.dense is None and model.lm_head_packed.dense is None


@pytest.mark.slow
def test_smollm_on_its_blocks_is_as_near_llama_cpp_as_the_dequantized_model(smollm_path):
    """llama.cpp on the same file (where llama-cpp-python is installed): its logits differ from
    langrt's by ~4% (relative, per position; it rounds activations to int8 and keeps K/V in
    float16), and the blocks leave that distance where the dequantized model has it."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from runner_driver import RunnerDriver, make_runner
    from langrt.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(smollm_path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers in Europe."}], tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)
    llm = llama_cpp.Llama(str(smollm_path), n_threads=1, n_ctx=512, logits_all=True, verbose=False)
    llm.eval(prompt)
    theirs = torch.tensor(np.array(llm.scores[: len(prompt)]))
    distance = {}
    for quantization in ("auto", "none"):
        ours = RunnerDriver(make_runner(smollm_path, quantization=quantization, max_total_tokens=512)).prefill(
            [prompt]
        )[0]
        distance[quantization] = ((ours - theirs).norm(dim=-1) / theirs.norm(dim=-1)).mean().item()
    assert distance["auto"] < 0.06
    assert abs(distance["auto"] - distance["none"]) < 0.005
