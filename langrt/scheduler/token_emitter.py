"""Choosing each request's next tokens from logits, and feeding them to its stop checks and its
grammar.

Where the rest of a request's output is certain (its grammar allows one token at a time up to
its end), jump-forward outputs it at once and the request ends without another pass.

A request may come with drafts: tokens guessed to follow its output, computed in the same
forward pass as its last sampled token. Where drafts come from is the draft sources' business
(the grammar's forced text: constraints.GrammarDrafts; n-grams: speculative/ngram.py; chosen
per request by speculative.Drafter); how they are verified is this module's, whatever their
source. A request's logits rows are read in order: the token sampled
from row i is output, and if it equals draft i the next row (which was computed with that very
token in context) is sampled too. The first mismatch ends the run. Each output token is thus
sampled from the model's distribution given exactly the tokens before it, as without drafts;
drafts only save the forward passes they predicted.

Drafts a draft model sampled come with the distributions q they were drawn from
(Emission.probs): a sampled request's row i then keeps draft i with probability
min(1, p(x) / q(x)) and otherwise draws from max(0, p - q) (sampler.rejection_sample), which
keeps more drafts than asking the sample to equal them and still gives tokens that follow p
exactly. Greedy rows need no q: their token is the argmax either way.

Where a greedy request's grammar allows few tokens (inside forced text, a digit, `true` or
`false`), the choice is the argmax over those tokens' logits alone (the same token as the argmax
of the masked full row), drafted rows or not, so the LM head and the masking are spent only on
rows with many choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from langrt.scheduler.constraints import (
    GrammarDrafts,
    advance_grammar,
    allowed_ids_along_drafts,
    certain_tail,
    mask_logits,
)
from langrt.scheduler.logprob_collector import OutputLogprobs
from langrt.request import Req, StopChecker
from langrt.sampling.penalties import ban_tokens, early_stop_bans
from langrt.sampling.sampler import SamplingBatch, rejection_sample
from langrt.speculative.drafter import Drafter, DraftSource, SpeculativeSource


@dataclass
class Emission:
    """One request's turn: its logits rows (row i predicts the token after draft i - 1)."""

    req: Req
    rows: list[int]
    drafts: list[int]
    probs: Any = None  # per draft, the [V] distribution it was sampled from (None: guesses)

    def proposal(self, position: int) -> tuple[int, torch.Tensor] | None:
        """(draft, its distribution) at `position` for rejection sampling; None where there is
        none (no draft there, or drafts that were guesses)."""
        if self.probs is None or position >= len(self.drafts):
            return None
        return self.drafts[position], self.probs[position]


class TokenEmitter:
    def __init__(
        self,
        stop_checker: StopChecker,
        tokenizer,
        jump_forward: bool,
        stats,
        draft_source: DraftSource | None = None,
        speculative: Sequence[SpeculativeSource] = (),
    ):
        """`draft_source`: jump-forward's (the grammar's forced text by default; none without
        jump-forward); `speculative`: the guessing sources, asked where it has no drafts."""
        self.stop_checker = stop_checker
        self.tokenizer = tokenizer
        self.jump_forward = jump_forward
        self.stats = stats
        if draft_source is None and jump_forward:
            draft_source = GrammarDrafts(tokenizer.encode)
        self.drafter = Drafter(draft_source if jump_forward else None, speculative)

    @property
    def draft_source(self) -> DraftSource | None:
        """Jump-forward's draft source (None without jump-forward)."""
        return self.drafter.grammar

    def emit(self, emissions: list[Emission], hidden: torch.Tensor, runner) -> None:
        """Choose and output tokens from the rows of `hidden` the emissions name, and verify
        each emission's drafts against them (whatever their source)."""
        # rows where the grammar allows few tokens: only those tokens' logits are computed
        allowed = [allowed_ids_along_drafts(e.req, e.drafts, len(e.rows)) for e in emissions]
        picks, sparse = _among_allowed(emissions, allowed, hidden, runner)
        full = sorted(
            {row for e, p in zip(emissions, picks) for row, t in zip(e.rows, p) if t is None and row not in sparse}
        )
        logits, where = _rows_to_sample(full, sparse, hidden, runner)
        active, position = list(range(len(emissions))), 0
        kept = [0] * len(emissions)
        while active:
            chosen = {}
            sampled = [k for k in active if picks[k][position] is None]
            if sampled:
                rows = torch.tensor([where[emissions[k].rows[position]] for k in sampled], device=hidden.device)
                reqs, proposals = (
                    [emissions[k].req for k in sampled],
                    [emissions[k].proposal(position) for k in sampled],
                )
                chosen = dict(zip(sampled, self._sample(reqs, logits[rows], proposals)))
            for k in active:
                if picks[k][position] is not None:
                    chosen[k] = picks[k][position]
                    self._output(emissions[k].req, chosen[k])
            still = []
            for k in active:
                e = emissions[k]
                if position < len(e.drafts) and chosen[k] == e.drafts[position] and not e.req.finished:
                    kept[k] += 1
                    still.append(k)
            active, position = still, position + 1
        for e, n in zip(emissions, kept):
            self._verified(e, n)

    def _verified(self, emission: Emission, kept: int) -> None:
        """Tell the drafts' source how many were kept, and count them as its kind."""
        if self.drafter.verified(emission.req, len(emission.drafts), kept):
            self.stats.spec_verifications += 1
            self.stats.spec_draft_tokens += len(emission.drafts)
            self.stats.spec_accepted_tokens += kept
        else:
            self.stats.jump_forward_tokens += kept

    def propose(self, req: Req) -> None:
        """Jump-forward, if the grammar forces text: where the rest of the output is certain
        (certain_tail: `"}` closing an object, say), its tokens are output now and the request
        ends without another pass, since no token after them needs computing; otherwise drafts
        for the next pass, from the first draft source that has any."""
        if self._certain_tail(req):
            self.drafter.propose(req)

    def _certain_tail(self, req: Req) -> bool:
        """Output the certain rest of the request's output (jump-forward); whether it still
        runs after that."""
        if req.finished:
            return False
        for token in certain_tail(req) if self.jump_forward else []:
            self._output(req, token)
            self.stats.certain_tail_tokens += 1
            if req.finished:
                return False
        return True

    def propose_all(self, reqs: list[Req]) -> None:
        """`propose` for each request, the speculative sources' drafts asked for all at once
        (a draft model runs them as one batch)."""
        drafting = []
        for req in reqs:
            if self._certain_tail(req):
                drafting.append(req)
        self.drafter.propose_all(drafting)

    def _sample(self, reqs: list[Req], logits: torch.Tensor, proposals: list | None = None) -> list[int]:
        """Each request's next token from its [V] logits row; output it and check stops.
        proposals[i]: (draft, the distribution it was sampled from), to keep or reject by
        rejection sampling (None: sample as usual)."""
        logprobs = OutputLogprobs.capture(reqs, logits)  # raw model logprobs, before penalties
        self._ban_early_stops(reqs, logits)
        sampling = SamplingBatch.from_params([r.params for r in reqs], [r.generator for r in reqs], logits.device)
        sampling.apply_penalties(logits, [r.input_ids for r in reqs], [r.output_ids for r in reqs])
        mask_logits(reqs, logits)
        judged = [i for i, p in enumerate(proposals or []) if p is not None and not reqs[i].params.is_greedy]
        next_ids = sampling.sample(logits).tolist() if len(judged) < len(reqs) else [0] * len(reqs)
        if judged:
            p = sampling.distribution(logits)[judged]
            q = torch.stack([proposals[i][1].to(p.device) for i in judged])
            drafts = torch.tensor([proposals[i][0] for i in judged], device=p.device)
            kept = rejection_sample(p, q, drafts, [reqs[i].generator for i in judged]).tolist()
            for i, token in zip(judged, kept):
                next_ids[i] = token
        logprobs.record(next_ids)
        for req, token in zip(reqs, next_ids):
            self._output(req, token)
        return next_ids

    def _output(self, req: Req, token: int) -> None:
        req.output_ids.append(token)
        self.stop_checker.update(req, token)
        advance_grammar(req, token, self.tokenizer.eos_token_id)

    def _ban_early_stops(self, reqs: list[Req], logits: torch.Tensor) -> None:
        """Before min_new_tokens, EOS and stop token ids cannot be sampled (unless a grammar
        governs the request: it alone decides when the output may end)."""
        banned = early_stop_bans(
            [r.params for r in reqs],
            [len(r.output_ids) for r in reqs],
            [r.matcher is not None for r in reqs],
            self.stop_checker.eos_token_ids,
        )
        if any(banned):
            ban_tokens(logits, banned)


def _among_allowed(
    emissions: list[Emission], allowed: list[list], hidden: torch.Tensor, runner
) -> tuple[list[list], dict]:
    """Per emission and row where `allowed` lists the tokens, only their logits computed (none
    for a greedy row where one token alone is allowed): (greedy rows' picks, the allowed token
    of highest logit, the lowest id on ties, as the argmax over the masked full row gives, None
    elsewhere; {row of hidden: [V] logits, -inf but at the allowed tokens} for sampled rows,
    the masked full row's values, so the sampler draws the same token from the same noise)."""
    chosen = [[None] * len(a) for a in allowed]
    places = []
    for k, a in enumerate(allowed):
        for i, ids in enumerate(a):
            if ids is not None and len(ids) == 1 and emissions[k].req.params.is_greedy:
                chosen[k][i] = int(ids[0])
            elif ids is not None:
                places.append((k, i))
    if not places:
        return chosen, {}
    lists = [allowed[k][i] for k, i in places]
    sizes = [len(ids) for ids in lists]
    rows = torch.repeat_interleave(torch.tensor([emissions[k].rows[i] for k, i in places]), torch.tensor(sizes))
    ids = torch.cat(lists)
    token_ids = ids.to(hidden.device)
    logits = runner.compute_logits_of(hidden, rows.to(hidden.device), token_ids)
    values, ids, sparse, start = logits.tolist(), ids.tolist(), {}, 0
    for (k, i), n in zip(places, sizes):
        if emissions[k].req.params.is_greedy:
            part = values[start : start + n]
            chosen[k][i] = ids[start + part.index(max(part))]  # the first maximum: the lowest id
        else:
            row = torch.full((runner.vocab_size,), float("-inf"), device=hidden.device)
            sparse[emissions[k].rows[i]] = row.index_copy_(
                0, token_ids[start : start + n].long(), logits[start : start + n]
            )
        start += n
    return chosen, sparse


def _rows_to_sample(full: list[int], sparse: dict, hidden: torch.Tensor, runner) -> tuple[torch.Tensor | None, dict]:
    """The logits rows the sampler reads: the full rows of `full` (rows of hidden), then the
    rows of `sparse`; and where each row of hidden is among them."""
    parts = [runner.compute_logits(hidden[torch.tensor(full, device=hidden.device)])] if full else []
    parts += [row.unsqueeze(0) for row in sparse.values()]
    where = {row: i for i, row in enumerate(full + list(sparse))}
    return (torch.cat(parts) if len(parts) > 1 else parts[0] if parts else None), where
