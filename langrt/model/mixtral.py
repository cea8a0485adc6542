"""Mixtral (MixtralForCausalLM): Mistral's attention; every layer's MLP is a mixture of
`num_local_experts` SwiGLU experts of `intermediate_size` rows, `num_experts_per_tok` per token,
the chosen experts' weights always renormalised to sum to 1 and kept in float32."""

from __future__ import annotations

from langrt.model.config import ModelConfig
from langrt.model.moe import MoEForCausalLM, MoESettings, num_experts_of


class MixtralForCausalLM(MoEForCausalLM):
    @staticmethod
    def moe_settings(config: ModelConfig) -> MoESettings:
        hf = config.hf  # defaults: transformers' MixtralConfig
        return MoESettings(
            num_experts=num_experts_of(hf, 8),
            top_k=hf.get("num_experts_per_tok", 2),
            expert_size=config.intermediate_size,
            renormalize=True,
            float32_weights=True,
        )


ENTRY_CLASS = MixtralForCausalLM
