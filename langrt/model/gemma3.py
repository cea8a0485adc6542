"""Gemma 3 (text): LlamaForCausalLM's machinery (fused qkv and gate_up, loading, packing,
quantization, logits) around Gemma's layer.

What differs from Llama, as transformers' Gemma3ForCausalLM does it:
- every norm scales by (1 + w), in float32 (norms.gemma_rms_norm); four per layer: before and
  after attention, before and after the MLP (whose outputs are normed before the residual add);
- per-head q/k norms before rotary; the softmax scale is query_pre_attn_scalar ** -0.5 (in
  ModelConfig.attention_scale, which the attention backends apply);
- the MLP is GELU-tanh gated; head_dim comes from the config (Gemma 3 270M: 4 heads of 256 on a
  width of 640); one KV head is fine;
- embeddings are scaled by sqrt(hidden) rounded to the activation dtype;
- sliding-window layers (ModelConfig.layer_windows) rotate with their own base
  (rope_local_base_freq), full layers with rope_theta and rope_scaling.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch
from torch import nn

from langrt.errors import ModelLoadError
from langrt.model.attention import Attention
from langrt.model.attention_layout import layer_is_sliding
from langrt.model.config import ModelConfig
from langrt.model.layers import RotaryEmbedding, apply_rotary, gelu_tanh_and_mul, linear
from langrt.model.llama import DenseOps, LlamaAttention, LlamaForCausalLM, LlamaMLP, Rope
from langrt.model.norms import GemmaRMSNorm, gemma_rms_norm, per_head_norm

SLIDING, FULL = "sliding", "full"
# A multimodal (Gemma3ForConditionalGeneration) checkpoint: its language model's tensors under
# these prefixes (transformers >= 4.52, and before), the vision tower's skipped.
_TEXT_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


class Gemma3Attention(LlamaAttention):
    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__(config, layer_id)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.sizes = (config.q_size, config.kv_size, config.head_dim)

    def forward(self, normed: torch.Tensor, rope: Rope, attn: Attention) -> torch.Tensor:
        """The input norm's output [T, hidden] -> attention's projected output [T, hidden]."""
        q_size, kv_size, head_dim = self.sizes
        weight, packed = self.qkv_proj.weights
        qkv = linear(normed, weight, self.qkv_proj.bias, packed)
        q = per_head_norm(gemma_rms_norm, qkv[:, :q_size], self.q_norm.weight, self.q_norm.eps, head_dim)
        k = per_head_norm(
            gemma_rms_norm, qkv[:, q_size : q_size + kv_size], self.k_norm.weight, self.k_norm.eps, head_dim
        )
        qk = apply_rotary(torch.cat((q, k), dim=1), *rope, head_dim)
        o = attn.attend(self.layer_id, qk[:, :q_size], qk[:, q_size:], qkv[:, q_size + kv_size :])
        return self.o_proj(o)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, rope_kind: str):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.self_attn = Gemma3Attention(config, layer_id)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.mlp = LlamaMLP(config)  # gate_up and down; the activation is applied here
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.rope_kind = rope_kind
        self.tp = None  # under tensor parallelism: sums the row-parallel o and down projections

    def forward(self, ropes: Mapping[str, Rope], x: torch.Tensor, attn: Attention) -> torch.Tensor:
        """The residual stream in -> out."""
        h = self._reduce(self.self_attn(self.input_layernorm(x), ropes[self.rope_kind], attn))
        x = x + self.post_attention_layernorm(h)
        h = gelu_tanh_and_mul(self.mlp.gate_up_proj(self.pre_feedforward_layernorm(x)))
        return x + self.post_feedforward_layernorm(self._reduce(self.mlp.down_proj(h)))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial if self.tp is None else self.tp.all_reduce(partial)


class Gemma3ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig, compiled: bool = False):
        _check_supported(config)
        super().__init__(config, compiled)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def make_layer(self, config: ModelConfig, layer_id: int, ops: DenseOps) -> Gemma3DecoderLayer:
        sliding = layer_is_sliding(config.hf, config.num_layers)[layer_id]
        return Gemma3DecoderLayer(config, layer_id, SLIDING if sliding else FULL)

    def make_rotary(self, config: ModelConfig) -> nn.ModuleDict:
        """One table per kind of layer, each with its base (and scaling)."""
        return nn.ModuleDict(
            {
                kind: RotaryEmbedding(config.head_dim, config.max_position_embeddings, theta, scaling)
                for kind, (theta, scaling) in rope_settings(config.hf).items()
            }
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Attention) -> torch.Tensor:
        """[T] token ids -> [T, hidden] final hidden states (after the last norm)."""
        x = self.embed_tokens(input_ids) if self.tp is None else self._embed_vocab_part(input_ids)
        # HF multiplies by sqrt(hidden) rounded to the activation dtype
        x = x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)
        ropes = {kind: rotary.cos_sin(positions, x.dtype) for kind, rotary in self.rotary.items()}
        for layer in self.layers:
            x = layer(ropes, x, attn)
        return self.norm(x)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Also takes a multimodal checkpoint's language model (its vision tower is not used)."""
        super().load_weights(_text_weights(weights))


def _text_weights(weights: Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
    for name, tensor in weights:
        if name.startswith(_VISION_PREFIXES):
            continue
        for prefix, ours in _TEXT_PREFIXES:
            if name.startswith(prefix):
                name = ours + name.removeprefix(prefix)
                break
        yield name, tensor


def rope_settings(hf: Mapping[str, Any]) -> dict[str, tuple[float, Mapping[str, Any] | None]]:
    """{kind: (theta, scaling)} from transformers 5's `rope_parameters` per layer type, or the
    older rope_theta / rope_scaling (full layers) and rope_local_base_freq (sliding layers)."""
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention") or {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 1e6)}
    local = params.get("sliding_attention") or {"rope_theta": hf.get("rope_local_base_freq", 1e4)}
    return {FULL: _theta_and_scaling(full), SLIDING: _theta_and_scaling(local)}


def _theta_and_scaling(p: Mapping[str, Any]) -> tuple[float, Mapping[str, Any] | None]:
    kind = p.get("rope_type", p.get("type", "default"))
    return float(p["rope_theta"]), None if kind == "default" else {**p, "rope_type": kind}


def _check_supported(config: ModelConfig) -> None:
    """What Gemma 3's text model can have that this module does not do: refused by name."""
    hf = config.hf
    for key in ("final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention"):
        if hf.get(key):
            raise ModelLoadError(
                f"Gemma 3 config sets {key}={hf[key]!r}, which langrt's gemma3 module does not implement; "
                "serve it with --model-impl transformers"
            )
    if hf.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ModelLoadError(
            f"Gemma 3 hidden_activation {hf['hidden_activation']!r}: langrt's gemma3 module has gelu_pytorch_tanh only"
        )


ENTRY_CLASS = Gemma3ForCausalLM
