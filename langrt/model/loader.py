"""Build the torch module of a model and fill its weights (from a `ModelSource`, or `dummy`:
seeded random values for a given config, for benchmarks of an architecture)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable

import torch

from langrt.errors import ModelLoadError
from langrt.model.config import ModelConfig
from langrt.model.registry import model_class
from langrt.model.quant import PLAIN_QUANTIZATIONS
from langrt.model.quant_choice import dense_copy_budget
from langrt.model.source import ModelSource

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


def load_model(
    source: ModelSource,
    config: ModelConfig,
    load_format: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    progress: bool = True,
    compiled: bool = False,
    gguf_blocks: bool = False,
    quantize: str | None = None,
    shard: Callable[[Iterable], Iterable] | None = None,
    tp=None,
    dense_copy: bool = False,
) -> torch.nn.Module:
    """Build the model on `device` in `dtype` with real (or dummy) weights, in eval mode; with
    `gguf_blocks` a GGUF file's quantized matrices keep their blocks, with `quantize` ('int8',
    'int4') plain weights are quantized into blocks (see langrt.model.quant). Under tensor
    parallelism `config` is this rank's part, `shard` takes its slices of the checkpoint's
    tensors and `tp` (langrt.parallel.group) sums and gathers the ranks' partial results. With
    `dense_copy` (--cpu-dense-copy) quantized matrices also keep a bfloat16 copy where it fits."""
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"unknown load format {load_format!r}; choose from {LOAD_FORMATS}")
    if load_format == "gguf" and not source.is_gguf or load_format == "safetensors" and source.is_gguf:
        raise ModelLoadError(f"load format {load_format!r} does not match model path {source.path}")
    if config.impl == "transformers":  # the model's own transformers code over langrt's attention
        from langrt.model.hf_fallback import load_transformers_model

        return load_transformers_model(source, config, load_format, dtype, device, seed, compiled, quantize, tp)
    with torch.device(device), _default_dtype(dtype):
        model = model_class(config.model_type)(config, compiled)  # parameters uninitialized: filled below
    model.set_tensor_parallel(tp)
    if load_format == "dummy":
        _fill_dummy(model, seed)
    else:
        weights = source.iter_weights(dtype, progress, gguf_blocks=gguf_blocks)
        model.load_weights(weights if shard is None else shard(weights))
    model.eval().requires_grad_(False)
    if quantize is not None:
        model.quantize_weights(*PLAIN_QUANTIZATIONS[quantize])
    if not compiled:  # compiled graphs take plain weights (the compiler packs its own)
        model.pack_for_cpu(dense_budget=dense_copy_budget() if dense_copy else 0)
    return model


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Parameters are created in the serving dtype directly (no float32 copy first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _fill_dummy(model: torch.nn.Module, seed: int) -> None:
    """Seeded N(0, 0.02) weights and unit norms: a model of the right shape and cost. Drawn on
    the model's device: an 8B model's values take minutes on one CPU core, seconds on a GPU (so
    a seed gives other values on CUDA than on CPU)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "norm.weight":
            param.data.fill_(1.0)
        else:
            values = torch.randn(param.shape, generator=gen, dtype=torch.float32, device=device) * 0.02
            param.data.copy_(values)
