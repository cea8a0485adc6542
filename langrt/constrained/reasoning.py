"""Think, then follow the grammar: a matcher for reasoning models' outputs.

A reasoning model writes its thinking first and ends it with one token (`</think>`); only the
answer after that token is held to the request's grammar (JSON schema, regex, tool calls).
`ThinkThenGrammar` wraps any backend's matcher (constrained/backends/base.GrammarMatcherLike) and is
one itself, so the scheduler, jump-forward and speculative drafts use it unchanged:

    thinking --end token--> answering (the inner matcher, from its initial state)

While thinking every token is allowed but EOS (an answer must follow; without a grammar EOS
is allowed too). With a budget (`max_reasoning_tokens`), once that many thinking tokens are
out only the end token is allowed, so the answer always begins in time. The inner matcher is
not touched until the end token is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from langrt.constrained.bitmask import allocate_token_bitmask
from langrt.constrained.reasoning_syntax import reasoning_syntax


@dataclass(frozen=True, eq=False)
class ThinkTokens:
    """The end-of-thinking token and the mask rows a thinking matcher fills (built once per
    server, shared by every request's matcher)."""

    end_id: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    open_row: torch.Tensor = field(repr=False)  # every token (free thinking, no grammar after)
    free_row: torch.Tensor = field(repr=False)  # every token but EOS (thinking before a grammar)
    end_row: torch.Tensor = field(repr=False)  # the end token alone (the budget is spent)

    def __post_init__(self):
        assert 0 <= self.end_id < self.vocab_size, "the end-of-thinking token must be in the vocabulary"

    @classmethod
    def build(cls, end_id: int, vocab_size: int, eos_token_ids) -> ThinkTokens:
        eos = frozenset(int(t) for t in eos_token_ids)
        open_row = allocate_token_bitmask(1, vocab_size)[0]
        free_row = open_row.clone()
        for token in eos:
            if token < vocab_size:
                _set_bit(free_row, token, False)
        end_row = torch.zeros_like(open_row)
        _set_bit(end_row, end_id, True)
        return cls(end_id, vocab_size, eos, open_row, free_row, end_row)

    @property
    def vocab(self) -> ThinkTokens:
        """What the scheduler reads of a grammar's vocabulary (`eos_token_ids`), for the free
        answer of a request with a budget and no grammar."""
        return self


def _set_bit(row: torch.Tensor, token: int, on: bool) -> None:
    word, bit = divmod(token, 32)
    value = int(row[word]) & 0xFFFFFFFF
    value = value | (1 << bit) if on else value & ~(1 << bit)
    row[word] = value - 2**32 if value >= 2**31 else value


class FreeAnswer:
    """The matcher of an answer with no grammar (a request that only bounds its thinking):
    every token allowed, ended by EOS."""

    def __init__(self, tokens: ThinkTokens, terminated: bool = False):
        self.grammar = tokens  # `grammar.vocab.eos_token_ids`, as the scheduler reads it
        self.terminated = terminated

    def copy(self) -> FreeAnswer:
        return FreeAnswer(self.grammar, self.terminated)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        _copy_row(bitmask, row, self.grammar.open_row)

    def accept_token(self, token: int) -> bool:
        if self.terminated:
            return False
        self.terminated = token in self.grammar.eos_token_ids
        return True

    accept_sampled = accept_token

    def is_terminated(self) -> bool:
        return self.terminated

    def certain_tail(self, max_tokens: int) -> list[int]:
        return []

    def propose_drafts(self, max_tokens: int, encode: Callable[[str], list[int]]) -> list[int]:
        return []

    def allowed_ids_along(self, drafts: list[int], n_rows: int) -> list[None]:
        return [None] * n_rows


def _copy_row(bitmask: torch.Tensor, row: int, words: torch.Tensor) -> None:
    n = min(words.numel(), bitmask.shape[1])
    bitmask[row, :n].copy_(words[:n])
    bitmask[row, n:] = 0


class ThinkThenGrammar:
    """`inner` (a GrammarMatcherLike, or FreeAnswer) after a thinking phase ended by
    `tokens.end_id`. `budget`: thinking tokens allowed before the end token is forced (None:
    unbounded). Used by the scheduler thread alone, like every matcher."""

    def __init__(
        self, tokens: ThinkTokens, inner: Any, budget: int | None = None, thought: int = 0, thinking: bool = True
    ):
        assert budget is None or budget >= 0, "a thinking budget is a token count"
        self.tokens = tokens
        self.inner = inner
        self.budget = budget
        self.thought = thought  # thinking tokens accepted so far (the end token not counted)
        self.thinking = thinking

    @property
    def grammar(self):
        return self.inner.grammar

    @property
    def budget_spent(self) -> bool:
        return self.budget is not None and self.thought >= self.budget

    def copy(self) -> ThinkThenGrammar:
        return ThinkThenGrammar(self.tokens, self.inner.copy(), self.budget, self.thought, self.thinking)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if not self.thinking:
            self.inner.fill_bitmask(bitmask, row)
        elif self.budget_spent:
            _copy_row(bitmask, row, self.tokens.end_row)
        else:
            free = isinstance(self.inner, FreeAnswer)
            _copy_row(bitmask, row, self.tokens.open_row if free else self.tokens.free_row)

    def prefetch(self, drafts: list[int]) -> None:
        """The answer's masks (GrammarMatcher.prefetch) once thinking is over; while thinking
        the rows are fixed ones."""
        if not self.thinking and hasattr(self.inner, "prefetch"):
            self.inner.prefetch(drafts)

    def accept_token(self, token: int) -> bool:
        return self._think(token) if self.thinking else self.inner.accept_token(token)

    def accept_sampled(self, token: int) -> bool:
        return self._think(token) if self.thinking else self.inner.accept_sampled(token)

    def _think(self, token: int) -> bool:
        """Accept a token of the thinking phase; False (and no change) where it is forbidden."""
        if token == self.tokens.end_id:
            self.thinking = False
            return True
        if self.budget_spent or token >= self.tokens.vocab_size:
            return False
        if token in self.tokens.eos_token_ids:
            # EOS while thinking ends the output only when no grammar waits for an answer
            return isinstance(self.inner, FreeAnswer) and self.inner.accept_token(token)
        self.thought += 1
        return True

    def is_terminated(self) -> bool:
        if self.thinking and not isinstance(self.inner, FreeAnswer):
            return False  # the inner grammar has not started
        return self.inner.is_terminated()

    def certain_tail(self, max_tokens: int) -> list[int]:
        """Nothing is certain while thinking (the forced end token takes a pass; the grammar's
        certain text after it follows from the next call)."""
        return [] if self.thinking else self.inner.certain_tail(max_tokens)

    def propose_drafts(self, max_tokens: int, encode: Callable[[str], list[int]]) -> list[int]:
        return [] if self.thinking else self.inner.propose_drafts(max_tokens, encode)

    def allowed_ids_along(self, drafts: list[int], n_rows: int) -> list:
        """While thinking, full rows (masked by fill_bitmask as each token is chosen, so drafts
        that cross the end token still meet the grammar after it)."""
        return [None] * n_rows if self.thinking else self.inner.allowed_ids_along(drafts, n_rows)


def think_then(tokens: ThinkTokens, matcher: Any | None, budget: int | None) -> ThinkThenGrammar:
    """A reasoning request's matcher: `matcher` (None: no grammar) after its thinking."""
    return ThinkThenGrammar(tokens, FreeAnswer(tokens) if matcher is None else matcher, budget)


def think_tokens_for(
    parser: str | None, encode: Callable[[str], list[int]], vocab_size: int, eos_token_ids
) -> ThinkTokens | None:
    """The server's ThinkTokens for `--reasoning-parser parser` (None without one). Raises
    ValueError where the tokenizer does not spell the parser's end tag as one token (the model is
    not that kind of reasoning model, and no token could end its thinking)."""
    if parser is None:
        return None
    end = reasoning_syntax(parser).end
    ids = encode(end)
    if len(ids) != 1:
        raise ValueError(
            f"--reasoning-parser {parser}: the tokenizer spells {end} as {len(ids)} tokens {ids}, not one; "
            "this model does not end its thinking with that token (use the parser of its family, or none)"
        )
    return ThinkTokens.build(ids[0], vocab_size, eos_token_ids)
