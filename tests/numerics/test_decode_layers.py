"""A one-row decode pass through every layer in one C++ call (langrt.model.decode_layers) gives
the per-layer Python loop's bits: for the built-in model on its GGUF blocks and for tiny models with
plain weights (untied; tied with qkv biases) and quantized at load, in bfloat16 and float32, with
each build of the kernels this CPU runs; and only the passes it can take go to it."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import unavailable_reason
from langrt.model import decode_layers
from runner_driver import RunnerDriver, make_runner

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"C++ CPU kernels unavailable: {unavailable_reason()}")


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
    """Counts the passes decode_layers ran (its `run` answering something other than None)."""
    taken = []
    real = decode_layers.run

    def counting(*args):
        out = real(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(decode_layers, "run", counting)
    return taken


def _decode_logits(path, dtype: str, steps: int, monkeypatch, whole: bool, **kw) -> torch.Tensor:
    """Greedy decode of one request after a short prompt, with decode_layers on or off: the logits
    of every step, [steps, V]."""
    if not whole:
        monkeypatch.setenv(decode_layers.ENV, "0")
    driver = RunnerDriver(make_runner(path, dtype=dtype, max_total_tokens=2048, max_running_requests=4, **kw))
    last = driver.prefill([[5, 9, 17, 33, 2, 101, 64, 8, 70, 3]])[0][-1]
    logits = []
    for _ in range(steps):
        last = driver.decode([0], [int(last.argmax())])[0]
        logits.append(last)
    monkeypatch.delenv(decode_layers.ENV, raising=False)
    return torch.stack(logits)


@pytest.mark.usefixtures("cpu_isa")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model, quantization", [("llama", "auto"), ("qwen2", "auto"), ("llama", "int4"), ("qwen2", "int8")])
def test_tiny_models_give_the_per_layer_loops_bits(tiny_paths, model, quantization, dtype, monkeypatch, whole_passes):
    path = tiny_paths[model]
    got = _decode_logits(path, dtype, 6, monkeypatch, True, quantization=quantization)
    assert sum(whole_passes) == 6  # every decode step, not the prompt
    want = _decode_logits(path, dtype, 6, monkeypatch, False, quantization=quantization)
    assert sum(whole_passes) == 6
    assert torch.equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_builtin_model_on_its_blocks_gives_the_per_layer_loops_bits(smollm_path, dtype, monkeypatch, whole_passes):
    got = _decode_logits(smollm_path, dtype, 16, monkeypatch, True)
    want = _decode_logits(smollm_path, dtype, 16, monkeypatch, False)
    assert sum(whole_passes) == 16
    assert torch.equal(got, want)


def test_only_one_row_decode_passes_take_it(tiny_paths, whole_passes):
    driver = RunnerDriver(make_runner(tiny_paths["llama"], max_total_tokens=2048, max_running_requests=4))
    driver.prefill([[5, 9, 17], [33, 2]])
    assert whole_passes == [False]  # a prompt pass
    driver.decode([0, 1], [4, 6])
    assert whole_passes == [False, False]  # two rows: the per-layer loop batches them
    driver.decode([1], [7])
    assert whole_passes == [False, False, True]


def test_a_compiled_model_keeps_its_graphs(tiny_paths):
    runner = make_runner(tiny_paths["llama"], max_total_tokens=2048, max_running_requests=4, enable_torch_compile=True)
    assert decode_layers.layer_tensors(runner.model) is not None  # the model itself would qualify
    driver = RunnerDriver(runner)
    driver.prefill([[5, 9, 17]])
    driver.decode([0], [4])
    assert runner.model._layer_tensors is None  # but compiled layers are not replaced
