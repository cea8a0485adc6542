"""Find a model's config and weights and build the torch module.

Sources: an HF directory (config.json + *.safetensors), a GGUF file, or `dummy` weights (seeded
random values for a given config, for benchmarks of an architecture). `model_path=None` is the
built-in model everywhere.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from langrt.errors import ModelLoadError
from langrt.model.config import ModelConfig
from langrt.model.llama import LlamaForCausalLM

LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")


@dataclass(frozen=True)
class ModelSource:
    """Where a model lives: `path` is an HF directory or a .gguf file."""

    path: Path
    is_gguf: bool

    @classmethod
    def resolve(cls, model_path: str | Path | None) -> "ModelSource":
        if model_path is None:
            from langrt.builtin import builtin_model_path

            return cls(builtin_model_path(), is_gguf=True)
        path = Path(model_path).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            return cls(path, is_gguf=True)
        if path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            if not (path / "config.json").exists() and len(ggufs) == 1:
                return cls(ggufs[0], is_gguf=True)
            return cls(path, is_gguf=False)
        raise ModelLoadError(
            f"model path {str(model_path)!r} is neither an HF model directory nor a .gguf file "
            "(langrt never downloads models: pass a local path, or omit it for the built-in model)"
        )

    def hf_config(self) -> dict:
        if self.is_gguf:
            return self._gguf().hf_config
        config_file = self.path / "config.json"
        if not config_file.is_file():
            raise ModelLoadError(f"{self.path} has no config.json")
        return json.loads(config_file.read_text())

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_hf_dict(self.hf_config())

    def _gguf(self):
        from langrt.model.gguf_loader import GGUFFile

        return GGUFFile(self.path)

    def iter_weights(self, dtype: torch.dtype, progress: bool) -> Iterator[tuple[str, torch.Tensor]]:
        from tqdm import tqdm  # here: importing it creates a multiprocessing lock

        if self.is_gguf:
            gguf = self._gguf()
            yield from tqdm(gguf.iter_weights(dtype), total=gguf.num_tensors, desc="Loading GGUF", disable=not progress)
            return
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{self.path} has no *.safetensors files")
        from safetensors import safe_open

        for file in tqdm(files, desc="Loading safetensors", disable=not progress or len(files) < 2):
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name).to(dtype)


def load_model(
    source: ModelSource,
    config: ModelConfig,
    load_format: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    progress: bool = True,
) -> LlamaForCausalLM:
    """Build the model on `device` in `dtype` with real (or dummy) weights, in eval mode."""
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"unknown load format {load_format!r}; choose from {LOAD_FORMATS}")
    if load_format == "gguf" and not source.is_gguf or load_format == "safetensors" and source.is_gguf:
        raise ModelLoadError(f"load format {load_format!r} does not match model path {source.path}")
    with torch.device(device), _default_dtype(dtype):
        model = LlamaForCausalLM(config)  # parameters uninitialized: filled below
    if load_format == "dummy":
        _fill_dummy(model, seed)
    else:
        model.load_weights(source.iter_weights(dtype, progress))
    return model.eval().requires_grad_(False)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Parameters are created in the serving dtype directly (no float32 copy first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _fill_dummy(model: LlamaForCausalLM, seed: int) -> None:
    """Seeded N(0, 0.02) weights and unit norms: a model of the right shape and cost."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("layernorm.weight") or name == "norm.weight":
            param.data.fill_(1.0)
        else:
            values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.02
            param.data.copy_(values)
