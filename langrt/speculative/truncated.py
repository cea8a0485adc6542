"""A draft model made from a model itself, with nothing to download: its embedding, its first
few layers, its final norm and its LM head, saved as an HF directory (config.json, safetensors,
the model's tokenizer) that --speculative-draft-model-path takes.

Such an early exit was never trained to predict the next token, yet on easy text (copying,
closing a phrase) its argmax often is the full model's; it costs layers/total of a pass. It is
the draft the benchmark (benchmarks/bench_speculative.py) uses for the built-in model, which has
no smaller sibling on PyPI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def write_truncated_model(model_path, out_dir, num_layers: int, dtype: str = "float32") -> Path:
    """Write the first `num_layers` layers of the model at `model_path` (an HF directory or a
    .gguf file; None: the built-in model) to `out_dir`; -> out_dir."""
    import torch
    from safetensors.torch import save_file

    from langrt.model.source import ModelSource
    from langrt.tokenizer.loader import load_tokenizer

    source = ModelSource.resolve(model_path)
    config = source.hf_config()
    total = config["num_hidden_layers"]
    if not 0 < num_layers <= total:
        raise ValueError(f"num_layers must be in [1, {total}] for {source.path}; got {num_layers}")
    kept = {}
    for name, tensor in source.iter_weights(getattr(torch, dtype), progress=False):
        layer = _LAYER.match(name)
        if layer is None or int(layer.group(1)) < num_layers:
            kept[name] = tensor.contiguous()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(kept, str(out / "model.safetensors"))
    config.update(num_hidden_layers=num_layers, torch_dtype=dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    load_tokenizer(source.path).save_pretrained(out)
    return out
