"""Grammar backends (`--grammar-backend`): which engine compiles a request's grammar and tracks
its output, behind one interface the scheduler uses.

- `langrt` (default): langrt's own engine (langrt_backend.py over grammar.Grammar), the only one
  with jump-forward.
- `xgrammar`, `llguidance`: those packages, adapted in xgrammar_backend.py and
  llguidance_backend.py (langrt's EBNF written in their dialects by dialects.py).

Every backend compiles through the one compile service (constrained/service.py: cache, queue,
time limit); `create_grammar_service` picks the backend. Light to import: the engines load in the
scheduler process, when the first constrained request arrives (whether their packages are
installed is checked by ServerArgs, at start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    import torch

    from langrt.constrained.service import GrammarService
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


class GrammarBackend(Protocol):
    """One engine's compiler over one vocabulary, driven by the compile service.

    - `compile(spec)`: the compiled grammar (its `matcher()` gives a GrammarMatcherLike), or
      InvalidRequest naming what is wrong with the spec; any other exception is a bug in the engine
      or its adapter (the service refuses the request with its message, and goes on).
    - `stops_itself`: True where `compile` raises InvalidRequest on its own once past the time
      limit (langrt kills its worker process), so the service runs compiles one after another on
      its thread and `compile` is never called concurrently. False for native code that cannot be
      stopped: each compile gets a thread of its own, abandoned at the limit (it runs on to its end
      and nothing reads it), so `compile` must be thread-safe.
    - `close()`: release what the backend holds (a worker process); no compile follows.
    """

    stops_itself: bool

    def compile(self, spec: GrammarSpec) -> Any: ...
    def close(self) -> None: ...


def prechecked(backend: str) -> bool:
    """Whether requests' grammars are checked before they reach the compiler: langrt's
    translation (validation.check_grammar) is its own engine's first compile step and cheap, so
    the main process and the scheduler run it on arrival. The other engines' compile is their
    check (a failure fails the request alone, with a 400), and langrt's check would refuse what
    they accept."""
    return backend == "langrt"


def create_grammar_backend(
    backend: str, vocab: TokenVocabulary, encode: Callable[[str], list[int]], timeout_s: float
) -> GrammarBackend:
    """The engine `backend` names, over `vocab` (encode: the tokenizer's text -> ids)."""
    if backend == "langrt":
        from langrt.constrained.backends.langrt_backend import LangrtBackend

        return LangrtBackend(vocab, timeout_s)
    if backend == "xgrammar":
        from langrt.constrained.backends.xgrammar_backend import XGrammarBackend

        return XGrammarBackend(vocab)
    if backend == "llguidance":
        from langrt.constrained.backends.llguidance_backend import LLGuidanceBackend

        return LLGuidanceBackend(vocab, encode)
    raise ValueError(f"unknown grammar backend {backend!r}; choose from langrt, xgrammar, llguidance")


def create_grammar_service(
    backend: str, vocab: TokenVocabulary, encode: Callable[[str], list[int]], timeout_s: float
) -> GrammarService:
    """The compile service of `backend` over `vocab`, with its time limit per grammar."""
    from langrt.constrained.service import GrammarService

    return GrammarService(create_grammar_backend(backend, vocab, encode, timeout_s), timeout_s)
