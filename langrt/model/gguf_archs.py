"""What each GGUF architecture (llama.cpp's `general.architecture`) means in HF terms.

A `GGUFArch` gives the HF class a file's tensors load into, the map from llama.cpp's per-layer
tensor names to HF module paths, whether llama.cpp's converter permuted the q/k rows, how its
norm weights are stored, and the config.json keys the metadata does not spell the llama way.
`langrt.model.registry` says which of them langrt serves natively (`Arch.gguf`); this module
only knows the file format.

Facts from llama.cpp's converter (convert_hf_to_gguf.py) and its model graphs (src/models/):
- Llama-arch files permute q/k rows (see gguf_loader._unpermute_rows); the others keep HF's
  rotate-half layout (llama.cpp runs them with NEOX rope).
- Gemma stores every RMSNorm weight as 1 + w (HF's Gemma norms multiply by 1 + w); transformers'
  GGUF loader subtracts 1 again (Gemma2TensorProcessor), and so does langrt.
- Gemma 3's sliding layers are 5 of every 6, their rope base 10,000 and the query scale
  1/sqrt(head_dim) (1/sqrt(hidden/heads) on the 62-layer 27B): llama.cpp hard-codes these
  (llama-model.cpp, LLM_ARCH_GEMMA3), the files do not store them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol

from langrt.model.gguf_chat_templates import GEMMA_CHAT_TEMPLATE

# llama.cpp layer tensor -> HF module path under model.layers.N, shared by Llama-like models.
_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA3_LAYER = {
    **_LLAMA_LAYER,
    **_QK_NORM,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",  # Gemma's norm before the MLP, llama's name for it
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Mixture-of-experts layers: the router, each projection's experts stacked [experts, rows, cols]
# (split per expert by hf_parameters), and Qwen2-MoE's shared expert with its sigmoid gate.
_MOE = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj_stacked",
    "ffn_up_exps": "mlp.experts.up_proj_stacked",
    "ffn_down_exps": "mlp.experts.down_proj_stacked",
}
_SHARED_EXPERT = {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_STACKED = re.compile(r"(.*\.mlp\.experts)\.(gate|up|down)_proj_stacked\.weight")

# llama.cpp's fixed Gemma 3 values (see the module docstring).
_GEMMA3_PATTERN = 6
_GEMMA3_LOCAL_BASE = 10000.0
_PHI3_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",  # the converter keeps HF's fused [gate; up] under ffn_up
    "ffn_down": "mlp.down_proj",
}


class ArchFile(Protocol):
    """What a config hook reads from the file (gguf_loader.GGUFFile)."""

    def arch_key(self, key: str, default: Any = None) -> Any: ...  # metadata, without the arch prefix

    def vector(self, name: str) -> list[float] | None: ...  # a float tensor's values, None if absent


@dataclass(frozen=True)
class GGUFArch:
    """How one llama.cpp architecture's files map onto an HF model."""

    name: str  # general.architecture
    model_type: str
    hf_class: str
    layer_names: Mapping[str, str]  # blk.N.<key> -> model.layers.N.<value>
    permuted: bool = False  # q/k rows in llama.cpp's interleaved order (llama, mistral)
    norm_offset: float = 0.0  # stored norm weight = HF weight + norm_offset
    # Tensors that carry no parameter (rope factors: folded into the config).
    non_parameters: frozenset[str] = field(default_factory=frozenset)
    # (the file, the Llama-style config built from it) -> the architecture's config.
    config_hook: Callable[[ArchFile, dict[str, Any]], dict[str, Any]] | None = None
    default_chat_template: str | None = None  # when the file has none (llama.cpp's built-in templates)
    end_of_turn: tuple[str, ...] = ()  # tokens that end a turn besides EOS (HF's generation_config eos list)


def _gemma3_config(file: ArchFile, base: dict[str, Any]) -> dict[str, Any]:
    """Gemma3TextConfig's keys, as transformers 5 writes them into config.json."""
    key = file.arch_key
    layers, head_dim = base["num_hidden_layers"], base["head_dim"]
    full = {"rope_type": "default", "rope_theta": base["rope_theta"]}
    if base["rope_scaling"] is not None:  # Gemma 3 4B+: linear scaling, global layers only
        full = {**base["rope_scaling"], "rope_theta": base["rope_theta"]}
    local = {"rope_type": "default", "rope_theta": float(key("rope.freq_base_swa", _GEMMA3_LOCAL_BASE))}
    scalar = base["hidden_size"] // base["num_attention_heads"] if layers == 62 else head_dim
    llama_only = ("hidden_act", "rope_theta", "rope_scaling")
    return {k: v for k, v in base.items() if k not in llama_only} | {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": scalar,
        "sliding_window": key("attention.sliding_window"),
        "layer_types": _gemma3_layer_types(key("attention.sliding_window_pattern"), layers),
        "_sliding_window_pattern": _GEMMA3_PATTERN,
        "rope_parameters": {"sliding_attention": local, "full_attention": full},
        "final_logit_softcapping": key("final_logit_softcapping"),
        "attn_logit_softcapping": key("attn_logit_softcapping"),
        "use_bidirectional_attention": False,
    }


def _gemma3_layer_types(pattern: Any, layers: int) -> list[str]:
    """Per-layer attention kinds: newer converters store the pattern (one bool per layer, true
    for sliding); older ones (and the files seen so far) leave it to llama.cpp's fixed 6."""
    if isinstance(pattern, list) and len(pattern) == layers:
        return ["sliding_attention" if sliding else "full_attention" for sliding in pattern]
    return ["full_attention" if (i + 1) % _GEMMA3_PATTERN == 0 else "sliding_attention" for i in range(layers)]


def _phi3_config(file: ArchFile, base: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 / Phi-4-mini: partial rotary (Phi-4-mini rotates 3/4 of each head), a sliding
    window, and LongRoPE's per-frequency factors, which the converter stores as two tensors."""
    rotary = file.arch_key("rope.dimension_count") or base["head_dim"]
    config = base | {
        "partial_rotary_factor": rotary / base["head_dim"],
        "sliding_window": file.arch_key("attention.sliding_window"),
    }
    original = file.arch_key("rope.scaling.original_context_length")
    if original is not None:
        config["original_max_position_embeddings"] = original
    long, short = file.vector("rope_factors_long.weight"), file.vector("rope_factors_short.weight")
    if long is not None and short is not None:
        config["rope_scaling"] = {"rope_type": "longrope", "long_factor": long, "short_factor": short}
    return config


def _moe_config(norm_topk_prob: bool, **fixed: Any) -> Callable[[ArchFile, dict[str, Any]], dict[str, Any]]:
    """Qwen2-MoE / Qwen3-MoE / OLMoE: expert counts and sizes from the metadata. Whether the
    chosen experts' weights are renormalized is not stored: llama.cpp fixes it per architecture
    (false for qwen2moe and olmoe, true for qwen3moe), and so do the HF configs."""

    def hook(file: ArchFile, base: dict[str, Any]) -> dict[str, Any]:
        config = (
            base
            | fixed
            | {
                "num_experts": file.arch_key("expert_count"),
                "num_experts_per_tok": file.arch_key("expert_used_count"),
                "moe_intermediate_size": file.arch_key("expert_feed_forward_length", base["intermediate_size"]),
                "norm_topk_prob": norm_topk_prob,
            }
        )
        shared = file.arch_key("expert_shared_feed_forward_length")
        if shared is not None:
            config["shared_expert_intermediate_size"] = shared
        return config

    return hook


def _olmoe_config(file: ArchFile, base: dict[str, Any]) -> dict[str, Any]:
    """OLMoE's config calls the expert size intermediate_size."""
    experts = file.arch_key("expert_feed_forward_length", base["intermediate_size"])
    return base | {
        "num_experts": file.arch_key("expert_count"),
        "num_experts_per_tok": file.arch_key("expert_used_count"),
        "intermediate_size": experts,
        "norm_topk_prob": False,
    }


def _mixtral_config(file: ArchFile, base: dict[str, Any]) -> dict[str, Any]:
    experts = {
        "num_local_experts": file.arch_key("expert_count"),
        "num_experts_per_tok": file.arch_key("expert_used_count"),
    }
    return base | experts


def hf_parameters(name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
    """The HF parameters one GGUF tensor holds: a stacked experts tensor [experts, rows, cols] is
    one matrix per expert, under the names transformers' save_pretrained writes (views of it; or
    a list of each expert's QuantizedWeight, kept as blocks); the shared expert's gate, a vector
    in GGUF, is HF's [1, hidden]."""
    stacked = _STACKED.fullmatch(name)
    if stacked is not None:
        for expert in range(len(tensor)):
            yield f"{stacked[1]}.{expert}.{stacked[2]}_proj.weight", tensor[expert]
    elif name.endswith(".shared_expert_gate.weight"):
        yield name, tensor.reshape(1, -1)
    else:
        yield name, tensor


_ROPE_FREQS = frozenset({"rope_freqs.weight"})  # llama3 factors, folded into rope_scaling
_MOE_DEFAULTS = {"decoder_sparse_step": 1, "mlp_only_layers": []}  # every layer sparse, as llama.cpp runs them


ARCHITECTURES: dict[str, GGUFArch] = {
    a.name: a
    for a in (
        GGUFArch("llama", "llama", "LlamaForCausalLM", _LLAMA_LAYER, permuted=True, non_parameters=_ROPE_FREQS),
        GGUFArch("qwen2", "qwen2", "Qwen2ForCausalLM", _LLAMA_LAYER),
        GGUFArch("qwen3", "qwen3", "Qwen3ForCausalLM", {**_LLAMA_LAYER, **_QK_NORM}),
        GGUFArch(
            "gemma3",
            "gemma3_text",
            "Gemma3ForCausalLM",
            _GEMMA3_LAYER,
            norm_offset=1.0,
            config_hook=_gemma3_config,
            default_chat_template=GEMMA_CHAT_TEMPLATE,
            end_of_turn=("<end_of_turn>",),
        ),
        GGUFArch(
            "phi3",
            "phi3",
            "Phi3ForCausalLM",
            _PHI3_LAYER,
            non_parameters=frozenset({"rope_factors_long.weight", "rope_factors_short.weight"}),
            config_hook=_phi3_config,
        ),
        GGUFArch(
            "qwen2moe",
            "qwen2_moe",
            "Qwen2MoeForCausalLM",
            _LLAMA_LAYER | _MOE | _SHARED_EXPERT,
            config_hook=_moe_config(False, **_MOE_DEFAULTS),
        ),
        GGUFArch(
            "qwen3moe",
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            _LLAMA_LAYER | _QK_NORM | _MOE,
            config_hook=_moe_config(True, **_MOE_DEFAULTS),
        ),
        GGUFArch("olmoe", "olmoe", "OlmoeForCausalLM", _LLAMA_LAYER | _QK_NORM | _MOE, config_hook=_olmoe_config),
    )
}
MIXTRAL = GGUFArch(
    "llama",
    "mixtral",
    "MixtralForCausalLM",
    _LLAMA_LAYER | _MOE,
    permuted=True,
    non_parameters=_ROPE_FREQS,
    config_hook=_mixtral_config,
)
# Stored as arch "llama" and told apart by name, as llama.cpp and transformers do.
MISTRAL = GGUFArch("llama", "mistral", "MistralForCausalLM", _LLAMA_LAYER, permuted=True, non_parameters=_ROPE_FREQS)
