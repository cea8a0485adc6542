"""Log-probabilities reported to clients (`return_logprob`, `top_logprobs_num`).

Both functions take the raw model logits: they are computed before penalties, temperature and
top-k / top-p / min-p, so they describe the model's own distribution (as SGLang and vLLM report
by default), not the distribution the token was drawn from. Softmax runs in float32 whatever the
logits' dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor


def logprobs_of(logits: Tensor, token_ids: Tensor) -> Tensor:
    """[N, V] raw logits, [N] token ids -> [N] float32 logprob of each id under its row."""
    if logits.dim() != 2 or token_ids.shape != (logits.shape[0],):
        raise ValueError(
            f"expected logits [N, V] and token_ids [N], got {tuple(logits.shape)} and {tuple(token_ids.shape)}"
        )
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, token_ids.long().unsqueeze(1)).squeeze(1)


def top_logprobs(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """[N, V] raw logits -> (values [N, k] float32 descending, ids [N, k] int64).

    k larger than V is clamped to V; k = 0 gives empty [N, 0] tensors.
    """
    if logits.dim() != 2:
        raise ValueError(f"expected logits [N, V], got {tuple(logits.shape)}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logprobs.topk(min(k, logits.shape[-1]), dim=-1)
    return values, ids
