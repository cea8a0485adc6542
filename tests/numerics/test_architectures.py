"""langrt's native Qwen3, Gemma 3 and Phi-3 give transformers' logits on tiny random-weight
checkpoints (float32): a batch of prompts of mixed lengths (5, 23, 41 tokens), a pass reusing
cached prefixes (the prefix cache's case) beside a fresh prompt, and greedy decode steps through
the paged cache, on the torch backend and on the CPU kernel's.

Each model is shaped to reach its architecture's own parts: head_dim not hidden / heads, q/k
norms; Gemma 3 with one KV head, a query_pre_attn_scalar that is not head_dim, a window of 8
(shorter than the prompts) on two of its three layers and linear rope scaling on the full one;
Phi-3 with partial rotary, a window of 16 and LongRoPE whose original context (13) the prompts,
the reused prefixes and the decodes cross."""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from tiny_arch import hf_logits, hf_logits_stepwise, langrt_pieces, max_logit_error, write_tiny_checkpoint

# float32 on both sides; the worst errors measured are 2e-6 (Qwen3, Phi-3) to 2.4e-5 (Gemma 3,
# whose (1 + w) norms and sqrt(hidden) embedding scale make larger logits).
TOLERANCE = 1e-4
BACKENDS = ("torch", "cpu")


def _qwen3(path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return write_tiny_checkpoint(Qwen3Config, Qwen3ForCausalLM, path, seed=2, head_dim=32, tie_word_embeddings=True)


def _gemma3(path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}  # fmt: skip
    return write_tiny_checkpoint(
        Gemma3TextConfig, Gemma3ForCausalLM, path, seed=3, num_hidden_layers=3, num_key_value_heads=1, head_dim=32,
        sliding_window=8, layer_types=layer_types, query_pre_attn_scalar=24, rope_parameters=rope,
    )  # fmt: skip


def _gemma3_multimodal(path):
    """A Gemma3ForConditionalGeneration checkpoint (a tiny vision tower beside the language
    model): langrt serves its language model from the nested text_config."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    from tiny_arch import TINY_DIMS

    def config(bos_token_id, eos_token_id, **_):
        text = Gemma3TextConfig(**{**TINY_DIMS, "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 8})
        vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                    image_size=28, patch_size=14)  # fmt: skip
        return Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                            bos_token_id=bos_token_id, eos_token_id=eos_token_id)  # fmt: skip

    return write_tiny_checkpoint(config, Gemma3ForConditionalGeneration, path, seed=8)


def _phi3(path, partial: float = 0.5, longrope: bool = True):
    from transformers import Phi3Config, Phi3ForCausalLM

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    if longrope:
        gen = torch.Generator().manual_seed(5)
        half = int(16 * partial) // 2
        factors = {"short_factor": (1 + torch.rand(half, generator=gen)).tolist(),
                   "long_factor": (1 + 3 * torch.rand(half, generator=gen)).tolist()}  # fmt: skip
        rope |= {"rope_type": "longrope", "original_max_position_embeddings": 13, **factors}
    return write_tiny_checkpoint(
        Phi3Config, Phi3ForCausalLM, path, seed=4, partial_rotary_factor=partial, sliding_window=16,
        original_max_position_embeddings=13, rope_parameters=rope,
    )  # fmt: skip


def _phi3_llama_shaped(path):
    """Heads of 32 rotated whole, no LongRoPE: exactly Llama's layers, so fused_layers' C++ op
    runs them."""
    from transformers import Phi3Config, Phi3ForCausalLM

    return write_tiny_checkpoint(
        Phi3Config, Phi3ForCausalLM, path, seed=6, num_attention_heads=2, num_key_value_heads=1
    )


@dataclass(frozen=True)
class Case:
    build: Callable
    module: str
    fused: bool = False  # whether fused_layers' one C++ call runs its layers
    # LongRoPE picks its factors per position in langrt, per pass in a transformers forward; fed
    # token by token, transformers does the same per position (see langrt.model.rope).
    stepwise: bool = False


CASES = {
    "qwen3": Case(_qwen3, "qwen3"),
    "gemma3": Case(_gemma3, "gemma3"),
    "gemma3_multimodal": Case(_gemma3_multimodal, "gemma3"),
    "phi3": Case(_phi3, "phi3", stepwise=True),
    "phi3_whole_heads": Case(_phi3_llama_shaped, "phi3", fused=True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny_case(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    case = CASES[request.param]
    hf = case.build(path)
    reference = functools.lru_cache(maxsize=None)(
        lambda ids: (hf_logits_stepwise if case.stepwise else hf_logits)(hf, list(ids))
    )
    return request.param, path, hf, case, lambda _hf, ids: reference(tuple(ids))


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_match_transformers(tiny_case, backend):
    name, path, hf, _, reference = tiny_case
    errors = max_logit_error(hf, langrt_pieces(path, attention_backend=backend), reference)
    assert set(errors) == {"prefill", "prefix_reuse", "decode"}
    assert max(errors.values()) <= TOLERANCE, f"{name} on {backend}: {errors}"


def test_each_is_served_by_its_own_module(tiny_case):
    """The registry picks the architecture's module (Llama's would ignore the q/k norms); only
    exactly Llama-shaped layers go to fused_layers' C++ op."""
    from runner_driver import make_runner

    from langrt.model import fused_layers

    _, path, _, case, _ = tiny_case
    runner = make_runner(path, max_total_tokens=256, max_running_requests=4)
    assert type(runner.model).__module__ == f"langrt.model.{case.module}"
    assert (fused_layers.layer_tensors(runner.model) is not None) == case.fused


@pytest.mark.parametrize("tiny_case", ["gemma3"], indirect=True)
def test_gemma3_windows_are_exercised(tiny_case, tmp_path):
    """The same Gemma 3 with a window longer than any sequence is far from transformers' (whose
    window of 8 the prompts outrun): langrt's windowed layers are what match it."""
    _, path, hf, _, reference = tiny_case
    unwindowed = tmp_path / "gemma3_wide_window"
    shutil.copytree(path, unwindowed)
    config = json.loads((unwindowed / "config.json").read_text())
    (unwindowed / "config.json").write_text(json.dumps({**config, "sliding_window": 4096}))
    errors = max_logit_error(hf, langrt_pieces(unwindowed, decode_steps=1, attention_backend="torch"), reference)
    assert errors["prefill"] > 100 * TOLERANCE


@pytest.mark.parametrize("tiny_case", ["phi3"], indirect=True)
def test_phi3_refuses_tensor_parallelism_by_name(tiny_case):
    """Its fused qkv_proj / gate_up_proj would reach the ranks unsplit: refused before loading."""
    from langrt.errors import ModelLoadError
    from langrt.model.config import ModelConfig
    from langrt.model.registry import model_class

    config = ModelConfig.from_dir(tiny_case[1])
    model = model_class(config.model_type)(config)
    with pytest.raises(ModelLoadError, match="--tp-size > 1 is not available for Phi-3"):
        model.set_tensor_parallel(object())
