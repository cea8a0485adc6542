"""Grammar backends (`--grammar-backend`): which engine compiles a request's grammar and tracks
its output, behind one interface the scheduler uses.

- `langrt` (default): langrt's own engine (service.GrammarService, grammar.Grammar), the only one
  with jump-forward.
- `xgrammar`, `llguidance`: those packages, adapted in xgrammar_backend.py and
  llguidance_backend.py and compiled in threads (threaded_service.ThreadedGrammarService).

Light to import: the engines load in the scheduler process, when the first constrained request
arrives (whether their packages are installed is checked by ServerArgs, at start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from concurrent.futures import Future

    import torch

    from langrt.constrained.spec import GrammarSpec
    from langrt.constrained.vocab import TokenVocabulary

class GrammarMatcherLike(Protocol):
    """One request's place in its grammar. Used by the scheduler thread alone (no locking);
    `copy()` forks it (n > 1 shares a compiled grammar, never a matcher).

    - `fill_bitmask(bitmask, row)`: the tokens allowed next as bits of int32 words into
      bitmask[row] (CPU, [batch, ceil(V / 32)]; bits past the vocabulary zero); EOS only where
      the grammar may end. Does not move the matcher.
    - `accept_token(token)` / `accept_sampled(token)` (the same, for a model's token): advance;
      False, and no change, where the grammar forbids it.
    - `is_terminated()`: EOS was accepted, or the grammar is complete and allows nothing more
      (the scheduler then finishes the request, type `stop`, without another pass).
    - `grammar.vocab.eos_token_ids`: the tokens that end the output.
    - Jump-forward: `certain_tail(n)` (tokens the grammar alone decides), `propose_drafts(n,
      encode)` and `allowed_ids_along(drafts, rows)`. A matcher without jump-forward returns []
      from the first two and [None] * rows from the last (never asked: it drafts nothing).
    """

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None: ...
    def accept_token(self, token: int) -> bool: ...
    def accept_sampled(self, token: int) -> bool: ...
    def is_terminated(self) -> bool: ...
    def copy(self) -> GrammarMatcherLike: ...
    def certain_tail(self, max_tokens: int) -> list[int]: ...
    def propose_drafts(self, max_tokens: int, encode: Callable[[str], list[int]]) -> list[int]: ...
    def allowed_ids_along(self, drafts: list[int], n_rows: int) -> list: ...


class GrammarServiceLike(Protocol):
    """Compiles off the scheduler thread. `submit(spec)`: a future grammar (its `matcher()` gives
    a GrammarMatcherLike), failing with InvalidRequest (HTTP 400) naming the problem, or when the
    compile runs past the time limit; the same future for the same spec while it is cached.
    `close()`: stop compiling."""

    def submit(self, spec: GrammarSpec) -> Future: ...
    def close(self) -> None: ...


def prechecked(backend: str) -> bool:
    """Whether requests' grammars are checked before they reach the compiler: langrt's
    translation (validation.check_grammar) is its own engine's first compile step and cheap, so
    the main process and the scheduler run it on arrival. The other engines' compile is their
    check (a failure fails the request alone, with a 400), and langrt's check would refuse what
    they accept."""
    return backend == "langrt"


def make_grammar_service(
    backend: str, vocab: TokenVocabulary, encode: Callable[[str], list[int]], timeout_s: float
) -> GrammarServiceLike:
    """The compile service of `backend` over `vocab` (encode: the tokenizer's text -> ids)."""
    if backend == "langrt":
        from langrt.constrained.service import GrammarService

        return GrammarService(vocab, timeout_s=timeout_s)
    from langrt.constrained.threaded_service import ThreadedGrammarService

    if backend == "xgrammar":
        from langrt.constrained.xgrammar_backend import XGrammarBackend

        return ThreadedGrammarService(XGrammarBackend(vocab).compile, timeout_s)
    if backend == "llguidance":
        from langrt.constrained.llguidance_backend import LLGuidanceBackend

        return ThreadedGrammarService(LLGuidanceBackend(vocab, encode).compile, timeout_s)
    raise ValueError(f"unknown grammar backend {backend!r}")
