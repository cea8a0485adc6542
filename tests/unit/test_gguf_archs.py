"""GGUF files of Gemma 3, Qwen3, Phi-3 and the mixture-of-experts models (Mixtral, Qwen2-MoE,
Qwen3-MoE, OLMoE), written as llama.cpp's converter writes them (tensor names
from gguf-py's own table, Gemma's norms as 1 + w), load into transformers' config and weights,
and langrt serves them with transformers' logits."""

from __future__ import annotations

import pytest
import torch
import transformers

from gguf_utils import tokenizer_fields, write_converted_gguf
from langrt.builtin import builtin_model_path
from langrt.model.gguf_loader import GGUFFile
from langrt.model.gguf_reader import read_header
from langrt.tokenizer.loader import load_tokenizer
from tiny_arch import TINY_DIMS, langrt_pieces, max_logit_error

TOLERANCE = 1e-4  # float32 logits, as in tests/numerics/test_architectures.py


def _tiny(config_cls, model_cls, **overrides):
    """A tiny model with every parameter random (norms around 1, so Gemma's 1 + w is around 2)."""
    config = config_cls(**{**TINY_DIMS, **overrides})
    torch.manual_seed(0)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(param))
    return config, model


def tiny_gemma3():
    # 7 layers: the 6th is the first global one; a window shorter than the test prompts.
    return _tiny(
        transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
        num_hidden_layers=7, num_key_value_heads=1, head_dim=32, sliding_window=8, query_pre_attn_scalar=32,
    )  # fmt: skip


def tiny_qwen3():
    return _tiny(transformers.Qwen3Config, transformers.Qwen3ForCausalLM, head_dim=32, tie_word_embeddings=False)


def tiny_phi3():
    # Half of each head rotated (Phi-4-mini rotates 3/4), a window shorter than the prompts.
    return _tiny(transformers.Phi3Config, transformers.Phi3ForCausalLM, partial_rotary_factor=0.5, sliding_window=16)


def tiny_phi3_longrope():
    """LongRoPE factors (GGUF: rope_factors_long / _short tensors). Prompts stay under the
    original context, where both sides rotate by the short factors (transformers picks the
    factors per sequence, langrt per position: they differ past it, see test_architectures)."""
    half = TINY_DIMS["hidden_size"] // TINY_DIMS["num_attention_heads"] // 4  # rotated width / 2
    gen = torch.Generator().manual_seed(7)
    rope = {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "original_max_position_embeddings": 1024,
        "short_factor": (1 + torch.rand(half, generator=gen)).tolist(), "long_factor": (1 + 3 * torch.rand(half, generator=gen)).tolist(),
    }  # fmt: skip
    return _tiny(
        transformers.Phi3Config, transformers.Phi3ForCausalLM, partial_rotary_factor=0.5, rope_parameters=rope,
        original_max_position_embeddings=1024,
    )  # fmt: skip


EXPERTS = dict(num_experts_per_tok=2)


def tiny_mixtral():
    return _tiny(transformers.MixtralConfig, transformers.MixtralForCausalLM, num_local_experts=4, **EXPERTS)


def tiny_qwen2_moe():
    return _tiny(
        transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM, num_experts=4, moe_intermediate_size=64,
        shared_expert_intermediate_size=96, **EXPERTS,
    )  # fmt: skip


def tiny_qwen3_moe():
    return _tiny(
        transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, num_experts=4, moe_intermediate_size=64,
        norm_topk_prob=True, head_dim=32, **EXPERTS,
    )  # fmt: skip


def tiny_olmoe():
    return _tiny(transformers.OlmoeConfig, transformers.OlmoeForCausalLM, num_experts=4, **EXPERTS)


MOE = [tiny_mixtral, tiny_qwen2_moe, tiny_qwen3_moe, tiny_olmoe]


def per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' stacked experts as the per-expert matrices save_pretrained writes."""
    out = {}
    for name, tensor in state.items():
        prefix = name.rsplit(".", 1)[0]
        if name.endswith(".mlp.experts.gate_up_proj"):
            half = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"{prefix}.{e}.gate_proj.weight"], out[f"{prefix}.{e}.up_proj.weight"] = (
                    tensor[e, :half],
                    tensor[e, half:],
                )
        elif name.endswith(".mlp.experts.down_proj"):
            out |= {f"{prefix}.{e}.down_proj.weight": tensor[e] for e in range(tensor.shape[0])}
        else:
            out[name] = tensor
    return out


def _write(tmp_path, config, model):
    _, metadata, _ = read_header(builtin_model_path())
    path = tmp_path / f"{config.model_type}.gguf"
    return write_converted_gguf(path, model.state_dict(), config, tokenizer_metadata=tokenizer_fields(metadata))


CONFIG_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "tie_word_embeddings", "max_position_embeddings",
)  # fmt: skip
GEMMA3_KEYS = (
    "layer_types", "sliding_window", "query_pre_attn_scalar", "rope_parameters", "hidden_activation",
    "final_logit_softcapping", "attn_logit_softcapping",
)  # fmt: skip


MOE_KEYS = ("num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob")
ARCH_KEYS = [
    (tiny_gemma3, GEMMA3_KEYS),
    (tiny_qwen3, ("rope_parameters",)),
    (tiny_phi3, ("rope_parameters", "sliding_window")),
    (tiny_phi3_longrope, ("rope_parameters", "original_max_position_embeddings")),
    (tiny_mixtral, MOE_KEYS),
    (tiny_qwen2_moe, (*MOE_KEYS, "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers")),
    (tiny_qwen3_moe, (*MOE_KEYS, "decoder_sparse_step", "mlp_only_layers")),
    (tiny_olmoe, MOE_KEYS),
]


@pytest.mark.parametrize("make, extra_keys", ARCH_KEYS)
def test_config_rebuilds_transformers_config(tmp_path, make, extra_keys):
    config, model = make()
    loaded = GGUFFile(_write(tmp_path, config, model))
    hf = loaded.hf_config
    assert hf["architectures"] == [type(model).__name__]
    rebuilt = transformers.AutoConfig.for_model(**hf)
    assert type(rebuilt) is type(config)
    for key in CONFIG_KEYS + extra_keys:
        assert getattr(rebuilt, key, None) == getattr(config, key, None), key
    assert rebuilt.rms_norm_eps == pytest.approx(config.rms_norm_eps, rel=1e-6)
    assert hf["head_dim"] == (getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


@pytest.mark.parametrize("make", [tiny_gemma3, tiny_qwen3, tiny_phi3, tiny_phi3_longrope, *MOE])
def test_weights_are_transformers_state_dict(tmp_path, make):
    config, model = make()
    weights = dict(GGUFFile(_write(tmp_path, config, model)).iter_weights(torch.float32))
    state = per_expert(model.state_dict())
    expected = set(state) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    assert set(weights) == expected
    for name, tensor in weights.items():
        # Gemma's norms come back from 1 + w: exact up to that rounding (half an ulp of ~2).
        torch.testing.assert_close(tensor, state[name], rtol=0, atol=2.5e-7, msg=name)


def test_gemma3_norms_are_stored_plus_one(tmp_path):
    """Guards the test above: the file holds 1 + w (llama.cpp's layout), not w."""
    config, model = tiny_gemma3()
    loaded = GGUFFile(_write(tmp_path, config, model))
    stored = loaded._tensor(loaded.tensors["blk.0.post_ffw_norm.weight"], torch.float32)
    torch.testing.assert_close(stored, model.state_dict()["model.layers.0.post_feedforward_layernorm.weight"] + 1)


def test_gemma3_end_of_turn_joins_eos_and_the_template_is_gemmas(tmp_path):
    """A Gemma file whose vocabulary has <end_of_turn> stops on it as on EOS (Gemma's HF
    generation_config lists both); one with no chat template gets Gemma's own."""
    config, model = tiny_gemma3()
    _, metadata, _ = read_header(builtin_model_path())
    fields = tokenizer_fields(metadata)
    del fields["tokenizer.chat_template"]
    fields["tokenizer.ggml.tokens"] = list(fields["tokenizer.ggml.tokens"])
    fields["tokenizer.ggml.tokens"][5] = "<end_of_turn>"
    path = write_converted_gguf(tmp_path / "g.gguf", model.state_dict(), config, tokenizer_metadata=fields)
    loaded = GGUFFile(path)
    assert loaded.hf_config["eos_token_id"] == [fields["tokenizer.ggml.eos_token_id"], 5]
    tokenizer = load_tokenizer(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == f"{tokenizer.bos_token}<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_qwen3_eos_is_the_files_alone(tmp_path):
    config, model = tiny_qwen3()
    loaded = GGUFFile(_write(tmp_path, config, model))
    assert loaded.hf_config["eos_token_id"] == loaded.metadata["tokenizer.ggml.eos_token_id"]
    assert loaded.chat_template == loaded.metadata["tokenizer.chat_template"]


@pytest.mark.parametrize("make", [tiny_gemma3, tiny_qwen3, tiny_phi3, tiny_phi3_longrope, *MOE])
def test_langrt_serves_the_file_with_transformers_logits(tmp_path, make):
    config, model = make()
    path = _write(tmp_path, config, model)
    worst = max_logit_error(model, langrt_pieces(path, lengths=(5, 23, 41)))
    assert set(worst) == {"prefill", "prefix_reuse", "decode"}
    assert max(worst.values()) < TOLERANCE, worst


BLOCKS_REL = 5e-4  # relative logit distance, as tests/numerics/test_quant_linear.py's MODEL_REL


@pytest.mark.parametrize("make", [tiny_mixtral, tiny_qwen2_moe])  # q/k permuted; a shared expert
def test_quantized_experts_are_served_as_blocks(tmp_path, caplog, make):
    """A MoE file with Q8_0 matrices and Q4_0 experts: every expert kept as blocks (the log says
    so, and no tensor is expanded), and the logits within BLOCKS_REL of the same file dequantized."""
    from gguf_utils import Q
    from langrt.model.quant import QuantizedWeight
    from runner_driver import RunnerDriver, make_runner

    config, model = make()
    _, metadata, _ = read_header(builtin_model_path())
    path = write_converted_gguf(
        tmp_path / "moe.gguf", model.state_dict(), config, Q.Q8_0, tokenizer_metadata=tokenizer_fields(metadata),
        expert_qtype=Q.Q4_0,
    )  # fmt: skip
    with caplog.at_level("INFO", logger="langrt.model.gguf_loader"):
        blocks = make_runner(path, quantization="auto", max_total_tokens=512)
    assert "kept in their stored blocks" in caplog.text and "expanded" not in caplog.text
    assert "6 Q4_0" in caplog.text  # 2 layers' gate, up and down experts
    for layer in blocks.model.layers:
        experts = layer.mlp.experts
        assert experts.gate_up.numel() == 0 and experts.down.numel() == 0  # no float copy kept
        assert len(experts.gate_up_blocks) == len(experts.down_blocks) == 4
        assert all(
            isinstance(w, QuantizedWeight) and w.type_name == "Q4_0"
            for w in experts.gate_up_blocks + experts.down_blocks
        )
        if layer.mlp.shared_expert is not None:
            assert layer.mlp.shared_expert.gate_up_proj.packed.type_name == "Q8_0"
    dense = make_runner(path, quantization="none", max_total_tokens=512)
    assert dense.model.layers[0].mlp.experts.gate_up_blocks is None
    got, want = RunnerDriver(blocks), RunnerDriver(dense)
    prompts = [[5, 9, 17, 33, 2, 101, 64, 8], [70, 3]]
    pairs = list(zip(got.prefill(prompts), want.prefill(prompts)))
    for step in range(3):
        pairs.append((got.decode([0, 1], [step, 40 + step]), want.decode([0, 1], [step, 40 + step])))
    for a, b in pairs:
        assert ((a.double() - b.double()).norm() / b.double().norm()).item() < BLOCKS_REL


def test_experts_may_mix_block_and_float_projections_but_not_within_gate_up(tmp_path):
    """Blocks for every expert's gate and up beside float down projections load and give the
    dequantized model's logits; a gate in blocks beside a float up is refused by name."""
    from gguf_utils import Q
    from langrt.errors import ModelLoadError
    from langrt.model.quant import QuantizedWeight
    from runner_driver import RunnerDriver, make_runner

    config, model = tiny_olmoe()
    _, metadata, _ = read_header(builtin_model_path())
    path = write_converted_gguf(
        tmp_path / "moe.gguf", model.state_dict(), config, tokenizer_metadata=tokenizer_fields(metadata), expert_qtype=Q.Q8_0
    )  # fmt: skip

    def weights(floats: str):
        for name, w in GGUFFile(path).iter_weights(torch.float32, quantized=True):
            yield name, (w.dequantize(torch.float32) if isinstance(w, QuantizedWeight) and floats in name else w)

    mixed, dense = (make_runner(path, quantization="none", max_total_tokens=512) for _ in range(2))
    mixed.model.load_weights(weights(".down_proj."))
    experts = mixed.model.layers[1].mlp.experts
    assert (
        experts.gate_up_blocks[3].type_name == "Q8_0"
        and experts.down_blocks is None
        and experts.down.shape == (4, 64, 128)
    )
    prompts = [[5, 9, 17, 33, 2, 101, 64, 8], [70, 3]]
    for a, b in zip(RunnerDriver(mixed).prefill(prompts), RunnerDriver(dense).prefill(prompts)):
        assert ((a.double() - b.double()).norm() / b.double().norm()).item() < BLOCKS_REL
    with pytest.raises(ModelLoadError, match="layer 0 expert 0's up projection is plain floats"):
        make_runner(path, quantization="none", max_total_tokens=512).model.load_weights(weights(".up_proj."))
