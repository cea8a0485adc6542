"""How hidden states become one vector per input: the pooling mode and whether to normalize.

A sentence-transformers directory says both: `modules.json` lists a Normalize module where the
vectors are unit length, and `1_Pooling/config.json` names the pooling mode. Without those files
the model's own default (or --pooling) decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from langrt.errors import ModelLoadError

POOLING_MODES = ("mean", "last", "cls")
_ST_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last", "pooling_mode_cls_token": "cls"}


@dataclass(frozen=True)
class Pooling:
    mode: str
    normalize: bool

    def __post_init__(self):
        assert self.mode in POOLING_MODES, f"pooling mode must be one of {POOLING_MODES}"

    @classmethod
    def of_model(cls, model_dir: Path, mode: str | None, default: "Pooling") -> "Pooling":
        """The model directory's sentence-transformers settings, else `default`; `mode` (a
        --pooling flag) overrides the mode either way."""
        found = _sentence_transformers_pooling(model_dir) or default
        return cls(mode or found.mode, found.normalize)

    def __call__(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, T, H] hidden states and [B, T] bool mask (True on real tokens, padding on the
        right) -> [B, H] float32 vectors."""
        hidden = hidden.float()
        if self.mode == "mean":
            weights = mask.unsqueeze(-1).float()
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        elif self.mode == "cls":
            pooled = hidden[:, 0]
        else:
            last = mask.sum(1) - 1
            pooled = hidden[torch.arange(hidden.shape[0]), last]
        return torch.nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled


def _sentence_transformers_pooling(model_dir: Path) -> Pooling | None:
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text())
        normalize = any(m.get("type", "").endswith("models.Normalize") for m in modules)
        pooling_dir = next(m["path"] for m in modules if m.get("type", "").endswith("models.Pooling"))
        settings = json.loads((model_dir / pooling_dir / "config.json").read_text())
    except (OSError, ValueError, StopIteration, KeyError) as e:
        raise ModelLoadError(
            f"{model_dir}: unreadable sentence-transformers pooling settings ({e}); fix or remove modules.json"
        )
    modes = [mode for key, mode in _ST_MODES.items() if settings.get(key)]
    if len(modes) != 1:
        raise ModelLoadError(
            f"{model_dir}: pooling config asks for {modes or 'no supported mode'}; langrt pools with one of {POOLING_MODES}"
        )
    return Pooling(modes[0], normalize)
