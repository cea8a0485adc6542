"""A draft model made from a model itself, with nothing to download: its embedding, some of its
layers (the first N, or any list: skipping middle layers keeps more of the model's behaviour
than an early exit), its final norm and its LM head, saved as an HF directory (config.json,
safetensors, the model's tokenizer) that --speculative-draft-model-path takes.

It costs kept/total layers of a pass; it was never trained to stand alone, so its argmax agrees
with the full model's only part of the time (measured on SmolLM2 in benchmarks/README.md). It
is the draft the benchmark (benchmarks/bench_speculative.py) uses for the built-in model, which
has no smaller sibling on PyPI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def write_truncated_model(model_path, out_dir, layers: int | Sequence[int], dtype: str = "float32") -> Path:
    """Write the model at `model_path` (an HF directory or a .gguf file; None: the built-in
    model) with only some of its layers to `out_dir`: `layers` = N keeps the first N, a list
    keeps those (in order: [0, 1, 2, 27, 28, 29] skips the middle). -> out_dir."""
    import torch
    from safetensors.torch import save_file

    from langrt.model.source import ModelSource
    from langrt.tokenizer.loader import load_tokenizer

    source = ModelSource.resolve(model_path)
    config = source.hf_config()
    total = config["num_hidden_layers"]
    kept_layers = list(range(layers)) if isinstance(layers, int) else list(layers)
    if not kept_layers or any(not 0 <= i < total for i in kept_layers) or len(set(kept_layers)) < len(kept_layers):
        raise ValueError(f"layers must name distinct layers in [0, {total}) of {source.path}; got {layers}")
    renumber = {old: new for new, old in enumerate(kept_layers)}
    kept = {}
    for name, tensor in source.iter_weights(getattr(torch, dtype), progress=False):
        layer = _LAYER.match(name)
        if layer is None:
            kept[name] = tensor.contiguous()
        elif int(layer.group(1)) in renumber:
            kept[f"model.layers.{renumber[int(layer.group(1))]}.{name[layer.end() :]}"] = tensor.contiguous()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(out / "model.safetensors"))
    config.update(num_hidden_layers=len(kept_layers), torch_dtype=dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    load_tokenizer(source.path).save_pretrained(out)
    return out
