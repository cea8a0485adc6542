"""What one token costs a model: the bytes a batch-1 decode step reads and the FLOPs per token.

Counted from the file as stored (a GGUF's blocks, a checkpoint's safetensors), the same figure
for every engine serving that file, so "bytes per step / bandwidth" is the file's limit, not one
engine's. A decode step reads every matrix once; the token embedding is read one row per token
unless it is also the LM head (tied). FLOPs: 2 per matrix weight per token, plus attention's
QK^T and PV products over the positions before each token.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

EMBEDDING_NAMES = ("token_embd.weight", "model.embed_tokens.weight")
LM_HEAD_NAMES = ("output.weight", "lm_head.weight")


@dataclass(frozen=True)
class ModelCost:
    path: str
    file_bytes: int
    bytes_per_step: int  # weights a batch-1 decode step reads
    matmul_params: int  # matrix weights each token is multiplied by
    num_layers: int
    q_size: int  # query heads x head dim: attention's width
    kv_size: int  # key (or value) heads x head dim

    def kv_bytes(self, tokens: int, bytes_per_value: int) -> int:
        """A KV cache of `tokens` positions: keys and values of every layer."""
        return 2 * self.num_layers * self.kv_size * tokens * bytes_per_value

    @property
    def flops_per_token(self) -> int:
        return 2 * self.matmul_params

    def prompt_flops(self, tokens: int) -> float:
        """A prompt of `tokens`: the matrices for each, and causal attention (token i attends to
        i + 1 positions: QK^T and PV, 2 flops each per position and query channel)."""
        attention = 2 * 2 * self.num_layers * self.q_size * tokens * (tokens + 1) / 2
        return self.flops_per_token * tokens + attention


def _tensors_gguf(path: Path) -> list[tuple[str, tuple[int, ...], int]]:
    from langrt.model.gguf_loader import GGUFFile

    return [(t.name, tuple(t.shape), t.nbytes) for t in GGUFFile(path).tensors.values()]


def _tensors_safetensors(directory: Path) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, bytes) from each safetensors file's header, without reading the weights."""
    found = []
    for file in sorted(directory.glob("*.safetensors")):
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, t in header.items():
            if name != "__metadata__":
                found.append((name, tuple(t["shape"]), t["data_offsets"][1] - t["data_offsets"][0]))
    if not found:
        raise FileNotFoundError(
            f"{directory} has no .safetensors files: give a GGUF file or an HF directory with safetensors weights"
        )
    return found


def model_cost(path: str | Path) -> ModelCost:
    from langrt.model.source import ModelSource

    path = Path(path).expanduser()
    tensors = _tensors_gguf(path) if path.is_file() else _tensors_safetensors(path)
    untied = any(name in LM_HEAD_NAMES for name, _, _ in tensors)
    read = [(n, s, b) for n, s, b in tensors if not (untied and n in EMBEDDING_NAMES)]
    config = ModelSource.resolve(path).model_config()
    file_bytes = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return ModelCost(
        path=str(path), file_bytes=file_bytes, bytes_per_step=sum(b for _, _, b in read),
        matmul_params=sum(s[0] * s[1] for _, s, _ in read if len(s) == 2),
        num_layers=config.num_layers, q_size=config.q_size, kv_size=config.kv_size,
    )  # fmt: skip
