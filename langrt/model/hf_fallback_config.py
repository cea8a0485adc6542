"""ModelConfig of a model served through its own transformers code (--model-impl transformers).

The KV pool and the attention backends need a few numbers (layers, KV heads, head size,
vocabulary, context, sliding window); transformers' config classes read them under one set of
names whatever the checkpoint calls them (GPT-2's `n_embd` is `hidden_size`), so they are read
from `AutoConfig`, not from the raw config.json. The main process checks a model with this
module before any process starts (importing the model's transformers code, and torch, only for
a model that runs on it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from langrt.errors import ModelLoadError
from langrt.model import registry
from langrt.model.config import ModelConfig, _as_tuple

if TYPE_CHECKING:
    from langrt.model.source import ModelSource
    from langrt.server_args import ServerArgs


def fallback_model_config(source: ModelSource, hf: Mapping[str, Any]) -> ModelConfig:
    """The numbers langrt needs of a model its transformers code runs; raises ModelLoadError
    where transformers cannot serve it as a causal LM over langrt's attention."""
    text = transformers_config(source, hf).get_text_config()
    if getattr(text, "final_logit_softcapping", None):  # near the identity on small logits: the probe misses it
        raise ModelLoadError(
            f"{source.path}: {text.model_type} caps its logits (final_logit_softcapping), which langrt does not"
        )
    heads = _number(text, "num_attention_heads")
    hidden = _number(text, "hidden_size")
    window, layer_windows = _windows(text, source)
    return ModelConfig(
        model_type=text.model_type or hf.get("model_type"),
        vocab_size=_number(text, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=getattr(text, "intermediate_size", None) or 0,
        num_layers=_number(text, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or hidden // heads,
        rms_norm_eps=getattr(text, "rms_norm_eps", None) or getattr(text, "layer_norm_eps", None) or 1e-6,
        rope_theta=10000.0,  # the model's own code applies its rotary; langrt's is unused
        rope_scaling=None,
        max_position_embeddings=getattr(text, "max_position_embeddings", None) or 4096,
        tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
        attention_bias=bool(getattr(text, "attention_bias", False)),
        sliding_window=window,
        bos_token_id=hf.get("bos_token_id", getattr(text, "bos_token_id", None)),
        eos_token_ids=_as_tuple(hf.get("eos_token_id", getattr(text, "eos_token_id", None))),
        hf=dict(hf),
        impl="transformers",
        layer_windows=layer_windows,
    )


def transformers_config(source: ModelSource, hf: Mapping[str, Any]):
    """transformers' config object of the model, or a ModelLoadError naming why there is none."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    what = _describe(hf)
    if source.is_gguf:
        raise ModelLoadError(
            f"{source.path}: {what} would run through its transformers code, which langrt loads from an HF "
            "directory (config.json + *.safetensors), not a GGUF file; use the model's HF checkpoint"
        )
    if hf.get("auto_map"):
        raise ModelLoadError(
            f"{source.path}: {what} ships its own modeling code (config.json's auto_map); langrt runs only the "
            f"architectures it implements ({_native()}) and those the installed transformers has"
        )
    try:
        config = AutoConfig.from_pretrained(source.path, local_files_only=True)
    except (ValueError, KeyError, OSError) as e:
        raise ModelLoadError(
            f"{source.path}: {what} is served neither natively by langrt ({_native()}) nor by the installed "
            f"transformers {transformers.__version__} ({_first_line(e)})"
        ) from None
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"{source.path}: {what}: transformers {transformers.__version__} knows model_type {config.model_type!r} "
            "but has no causal LM (text generation) class for it, so langrt cannot serve it"
        )
    causal_lm_class(config)
    return config


def causal_lm_class(config) -> type:
    """transformers' causal LM class of a config (importing its modeling code, and torch), if
    its code takes a custom attention function, as langrt's paged attention is plugged in."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    if not getattr(model_class, "_supports_attention_backend", False):
        raise ModelLoadError(
            f"{model_class.__name__}'s transformers code does not take a custom attention function "
            "(_supports_attention_backend is off), so langrt's paged attention cannot run inside it"
        )
    return model_class


def _windows(text, source: ModelSource) -> tuple[int | None, tuple[int | None, ...]]:
    """(the sliding window, each layer's: the window or None for full attention) as the model's
    transformers code assigns them: by its config's `layer_types` where it has them."""
    window = getattr(text, "sliding_window", None)
    kinds = getattr(text, "layer_types", None)
    if kinds is None:
        uniform = int(window) if window and getattr(text, "use_sliding_window", True) is not False else None
        return uniform, (uniform,) * text.num_hidden_layers
    unknown = sorted(set(kinds) - {"full_attention", "sliding_attention"})
    if unknown or len(kinds) != text.num_hidden_layers:
        raise ModelLoadError(
            f"{source.path}: {text.model_type} has layers of kinds {unknown or kinds}; langrt's attention backends "
            "compute full and sliding-window attention, one kind per layer"
        )
    per_layer = tuple(int(window) if kind == "sliding_attention" and window else None for kind in kinds)
    return next((w for w in per_layer if w is not None), None), per_layer


def _number(text, name: str) -> int:
    value = getattr(text, name, None)
    if not isinstance(value, int) or value <= 0:
        raise ModelLoadError(
            f"{text.model_type} config has no usable {name} ({value!r}); langrt sizes its KV pool by it"
        )
    return value


def _describe(hf: Mapping[str, Any]) -> str:
    names = ", ".join(hf.get("architectures") or ()) or "no architectures listed"
    return f"model_type {hf.get('model_type')!r} ({names})"


def _native() -> str:
    return "native: " + ", ".join(arch.hf_class for arch in registry.NATIVE)


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def check_model_servable(args: ServerArgs) -> None:
    """Raise ModelLoadError in the calling process where no code serves the model under
    --model-impl, or the code that would has no support for the options asked for, before any
    process starts (the scheduler's refusal would show only in its log). An HF directory's
    config is read here; a GGUF file's reader makes its own refusals when it loads, so it is
    read only when transformers is asked for (which refuses it)."""
    from langrt.model.source import ModelSource

    source = ModelSource.resolve(args.model_path)
    if source.is_gguf and args.model_impl != "transformers":
        return
    config = source.model_config(args.model_impl)
    native_only = {
        f"--tp-size {args.tp_size}": args.tp_size > 1,
        f"--quantization {args.quantization}": args.quantization in ("int8", "int4"),
        "--enable-torch-compile": args.enable_torch_compile,
    }
    asked = [flag for flag, on in native_only.items() if on]
    if config.impl == "transformers" and asked:
        raise ModelLoadError(
            f"{', '.join(asked)}: langrt applies it to its native modules only, and {config.model_type} runs "
            "through its transformers code; leave it off"
        )
