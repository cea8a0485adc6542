"""Qwen2-MoE (Qwen2MoeForCausalLM, e.g. Qwen1.5-MoE-A2.7B): Qwen2's attention (q/k/v bias);
sparse layers route each token to `num_experts_per_tok` of `num_experts` experts of
`moe_intermediate_size` rows (renormalised only with `norm_topk_prob`) and add a shared expert
every token runs, scaled by sigmoid(shared_expert_gate(x)). Layers in `mlp_only_layers` or off
the `decoder_sparse_step` grid have a dense MLP of `intermediate_size` rows."""

from __future__ import annotations

from langrt.model.config import ModelConfig
from langrt.model.moe import MoEForCausalLM, MoESettings, dense_layers_of, num_experts_of


class Qwen2MoeForCausalLM(MoEForCausalLM):
    @staticmethod
    def moe_settings(config: ModelConfig) -> MoESettings:
        hf = config.hf  # defaults: transformers' Qwen2MoeConfig
        num_experts = num_experts_of(hf, 60)
        return MoESettings(
            num_experts=num_experts,
            top_k=hf.get("num_experts_per_tok", 4),
            expert_size=hf.get("moe_intermediate_size", 1408),
            renormalize=bool(hf.get("norm_topk_prob", False)),
            float32_weights=False,
            shared_expert_size=hf.get("shared_expert_intermediate_size", 5632),
            dense_layers=dense_layers_of(hf, config.num_layers, num_experts),
        )


ENTRY_CLASS = Qwen2MoeForCausalLM
