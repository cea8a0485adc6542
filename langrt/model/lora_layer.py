"""A Llama-family decoder layer (LlamaDecoderLayer: Llama, Mistral, Qwen2) with each
request's adapter product added after every base projection.

The math is `langrt.model.llama`'s before_attention / after_attention, step by step, with
`LoraPass.add` after the qkv, o, gate_up and down products. Passes without adapters never come
here: they keep the plain layer (and its fused C++ path) untouched. langrt/lora/registry.py asks
`supports` before it loads an adapter.
"""

from __future__ import annotations

import torch

from langrt.model.layers import add_rms_norm, apply_rotary, linear, rms_norm, silu_and_mul
from langrt.model.lora_pass import LoraPass


def supports(model) -> str | None:
    """None when `model`'s layers can take adapters; else why not (for the error message)."""
    from langrt.model.llama import LlamaDecoderLayer

    kinds = {type(layer).__name__ for layer in model.layers if type(layer) is not LlamaDecoderLayer}
    if kinds:
        return f"its layers are {', '.join(sorted(kinds))}; LoRA serves Llama / Mistral / Qwen2 layers"
    if model.tp is not None:
        return "it runs under --tp-size > 1; LoRA serves one rank's whole model"
    return None


def forward_layer(layer, lora: LoraPass, rope, x: torch.Tensor, residual: torch.Tensor | None, attn):
    """LlamaDecoderLayer.forward with the adapters' products -> (layer output, residual)."""
    a, norm, i = layer.self_attn, layer.input_layernorm, layer.self_attn.layer_id
    q_size, kv_size, head_dim = layer.sizes
    if residual is None:
        residual, normed = x, rms_norm(x, norm.weight, norm.eps)
    else:
        normed, residual = add_rms_norm(x, residual, norm.weight, norm.eps)
    weight, packed = a.qkv_proj.weights
    qkv = lora.add(linear(normed, weight, a.qkv_proj.bias, packed), normed, i, "qkv")
    qk = apply_rotary(qkv[:, : q_size + kv_size], *rope, head_dim)
    o = attn.attend(i, qk[:, :q_size], qk[:, q_size:], qkv[:, q_size + kv_size :])
    o_out = lora.add(linear(o, a.o_proj.weight, None, a.o_proj.packed), o, i, "o")
    post, mlp = layer.post_attention_layernorm, layer.mlp
    h, residual = add_rms_norm(o_out, residual, post.weight, post.eps)
    gate_up = lora.add(linear(h, mlp.gate_up_proj.weight, None, mlp.gate_up_proj.packed), h, i, "gate_up")
    act = silu_and_mul(gate_up)
    down = lora.add(linear(act, mlp.down_proj.weight, None, mlp.down_proj.packed), act, i, "down")
    return down, residual
