"""Per-layer attention settings read from an HF config dict: each layer's sliding window and the
softmax scale, and the text part of a multimodal config.

Torch-free (ModelConfig is parsed in processes that never load weights).
"""

from __future__ import annotations

from typing import Any, Mapping

from langrt.errors import ModelLoadError

SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' default for Gemma 3 configs that name neither `layer_types` nor a pattern: five
# sliding layers, then a full one.
GEMMA3_PATTERN = 6
_GEMMA3_TYPES = ("gemma3", "gemma3_text")


def text_part(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal config (Gemma 3's `gemma3`) nests its language model's numbers under
    `text_config`: that dict, with the outer config's token ids, tying and `architectures` (which
    name the checkpoint's layout) over it. Other configs as they are."""
    text = d.get("text_config")
    if "hidden_size" in d or not isinstance(text, Mapping):
        return d
    outer = {k: d[k] for k in ("bos_token_id", "eos_token_id", "tie_word_embeddings") if k in d}
    return {**text, **outer, "architectures": d.get("architectures", [])}


def layer_windows(d: Mapping[str, Any], num_layers: int, window: int | None) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: full attention), as transformers assigns them:
    `layer_types` where given; else Gemma's `sliding_window_pattern` (every pattern-th layer
    full); else Qwen's `max_window_layers` (layers from it on slide); else every layer alike."""
    if window is None:
        return (None,) * num_layers
    kinds = d.get("layer_types")
    if kinds is None and (d.get("sliding_window_pattern") or d.get("model_type") in _GEMMA3_TYPES):
        pattern = d.get("sliding_window_pattern") or GEMMA3_PATTERN
        kinds = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]
    elif kinds is None and d.get("max_window_layers") is not None:
        kinds = [SLIDING if i >= d["max_window_layers"] else FULL for i in range(num_layers)]
    if kinds is None:
        return (window,) * num_layers
    unknown = sorted(set(kinds) - {SLIDING, FULL})
    if unknown or len(kinds) != num_layers:
        raise ModelLoadError(
            f"layer_types {unknown or kinds!r}: langrt serves {SLIDING!r} and {FULL!r} layers, one per layer "
            f"({num_layers}); this model needs --model-impl transformers"
        )
    return tuple(window if kind == SLIDING else None for kind in kinds)


def layer_is_sliding(d: Mapping[str, Any], num_layers: int) -> tuple[bool, ...]:
    """Which layers are sliding-window layers by the config's layer kinds, whether or not a window
    is set (Gemma rotates them with their own base either way)."""
    return tuple(window is not None for window in layer_windows(d, num_layers, window=1))


def attention_scale(d: Mapping[str, Any], head_dim: int) -> float:
    """The factor on q.k before the softmax: Gemma's query_pre_attn_scalar ** -0.5 where the
    config has one, else head_dim ** -0.5."""
    scalar = d.get("query_pre_attn_scalar")
    return float(scalar) ** -0.5 if scalar else head_dim**-0.5
