"""The Llama family (Llama 2/3, Mistral, Qwen2/2.5) over langrt's paged attention.

q/k/v are one fused projection and gate/up another, so a layer is four matmuls. Modules hold the
parameters; a layer's math is two plain functions around attention (which `--enable-torch-compile`
compiles). `load_weights` takes HF parameter names and fills the fused tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from langrt.cpu_features import separate_compile_cache
from langrt.errors import ModelLoadError
from langrt.model.attention import Attention
from langrt.model.config import ModelConfig
from langrt.model import fused_layers
from langrt.model.fused_layers import LayerTensors
from langrt.model.quant import BLOCK, PassContext, QuantizedWeight
from langrt.model.layers import (
    Embedding,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    add_rms_norm,
    apply_rotary,
    can_pack,
    linear,
    pack_weight,
    rms_norm,
    silu_and_mul,
)

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin for this pass's positions


class LlamaAttention(nn.Module):
    """Holds the attention projections; the math is in `before_attention` / `after_attention`."""

    def __init__(self, config: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.qkv_proj = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(config.q_size, config.hidden_size)


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)


def before_attention(
    x, residual, norm_w, eps: float, qkv_w, qkv_packed, qkv_b, cos, sin, q_size: int, kv_size: int, head_dim: int
):
    """(residual add +) input norm, qkv projection, rotary on q and k -> (q, k, v, residual).
    Each weight comes with its packed copy or None (see Linear)."""
    if residual is None:
        residual, normed = x, rms_norm(x, norm_w, eps)
    else:
        normed, residual = add_rms_norm(x, residual, norm_w, eps)
    qkv = linear(normed, qkv_w, qkv_b, qkv_packed)
    # q and k sit side by side in qkv: one rotation covers both.
    qk = apply_rotary(qkv[:, : q_size + kv_size], cos, sin, head_dim)
    return qk[:, :q_size], qk[:, q_size:], qkv[:, q_size + kv_size :], residual


def after_attention(o, residual, o_w, o_packed, norm_w, eps: float, gate_up_w, gate_up_packed, down_w, down_packed):
    """Output projection, residual add, post norm, SwiGLU MLP -> (layer output, residual)."""
    return mlp_block(
        linear(o, o_w, None, o_packed), residual, norm_w, eps, gate_up_w, gate_up_packed, down_w, down_packed
    )


def mlp_block(attn_out, residual, norm_w, eps: float, gate_up_w, gate_up_packed, down_w, down_packed):
    """Residual add, post norm, SwiGLU MLP -> (MLP output, residual)."""
    x, residual = add_rms_norm(attn_out, residual, norm_w, eps)
    return linear(silu_and_mul(linear(x, gate_up_w, None, gate_up_packed)), down_w, None, down_packed), residual


@dataclass(frozen=True)
class DenseOps:
    """The two attention-free halves of a layer, eager or compiled with torch.compile (one
    graph each, shared by all layers: weights are arguments, not captured)."""

    before_attention: Callable
    after_attention: Callable
    mlp_block: Callable  # after_attention without the output projection (tensor parallelism sums that first)

    @classmethod
    def create(cls, compiled: bool) -> "DenseOps":
        ops = (before_attention, after_attention, mlp_block)
        if not compiled:
            return cls(*ops)
        separate_compile_cache()
        return cls(*(torch.compile(op, dynamic=True) for op in ops))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int, ops: DenseOps):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_id)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.ops = ops
        self.sizes = (config.q_size, config.kv_size, config.head_dim)
        self.tp = None  # under tensor parallelism: sums the row-parallel o and down projections

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None, attn: Attention
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's output, the residual stream before it); their sum is the new stream."""
        a, norm = self.self_attn, self.input_layernorm
        q, k, v, residual = self.ops.before_attention(
            x, residual, norm.weight, norm.eps, *a.qkv_proj.weights, a.qkv_proj.bias, *rope, *self.sizes
        )
        return self.after_attention(attn.attend(a.layer_id, q, k, v), residual)

    def after_attention(self, o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention's output [T, q_size] -> (this layer's output, the residual stream before
        it): o projection, post norm, MLP (under tensor parallelism, each product summed)."""
        a, post, mlp = self.self_attn, self.post_attention_layernorm, self.mlp
        if self.tp is None:
            return self.ops.after_attention(
                o,
                residual,
                *a.o_proj.weights,
                post.weight,
                post.eps,
                *mlp.gate_up_proj.weights,
                *mlp.down_proj.weights,
            )
        o = self.tp.all_reduce(a.o_proj(o))
        x, residual = self.ops.mlp_block(
            o, residual, post.weight, post.eps, *mlp.gate_up_proj.weights, *mlp.down_proj.weights
        )
        return self.tp.all_reduce(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, compiled: bool = False):
        super().__init__()
        self.config = config
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        ops = DenseOps.create(compiled)
        self.layers = nn.ModuleList(self.make_layer(config, i, ops) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = self.make_rotary(config)
        if not config.tie_word_embeddings:
            self.lm_head = Linear(config.hidden_size, config.vocab_size)
        self.lm_head_packed: torch.Tensor | None = None
        self.compiled = compiled
        self._layer_tensors: LayerTensors | None | bool = False  # fused_layers' tensors, once asked
        self.pass_context = PassContext()  # its ModelRunner's, once attached (quant.attach_pass_context)
        self.tp = None  # langrt.parallel.group.TensorParallel: this model is one rank's part

    def make_layer(self, config: ModelConfig, layer_id: int, ops: DenseOps) -> nn.Module:
        """Decoder layer `layer_id`; an architecture with other layers (mixture-of-experts MLPs)
        overrides this. Called from __init__, where only self.config and the embedding are set."""
        return LlamaDecoderLayer(config, layer_id, ops)

    def make_rotary(self, config: ModelConfig) -> nn.Module:
        """The rotary tables `forward` reads; an architecture rotating part of each head, or with
        a rope base per kind of layer, overrides this."""
        return RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling)

    def set_tensor_parallel(self, tp) -> None:
        """Make this model one rank's part (its config already is): the embedding and the o and
        down projections' products are summed over the ranks, the logits gathered on rank 0.
        The per-layer loop runs (fused_layers' one C++ call has no collectives)."""
        self.tp = tp
        for layer in self.layers:
            layer.tp = tp

    def pack_for_cpu(self, dense_budget: int = 0) -> bool:
        """Adds oneDNN-packed copies of the layers' and the LM head's weights where that pays
        (bf16 on CPU, see Linear). Quantized weights get theirs only if all of them fit in
        `dense_budget` bytes. Call once, after the weights are loaded. -> whether it packed."""
        if not can_pack(self.embed_tokens.weight):
            return False
        quantized = [m.packed for m in self.layers.modules() if isinstance(m, Linear) and m.quantized]
        if isinstance(self.lm_head_packed, QuantizedWeight):
            quantized.append(self.lm_head_packed)
        dense_copy = 2 * sum(q.out_features * q.in_features for q in quantized) <= dense_budget
        for module in self.layers.modules():
            if isinstance(module, Linear):
                module.pack_for_cpu(dense_copy)
        if not isinstance(self.lm_head_packed, QuantizedWeight):
            self.lm_head_packed = pack_weight(self.lm_head_weight)
        elif dense_copy and self.lm_head_packed.dense is None:
            self.lm_head_packed.add_dense_copy()
        return True

    def quantize_weights(self, layer_type: int, head_type: int) -> None:
        """Turn the layers' linear weights and the LM head into blocks of these GGML types
        (--quantization int8 / int4 on plain weights); the embedding stays as it is. A matrix
        whose rows are not whole blocks of 32 keeps its plain weight."""
        for module in self.layers.modules():
            if isinstance(module, Linear) and not module.quantized and module.weight.shape[1] % BLOCK == 0:
                module.fill_quantized(0, QuantizedWeight.quantize(module.weight, layer_type))
        if self.lm_head_weight.shape[1] % BLOCK or isinstance(self.lm_head_packed, QuantizedWeight):
            return  # rows not whole blocks; or blocks already (a GGUF file's)
        head = QuantizedWeight.quantize(self.lm_head_weight, head_type)
        if not self.config.tie_word_embeddings:
            self.lm_head.fill_quantized(0, head)
            head = self.lm_head.packed
        self.lm_head_packed = head

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Attention, lora=None) -> torch.Tensor:
        """[T] token ids -> [T, hidden] final hidden states (after the last norm). `lora` (a
        langrt.model.lora_pass.LoraPass) adds the requests' adapters to the layers (lora_layer.py)."""
        x = self.embed_tokens(input_ids) if self.tp is None else self._embed_vocab_part(input_ids)
        rope = self.rotary.cos_sin(positions, x.dtype)
        if self._layer_tensors is False:  # the weights are final by the first pass
            self._layer_tensors = None if self.compiled or self.tp else fused_layers.layer_tensors(self)
        whole = fused_layers.run(self._layer_tensors, x, rope, attn, self.pass_context.quant) if lora is None else None
        if whole is not None:
            x, residual = whole
        elif lora is not None:
            x, residual = _lora_layers(self.layers, lora, rope, x, attn)
        else:
            residual = None
            for layer in self.layers:
                x, residual = layer(rope, x, residual, attn)
        x, _ = self.norm(x, residual)
        return x

    def _embed_vocab_part(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Tensor parallel: each rank looks up the ids in its vocabulary rows (zeros elsewhere), summed."""
        local, outside = self._vocab_part(input_ids)
        return self.tp.all_reduce(self.embed_tokens(local).masked_fill_(outside[:, None], 0))

    def _vocab_part(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids as rows of this rank's vocabulary part, clamped into it; where they fall outside it)."""
        start, end = self.tp.layout.vocab
        local = token_ids - start
        return local.clamp(0, end - start - 1), (local < 0) | (local >= end - start)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[N, hidden] -> [N, vocab] float32 logits (tensor parallel: on rank 0; None elsewhere)."""
        logits = linear(hidden, self.lm_head_weight, None, self.lm_head_packed).float()
        return logits if self.tp is None else self.tp.gather_vocab(logits)

    def compute_logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits of single tokens: [K] float32, logit of token_ids[k] under hidden[rows[k]] —
        what compute_logits gives at that place (accumulated in float32, rounded to the model's
        dtype), without the rest of the row. Tensor parallel: each id on the rank holding its
        row (zeros elsewhere), summed."""
        if self.tp is None:
            return self._logits_of(hidden, rows, token_ids)
        local, outside = self._vocab_part(token_ids)
        return self.tp.all_reduce(self._logits_of(hidden, rows, local).masked_fill_(outside, 0))

    def _logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.lm_head_packed, QuantizedWeight):
            return self.lm_head_packed.logits_of(hidden, rows, token_ids).float()
        weight = self.lm_head_weight.index_select(0, token_ids).float()
        dots = (weight * hidden.index_select(0, rows).float()).sum(dim=-1)
        return dots.to(hidden.dtype).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors into this model's (fused) parameters; every one must be filled."""
        params = dict(self.named_parameters())
        filled: set[str] = set()
        for hf_name, tensor in weights:
            target = _map_hf_name(hf_name, self.config)
            if target is None:
                continue
            name, offset = target
            if name not in params:
                raise ModelLoadError(f"checkpoint tensor {hf_name} has no place in a {self.config.model_type} model")
            if isinstance(tensor, QuantizedWeight):
                tensor = self._load_quantized(name, offset, tensor)
                if tensor is None:
                    filled.add(f"{name}@{offset}")
                    continue
            param = params[name]
            dest = param.data if offset is None else param.data.narrow(0, offset, tensor.shape[0])
            if dest.shape != tensor.shape:
                raise ModelLoadError(f"{hf_name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(dest.shape)}")
            dest.copy_(tensor)
            filled.add(f"{name}@{offset}")
        missing = [n for n in self._expected_fills() if n not in filled]
        if missing:
            raise ModelLoadError(f"checkpoint is missing {len(missing)} tensors, e.g. {missing[:3]}")
        if not self.config.tie_word_embeddings and self.lm_head.quantized:
            self.lm_head_packed = self.lm_head.packed

    def _load_quantized(self, name: str, offset: int | None, weight: QuantizedWeight) -> torch.Tensor | None:
        """A Linear keeps the blocks (-> None), and so does the embedding on a CPU without tensor
        parallelism (elsewhere it takes their values: -> the tensor to copy); when tied the LM
        head multiplies its blocks."""
        module = self.get_submodule(name.removesuffix(".weight")) if name.endswith(".weight") else None
        if isinstance(module, Linear):
            module.fill_quantized(offset or 0, weight)
            return None
        if name == "embed_tokens.weight" and self.config.tie_word_embeddings:
            self.lm_head_packed = weight
        if name == "embed_tokens.weight" and self.tp is None and self.embed_tokens.weight.device.type == "cpu":
            self.embed_tokens.fill_quantized(weight)  # rows dequantized as they are looked up
            return None
        return weight.dequantize(self.embed_tokens.weight.dtype)

    def _expected_fills(self) -> list[str]:
        c = self.config
        names = []
        for name, _ in self.named_parameters():
            if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
                names += [f"{name}@0", f"{name}@{c.q_size}", f"{name}@{c.q_size + c.kv_size}"]
            elif name.endswith("gate_up_proj.weight"):
                names += [f"{name}@0", f"{name}@{c.intermediate_size}"]
            else:
                names.append(f"{name}@None")
        return names


def _lora_layers(layers, lora, rope: Rope, x: torch.Tensor, attn: Attention) -> tuple[torch.Tensor, torch.Tensor]:
    from langrt.model.lora_layer import forward_layer  # only passes with adapters need it

    residual = None
    for layer in layers:
        x, residual = forward_layer(layer, lora, rope, x, residual, attn)
    return x, residual


ENTRY_CLASS = LlamaForCausalLM

_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _map_hf_name(hf_name: str, c: ModelConfig) -> tuple[str, int | None] | None:
    """HF name -> (our parameter name, row offset into a fused tensor or None); None to skip."""
    if hf_name.endswith(_IGNORED_SUFFIXES):
        return None
    name = hf_name.removeprefix("model.")
    if name == "lm_head.weight" and c.tie_word_embeddings:
        return None
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED:
        fused, index = _FUSED[parts[-2]]
        offsets = (0, c.q_size, c.q_size + c.kv_size) if fused == "qkv_proj" else (0, c.intermediate_size)
        return ".".join(parts[:-2] + [fused, parts[-1]]), offsets[index]
    return name, None
