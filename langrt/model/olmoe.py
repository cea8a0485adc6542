"""OLMoE (OlmoeForCausalLM, e.g. OLMoE-1B-7B): Llama layers with an RMSNorm over the whole q
projection and one over the whole k projection (not per head) before rotary, q/k/v clamped to
+-`clip_qkv` where set; every layer's MLP routes each token to `num_experts_per_tok` of
`num_experts` experts of `intermediate_size` rows (renormalised only with `norm_topk_prob`)."""

from __future__ import annotations

import torch

from langrt.model.config import ModelConfig
from langrt.model.layers import Linear, RMSNorm, apply_rotary, linear, rms_norm
from langrt.model.llama import LlamaAttention, Rope
from langrt.model.moe import MoEDecoderLayer, MoEForCausalLM, MoESettings, num_experts_of
from langrt.model.qwen3 import input_norm


class OlmoeAttention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__(config, layer_id)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=config.attention_bias)
        self.q_norm = RMSNorm(config.q_size, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.kv_size, config.rms_norm_eps)
        clip = config.hf.get("clip_qkv")
        self.clip_qkv = None if clip is None else float(clip)


def olmoe_qkv(normed: torch.Tensor, a: OlmoeAttention, cos, sin, sizes: tuple[int, int, int]):
    """The input norm's output -> q, k, v: qkv projection, q and k norms, clamp, rotary."""
    q_size, kv_size, head_dim = sizes
    qkv = linear(normed, a.qkv_proj.weight, a.qkv_proj.bias, a.qkv_proj.packed)
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = rms_norm(q.contiguous(), a.q_norm.weight, a.q_norm.eps)
    k = rms_norm(k.contiguous(), a.k_norm.weight, a.k_norm.eps)
    if a.clip_qkv is not None:
        q, k, v = (t.clamp(-a.clip_qkv, a.clip_qkv) for t in (q, k, v))
    qk = apply_rotary(torch.cat([q, k], dim=-1), cos, sin, head_dim)
    return qk[:, :q_size], qk[:, q_size:], v


class OlmoeDecoderLayer(MoEDecoderLayer):
    attention_class = OlmoeAttention

    def attention_inputs(self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None):
        normed, residual = input_norm(self.input_layernorm, x, residual)
        return (*olmoe_qkv(normed, self.self_attn, *rope, self.sizes), residual)


class OlmoeForCausalLM(MoEForCausalLM):
    layer_class = OlmoeDecoderLayer

    @staticmethod
    def moe_settings(config: ModelConfig) -> MoESettings:
        hf = config.hf  # defaults: transformers' OlmoeConfig
        return MoESettings(
            num_experts=num_experts_of(hf, 64),
            top_k=hf.get("num_experts_per_tok", 8),
            expert_size=config.intermediate_size,
            renormalize=bool(hf.get("norm_topk_prob", False)),
            float32_weights=False,
        )


ENTRY_CLASS = OlmoeForCausalLM
