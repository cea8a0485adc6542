"""A forward pass through every layer in one C++ call (langrt.model.fused_layers) gives the
per-layer Python loop's bits: for the built-in model on its GGUF blocks and for tiny models with
plain weights (untied; tied with qkv biases) and quantized at load, in bfloat16 and float32, with
each build of the kernels this CPU runs, for prompts, single and batched decodes and passes with
drafts; and only the passes it can take go to it."""

from __future__ import annotations

import pytest
import torch

from langrt_kernels.cpu import unavailable_reason
from langrt.model import fused_layers
from runner_driver import RunnerDriver, make_runner

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"C++ CPU kernels unavailable: {unavailable_reason()}"
)


@pytest.fixture(scope="module")
def tiny_paths(tiny_model_builder, tmp_path_factory):
    """Tiny llama (untied) and qwen2 (tied, qkv biases) with head_dim 32, the rotary kernel's unit."""
    paths = {}
    for kind in ("llama", "qwen2"):
        paths[kind] = tmp_path_factory.mktemp(f"tiny_{kind}_hd32")
        tiny_model_builder(kind, paths[kind], seed=3, num_attention_heads=2, num_key_value_heads=1)
    return paths


@pytest.fixture
def whole_passes(monkeypatch):
    """Counts the passes fused_layers ran (its `run` answering something other than None)."""
    taken = []
    real = fused_layers.run

    def counting(*args):
        out = real(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(fused_layers, "run", counting)
    return taken


def _logits(path, dtype: str, monkeypatch, fused: bool, **kw) -> list[torch.Tensor]:
    """Every pass's logits with fused_layers on or off: prompts of two requests, greedy decodes of
    both (two rows), of one (one row), then a pass with drafts (several rows of one request)."""
    if not fused:
        monkeypatch.setenv(fused_layers.ENV, "0")
    driver = RunnerDriver(make_runner(path, dtype=dtype, max_total_tokens=2048, max_running_requests=4, **kw))
    out = driver.prefill([[5, 9, 17, 33, 2, 101, 64, 8, 70, 3], [44, 12, 7]])
    last = [x[-1] for x in out]
    for step in range(6):
        rows = [0, 1] if step < 3 else [1]
        logits = driver.decode(rows, [int(last[i].argmax()) for i in rows])
        out.append(logits)
        for k, i in enumerate(rows):
            last[i] = logits[k]
    out += driver.extend([0], [[int(last[0].argmax()), 11, 12, 13]])  # a token and three drafts
    monkeypatch.delenv(fused_layers.ENV, raising=False)
    return out


@pytest.mark.usefixtures("cpu_isa")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_q4_k_m_file_with_mixed_type_matrices_gives_the_loops_bits(tmp_path, dtype, monkeypatch, whole_passes):
    """Q4_K_M keeps layer 0's v projection in Q6_K beside Q4_K q and k: that qkv matrix is two
    parts (StackedQuantizedWeight), multiplied part by part in the fused pass too."""
    import sys

    from gguf_utils import write_q4_k_m_like

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "unit"))
    import test_gguf

    config, state = test_gguf.tiny_llama(hidden_size=256, intermediate_size=512)
    path = write_q4_k_m_like(tmp_path / "tiny-q4_k_m.gguf", config, state)
    fused = _logits(path, dtype, monkeypatch, fused=True)
    assert whole_passes == [True] * 8
    loop = _logits(path, dtype, monkeypatch, fused=False)
    assert all(torch.equal(a, b) for a, b in zip(fused, loop))


@pytest.mark.usefixtures("cpu_isa")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "model, quantization", [("llama", "auto"), ("qwen2", "auto"), ("llama", "int4"), ("qwen2", "int8")]
)
def test_tiny_models_give_the_per_layer_loops_bits(tiny_paths, model, quantization, dtype, monkeypatch, whole_passes):
    path = tiny_paths[model]
    got = _logits(path, dtype, monkeypatch, True, quantization=quantization)
    assert whole_passes == [True] * 8  # the prompts, six decodes, the drafts
    want = _logits(path, dtype, monkeypatch, False, quantization=quantization)
    assert whole_passes == [True] * 8 + [False] * 8
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_builtin_model_on_its_blocks_gives_the_per_layer_loops_bits(smollm_path, dtype, monkeypatch, whole_passes):
    got = _logits(smollm_path, dtype, monkeypatch, True)
    want = _logits(smollm_path, dtype, monkeypatch, False)
    assert whole_passes == [True] * 8 + [False] * 8
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.usefixtures("cpu_isa")
def test_a_long_float32_prompt_on_blocks_gives_the_loops_bits(tiny_paths, monkeypatch, whole_passes):
    """A float32 prompt of PROMPT_TILE_MIN_ROWS rows or more multiplies dequantized panels of the
    weights (and fewer rows, decodes and drafts the blocks): the fused pass does as the loop does."""
    from langrt_kernels.cpu import quant as quant_kernels
    from langrt.model import quant

    calls = []
    real = quant_kernels.tile_linear
    monkeypatch.setattr(quant_kernels, "tile_linear", lambda *a: calls.append(a[2]) or real(*a))

    def run(fused: bool) -> list[torch.Tensor]:
        if not fused:
            monkeypatch.setenv(fused_layers.ENV, "0")
        driver = RunnerDriver(
            make_runner(tiny_paths["llama"], max_total_tokens=2048, max_running_requests=4, quantization="int4")
        )
        out = driver.prefill([[(7 * i) % 100 + 3 for i in range(quant.PROMPT_TILE_MIN_ROWS + 6)], [5, 9, 17]])
        out.append(driver.decode([0, 1], [4, 8]))
        out += driver.extend([0], [[6, 11, 12]])
        monkeypatch.delenv(fused_layers.ENV, raising=False)
        return out

    loop = run(fused=False)
    assert calls  # the loop's long prompt took the dequantized panels
    fused = run(fused=True)
    assert whole_passes[-3:] == [True] * 3
    assert all(torch.equal(a, b) for a, b in zip(fused, loop))


def test_a_prompt_longer_than_the_kernel_takes_keeps_the_loop(tiny_paths, monkeypatch, whole_passes):
    from langrt.model.attention import cpu_backend

    monkeypatch.setattr(
        cpu_backend, "KERNEL_MAX_EXTEND", dict.fromkeys(cpu_backend.KERNEL_MAX_EXTEND, 8)
    )  # longer: SDPA
    driver = RunnerDriver(make_runner(tiny_paths["llama"], max_total_tokens=2048, max_running_requests=4))
    driver.prefill([list(range(20, 40))])
    driver.decode([0], [4])
    assert whole_passes == [False, True]


def test_a_compiled_model_keeps_its_graphs(tiny_paths):
    runner = make_runner(tiny_paths["llama"], max_total_tokens=2048, max_running_requests=4, enable_torch_compile=True)
    assert fused_layers.layer_tensors(runner.model) is not None  # the model itself would qualify
    driver = RunnerDriver(runner)
    driver.prefill([[5, 9, 17]])
    driver.decode([0], [4])
    assert runner.model._layer_tensors is None  # but compiled layers are not replaced
