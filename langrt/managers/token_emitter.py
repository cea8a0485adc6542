"""Choosing each request's next tokens from logits, and feeding them to its stop checks and its
grammar.

A request may come with jump-forward drafts (constraints.propose_drafts): tokens the grammar
forces, computed in the same forward pass as its last sampled token. Then its logits rows are
read in order: the token sampled from row i is output, and if it equals draft i the next row
(which was computed with that very token in context) is sampled too. The first mismatch ends
the run. Each output token is thus sampled from the model's distribution given exactly the
tokens before it, as without drafts; drafts only save the forward passes they predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from langrt.managers.constraints import advance_grammar, mask_logits, propose_drafts
from langrt.managers.logprob_collector import OutputLogprobs
from langrt.managers.req import Req, StopChecker
from langrt.sampling.penalties import ban_tokens
from langrt.sampling.sampler import SamplingBatch


@dataclass
class Emission:
    """One request's turn: its logits rows (row i predicts the token after draft i - 1)."""

    req: Req
    rows: list[int]
    drafts: list[int]


class TokenEmitter:
    def __init__(self, stop_checker: StopChecker, tokenizer, jump_forward: bool, stats):
        self.stop_checker = stop_checker
        self.tokenizer = tokenizer
        self.jump_forward = jump_forward
        self.stats = stats

    def emit(self, emissions: list[Emission], logits: torch.Tensor) -> None:
        """Sample and output tokens; `logits` holds every row any emission names."""
        active, position = emissions, 0
        while active:
            rows = torch.tensor([e.rows[position] for e in active], device=logits.device)
            chosen = self._sample([e.req for e in active], logits[rows])
            still = []
            for e, token in zip(active, chosen):
                if position < len(e.drafts) and token == e.drafts[position] and not e.req.finished:
                    self.stats.jump_forward_tokens += 1
                    still.append(e)
            active, position = still, position + 1

    def propose(self, req: Req) -> None:
        """Drafts for the next pass (jump-forward), if the grammar forces text."""
        if self.jump_forward and not req.finished:
            req.draft_ids = propose_drafts(req, self.tokenizer.encode)

    def _sample(self, reqs: list[Req], logits: torch.Tensor) -> list[int]:
        """Each request's next token from its [V] logits row; output it and check stops."""
        logprobs = OutputLogprobs.capture(reqs, logits)  # raw model logprobs, before penalties
        self._ban_early_stops(reqs, logits)
        sampling = SamplingBatch.from_params([r.params for r in reqs], [r.generator for r in reqs], logits.device)
        sampling.apply_penalties(logits, [r.input_ids for r in reqs], [r.output_ids for r in reqs])
        mask_logits(reqs, logits)
        next_ids = sampling.sample(logits).tolist()
        logprobs.record(next_ids)
        eos = self.tokenizer.eos_token_id
        for req, token in zip(reqs, next_ids):
            req.output_ids.append(token)
            self.stop_checker.update(req, token)
            advance_grammar(req, token, eos)
        return next_ids

    def _ban_early_stops(self, reqs: list[Req], logits: torch.Tensor) -> None:
        """Before min_new_tokens, EOS and stop token ids cannot be sampled (unless a grammar
        governs the request: it alone decides when the output may end)."""
        eos = self.stop_checker.eos_token_ids
        banned = [
            list(set(r.params.stop_token_ids) | (set() if r.params.ignore_eos else eos))
            if len(r.output_ids) < r.params.min_new_tokens and r.matcher is None
            else []
            for r in reqs
        ]
        if any(banned):
            ban_tokens(logits, banned)
