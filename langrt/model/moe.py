"""Mixture-of-experts MLP blocks (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) in Llama-style layers.

A router scores every expert for each token; the token's top-k experts run SwiGLU MLPs whose
outputs are summed with the routing weights. Each kind of expert matrix is stored stacked
([E, 2I, H] gate_up, [E, H, I] down) and a pass's (token, choice) pairs are grouped by expert,
so a chosen expert's weights are multiplied once per pass, over all the tokens that chose it.

Numerics are transformers': router logits in the model's dtype, softmax in float32, top-k,
renormalised in float32 where the model does, then cast to the model's dtype (Mixtral keeps
float32 weights into the product); each expert's product is weighted and cast to the model's
dtype before a token's k products are summed (transformers adds them one by one in that dtype,
in ascending expert order: for k = 2 the same value; for more, within a rounding).

--quantization turns the Linears into blocks (attention, dense layers, the shared expert); the
stacked experts and the routers stay plain. A GGUF file served as blocks keeps its experts' too:
each expert's gate_up and down as a QuantizedWeight (StackedExperts.keep_blocks), multiplied by
the block kernels over the rows that chose it.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch import nn

from langrt.errors import ModelLoadError
from langrt.model.attention import Attention
from langrt.model.config import ModelConfig
from langrt.model.layers import Linear, RMSNorm, add_rms_norm, linear, silu_and_mul
from langrt.model.llama import DenseOps, LlamaAttention, LlamaForCausalLM, LlamaMLP, Rope
from langrt.model.moe_weights import ExpertLoader, is_expert_tensor
from langrt.model.quant import QuantizedWeight

# One projection of every expert: stacked plain matrices [E, rows, cols], or one block matrix each.
ExpertMatrices = torch.Tensor | Sequence[QuantizedWeight]


@dataclass(frozen=True)
class MoESettings:
    num_experts: int
    top_k: int  # experts per token
    expert_size: int  # intermediate rows of one expert
    renormalize: bool  # divide the top-k probabilities by their sum
    float32_weights: bool  # the routing weights enter the weighted sum in float32 (Mixtral)
    shared_expert_size: int = 0  # Qwen2-MoE's expert every token runs, behind a sigmoid gate; 0: none
    dense_layers: frozenset[int] = frozenset()  # layers whose MLP is a plain SwiGLU (config.intermediate_size)

    def __post_init__(self):
        if not 0 < self.top_k <= self.num_experts:
            raise ModelLoadError(f"num_experts_per_tok {self.top_k} must be in 1..num_experts ({self.num_experts})")


def num_experts_of(hf: Mapping[str, Any], default: int) -> int:
    """`num_experts` or `num_local_experts`, whichever the config.json has: transformers writes
    the name its config class stores (Qwen3-MoE's save_pretrained writes `num_local_experts`,
    its published configs say `num_experts`; Mixtral's is `num_local_experts`)."""
    for key in ("num_experts", "num_local_experts"):
        if hf.get(key) is not None:
            return int(hf[key])
    return default


def dense_layers_of(hf: Mapping[str, Any], num_layers: int, num_experts: int) -> frozenset[int]:
    """Qwen-MoE's dense layers: those in `mlp_only_layers`, those off the `decoder_sparse_step`
    grid (layer i is sparse where (i + 1) % step == 0), every layer of a model without experts."""
    only = set(hf.get("mlp_only_layers") or ())
    step = hf.get("decoder_sparse_step") or 1
    return frozenset(i for i in range(num_layers) if i in only or num_experts == 0 or (i + 1) % step)


def route(logits: torch.Tensor, s: MoESettings) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, E] router logits -> (routing weights [T, k], expert ids [T, k])."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, s.top_k, dim=-1)
    if s.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if s.float32_weights else weights.to(logits.dtype)), ids


@dataclass(frozen=True)
class ExpertGroups:
    """A pass's (token, choice) pairs ordered by expert, by token within an expert."""

    experts: tuple[int, ...]  # the experts chosen at least once, ascending
    counts: tuple[int, ...]  # how many pairs each of them takes
    pairs: torch.Tensor  # [T*k] flat index (token * k + choice) of each pair, in that order
    top_k: int

    @classmethod
    def of(cls, ids: torch.Tensor, num_experts: int) -> "ExpertGroups":
        flat = ids.flatten()
        pairs = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=num_experts).tolist()  # the pass's one host sync
        hit = tuple(e for e, n in enumerate(counts) if n)
        return cls(hit, tuple(counts[e] for e in hit), pairs, ids.shape[1])

    @property
    def tokens(self) -> torch.Tensor:
        """[T*k] the token of each pair."""
        return self.pairs // self.top_k


def run_experts(
    x: torch.Tensor, weights: torch.Tensor, groups: ExpertGroups, gate_up: ExpertMatrices, down: ExpertMatrices
) -> torch.Tensor:
    """x [T, H] -> [T, H]: per token, the sum over its chosen experts e of its routing weight
    times down[e] @ silu_and_mul(gate_up[e] @ x). One gate_up and one down product per expert
    hit, over the rows of every token that chose it."""
    rows = x.index_select(0, groups.tokens)
    outs, start = [], 0
    for e, n in zip(groups.experts, groups.counts):
        outs.append(_product(silu_and_mul(_product(rows[start : start + n], gate_up[e])), down[e]))
        start += n
    weighted = (torch.cat(outs) * weights.flatten().index_select(0, groups.pairs)[:, None]).to(x.dtype)
    # Back in (token, choice) order, then each token's k rows summed. Not index_add_: on CPU it
    # runs as scatter_add_, measured at 70 ms a call (2 rows of 1024) in decode steps on a busy
    # 2-core machine, where index_copy_ and sum took microseconds.
    per_pair = torch.empty_like(weighted).index_copy_(0, groups.pairs, weighted)
    return per_pair.view(-1, groups.top_k, x.shape[1]).sum(dim=1)


def _product(x: torch.Tensor, w: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    return w.matmul(x) if isinstance(w, QuantizedWeight) else linear(x, w)


class Router(nn.Module):
    """The gate's [E, H] matrix. Not a Linear, so --quantization leaves it exact: blocks would
    move near-tied scores and change which experts run."""

    def __init__(self, hidden_size: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))


class StackedExperts(nn.Module):
    """Every expert's gate_up [2I, H] and down [H, I]: stacked plain tensors, or (a GGUF file
    served as blocks, see keep_blocks) one QuantizedWeight per expert, the stacked tensor then
    empty. `gate_up_weights` / `down_weights` are what run_experts takes, either way."""

    def __init__(self, hidden_size: int, s: MoESettings):
        super().__init__()
        self.gate_up = nn.Parameter(torch.empty(s.num_experts, 2 * s.expert_size, hidden_size))
        self.down = nn.Parameter(torch.empty(s.num_experts, hidden_size, s.expert_size))
        self.gate_up_blocks: list[QuantizedWeight] | None = None
        self.down_blocks: list[QuantizedWeight] | None = None

    @property
    def gate_up_weights(self) -> ExpertMatrices:
        return self.gate_up if self.gate_up_blocks is None else self.gate_up_blocks

    @property
    def down_weights(self) -> ExpertMatrices:
        return self.down if self.down_blocks is None else self.down_blocks

    def keep_blocks(self, gate_up: list[QuantizedWeight] | None, down: list[QuantizedWeight] | None) -> None:
        """Serve these projections (one weight per expert; None: keep the plain tensor) as
        blocks; their plain tensors are dropped (as Linear.fill_quantized drops its weight)."""
        if gate_up is not None:
            self.gate_up_blocks, self.gate_up = gate_up, _emptied(self.gate_up)
        if down is not None:
            self.down_blocks, self.down = down, _emptied(self.down)


def _emptied(param: nn.Parameter) -> nn.Parameter:
    return nn.Parameter(torch.empty(0, dtype=param.dtype, device=param.device), requires_grad=False)


class DenseMLP(LlamaMLP):
    """A SwiGLU MLP of `intermediate_size` rows with its own forward (a dense layer's MLP, the
    shared expert)."""

    def __init__(self, config: ModelConfig, intermediate_size: int):
        super().__init__(dataclasses.replace(config, intermediate_size=intermediate_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class SparseMoE(nn.Module):
    def __init__(self, config: ModelConfig, s: MoESettings):
        super().__init__()
        self.settings = s
        self.gate = Router(config.hidden_size, s.num_experts)
        self.experts = StackedExperts(config.hidden_size, s)
        self.shared_expert = DenseMLP(config, s.shared_expert_size) if s.shared_expert_size else None
        self.shared_expert_gate = Linear(config.hidden_size, 1) if s.shared_expert_size else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(nn.functional.linear(x, self.gate.weight), self.settings)
        groups = ExpertGroups.of(ids, self.settings.num_experts)
        out = run_experts(x, weights, groups, self.experts.gate_up_weights, self.experts.down_weights)
        if self.shared_expert is None:
            return out
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)


class MoEDecoderLayer(nn.Module):
    """A Llama layer whose MLP is a SparseMoE block (a DenseMLP in a model's dense layers).
    Architectures with other attention inputs (q/k norms) subclass it: `attention_class` holds
    the projections, `attention_inputs` turns the layer input into rotated q, k and v."""

    attention_class: type[nn.Module] = LlamaAttention

    def __init__(self, config: ModelConfig, layer_id: int, ops: DenseOps, s: MoESettings):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = self.attention_class(config, layer_id)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        dense = layer_id in s.dense_layers
        self.mlp = DenseMLP(config, config.intermediate_size) if dense else SparseMoE(config, s)
        self.ops = ops
        self.sizes = (config.q_size, config.kv_size, config.head_dim)

    def forward(
        self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None, attn: Attention
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's output, the residual stream before it), as LlamaDecoderLayer."""
        q, k, v, residual = self.attention_inputs(rope, x, residual)
        o = attn.attend(self.self_attn.layer_id, q, k, v)
        post = self.post_attention_layernorm
        x, residual = add_rms_norm(self.self_attn.o_proj(o), residual, post.weight, post.eps)
        return self.mlp(x), residual

    def attention_inputs(self, rope: Rope, x: torch.Tensor, residual: torch.Tensor | None):
        """-> (q, k, v, residual): (residual add +) input norm, qkv projection, rotary."""
        a, norm = self.self_attn, self.input_layernorm
        return self.ops.before_attention(
            x, residual, norm.weight, norm.eps, *a.qkv_proj.weights, a.qkv_proj.bias, *rope, *self.sizes
        )


class MoEForCausalLM(LlamaForCausalLM, metaclass=abc.ABCMeta):
    """LlamaForCausalLM with MoE layers: the embedding, rotary, final norm, LM head, logits and
    the loading of every tensor but the experts' are Llama's. Each architecture says how its
    config reads (`moe_settings`) and which layer it runs (`layer_class`)."""

    layer_class: type[MoEDecoderLayer] = MoEDecoderLayer

    @staticmethod
    @abc.abstractmethod
    def moe_settings(config: ModelConfig) -> MoESettings:
        """The routing and expert sizes, from the architecture's own config.json keys."""

    def make_layer(self, config: ModelConfig, layer_id: int, ops: DenseOps) -> nn.Module:
        return self.layer_class(config, layer_id, ops, self.moe_settings(config))

    def set_tensor_parallel(self, tp) -> None:
        if tp is not None:
            raise ModelLoadError(
                f"--tp-size {tp.size}: tensor parallelism does not split mixture-of-experts models "
                f"({self.config.model_type}); serve it with --tp-size 1"
            )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The experts' matrices (per expert or stacked, see moe_weights) into the stacked
        tensors; every other tensor as Llama loads it."""
        experts = ExpertLoader(self.layers)
        super().load_weights(experts.take(weights))
        experts.check_complete()

    def _expected_fills(self) -> list[str]:
        return [name for name in super()._expected_fills() if not is_expert_tensor(name)]
