"""Which langrt module serves a model, by its HF `architectures` name, `model_type` or GGUF
`general.architecture`.

Each native architecture is one module under `langrt.model` that defines `ENTRY_CLASS` (the
torch module) and is listed once in `NATIVE` below; adding an architecture is that module, one
`Arch` line and a test against transformers. Models whose architecture is not listed run
through their own transformers code (`--model-impl transformers`, langrt.model.hf_fallback).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Mapping

from langrt.errors import ModelLoadError
from langrt.server_args import MODEL_IMPLS


@dataclass(frozen=True)
class Arch:
    hf_class: str  # the `architectures` entry of an HF config.json
    model_type: str  # its `model_type`
    module: str  # the langrt module defining ENTRY_CLASS
    gguf: str | None = None  # llama.cpp's `general.architecture`, where langrt loads GGUF files of it
    qkv_bias: bool = False  # q/k/v projections carry a bias unless the config says otherwise
    encoder: bool = False  # bidirectional, embeddings only (--is-embedding; langrt.embeddings)


NATIVE: tuple[Arch, ...] = (
    Arch("LlamaForCausalLM", "llama", "langrt.model.llama", gguf="llama"),
    Arch("MistralForCausalLM", "mistral", "langrt.model.llama"),  # GGUF: arch "llama", told apart by name
    Arch("Qwen2ForCausalLM", "qwen2", "langrt.model.llama", gguf="qwen2", qkv_bias=True),
    Arch("Qwen3ForCausalLM", "qwen3", "langrt.model.qwen3", gguf="qwen3"),
    Arch("Gemma3ForCausalLM", "gemma3_text", "langrt.model.gemma3", gguf="gemma3"),
    Arch("Gemma3ForConditionalGeneration", "gemma3", "langrt.model.gemma3"),  # its language model
    Arch("Phi3ForCausalLM", "phi3", "langrt.model.phi3", gguf="phi3"),
    Arch("MixtralForCausalLM", "mixtral", "langrt.model.mixtral"),  # GGUF: arch "llama" with experts
    Arch("Qwen2MoeForCausalLM", "qwen2_moe", "langrt.model.qwen2_moe", gguf="qwen2moe", qkv_bias=True),
    Arch("Qwen3MoeForCausalLM", "qwen3_moe", "langrt.model.qwen3_moe", gguf="qwen3moe"),
    Arch("OlmoeForCausalLM", "olmoe", "langrt.model.olmoe", gguf="olmoe"),
    Arch("BertModel", "bert", "langrt.model.bert", encoder=True),
)


def native_arch(hf_config: Mapping[str, Any]) -> Arch | None:
    """The native architecture serving this config: by its `architectures` names, else its
    `model_type`; None where langrt has no module for it."""
    names = hf_config.get("architectures") or ()
    for arch in NATIVE:
        if arch.hf_class in names:
            return arch
    model_type = hf_config.get("model_type")
    return next((arch for arch in NATIVE if arch.model_type == model_type), None)


def choose_impl(hf_config: Mapping[str, Any], model_impl: str) -> str:
    """Which code serves this config under --model-impl: "langrt" (a native module) or
    "transformers" (the model's own transformers code, langrt.model.hf_fallback)."""
    if model_impl not in MODEL_IMPLS:
        raise ModelLoadError(f"unknown model implementation {model_impl!r}; choose from {MODEL_IMPLS}")
    native = native_arch(hf_config)
    if model_impl == "transformers" or model_impl == "auto" and native is None:
        return "transformers"
    if native is None:
        names = ", ".join(hf_config.get("architectures") or ()) or "none listed"
        raise ModelLoadError(
            f"--model-impl langrt: langrt has no native module for model_type {hf_config.get('model_type')!r} "
            f"(architectures: {names}); native: {', '.join(a.hf_class for a in NATIVE)}. "
            "--model-impl auto or transformers runs it through its transformers code"
        )
    return "langrt"


def arch_by_model_type(model_type: str) -> Arch:
    arch = next((a for a in NATIVE if a.model_type == model_type), None)
    if arch is None:
        raise ModelLoadError(f"no native langrt module for model_type {model_type!r}; native: {native_model_types()}")
    return arch


def native_model_types() -> list[str]:
    return sorted({arch.model_type for arch in NATIVE})


def gguf_architectures() -> dict[str, Arch]:
    """GGUF `general.architecture` -> the Arch that serves it."""
    return {arch.gguf: arch for arch in NATIVE if arch.gguf is not None}


def model_class(model_type: str) -> type:
    """The torch module class of a native model_type."""
    arch = arch_by_model_type(model_type)
    return importlib.import_module(arch.module).ENTRY_CLASS
