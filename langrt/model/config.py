"""ModelConfig: the architecture numbers langrt needs, read from an HF config.json dict.

GGUF files are turned into the same dict by `gguf_loader.GGUFFile.hf_config`, so there is one
parser for every source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from langrt.errors import ModelLoadError
from langrt.model import attention_layout, registry

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
_ROPE_TYPE_ALIASES = {"su": "longrope"}  # Phi-3's first configs


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Mapping[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    sliding_window: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # The whole config.json dict: the architecture modules read their own keys from it.
    hf: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # Which code runs the model: "langrt" (its native module) or "transformers" (its own
    # transformers code over langrt's paged attention, langrt.model.hf_fallback).
    impl: str = "langrt"
    # Each layer's sliding window (None: full attention); empty: `sliding_window` on every layer.
    layer_windows: tuple[int | None, ...] = ()
    # The factor on q.k before the softmax; None: head_dim ** -0.5.
    attention_scale: float | None = None

    def __post_init__(self):
        assert self.num_heads % self.num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def window_of(self, layer_id: int) -> int | None:
        """Layer `layer_id`'s sliding window, None for full attention."""
        return self.layer_windows[layer_id] if self.layer_windows else self.sliding_window

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5 if self.attention_scale is None else self.attention_scale

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        d = attention_layout.text_part(d)
        arch = registry.native_arch(d)
        if arch is None:
            raise ModelLoadError(
                f"unsupported model_type {d.get('model_type')!r}; langrt serves {registry.native_model_types()}"
            )
        model_type = arch.model_type
        num_heads = d["num_attention_heads"]
        hidden = d["hidden_size"]
        rope_theta, rope_scaling = _rope_settings(d)
        head_dim = d.get("head_dim") or hidden // num_heads
        window = _sliding_window(d)
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", d.get("qkv_bias", arch.qkv_bias))),  # qkv_bias: Qwen2-MoE's
            sliding_window=window,
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=_as_tuple(d.get("eos_token_id")),
            hf=dict(d),
            layer_windows=attention_layout.layer_windows(d, d["num_hidden_layers"], window),
            attention_scale=attention_layout.attention_scale(d, head_dim),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise ModelLoadError(f"{path} has no config.json; expected an HF model directory or a .gguf file")
        return cls.from_hf_dict(json.loads(config_file.read_text()))


def _rope_settings(d: Mapping[str, Any]) -> tuple[float, Mapping[str, Any] | None]:
    """(theta, scaling) from either the transformers<5 keys or the newer `rope_parameters`."""
    params = d.get("rope_parameters")
    if params:
        theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
        scaling = params if params.get("rope_type", "default") != "default" else None
    else:
        theta = d.get("rope_theta", 10000.0)
        scaling = d.get("rope_scaling")
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        rope_type = _ROPE_TYPE_ALIASES.get(rope_type, rope_type)
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(f"unsupported rope scaling {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
        scaling = dict(scaling, rope_type=rope_type)
        if rope_type == "longrope" and d.get(
            "original_max_position_embeddings"
        ):  # Phi-3's place for it, which HF prefers
            scaling["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    return float(theta), scaling


def _sliding_window(d: Mapping[str, Any]) -> int | None:
    window = d.get("sliding_window")
    if d.get("model_type") in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not d.get("use_sliding_window", False):
        return None
    return int(window) if window else None


def _as_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)
