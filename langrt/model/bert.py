"""BERT-family encoders (BertModel: all-MiniLM, bge, e5 ...) for embeddings.

Every token attends to every other token of its own sequence (no causal mask), so a sequence is
computed in one pass and nothing is kept afterwards: there is no KV cache. The module takes a
padded batch [B, T] with its attention mask and returns the last layer's hidden states
[B, T, hidden]; langrt.embeddings pools them.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from langrt.errors import ModelLoadError
from langrt.model.config import ModelConfig

_ACTIVATIONS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


class BertLayer(nn.Module):
    def __init__(self, hidden: int, intermediate: int, num_heads: int, eps: float, act):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)  # HF's query, key and value, stacked at load
        self.out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, intermediate)
        self.down = nn.Linear(intermediate, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = act

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, h // self.num_heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = self.attn_norm(x + self.out(o.transpose(1, 2).reshape(b, t, h)))  # post-norm, as BERT
        return self.ffn_norm(x + self.down(self.act(self.up(x))))


class BertModel(nn.Module):
    """hidden = BertModel(config)(input_ids [B, T], mask [B, T] bool: True on real tokens)."""

    is_encoder = True

    def __init__(self, config: ModelConfig, compiled: bool = False):
        super().__init__()
        hf = config.hf
        act = hf.get("hidden_act", "gelu")
        if act not in _ACTIVATIONS:
            raise ModelLoadError(f"BERT hidden_act {act!r} is not supported; langrt has {sorted(_ACTIVATIONS)}")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ModelLoadError(
                "BERT position_embedding_type must be 'absolute' (relative positions are not supported)"
            )
        eps = hf.get("layer_norm_eps", 1e-12)
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(hf.get("type_vocab_size", 2), config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=eps)
        self.layers = nn.ModuleList(
            BertLayer(config.hidden_size, config.intermediate_size, config.num_heads, eps, _ACTIVATIONS[act])
            for _ in range(config.num_layers)
        )

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # token type 0 for every token: one sentence per sequence, as sentence-transformers encodes
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        x = self.embed_norm(x)
        attn_mask = mask[:, None, None, :]  # [B, 1, 1, T]: keys that are real tokens
        for layer in self.layers:
            x = layer(x, attn_mask)
        return x

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        filled: set[str] = set()
        pending: dict[str, dict[str, torch.Tensor]] = {}  # qkv parameter -> the parts seen so far
        for hf_name, tensor in weights:
            mapped = _map_hf_name(hf_name)
            if mapped is None:
                continue
            name, part = mapped
            if part is not None:
                pending.setdefault(name, {})[part] = tensor
                if len(pending[name]) < 3:
                    continue
                parts = pending.pop(name)
                tensor = torch.cat([parts[p] for p in ("query", "key", "value")])
            params[name].data.copy_(tensor)
            filled.add(name)
        missing = sorted(set(params) - filled)
        if missing:
            raise ModelLoadError(
                f"BERT checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}; is it a BertModel?"
            )

    def pack_for_cpu(self, dense_budget: int = 0) -> bool:
        return False  # plain torch layers: nothing to pack

    def set_tensor_parallel(self, tp) -> None:
        if tp is not None:
            raise ModelLoadError("BERT encoders run on one rank; drop --tp-size")


_LAYER_NAMES = {
    "attention.output.dense": "out",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "up",
    "output.dense": "down",
    "output.LayerNorm": "ffn_norm",
}
_EMBED_NAMES = {"word_embeddings", "position_embeddings", "token_type_embeddings"}


def _map_hf_name(hf_name: str) -> tuple[str, str | None] | None:
    """HF name -> (our parameter, q/k/v part or None); None for tensors unused (pooler, heads)."""
    name = hf_name.removeprefix("bert.").removeprefix("model.")
    kind = name.rsplit(".", 1)[-1].replace("gamma", "weight").replace("beta", "bias")  # old LayerNorm names
    if name.startswith("embeddings."):
        module = name.split(".")[1]
        if module in _EMBED_NAMES:
            return f"{module}.weight", None
        return (f"embed_norm.{kind}", None) if module == "LayerNorm" else None
    if not name.startswith("encoder.layer."):
        return None  # pooler.*, cls.*, position_ids buffers
    index, rest = name.removeprefix("encoder.layer.").split(".", 1)
    module = rest.rsplit(".", 1)[0]
    if module.startswith("attention.self."):
        return f"layers.{index}.qkv.{kind}", module.removeprefix("attention.self.")
    ours = _LAYER_NAMES.get(module)
    return (f"layers.{index}.{ours}.{kind}", None) if ours else None


ENTRY_CLASS = BertModel
