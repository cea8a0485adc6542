"""A forward pass through every layer in one C++ call (kernels/cpu/fused_layers.cpp).

At batch 1 the layers' products take about half of a CPU decode step; the rest was Python
dispatching ~10 small ops per layer. The C++ op runs the same ops in the same order, so it gives
the per-layer loop's bits (tests/numerics/test_fused_layers.py). It takes the passes where that
loop would run langrt's CPU kernels throughout: CPU, bfloat16 or float32, eager layers, every
attention row through the paged kernel (prompts up to its length limit, decodes, drafts).
LANGRT_CPU_FUSED_LAYERS=0 keeps the per-layer loop (for comparisons).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from langrt import envs
from langrt.model.quant import Q8_0, QuantPass, StackedQuantizedWeight
from langrt.model.layers import PACKED_MAX_ROWS, Linear, _load_cpu_kernels

ENV = envs.LANGRT_CPU_FUSED_LAYERS.name


@dataclass(frozen=True)
class LayerTensors:
    """Per layer, in fused_layers' order: the qkv, o, gate_up and down matrices, each as its
    parts' weights (GGUF blocks or plain; a StackedQuantizedWeight's row ranges, of different
    types, are several parts) with their GGML types (0: plain) and the number of parts, and its
    packed copy (or None: see layers.Linear); the qkv bias or None, the two norms' weights."""

    weights: list[torch.Tensor]
    qtypes: list[int]
    parts: list[int]
    packed: list[torch.Tensor | None]
    qkv_biases: list[torch.Tensor | None]
    norms: list[torch.Tensor]
    eps: float
    sizes: list[int]  # q_size, kv_size, head_dim

    def op_args(self) -> list:
        """The C++ op's arguments from `weights` to `eps`, in its order."""
        return [self.weights, self.qtypes, self.parts, self.packed, self.qkv_biases, self.norms, self.eps]


@dataclass(frozen=True)
class ProductRoutes:
    """Which kernel each of the op's products takes, as QuantizedWeight.matmul would route it in
    the per-layer loop (quant.QuantPass's limits, and the quantized kernels' ISA)."""

    decoding: bool
    packed_max_rows: int  # layers.PACKED_MAX_ROWS: the most rows on a packed plain weight
    isa: int
    fly_max_rows: int
    fly_max_rows_q8_0: int
    vnni_max_rows: int
    prompt_tile_min_rows: int

    @classmethod
    def of(cls, step: QuantPass, isa: int) -> ProductRoutes:
        return cls(
            decoding=step.decoding,
            packed_max_rows=PACKED_MAX_ROWS,
            isa=isa,
            fly_max_rows=step.fly_rows(),
            fly_max_rows_q8_0=step.fly_rows(Q8_0),
            vnni_max_rows=step.vnni_rows(),
            prompt_tile_min_rows=step.prompt_tile_min_rows,
        )

    def op_args(self) -> list:
        """The C++ op's last arguments, in its order."""
        return [
            self.decoding,
            self.packed_max_rows,
            self.isa,
            self.fly_max_rows,
            self.fly_max_rows_q8_0,
            self.vnni_max_rows,
            self.prompt_tile_min_rows,
        ]


def layer_tensors(model) -> LayerTensors | None:
    """The tensors fused_layers takes, or None where the model is not one it runs (an odd size
    or dtype, a Linear with a bias other than qkv's). Not for compiled layers (graphs of their own)."""
    from langrt.model.llama import LlamaDecoderLayer  # here: llama imports this module

    # The C++ op is LlamaDecoderLayer's math; other layers (mixture-of-experts blocks, q/k
    # norms) run their own forward in the per-layer loop.
    if any(type(layer) is not LlamaDecoderLayer for layer in model.layers):
        return None
    c = model.config
    dtype = model.embed_tokens.weight.dtype
    if dtype not in (torch.bfloat16, torch.float32) or model.embed_tokens.weight.device.type != "cpu":
        return None
    if c.hidden_size % 32 or c.head_dim % 32 or (2 * c.intermediate_size) % 32:
        return None
    weights, qtypes, parts, packed, biases, norms = [], [], [], [], [], []
    for layer in model.layers:
        a, mlp = layer.self_attn, layer.mlp
        linears = (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if any(not _servable(m, dtype) for m in linears) or any(m.bias is not None for m in linears[1:]):
            return None
        for m in linears:
            pieces = _parts(m)
            weights += [w for w, _ in pieces]
            qtypes += [t for _, t in pieces]
            parts.append(len(pieces))
        packed += [m.packed.dense if m.quantized else m.packed for m in linears]
        biases.append(a.qkv_proj.bias)
        norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    if any(n.dtype != dtype for n in norms) or any(b is not None and b.dtype != dtype for b in biases):
        return None
    eps = model.layers[0].input_layernorm.eps
    return LayerTensors(weights, qtypes, parts, packed, biases, norms, eps, [c.q_size, c.kv_size, c.head_dim])


def _servable(module: Linear, dtype: torch.dtype) -> bool:
    """Blocks (of one type, or row ranges of several), or a plain weight in `dtype`."""
    if module.quantized:
        return True
    return module.weight.dtype == dtype and module.weight.dim() == 2


def _parts(module: Linear) -> list[tuple[torch.Tensor, int]]:
    """(weight, GGML type or 0 for plain) of each part of the layer's matrix."""
    if not module.quantized:
        return [(module.weight, 0)]
    stacked = module.packed.parts if isinstance(module.packed, StackedQuantizedWeight) else [module.packed]
    return [(p.data, p.ggml_type) for p in stacked]


def run(
    tensors: LayerTensors | None, x: torch.Tensor, rope, attn, step: QuantPass
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(x, residual) after the last layer, or None where this pass is not one fused_layers takes.
    `step`: the pass running now (its ModelRunner's), which routes the products."""
    if tensors is None or not envs.LANGRT_CPU_FUSED_LAYERS.get():
        return None
    pool_args = getattr(attn, "pool_args", None)
    pool = pool_args() if pool_args is not None else None
    if pool is None or _load_cpu_kernels() is None:
        return None
    from langrt_kernels.cpu import quant as quant_kernels, torch_ops

    cos, sin = rope
    sizes = tensors.sizes + [pool.heads, pool.kv_heads]
    routes = ProductRoutes.of(step, quant_kernels.op_isa())
    op = torch_ops().fused_layers
    x, residual = op(x, *tensors.op_args(), cos, sin, sizes, *pool.op_args(), *routes.op_args())
    return x, residual
