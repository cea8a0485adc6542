"""--quantization int8 / int4 on plain (safetensors) weights: quantized at load into GGUF's Q8_0 /
Q4_1 blocks (by gguf-py's quantizer, llama.cpp's rounding) and served by the same kernels as GGUF
files.

The served values are checked against gguf-py's blocks; a quantized model's logits against the
same model with its weights replaced by the blocks' values (what is left is the kernels' own
error: within 5e-4 relative through a tiny model in float32, as for GGUF files in
test_quant_linear.py); the built-in model, saved as safetensors and quantized at load, still
answers "Paris"; and what cannot be served is refused with a reason.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from langrt_kernels.cpu import quant
from langrt.errors import ModelLoadError
from langrt.model.layers import Linear
from langrt.model.quant import PLAIN_QUANTIZATIONS, Q4_1, Q8_0, QuantizedWeight
from langrt.server_args import ServerArgs
from runner_driver import RunnerDriver, make_runner

MODEL_REL = 5e-4
needs_kernels = pytest.mark.skipif(
    not quant.available(), reason="the quantized CPU kernels are off (LANGRT_CPU_KERNELS=0)"
)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _weights(seed: int, shape=(48, 256)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen) * torch.rand(shape[0], 1, generator=gen)  # rows of different scales
    w[3, 32:64] = 0.0  # an all-zero block: scale 0, no division by it
    w[5, :32] = 0.25  # a constant block: max == min for Q4_1
    return w


@needs_kernels
@pytest.mark.parametrize("ggml_type", [Q8_0, Q4_1], ids=["Q8_0", "Q4_1"])
@pytest.mark.parametrize("seed", [0, 1])
def test_quantized_weights_hold_gguf_pys_values(ggml_type, seed):
    """What QuantizedWeight.quantize serves (quantized in chunks of 4,096 rows, then repacked) is
    exactly the values of gguf-py's blocks for the whole matrix."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = torch.cat([_weights(seed), _weights(seed + 10, (4100, 256))])  # past one chunk
    got = QuantizedWeight.quantize(w, ggml_type).dequantize(torch.float32).numpy()
    qtype = GGMLQuantizationType(ggml_type)
    want = dequantize(quantize(w.numpy(), qtype), qtype).reshape(w.shape)
    assert np.array_equal(got, want)


@needs_kernels
@pytest.mark.parametrize("ggml_type, bound", [(Q8_0, 1 / 254), (Q4_1, 1 / 30)], ids=["Q8_0", "Q4_1"])
def test_quantized_values_are_within_half_a_step(ggml_type, bound):
    """Each value moves by at most half its block's step (max|w| / 127 for Q8_0, (max - min) / 15
    for Q4_1), plus the fp16 rounding of the stored scale and minimum."""
    w = _weights(2)
    values = QuantizedWeight.quantize(w, ggml_type).dequantize(torch.float32)
    blocks = w.view(w.shape[0], -1, 32)
    spread = blocks.abs().amax(-1) * 2 if ggml_type == Q8_0 else blocks.amax(-1) - blocks.amin(-1)
    error = (values - w).view_as(blocks).abs().amax(-1)
    assert (error <= spread * bound * 1.01 + blocks.abs().amax(-1) * 2**-10 + 1e-7).all()
    assert torch.equal(values[3, 32:64], torch.zeros(32))


def _dequantized_reference(runner, quantization: str) -> None:
    """Give the runner's plain model what --quantization would serve: the layers' and the LM
    head's values after a round trip through the blocks (a tied embedding keeps its own)."""
    layer_type, head_type = PLAIN_QUANTIZATIONS[quantization]
    model = runner.model
    for module in model.layers.modules():
        if isinstance(module, Linear):
            module.weight.data.copy_(QuantizedWeight.quantize(module.weight, layer_type).dequantize(torch.float32))
    head = QuantizedWeight.quantize(model.lm_head_weight, head_type).dequantize(torch.float32)
    model.compute_logits = lambda hidden: torch.nn.functional.linear(hidden, head).float()


@needs_kernels
@pytest.mark.parametrize("quantization", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # untied; tied with biases
def test_quantized_model_gives_the_dequantized_models_logits(tiny_llama_dir, tiny_qwen2_dir, kind, quantization):
    path = tiny_llama_dir if kind == "llama" else tiny_qwen2_dir
    runner = make_runner(path, quantization=quantization, max_total_tokens=2048, max_running_requests=8)
    quantized = [m.packed.type_name for m in runner.model.modules() if isinstance(m, Linear) and m.quantized]
    layer_type = "Q8_0" if quantization == "int8" else "Q4_1"
    assert quantized[:8] == [layer_type] * 8  # qkv, o, gate_up, down in both layers
    assert isinstance(runner.model.lm_head_packed, QuantizedWeight) and runner.model.lm_head_packed.type_name == "Q8_0"
    assert runner.model.embed_tokens.weight.shape == (49152, 64)  # looked up, not multiplied: stays plain
    reference = make_runner(path, quantization="none", max_total_tokens=2048, max_running_requests=8)
    _dequantized_reference(reference, quantization)
    ours, ref = RunnerDriver(runner), RunnerDriver(reference)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(17, 49152, (n,), generator=gen).tolist() for n in (5, 17)]
    for a, b in zip(ours.prefill(prompts), ref.prefill(prompts)):
        assert _rel(a, b) < MODEL_REL
    tokens = [int(x[-1].argmax()) for x in ref.prefill(prompts)]
    ours.prefill(prompts)
    for _ in range(4):
        a, b = ours.decode([2, 3], tokens), ref.decode([2, 3], tokens)
        assert _rel(a, b) < MODEL_REL
        tokens = [int(t) for t in b.argmax(-1)]


@pytest.fixture(scope="module")
def smollm_safetensors(smollm_path, tmp_path_factory):
    """The built-in model as an HF directory of plain float32 weights (its blocks' values)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    path = tmp_path_factory.mktemp("smollm_safetensors")
    loaded = AutoModelForCausalLM.from_pretrained(smollm_path.parent, gguf_file=smollm_path.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the values are plain now; transformers saves no model marked GGUF
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(smollm_path.parent, gguf_file=smollm_path.name).save_pretrained(path)
    return path


@pytest.mark.slow
@needs_kernels
@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_smollm_quantized_at_load_answers_paris(smollm_safetensors, new_engine, quantization, capfd):
    engine = new_engine(
        smollm_safetensors, quantization=quantization, dtype="float32", max_total_tokens=4096, log_level="info"
    )
    log = capfd.readouterr().err
    assert f"weights: quantized at load (--quantization {quantization})" in log and "matrices served as" in log, log[
        -2000:
    ]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = engine.generate(engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                          {"max_new_tokens": 12, "temperature": 0})  # fmt: skip
    assert "Paris" in out["text"], out["text"]


def test_what_cannot_be_served_is_refused_with_a_reason(smollm_path):
    with pytest.raises(ValueError, match="CPUs have no fp8 arithmetic"):
        ServerArgs(quantization="fp8")
    with pytest.raises(ValueError, match="float32 or bfloat16 activations"):
        ServerArgs(quantization="int8", device="cpu", dtype="float16").resolve()
    with pytest.raises(ValueError, match="compiled layers take plain weights"):
        ServerArgs(quantization="int4", enable_torch_compile=True)
    with pytest.raises(ModelLoadError, match="already quantized"):
        make_runner(smollm_path, quantization="int8")


def test_without_the_kernels_int8_and_int4_are_refused_naming_them(tiny_llama_dir, monkeypatch):
    """Where the kernels are off (LANGRT_CPU_KERNELS=0, or no compiler), --quantization int8 /
    int4 cannot be served: the load stops with the reason, not a crash later."""
    from langrt.model.quant_choice import plain_quantization
    from langrt.model.source import ModelSource

    monkeypatch.setenv("LANGRT_CPU_KERNELS", "0")
    quant.reset()
    try:
        for quantization in ("int8", "int4"):
            with pytest.raises(ModelLoadError, match="needs langrt's quantized CPU kernels, which are off here"):
                plain_quantization(ServerArgs(quantization=quantization), ModelSource.resolve(tiny_llama_dir))
    finally:
        quant.reset()  # availability is found again under the run's own setting, restored after the test
