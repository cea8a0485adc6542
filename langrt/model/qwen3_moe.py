"""Qwen3-MoE (Qwen3MoeForCausalLM, e.g. Qwen3-30B-A3B): Qwen3's attention (an RMSNorm over each
q and k head before rotary, langrt.model.qwen3); sparse layers route each token to
`num_experts_per_tok` of `num_experts` experts of `moe_intermediate_size` rows (renormalised
with `norm_topk_prob`), no shared expert. Layers in `mlp_only_layers` or off the
`decoder_sparse_step` grid have a dense MLP of `intermediate_size` rows."""

from __future__ import annotations

import torch

from langrt.model.config import ModelConfig
from langrt.model.llama import Rope
from langrt.model.moe import MoEDecoderLayer, MoEForCausalLM, MoESettings, dense_layers_of, num_experts_of
from langrt.model.qwen3 import Qwen3Attention, input_norm


class Qwen3MoeDecoderLayer(MoEDecoderLayer):
    attention_class = Qwen3Attention

    def attention_inputs(self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None):
        normed, residual = input_norm(self.input_layernorm, x, residual)
        q, k, v = self.self_attn.qkv(normed, rope)
        return q, k, v, residual


class Qwen3MoeForCausalLM(MoEForCausalLM):
    layer_class = Qwen3MoeDecoderLayer

    @staticmethod
    def moe_settings(config: ModelConfig) -> MoESettings:
        hf = config.hf  # defaults: transformers' Qwen3MoeConfig
        num_experts = num_experts_of(hf, 128)
        return MoESettings(
            num_experts=num_experts,
            top_k=hf.get("num_experts_per_tok", 8),
            expert_size=hf.get("moe_intermediate_size", 768),
            renormalize=bool(hf.get("norm_topk_prob", False)),
            float32_weights=False,
            dense_layers=dense_layers_of(hf, config.num_layers, num_experts),
        )


ENTRY_CLASS = Qwen3MoeForCausalLM
