"""Loading mixture-of-experts checkpoints into the stacked expert tensors of langrt.model.moe.

Published checkpoints (and transformers' save_pretrained, which writes the per-expert names
back) hold one matrix per expert and projection: Mixtral's
`layers.L.block_sparse_moe.experts.E.w1|w3|w2.weight` (gate, up, down) and router
`block_sparse_moe.gate.weight`; Qwen-MoE's and OLMoE's `layers.L.mlp.experts.E.gate_proj|up_proj|down_proj.weight`.
transformers' own modules hold them stacked, `layers.L.mlp.experts.gate_up_proj` [E, 2I, H] and
`down_proj` [E, H, I]; a state dict saved as it is has those. Both load. Qwen2-MoE's shared
expert (`mlp.shared_expert.gate_proj|up_proj|down_proj`) is loaded here too: its intermediate
size is not the config's, which Llama's loader would use to place the up rows.

A GGUF file served as blocks gives each expert's matrices as QuantizedWeight: they are kept as
they are (no dequantizing), an expert's gate and up joined into one gate_up (stack_parts), and
handed to the layer's StackedExperts once every tensor has come (check_complete).
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch
from torch import nn

from langrt.errors import ModelLoadError
from langrt.model.quant import QuantizedWeight, stack_parts

_PER_EXPERT = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_STACKED = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_SHARED = re.compile(r"layers\.(\d+)\.mlp\.shared_expert\.(gate_proj|up_proj|down_proj)\.weight$")
# Mixtral names an expert's matrices w1 (gate), w3 (up), w2 (down).
_PART = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}
PARTS = ("gate", "up", "down")


def is_expert_tensor(param_name: str) -> bool:
    """Whether a langrt parameter name (with a `@offset` fill suffix or not) is one that
    ExpertLoader fills: the stacked experts and the shared expert, not the routers."""
    return ".mlp.experts." in param_name or ".mlp.shared_expert." in param_name


class ExpertLoader:
    """Takes the expert matrices out of a stream of (HF name, tensor), copying each into its
    layer's stacked tensors and noting it; passes every other tensor on (Mixtral's
    `block_sparse_moe` renamed `mlp`)."""

    def __init__(self, layers: nn.ModuleList):
        self.layers = layers
        self.filled: set[tuple[int, str, int]] = set()  # (layer, part, expert; -1 the shared expert)
        self.blocks: dict[int, dict[tuple[str, int], QuantizedWeight]] = {}  # layer -> (part, expert) -> blocks

    def take(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in weights:
            name = name.replace(".block_sparse_moe.", ".mlp.")
            if not self._load(name, tensor):
                yield name, tensor

    def check_complete(self) -> None:
        """Raises if an expert matrix never came; then serves the experts that came as blocks."""
        missing = sorted(self._expected() - self.filled)
        if missing:
            layer, part, expert = missing[0]
            which = "the shared expert" if expert < 0 else f"expert {expert}"
            raise ModelLoadError(
                f"checkpoint is missing {len(missing)} expert matrices, e.g. layer {layer} {which}'s {part} projection"
            )
        for layer, parts in self.blocks.items():
            count = self.layers[layer].mlp.settings.num_experts
            gate_up = _blocks_of(layer, parts, ("gate", "up"), count)
            self.layers[layer].mlp.experts.keep_blocks(gate_up, _blocks_of(layer, parts, ("down",), count))

    def _expected(self) -> set[tuple[int, str, int]]:
        expected = set()
        for layer_id, layer in enumerate(self.layers):
            mlp = layer.mlp
            if not hasattr(mlp, "experts"):
                continue
            experts = range(mlp.settings.num_experts)
            expected |= {(layer_id, part, e) for part in PARTS for e in experts}
            if mlp.shared_expert is not None:
                expected |= {(layer_id, part, -1) for part in PARTS}
        return expected

    def _load(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy `tensor` where it goes if it is an expert matrix -> whether it was."""
        if (m := _PER_EXPERT.search(name)) is not None:
            layer, part, expert = int(m[1]), _PART[m[3]], int(m[2])
            dest = self._per_expert_dest(name, layer, part, expert)
            if isinstance(tensor, QuantizedWeight):
                self._keep(name, dest, tensor, layer, (part, expert))
            else:
                self._copy(name, dest, tensor, [(layer, part, expert)])
        elif (m := _STACKED.search(name)) is not None:
            layer, parts = int(m[1]), (("gate", "up") if m[2] == "gate_up_proj" else ("down",))
            stacked = self._sparse(name, layer).experts
            dest = stacked.gate_up if m[2] == "gate_up_proj" else stacked.down
            self._copy(name, dest.data, tensor, [(layer, p, e) for p in parts for e in range(dest.shape[0])])
        elif (m := _SHARED.search(name)) is not None:
            layer, part = int(m[1]), _PART[m[2]]
            if isinstance(tensor, QuantizedWeight):
                self._fill_shared_blocks(name, layer, part, tensor)
            else:
                self._copy(name, self._shared_dest(name, layer, part), tensor, [(layer, part, -1)])
        else:
            return False
        return True

    def _sparse(self, name: str, layer: int) -> nn.Module:
        """Layer `layer`'s SparseMoE block; an error naming `name` where the config has none there."""
        mlp = self.layers[layer].mlp if layer < len(self.layers) else None
        if mlp is None or not hasattr(mlp, "experts"):
            raise ModelLoadError(
                f"checkpoint tensor {name} is an expert of layer {layer}, which this config makes "
                "dense or does not have (check num_hidden_layers, mlp_only_layers, decoder_sparse_step)"
            )
        return mlp

    def _per_expert_dest(self, name: str, layer: int, part: str, expert: int) -> torch.Tensor:
        experts = self._sparse(name, layer).experts
        if expert >= experts.gate_up.shape[0]:
            count = experts.gate_up.shape[0]
            raise ModelLoadError(f"checkpoint tensor {name}: expert {expert}, but num_experts is {count}")
        if part == "down":
            return experts.down.data[expert]
        rows = experts.gate_up.shape[1] // 2
        return experts.gate_up.data[expert].narrow(0, 0 if part == "gate" else rows, rows)

    def _shared_dest(self, name: str, layer: int, part: str) -> torch.Tensor:
        shared = self._sparse(name, layer).shared_expert
        if shared is None:
            raise ModelLoadError(
                f"checkpoint tensor {name}: the config has no shared expert (shared_expert_intermediate_size)"
            )
        if part == "down":
            return shared.down_proj.weight.data
        rows = shared.gate_up_proj.weight.shape[0] // 2
        return shared.gate_up_proj.weight.data.narrow(0, 0 if part == "gate" else rows, rows)

    def _fill_shared_blocks(self, name: str, layer: int, part: str, weight: QuantizedWeight) -> None:
        """The shared expert is a DenseMLP: its Linears take the blocks (gate and up as row ranges)."""
        mlp = self._sparse(name, layer)
        if mlp.shared_expert is None:
            raise ModelLoadError(
                f"checkpoint tensor {name}: the config has no shared expert (shared_expert_intermediate_size)"
            )
        if part == "down":
            mlp.shared_expert.down_proj.fill_quantized(0, weight)
        else:
            offset = 0 if part == "gate" else mlp.settings.shared_expert_size
            mlp.shared_expert.gate_up_proj.fill_quantized(offset, weight)
        self.filled.add((layer, part, -1))

    def _keep(self, name: str, dest: torch.Tensor, weight: QuantizedWeight, layer: int, key: tuple[str, int]) -> None:
        if weight.shape != tuple(dest.shape):
            raise ModelLoadError(f"{name}: checkpoint shape {weight.shape} != model {tuple(dest.shape)}")
        self.blocks.setdefault(layer, {})[key] = weight
        self.filled.add((layer, *key))

    def _copy(self, name: str, dest: torch.Tensor, tensor: torch.Tensor, fills: list[tuple[int, str, int]]) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise ModelLoadError(f"{name}: expert matrices load from plain tensors only, not {type(tensor).__name__}")
        if dest.shape != tensor.shape:
            raise ModelLoadError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(dest.shape)}")
        dest.copy_(tensor)
        self.filled.update(fills)


def _blocks_of(
    layer: int, parts: dict[tuple[str, int], QuantizedWeight], names: tuple[str, ...], count: int
) -> list[QuantizedWeight] | None:
    """Each expert's `names` projections joined (gate_up) as one block matrix; None where none
    of them came as blocks."""
    present = [(p, e) for p in names for e in range(count) if (p, e) in parts]
    if not present:
        return None
    if len(present) < len(names) * count:
        part, expert = next((p, e) for p in names for e in range(count) if (p, e) not in parts)
        raise ModelLoadError(
            f"layer {layer} expert {expert}'s {part} projection is plain floats where the layer's other "
            f"{'/'.join(names)} expert matrices are blocks: store them in block types, or load with --quantization none"
        )
    return [stack_parts([parts[(p, e)] for p in names]) for e in range(count)]
