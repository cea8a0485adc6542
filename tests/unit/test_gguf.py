"""GGUFFile: header parsing, dequantization, llama.cpp's q/k permutation, configs, errors."""

from __future__ import annotations

import math
import os

import gguf
import numpy as np
import pytest
import transformers
import torch

from gguf_utils import Q, llamacpp_permute, tokenizer_fields, write_gguf
from langrt.builtin import builtin_model_path
from langrt.errors import ModelLoadError
from langrt.model.gguf_loader import GGUFFile
from langrt.tokenizer.loader import load_tokenizer


def _randomize(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter random (HF initialises norms to 1 and biases to 0, which would hide a
    wrongly permuted bias or a swapped norm)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return model.state_dict()


def tiny_llama(seed: int = 0, **overrides):
    settings = dict(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=50000.0,
        tie_word_embeddings=False,
    )
    config = transformers.LlamaConfig(**{**settings, **overrides})
    return config, _randomize(transformers.LlamaForCausalLM(config), seed)


def tiny_qwen2(seed: int = 1):
    config = transformers.Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    return config, _randomize(transformers.Qwen2ForCausalLM(config), seed)


def _rope_theta(config) -> float:
    return config.rope_parameters["rope_theta"]


def assert_config_matches(hf_config: dict, config, model_type: str) -> None:
    assert hf_config["model_type"] == model_type
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "tie_word_embeddings",
    ):
        assert hf_config[key] == getattr(config, key), key
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert hf_config["head_dim"] == head_dim
    assert hf_config["rms_norm_eps"] == pytest.approx(config.rms_norm_eps, rel=1e-6)
    assert hf_config["rope_theta"] == pytest.approx(_rope_theta(config), rel=1e-6)
    assert hf_config["rope_scaling"] is None
    # What the config dict is for: building the HF config class from it.
    rebuilt = transformers.AutoConfig.for_model(**hf_config)
    assert rebuilt.num_key_value_heads == config.num_key_value_heads
    assert rebuilt.rope_parameters["rope_theta"] == pytest.approx(_rope_theta(config), rel=1e-6)


def test_tiny_llama_reads_back_exactly(tmp_path):
    config, state = tiny_llama()
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    loaded = GGUFFile(path)
    weights = dict(loaded.iter_weights(torch.float32))
    assert list(weights) != [] and set(weights) == set(state)
    for name, tensor in state.items():
        assert weights[name].shape == tensor.shape, name
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], tensor), name
    assert_config_matches(loaded.hf_config, config, "llama")
    assert loaded.hf_config["architectures"] == ["LlamaForCausalLM"]
    assert loaded.hf_config["attention_bias"] is False
    assert loaded.hf_config["torch_dtype"] == "float32"
    assert loaded.num_tensors == len(state)


def test_headers_are_parsed_once_inside_cached_headers(tmp_path, monkeypatch):
    """A process's start-up reads one file's header for the config, the tokenizer and the weights:
    inside cached_headers() it is parsed once (a rewritten file again), outside every time."""
    from langrt.model import gguf_reader

    config, state = tiny_llama()
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    parses = []
    parse = gguf_reader.GGUFHeaderParser.header
    monkeypatch.setattr(gguf_reader.GGUFHeaderParser, "header", lambda self: parses.append(1) or parse(self))
    with gguf_reader.cached_headers():
        first, second = GGUFFile(path), GGUFFile(path)
        assert len(parses) == 1 and first.metadata is second.metadata
        weights = dict(second.iter_weights(torch.float32))  # each file its own mapping, still readable
        assert all(torch.equal(weights[name], tensor) for name, tensor in state.items())
        write_gguf(path, tiny_llama(seed=1)[1], config)  # a new file: size or time differ
        os.utime(path, ns=(0, 12345))
        assert GGUFFile(path).metadata is not first.metadata and len(parses) == 2
    GGUFFile(path), GGUFFile(path)
    assert len(parses) == 4


def test_llama_q_k_are_stored_permuted_and_loaded_unpermuted(tmp_path):
    """Guards the test above: the file really holds llama.cpp's row order, unlike HF's."""
    config, state = tiny_llama()
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    raw = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
    q = state["model.layers.0.self_attn.q_proj.weight"].numpy()
    k = state["model.layers.0.self_attn.k_proj.weight"].numpy()
    assert not np.array_equal(raw["blk.0.attn_q.weight"], q)
    assert np.array_equal(raw["blk.0.attn_q.weight"], llamacpp_permute(q, config.num_attention_heads))
    assert np.array_equal(raw["blk.0.attn_k.weight"], llamacpp_permute(k, config.num_key_value_heads))
    weights = dict(GGUFFile(path).iter_weights(torch.float32))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(weights[name], state[name])


def test_llama_with_explicit_head_dim_and_bias(tmp_path):
    config, state = tiny_llama(head_dim=32, attention_bias=True)
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    loaded = GGUFFile(path)
    weights = dict(loaded.iter_weights(torch.float32))
    assert set(weights) == set(state)
    assert "model.layers.1.self_attn.k_proj.bias" in weights
    for name, tensor in state.items():
        assert torch.equal(weights[name], tensor), name
    assert loaded.hf_config["head_dim"] == 32
    assert loaded.hf_config["attention_bias"] is True


def test_tiny_qwen2_with_bias_and_tied_embeddings(tmp_path):
    config, state = tiny_qwen2()
    path = write_gguf(tmp_path / "qwen2.gguf", state, config)
    loaded = GGUFFile(path)
    weights = dict(loaded.iter_weights(torch.float32))
    # A tied model's file has no output.weight, so no lm_head.weight comes back.
    assert set(weights) == set(state) - {"lm_head.weight"}
    for name, tensor in weights.items():
        assert torch.equal(tensor, state[name]), name
    hf_config = loaded.hf_config
    assert_config_matches(hf_config, config, "qwen2")
    assert hf_config["architectures"] == ["Qwen2ForCausalLM"]
    assert hf_config["tie_word_embeddings"] is True
    assert hf_config["attention_bias"] is True


def test_mistral_is_recognised_by_name(tmp_path):
    config = transformers.MistralConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
    )  # fmt: skip
    state = _randomize(transformers.MistralForCausalLM(config), seed=2)
    path = write_gguf(tmp_path / "mistral.gguf", state, config, name="Mistral 7B Instruct v0.3")
    loaded = GGUFFile(path)
    assert loaded.hf_config["model_type"] == "mistral"
    assert loaded.hf_config["architectures"] == ["MistralForCausalLM"]
    weights = dict(loaded.iter_weights(torch.float32))
    assert all(torch.equal(weights[name], state[name]) for name in state)


def _block_bound(original: np.ndarray, qtype: Q) -> np.ndarray:
    """Largest error each element may have after `qtype` (per 32-element block), with room for
    the fp16 rounding of the block's scale and minimum."""
    blocks = original.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    if qtype == Q.Q8_0:
        bound = 0.6 * amax / 127
    elif qtype == Q.Q4_0:
        bound = 1.05 * amax / 8
    else:  # Q4_1: scale (max - min) / 15, offset min
        lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
        bound = 0.55 * (hi - lo) / 15 + np.abs(lo) * 2e-3
    return np.broadcast_to(bound, blocks.shape).reshape(original.shape)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_dequantization_round_trips(tmp_path, qtype):
    config, state = tiny_llama(seed=3)
    path = write_gguf(tmp_path / f"{qtype.name}.gguf", state, config, qtype)
    loaded = GGUFFile(path)
    weights = dict(loaded.iter_weights(torch.float32))
    assert set(weights) == set(state)
    for name, tensor in state.items():
        original = tensor.numpy()
        got = weights[name].numpy()
        assert got.shape == original.shape and got.dtype == np.float32
        if original.ndim == 1 or qtype == Q.F32:  # vectors are always stored F32
            assert np.array_equal(got, original), name
        elif qtype == Q.F16:
            assert np.array_equal(got, original.astype(np.float16).astype(np.float32)), name
        elif qtype == Q.BF16:
            assert np.array_equal(got, tensor.to(torch.bfloat16).float().numpy()), name
        else:
            error = np.abs(got - original)
            assert (error <= _block_bound(original, qtype)).all(), (name, float(error.max()))
            # and bit-exact with gguf's own quantize/dequantize pair
            expected = gguf.quants.dequantize(gguf.quants.quantize(original, qtype), qtype)
            assert np.array_equal(got, expected), name
    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1):
        # The error is real (the check above is not vacuous) and small relative to the values.
        q = state["model.layers.0.self_attn.q_proj.weight"].numpy()
        error = np.abs(weights["model.layers.0.self_attn.q_proj.weight"].numpy() - q)
        assert 0 < error.mean() < 0.2 * np.abs(q).mean()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weights_come_in_the_requested_dtype(tmp_path, dtype):
    config, state = tiny_llama(seed=4)
    path = write_gguf(tmp_path / "q8.gguf", state, config, Q.Q8_0)
    as_fp32 = dict(GGUFFile(path).iter_weights(torch.float32))
    for name, tensor in GGUFFile(path).iter_weights(dtype):
        assert tensor.dtype == dtype
        assert torch.equal(tensor, as_fp32[name].to(dtype)), name


def test_weights_own_their_memory(tmp_path):
    config, state = tiny_llama(seed=5)
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    first = dict(GGUFFile(path).iter_weights(torch.float32))
    first["model.norm.weight"].zero_()
    second = dict(GGUFFile(path).iter_weights(torch.float32))
    assert torch.equal(second["model.norm.weight"], state["model.norm.weight"])


def _llamacpp_rope_factors(base, dim, factor, low, high, original) -> np.ndarray:
    """convert_hf_to_gguf.py's rope_freqs for a llama3-scaled model."""
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            factors.append(1.0)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


@pytest.mark.parametrize(("factor", "low", "high"), [(8.0, 1.0, 4.0), (32.0, 1.0, 4.0), (16.0, 2.0, 8.0)])
def test_llama3_rope_scaling_is_recovered_from_rope_freqs(tmp_path, factor, low, high):
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=256, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=131072, rope_theta=500000.0,
    )  # fmt: skip
    state = transformers.LlamaForCausalLM(config).state_dict()
    factors = _llamacpp_rope_factors(500000.0, 128, factor, low, high, 8192)
    path = write_gguf(tmp_path / "llama3.gguf", state, config, extra_tensors={"rope_freqs.weight": factors})
    loaded = GGUFFile(path)
    assert loaded.hf_config["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": 8192,
    }
    weights = dict(loaded.iter_weights(torch.float32))
    assert set(weights) == set(state) and loaded.num_tensors == len(weights)
    # The recovered settings give transformers' llama3 frequencies = llama.cpp's base / factors.
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rebuilt = transformers.AutoConfig.for_model(**loaded.hf_config)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](rebuilt, "cpu")
    base_inv_freq = 1.0 / (500000.0 ** (np.arange(0, 128, 2) / 128))
    np.testing.assert_allclose(inv_freq.numpy(), base_inv_freq / factors, rtol=1e-5)


def test_linear_rope_scaling_from_metadata(tmp_path):
    config, state = tiny_llama()
    path = write_gguf(
        tmp_path / "linear.gguf", state, config,
        metadata={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
    )  # fmt: skip
    assert GGUFFile(path).hf_config["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}


# --- the built-in model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2() -> GGUFFile:
    return GGUFFile(builtin_model_path())


def test_smollm2_config(smollm2):
    config = smollm2.hf_config
    expected = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert {key: config[key] for key in expected} == expected
    assert smollm2.num_tensors == 272
    assert "<|im_start|>" in smollm2.chat_template


def test_smollm2_header_matches_gguf_reader(smollm2):
    reader = gguf.GGUFReader(smollm2.path)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        expected = field.contents()
        if isinstance(expected, float):
            assert smollm2.metadata[key] == pytest.approx(expected, rel=1e-7), key
        else:
            assert smollm2.metadata[key] == expected, key
    assert set(smollm2.metadata) == {k for k in reader.fields if not k.startswith("GGUF.")}
    assert [t.name for t in reader.tensors] == list(smollm2.tensors)
    for tensor in reader.tensors:
        info = smollm2.tensors[tensor.name]
        assert info.shape == tuple(reversed(tensor.shape.tolist()))
        assert info.ggml_type == tensor.tensor_type
        assert info.offset == tensor.data_offset and info.nbytes == tensor.n_bytes


def test_smollm2_weights_load(smollm2):
    weights = dict(smollm2.iter_weights(torch.bfloat16))
    assert len(weights) == 272 and "lm_head.weight" not in weights
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert weights["model.layers.29.mlp.down_proj.weight"].shape == (576, 1536)
    assert all(t.dtype == torch.bfloat16 for t in weights.values())


@pytest.mark.slow
def test_smollm2_weights_equal_transformers(smollm2):
    path = smollm2.path
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    reference = model.state_dict()
    ours = dict(smollm2.iter_weights(torch.float32))
    assert set(reference) - set(ours) == {"lm_head.weight"}  # tied: transformers lists it too
    assert set(ours) <= set(reference)
    for name, tensor in ours.items():
        assert tensor.shape == reference[name].shape, name
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6, msg=name)


# --- errors --------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        GGUFFile(tmp_path / "absent.gguf")


@pytest.mark.parametrize("content", [b"", b"GGML" + bytes(60), b"GGUF" + bytes(3)], ids=["empty", "magic", "short"])
def test_not_a_gguf_file(tmp_path, content):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        GGUFFile(path)


def test_truncated_file(tmp_path):
    config, state = tiny_llama()
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    data = path.read_bytes()
    for cut in (len(data) // 2, 200):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match="truncated|not a valid GGUF"):
            GGUFFile(path)


def test_unsupported_architecture(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")  # an encoder: no native module
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ModelLoadError, match=r"'bert' is not supported; langrt loads GGUF files of \[.*'gemma3'.*'qwen3'"
    ):
        GGUFFile(tmp_path / "bert.gguf")


def test_type_without_dequantizer_is_refused_by_name(tmp_path):
    config, state = tiny_llama()
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    # Rewrite with one tensor in Q8_1, a type gguf.quants cannot dequantize.
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "q8_1.gguf"), "llama")
    for key, field in reader.fields.items():
        if key.startswith("llama."):
            value = field.contents()
            writer.add_uint32(key, value) if isinstance(value, int) else writer.add_float32(key, value)
    block, type_size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    for tensor in reader.tensors:
        if tensor.name == "blk.1.ffn_up.weight":
            rows, cols = tensor.data.shape
            writer.add_tensor(tensor.name, np.zeros((rows, cols // block * type_size), np.uint8), raw_dtype=Q.Q8_1)
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = GGUFFile(tmp_path / "q8_1.gguf")
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_up\.weight is stored as Q8_1"):
        dict(loaded.iter_weights(torch.float32))


def test_unknown_tensor_is_refused_by_name(tmp_path):
    config, state = tiny_llama()
    path = write_gguf(tmp_path / "extra.gguf", state, config, extra_tensors={"blk.0.attn_q_norm.weight": np.ones(16)})
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_q_norm\.weight"):
        dict(GGUFFile(path).iter_weights(torch.float32))


def test_file_written_with_tokenizer_fields_gives_a_tokenizer(tmp_path, smollm2):
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    state = transformers.LlamaForCausalLM(config).state_dict()
    fields = tokenizer_fields(smollm2.metadata)
    path = write_gguf(tmp_path / "vocab.gguf", state, config, Q.Q8_0, tokenizer_metadata=fields)
    loaded = GGUFFile(path)
    assert loaded.chat_template == smollm2.chat_template
    tokenizer = load_tokenizer(path)
    assert tokenizer.encode("<|im_start|>user\nHello world<|im_end|>") == [1, 4093, 198, 19556, 905, 2]


def test_metadata_that_contradicts_the_tensors(tmp_path):
    config, state = tiny_llama()
    config.intermediate_size = 100  # the tensors are 96 wide
    path = write_gguf(tmp_path / "llama.gguf", state, config)
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_gate\.weight has shape \[96, 64\].* is \[100, 64\]"):
        dict(GGUFFile(path).iter_weights(torch.float32))


def test_corrupted_headers_fail_cleanly(tmp_path):
    """Random byte changes in the header either still load or raise ModelLoadError, nothing else."""
    import random

    config, state = tiny_llama()
    original = write_gguf(tmp_path / "llama.gguf", state, config, Q.Q8_0).read_bytes()
    header_end = min(info.offset for info in GGUFFile(tmp_path / "llama.gguf").tensors.values())
    rng, path, failures = random.Random(0), tmp_path / "mutated.gguf", 0
    for _ in range(300):
        data = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(header_end)] = rng.randrange(256)
        path.write_bytes(data)
        try:
            loaded = GGUFFile(path)
            dict(loaded.iter_weights(torch.float32))
        except ModelLoadError:
            failures += 1
    assert failures > 100  # most mutations break something, and each said so as a ModelLoadError
