"""Qwen3: the Llama layer with an RMSNorm over each query and key head before rotary (no qkv
bias). Everything else (loading, packing, quantization, logits, tensor parallelism) is
LlamaForCausalLM's; `Qwen3Attention` is what Qwen3-MoE shares."""

from __future__ import annotations

import torch

from langrt.model.attention import Attention
from langrt.model.config import ModelConfig
from langrt.model.layers import RMSNorm, apply_rotary, linear, rms_norm
from langrt.model.llama import DenseOps, LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, Rope
from langrt.model.norms import input_norm, per_head_norm


class Qwen3Attention(LlamaAttention):
    """The fused qkv projection, then per-head q/k norms (one [head_dim] weight each, shared by
    the heads), then rotary."""

    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__(config, layer_id)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.sizes = (config.q_size, config.kv_size, config.head_dim)

    def qkv(self, normed: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The input norm's output [T, hidden] -> q, k (normed, rotated), v."""
        q_size, kv_size, head_dim = self.sizes
        qkv = linear(normed, *self._qkv_args())
        q = per_head_norm(rms_norm, qkv[:, :q_size], self.q_norm.weight, self.q_norm.eps, head_dim)
        k = per_head_norm(rms_norm, qkv[:, q_size : q_size + kv_size], self.k_norm.weight, self.k_norm.eps, head_dim)
        # q and k side by side: one rotation covers both
        qk = apply_rotary(torch.cat((q, k), dim=1), *rope, head_dim)
        return qk[:, :q_size], qk[:, q_size:], qkv[:, q_size + kv_size :]

    def _qkv_args(self):
        weight, packed = self.qkv_proj.weights
        return weight, self.qkv_proj.bias, packed


class Qwen3DecoderLayer(LlamaDecoderLayer):
    """Runs in the per-layer loop (langrt.model.fused_layers' C++ op has no q/k norms); with
    --enable-torch-compile its post-attention half is compiled, the q/k part runs eagerly."""

    def __init__(self, config: ModelConfig, layer_id: int, ops: DenseOps):
        super().__init__(config, layer_id, ops)
        self.self_attn = Qwen3Attention(config, layer_id)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None, attn: Attention
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = input_norm(self.input_layernorm, x, residual)
        q, k, v = self.self_attn.qkv(normed, rope)
        return self.after_attention(attn.attend(self.self_attn.layer_id, q, k, v), residual)


class Qwen3ForCausalLM(LlamaForCausalLM):
    def make_layer(self, config: ModelConfig, layer_id: int, ops: DenseOps) -> Qwen3DecoderLayer:
        return Qwen3DecoderLayer(config, layer_id, ops)


ENTRY_CLASS = Qwen3ForCausalLM
