"""Choice methods for `select` (docs/programs.md, select).

A method gets, per choice, the logprobs of the choice's own tokens (`[logprob, token_id, text]`
entries, conditioned on the prefix) and, when it asks for them, the choice's logprobs scored
alone. It returns the index of the winner and the method's meta info. Ties go to the earliest
choice: every comparison below keeps the first maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

TokenLogprobs = Sequence[Sequence]  # [[logprob or None, token_id, text or None], ...]


def _values(entries: TokenLogprobs) -> list[float]:
    # A missing logprob (the first token of a text scored alone) counts as 0.
    return [e[0] or 0.0 for e in entries]


def mean_logprob(entries: TokenLogprobs) -> float:
    values = _values(entries)
    return sum(values) / len(values) if values else float("-inf")


def _first_argmax(scores: Sequence[float]) -> int:
    best = 0
    for i, score in enumerate(scores):
        if score > scores[best]:
            best = i
    return best


@dataclass(frozen=True)
class ChoiceResult:
    index: int
    meta: dict


class TokenLengthNormalized:
    """The highest mean token logprob."""

    requires_unconditional = False

    def __call__(self, conditional: list[TokenLogprobs], unconditional=None) -> ChoiceResult:
        scores = [mean_logprob(c) for c in conditional]
        return ChoiceResult(_first_argmax(scores), {})

    def __repr__(self) -> str:
        return "token_length_normalized"


class GreedyTokenSelection:
    """Position by position, keep the choices whose logprob is maximal there, until one is left.
    A choice shorter than the longest is padded with its own mean logprob."""

    requires_unconditional = False

    def __call__(self, conditional: list[TokenLogprobs], unconditional=None) -> ChoiceResult:
        width = max((len(c) for c in conditional), default=0)
        matrix = [_values(c) + [mean_logprob(c)] * (width - len(c)) for c in conditional]
        remaining = list(range(len(conditional)))
        for column in range(width):
            if len(remaining) <= 1:
                break
            best = max(matrix[i][column] for i in remaining)
            remaining = [i for i in remaining if matrix[i][column] == best]
        return ChoiceResult(remaining[0], {"greedy_logprob_matrix": matrix})

    def __repr__(self) -> str:
        return "greedy_token_selection"


class UnconditionalLikelihoodNormalized:
    """The highest mean logprob gain over the choice scored alone (its first position counts 0)."""

    requires_unconditional = True

    def __call__(
        self, conditional: list[TokenLogprobs], unconditional: list[TokenLogprobs] | None = None
    ) -> ChoiceResult:
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs each choice's unconditional logprobs")
        scores = [mean_logprob(c) - mean_logprob(u) for c, u in zip(conditional, unconditional, strict=True)]
        meta = {
            "unconditional_token_logprobs": [list(u) for u in unconditional],
            "normalized_unconditional_prompt_logprobs": scores,
        }
        return ChoiceResult(_first_argmax(scores), meta)

    def __repr__(self) -> str:
        return "unconditional_likelihood_normalized"


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
