"""Repetition / frequency / presence penalties and token banning, in place on [B, V] logits.

Conventions (those of vLLM and HF transformers):
- repetition_penalty r over every token seen in the prompt or the output so far: a positive logit
  is divided by r, a negative one multiplied by it (r > 1 discourages, r < 1 encourages);
- frequency_penalty f: logit -= f * (times the token occurs in the output so far);
- presence_penalty q:  logit -= q * (1 if the token occurs in the output so far).
Repetition is applied first, then the two additive penalties. Rows whose penalties are neutral are
left bit-for-bit untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import torch
from torch import Tensor

from langrt.sampling.sampling_params import SamplingParams


MIN_REPETITION_PENALTY = 1e-6


@dataclass
class Penalties:
    """Per-row penalty values of one batch; build with `from_params` (None when all neutral)."""

    frequency: Tensor  # [B, 1] float32
    presence: Tensor  # [B, 1] float32
    repetition: Tensor  # [B, 1] float32
    additive_rows: tuple[bool, ...]  # rows with a frequency or presence penalty
    repetition_rows: tuple[bool, ...]  # rows with a repetition penalty != 1

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device) -> Penalties | None:
        if not any(p.needs_penalties for p in params):
            return None

        def column(values: list[float]) -> Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)

        return cls(
            frequency=column([p.frequency_penalty for p in params]),
            presence=column([p.presence_penalty for p in params]),
            # Floored: a float32 divisor of 1e-300 is 0, and logit / 0 = inf turns the row to NaN.
            repetition=column([max(p.repetition_penalty, MIN_REPETITION_PENALTY) for p in params]),
            additive_rows=tuple(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params),
            repetition_rows=tuple(p.repetition_penalty != 1.0 for p in params),
        )

    def apply(
        self,
        logits: Tensor,
        prompt_ids: Sequence[Sequence[int]],
        output_ids: Sequence[Sequence[int]],
    ) -> None:
        vocab, device = logits.shape[-1], logits.device
        if any(self.repetition_rows):
            seen = token_counts(_rows(prompt_ids, self.repetition_rows), vocab, device) > 0
            seen |= token_counts(_rows(output_ids, self.repetition_rows), vocab, device) > 0
            apply_repetition_penalty(logits, seen, self.repetition)
        if any(self.additive_rows):
            counts = token_counts(_rows(output_ids, self.additive_rows), vocab, device)
            logits -= self.frequency * counts + self.presence * (counts > 0)


def _rows(ids: Sequence[Sequence[int]], keep: Sequence[bool]) -> list[Sequence[int]]:
    """The id lists of the rows in `keep`, empty lists elsewhere (nothing to count there)."""
    if len(ids) != len(keep):
        raise ValueError(f"expected token ids for {len(keep)} rows, got {len(ids)}")
    return [row if k else () for row, k in zip(ids, keep)]


def token_counts(ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> Tensor:
    """[B, vocab_size] float32: how often each token occurs in each row of `ids`."""
    lengths = torch.tensor([len(row) for row in ids], dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(ids)), lengths).to(device)
    cols = torch.tensor(list(chain.from_iterable(ids)), dtype=torch.int64, device=device)
    counts = torch.zeros(len(ids), vocab_size, dtype=torch.float32, device=device)
    ones = torch.ones(cols.shape[0], dtype=torch.float32, device=device)
    return counts.index_put_((rows, cols), ones, accumulate=True)


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: Tensor) -> None:
    """In place: on `seen` tokens, divide positive logits by `penalty`, multiply negative ones."""
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits.copy_(torch.where(seen, penalized, logits))


def ban_tokens(logits: Tensor, banned: Sequence[Sequence[int]]) -> None:
    """In place: set logits[i, t] = -inf for every t in banned[i].

    The scheduler's tool for `min_new_tokens`: ban EOS and `stop_token_ids` on rows that have
    not produced enough tokens yet. Never ban every token of a row (its softmax would be NaN).
    """
    if len(banned) != logits.shape[0]:
        raise ValueError(f"expected banned ids for {logits.shape[0]} rows, got {len(banned)}")
    lengths = torch.tensor([len(row) for row in banned], dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(banned)), lengths).to(logits.device)
    cols = torch.tensor(list(chain.from_iterable(banned)), dtype=torch.int64, device=logits.device)
    logits[rows, cols] = float("-inf")


def early_stop_bans(
    params: Sequence, output_lens: Sequence[int], constrained: Sequence[bool], eos_ids
) -> list[list[int]]:
    """Per row, the ids that may not end the output yet: before min_new_tokens, EOS (unless
    ignore_eos) and the stop token ids, except where a grammar governs the row (it alone
    decides when the output may end). For `ban_tokens`."""
    return [
        list(set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids)))
        if n < p.min_new_tokens and not c
        else []
        for p, n, c in zip(params, output_lens, constrained)
    ]
