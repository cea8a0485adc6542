"""Where a model lives: an HF directory (config.json + *.safetensors) or a GGUF file.

`model_path=None` is the built-in model everywhere. Torch is imported only when weights are read,
so the main process can resolve a model and its tokenizer without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from langrt.errors import ModelLoadError
from langrt.model import registry
from langrt.model.config import ModelConfig

if TYPE_CHECKING:
    import torch


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

    def model_config(self, model_impl: str = "auto") -> ModelConfig:
        """The model's config, for the code --model-impl picks (see registry.choose_impl)."""
        hf = self.hf_config()
        if registry.choose_impl(hf, model_impl) == "transformers":
            from langrt.model.hf_fallback_config import fallback_model_config

            return fallback_model_config(self, hf)
        return ModelConfig.from_hf_dict(hf)

    def _gguf(self):
        from langrt.model.gguf_loader import GGUFFile

        return GGUFFile(self.path)

    def iter_weights(self, dtype: torch.dtype, progress: bool, gguf_blocks: bool = False) -> Iterator[tuple[str, Any]]:
        """(HF name, tensor) pairs; with `gguf_blocks`, a GGUF file's quantized matrices come as
        QuantizedWeight (see GGUFFile.iter_weights)."""
        from tqdm import tqdm  # here: importing it creates a multiprocessing lock

        if self.is_gguf:
            gguf = self._gguf()
            weights = gguf.iter_weights(dtype, quantized=gguf_blocks)
            yield from tqdm(weights, total=gguf.num_tensors, desc="Loading GGUF", disable=not progress)
            return
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"{self.path} has no *.safetensors files")
        from safetensors import safe_open  # torch-backed: only when weights are read

        for file in tqdm(files, desc="Loading safetensors", disable=not progress or len(files) < 2):
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name).to(dtype)
