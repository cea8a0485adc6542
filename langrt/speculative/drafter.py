"""Draft sources and their composition: which source proposes a request's drafts, and what each
source learns from their verification.

A request takes its drafts from the first source that has any for it, in order of trust: the
grammar's forced text (jump-forward) before a speculative guess (n-grams), so a request may take
drafts from several sources over its life, one source per pass. The verification itself is the
emitter's (scheduler/token_emitter.py), and the scheduler gives back the slots of rejected
drafts (CacheManager.trim), whatever their source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from langrt.request import Req


class DraftSource(Protocol):
    """Where drafts come from: tokens guessed to follow a request's output (at most its
    remaining budget less one, the token sampled after them). Any guess is safe, since
    TokenEmitter.emit keeps only the drafts the model's own samples confirm; a good one saves
    forward passes. `drafts` reads the request and changes nothing of it but state the source
    keeps there for itself (Req.draft_state)."""

    def drafts(self, req: Req) -> list[int]: ...


class SpeculativeSource(DraftSource, Protocol):
    """A draft source that guesses (n-grams, a draft model) and is told how its guesses fared:
    `verified(req, proposed, accepted)` after the pass that checked them, where of `proposed`
    drafts the first `accepted` were kept. `name` labels its figures. `flush()` forgets whatever
    it learned from earlier requests (called only while no request runs), so a flushed server
    drafts as a fresh one does."""

    name: str

    def verified(self, req: Req, proposed: int, accepted: int) -> None: ...

    def flush(self) -> bool: ...


@dataclass
class DraftCounts:
    """Figures of the speculative sources' drafts: `verifications` counts a request's drafts
    checked in one pass (its accepted length that pass is its kept drafts plus the token sampled
    after them)."""

    verifications: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def accept_length(self) -> float:
        """Tokens a verifying pass gives a request on average (1.0: as without drafts)."""
        return (self.accepted + self.verifications) / self.verifications if self.verifications else 0.0


class Drafter:
    """The sources a request's drafts may come from: `grammar` (jump-forward's forced text, or
    None without it) first, then the speculative ones in order."""

    def __init__(self, grammar: DraftSource | None, speculative: Sequence[SpeculativeSource] = ()):
        self.grammar = grammar
        self.speculative = list(speculative)
        self.counts = DraftCounts()

    @property
    def sources(self) -> list[DraftSource]:
        return ([self.grammar] if self.grammar is not None else []) + self.speculative

    def propose(self, req: Req) -> None:
        """Set req.draft_ids (and req.draft_source) from the first source with drafts for it."""
        self.propose_all([req])

    def propose_all(self, reqs: list[Req]) -> None:
        """`propose` for each request; a source with `drafts_for(reqs)` (a draft model) is asked
        once for all the requests that reach it, so it drafts for them in one batch. A source
        may also set req.draft_probs (the distributions its drafts were sampled from)."""
        for req in reqs:
            req.draft_ids, req.draft_source, req.draft_probs = [], None, None
        for source in self.sources:
            if not reqs:
                return
            many = getattr(source, "drafts_for", None)
            proposed = many(reqs) if many is not None else [source.drafts(req) for req in reqs]
            for req, drafts in zip(reqs, proposed):
                if drafts:
                    req.draft_ids, req.draft_source = drafts, source
                else:
                    req.draft_probs = None
            reqs = [req for req in reqs if not req.draft_ids]

    def release(self, req: Req) -> None:
        """`req` stopped running (finished, aborted or retracted): sources that hold something
        for it (a draft model's KV slots) let it go."""
        for source in self.speculative:
            if hasattr(source, "release"):
                source.release(req)

    def flush(self) -> None:
        """The prefix cache was emptied: every speculative source forgets earlier requests too
        (a draft model's prefix cache, the n-grams of recent outputs)."""
        for source in self.speculative:
            source.flush()

    def verified(self, req: Req, proposed: int, accepted: int) -> bool:
        """Tell the source of `req`'s last drafts how they fared; whether they were speculative
        (their figures are counted here, and on the request: Req.spec_accepted_tokens)."""
        source, req.draft_source = req.draft_source, None
        if source is None or proposed == 0 or source is self.grammar:
            return False
        source.verified(req, proposed, accepted)
        self.counts.verifications += 1
        self.counts.drafted += proposed
        self.counts.accepted += accepted
        req.spec_accepted_tokens = (req.spec_accepted_tokens or 0) + accepted
        return True


def make_speculative_sources(args, runner=None, tokenizer=None) -> list[SpeculativeSource]:
    """The sources --speculative-algorithm asks for ([] without it); a draft model's (DRAFT)
    shares the target's `runner`'s context length and pool size and must have `tokenizer`'s
    vocabulary."""
    if args.speculative_algorithm is None:
        return []
    if args.speculative_algorithm == "DRAFT":
        from langrt.speculative.draft_model import DraftModelDrafts

        return [DraftModelDrafts.load(args, runner, tokenizer)]
    from langrt.speculative.ngram import NgramDrafts, RecentOutputs

    return [NgramDrafts(args.speculative_num_draft_tokens, RecentOutputs())]
