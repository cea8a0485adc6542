"""The shape HF gives each parameter of a model with a given config.json dict: what a GGUF
tensor must have, so that a file whose metadata and tensors disagree fails at load, naming the
tensor, instead of misbehaving later.

Stacked expert tensors (`mlp.experts.<part>_proj_stacked`, GGUF's ffn_<part>_exps) are
[experts, rows, cols]; langrt.model.gguf_archs.hf_parameters splits them per expert.
"""

from __future__ import annotations

from typing import Any


def expected_shape(name: str, config: dict[str, Any]) -> tuple[int, ...]:
    """The shape HF gives parameter `name` in a model with this config."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (vocab, hidden)
    if name == "model.norm.weight":
        return (hidden,)
    layer, module, kind = name.split(".", 3)[2], name.split(".")[-2], name.split(".")[-1]
    if int(layer) >= config["num_hidden_layers"]:
        return (0,)  # no such layer: never matches
    if module.endswith("_stacked"):
        rows, cols = _matrix_shapes(config, _experts_intermediate(config))[module.removesuffix("_stacked")]
        return (_num_experts(config), rows, cols)
    inter = config.get("shared_expert_intermediate_size") if ".shared_expert." in name else config["intermediate_size"]
    rows, cols = _matrix_shapes(config, inter)[module]
    return (rows,) if kind == "bias" or cols is None else (rows, cols)


def _matrix_shapes(config: dict[str, Any], inter: int) -> dict[str, tuple[int, int | None]]:
    """(rows, cols) by module name; cols None for vectors (norms)."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim
    # OLMoE normalizes q and k whole (one weight over every head); Qwen3 and Gemma 3 per head.
    whole = config["model_type"] == "olmoe"
    return {
        "input_layernorm": (hidden, None),
        "post_attention_layernorm": (hidden, None),
        "pre_feedforward_layernorm": (hidden, None),
        "post_feedforward_layernorm": (hidden, None),
        "q_norm": (q_size if whole else head_dim, None),
        "k_norm": (kv_size if whole else head_dim, None),
        "qkv_proj": (q_size + 2 * kv_size, hidden),
        "gate_up_proj": (2 * inter, hidden),
        "q_proj": (q_size, hidden),
        "k_proj": (kv_size, hidden),
        "v_proj": (kv_size, hidden),
        "o_proj": (hidden, q_size),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
        "gate": (_num_experts(config), hidden),  # the router
        "shared_expert_gate": (hidden, None),  # a vector in GGUF, [1, hidden] in HF (hf_parameters)
    }


def _num_experts(config: dict[str, Any]) -> int:
    return config.get("num_experts") or config.get("num_local_experts") or 0


def _experts_intermediate(config: dict[str, Any]) -> int:
    return config.get("moe_intermediate_size") or config["intermediate_size"]
