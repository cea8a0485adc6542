"""Phi-3 and Phi-4-mini (Phi3ForCausalLM): the Llama layer, with the checkpoint's qkv_proj and
gate_up_proj already fused, rotary over the first partial_rotary_factor of each head
(Phi-4-mini: 0.75), LongRoPE scaling (rope.py) and a sliding window on every layer if the config
sets one (ModelConfig.layer_windows, applied by the attention backends).

A model rotating whole heads has exactly Llama's layers, so it keeps langrt.model.fused_layers'
one C++ call per pass; partial rotary runs the per-layer loop.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from langrt.errors import ModelLoadError
from langrt.model.attention import Attention
from langrt.model.config import ModelConfig
from langrt.model.layers import RotaryEmbedding, apply_partial_rotary
from langrt.model.llama import DenseOps, LlamaDecoderLayer, LlamaForCausalLM, Rope
from langrt.model.norms import input_norm
from langrt.model.rope import rotary_dim


class Phi3PartialRotaryLayer(LlamaDecoderLayer):
    """A Llama layer rotating only the first `rotary_dim` dimensions of each q and k head."""

    def __init__(self, config: ModelConfig, layer_id: int, ops: DenseOps, rotated: int):
        super().__init__(config, layer_id, ops)
        self.rotated = rotated

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None, attn: Attention
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q_size, kv_size, head_dim = self.sizes
        normed, residual = input_norm(self.input_layernorm, x, residual)
        qkv = self.self_attn.qkv_proj(normed)
        qk = apply_partial_rotary(qkv[:, : q_size + kv_size], *rope, head_dim, self.rotated)
        o = attn.attend(self.self_attn.layer_id, qk[:, :q_size], qk[:, q_size:], qkv[:, q_size + kv_size :])
        return self.after_attention(o, residual)


class Phi3ForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: ModelConfig, layer_id: int, ops: DenseOps) -> LlamaDecoderLayer:
        rotated = rotary_dim(config.head_dim, partial_rotary_factor(config.hf))
        if rotated == config.head_dim:
            return LlamaDecoderLayer(config, layer_id, ops)
        return Phi3PartialRotaryLayer(config, layer_id, ops, rotated)

    def make_rotary(self, config: ModelConfig) -> RotaryEmbedding:
        rotated = rotary_dim(config.head_dim, partial_rotary_factor(config.hf))
        return RotaryEmbedding(rotated, config.max_position_embeddings, config.rope_theta, config.rope_scaling)

    def set_tensor_parallel(self, tp) -> None:
        if tp is not None:
            raise ModelLoadError(
                "--tp-size > 1 is not available for Phi-3: its checkpoints hold qkv_proj and gate_up_proj fused, "
                "and langrt.parallel.shard splits q/k/v and gate/up by their separate names; serve it with --tp-size 1"
            )
        super().set_tensor_parallel(tp)

    def _expected_fills(self) -> list[str]:
        """Phi-3 checkpoints hold qkv_proj and gate_up_proj whole: every tensor is one fill."""
        return [f"{name}@None" for name, _ in self.named_parameters()]


def partial_rotary_factor(hf: Mapping[str, Any]) -> float:
    """Top-level in transformers < 5's configs, inside `rope_parameters` in later ones."""
    factor = hf.get("partial_rotary_factor") or (hf.get("rope_parameters") or {}).get("partial_rotary_factor")
    return float(factor or 1.0)


ENTRY_CLASS = Phi3ForCausalLM
