"""One embeddings call, shared by /v1/embeddings, /encode and Engine.encode: check the input,
send it to the scheduler, truncate to `dimensions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from langrt.embeddings.inputs import embedding_inputs
from langrt.errors import InvalidRequest


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: np.ndarray  # [N, D] float32, one row per input, in input order
    prompt_tokens: list[int]  # tokens of each input
    cached_tokens: list[int]  # of those, served by the prefix cache (decoder models)

    @property
    def total_prompt_tokens(self) -> int:
        return sum(self.prompt_tokens)


async def create_embeddings(manager, raw: Any, dimensions: int | None = None) -> EmbeddingResult:
    """`manager` is the TokenizerManager; raises InvalidRequest (HTTP 400) naming what is wrong."""
    if not manager.args.is_embedding:
        raise InvalidRequest(
            "this server generates text; embeddings need a server started with --is-embedding "
            "(an encoder model, or a decoder model with --pooling)",
            "model",
        )
    ready = manager.ready
    inputs = embedding_inputs(
        raw, lambda text: manager.tokenize(text, param="input"), ready.context_len, ready.vocab_size
    )
    reply = await manager.embed(inputs)
    vectors = np.asarray(reply["embeddings"], dtype=np.float32)
    if dimensions is not None:
        vectors = _truncate(vectors, dimensions, reply["normalized"])
    return EmbeddingResult(vectors, [len(ids) for ids in inputs], reply["cached_tokens"])


def _truncate(vectors: np.ndarray, dimensions: int, normalized: bool) -> np.ndarray:
    """Matryoshka truncation: the first `dimensions` values, renormalized where the model's
    vectors are unit length so cosine scores keep their meaning."""
    full = vectors.shape[1]
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= full:
        raise InvalidRequest(
            f"dimensions must be an integer in 1..{full} (this model's size); got {dimensions!r}", "dimensions"
        )
    cut = vectors[:, :dimensions]
    if not normalized:
        return np.ascontiguousarray(cut)
    return cut / np.maximum(np.linalg.norm(cut, axis=1, keepdims=True), 1e-12)
