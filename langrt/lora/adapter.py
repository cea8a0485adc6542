"""One PEFT LoRA adapter (a directory holding adapter_config.json and
adapter_model.safetensors) as low-rank factors laid out for langrt's fused projections.

langrt's Llama layer multiplies q/k/v as one matrix (qkv) and gate/up as another (gate_up). An
adapter's factors for a fused projection are stacked the same way: A_cat [sum of ranks, in]
holds each targeted part's A, and B_cat [out, sum of ranks] places each part's B (times the
adapter's scaling) in that part's output rows and its own rank columns, zeros elsewhere. Then
one product `x @ A_cat^T @ B_cat^T` gives every part's delta at once; a part the adapter does
not target adds nothing. Ranks are small (8-64), so the zeros cost little.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import torch

from langrt.errors import ModelLoadError

# HF module name -> (langrt's projection, which part of it in order)
_PARTS = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoraError(ModelLoadError):
    """An adapter that cannot be served: names the adapter and what to change."""


@dataclass(frozen=True)
class ProjectionFactors:
    a: torch.Tensor  # [R, in]
    b: torch.Tensor  # [out, R], scaling folded in


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    targets: tuple[str, ...]  # HF module names, e.g. ("q_proj", "v_proj")
    factors: dict[tuple[int, str], ProjectionFactors]  # (layer, "qkv" | "o" | "gate_up" | "down")
    # The prefix cache's key space for this load of the adapter: token id + namespace (the
    # registry gives each load a fresh one, so an adapter reloaded under the same name never
    # reuses the old one's K/V; 0 is the base model's).
    namespace: int

    def cache_key(self, ids: list[int]) -> list[int]:
        """Token ids moved into this adapter's key space (ids are < 2**32)."""
        return [t + self.namespace for t in ids]


def part_sizes(config) -> dict[str, tuple[int, ...]]:
    """Each fused projection's output rows per part, and its input width."""
    c = config
    return {
        "qkv": (c.q_size, c.kv_size, c.kv_size),
        "o": (c.hidden_size,),
        "gate_up": (c.intermediate_size, c.intermediate_size),
        "down": (c.hidden_size,),
    }


def in_size(config, projection: str) -> int:
    return {
        "qkv": config.hidden_size,
        "o": config.q_size,
        "gate_up": config.hidden_size,
        "down": config.intermediate_size,
    }[projection]


def load_adapter(name: str, path: str, config, dtype: torch.dtype, device: torch.device, namespace: int) -> LoraAdapter:
    """Read a PEFT adapter directory and check it fits `config` (a ModelConfig); raises LoraError."""
    settings = _read_config(name, path)
    rank, alpha = int(settings["r"]), float(settings.get("lora_alpha", settings["r"]))
    scaling = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
    tensors = _read_tensors(name, path)
    pairs = _pairs(name, tensors, config.num_layers)
    factors = {}
    for (layer, projection), parts in pairs.items():
        factors[(layer, projection)] = _stack(name, projection, parts, config, scaling, dtype, device)
    targets = tuple(sorted({m for (_, _), parts in pairs.items() for m in parts}))
    return LoraAdapter(name, path, rank, scaling, targets, factors, namespace)


def _read_config(name: str, path: str) -> dict:
    file = os.path.join(path, "adapter_config.json")
    try:
        with open(file) as f:
            settings = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise LoraError(f"LoRA adapter {name!r}: cannot read {file} ({e}); give a PEFT adapter directory") from e
    if settings.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"LoRA adapter {name!r}: {file} is a {settings['peft_type']} adapter; only LORA is served")
    unsupported = [k for k in ("use_dora", "modules_to_save") if settings.get(k)]
    if unsupported:
        raise LoraError(f"LoRA adapter {name!r}: {', '.join(unsupported)} is not supported; train without it")
    if settings.get("bias", "none") != "none":
        raise LoraError(f"LoRA adapter {name!r}: bias={settings['bias']!r} is not supported; use bias='none'")
    return settings


def _read_tensors(name: str, path: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.exists(file):
        raise LoraError(f"LoRA adapter {name!r}: {file} is missing; save the adapter with safe_serialization=True")
    try:
        return load_file(file)
    except (OSError, SafetensorError) as e:
        raise LoraError(f"LoRA adapter {name!r}: cannot read {file} ({e})") from e


def _pairs(name: str, tensors: dict[str, torch.Tensor], num_layers: int) -> dict:
    """-> {(layer, projection): {hf module: (A, B)}}; every tensor must be a known A or B."""
    found: dict[tuple[int, str], dict[str, dict[str, torch.Tensor]]] = {}
    for key, tensor in tensors.items():
        m = _KEY.search(key)
        if m is None or m.group(2) not in _PARTS or int(m.group(1)) >= num_layers:
            raise LoraError(
                f"LoRA adapter {name!r}: tensor {key} is not a LoRA factor of a q/k/v/o/gate/up/down "
                f"projection of a {num_layers}-layer model; was it trained on this base model?"
            )
        layer, module, side = int(m.group(1)), m.group(2), m.group(3)
        found.setdefault((layer, _PARTS[module][0]), {}).setdefault(module, {})[side] = tensor
    pairs = {}
    for where, modules in found.items():
        for module, sides in modules.items():
            if set(sides) != {"A", "B"}:
                raise LoraError(f"LoRA adapter {name!r}: layer {where[0]} {module} has lora_{''.join(sides)} only")
        pairs[where] = {module: (s["A"], s["B"]) for module, s in modules.items()}
    return pairs


def _stack(name, projection, parts, config, scaling, dtype, device) -> ProjectionFactors:
    sizes, width = part_sizes(config)[projection], in_size(config, projection)
    ranks = {m: a.shape[0] for m, (a, _) in parts.items()}
    b = torch.zeros(sum(sizes), sum(ranks.values()), dtype=torch.float32)
    a_rows, col = [], 0
    for module in sorted(parts, key=lambda m: _PARTS[m][1]):
        a, part_b = parts[module]
        index = _PARTS[module][1]
        row = sum(sizes[:index])
        if a.shape[1] != width or part_b.shape != (sizes[index], a.shape[0]):
            raise LoraError(
                f"LoRA adapter {name!r}: {module} factors {tuple(a.shape)}, {tuple(part_b.shape)} do not "
                f"fit the base model's [{sizes[index]}, {width}] projection; was it trained on this model?"
            )
        b[row : row + sizes[index], col : col + a.shape[0]] = part_b.float() * scaling
        a_rows.append(a.float())
        col += a.shape[0]
    return ProjectionFactors(torch.cat(a_rows).to(device, dtype).contiguous(), b.to(device, dtype).contiguous())
