"""Constrained decoding in the scheduler: requests waiting for their grammar, and the per-step
masking and advancing of grammar matchers.

A request with a regex / JSON schema / choices waits in the GrammarQueue until its grammar is
compiled (off the scheduler thread, see constrained/service.py); only then does it join the
waiting queue. A compile failure fails that request alone.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import torch

from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest
from langrt.managers.req import FinishReason, Req


class GrammarQueue:
    def __init__(self, make_service):
        self._make_service = make_service  # built on first use: the vocabulary takes ~0.3 s
        self._service = None
        self._pending: list[tuple[Req, Future]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, req: Req, spec: GrammarSpec) -> None:
        if self._service is None:
            self._service = self._make_service()
        self._pending.append((req, self._service.submit(spec)))

    def collect(self) -> tuple[list[Req], list[tuple[Req, InvalidRequest]]]:
        """Requests whose grammar is ready (with a fresh matcher), and those whose compile failed."""
        ready, failed, still = [], [], []
        for req, future in self._pending:
            if not future.done():
                still.append((req, future))
            elif future.exception() is not None:
                failed.append((req, future.exception()))
            else:
                req.matcher = future.result().matcher()
                ready.append(req)
        self._pending = still
        return ready, failed

    def remove(self, rid: str) -> Req | None:
        for i, (req, _) in enumerate(self._pending):
            if req.rid == rid:
                del self._pending[i]
                return req
        return None

    def close(self) -> None:
        if self._service is not None:
            self._service.close()


def mask_logits(reqs: list[Req], logits: torch.Tensor) -> None:
    """Disallowed tokens of constrained requests' rows -> -inf, in place."""
    from langrt.constrained.bitmask import apply_token_bitmask

    rows = [i for i, r in enumerate(reqs) if r.matcher is not None]
    if not rows:
        return
    words = (logits.shape[1] + 31) // 32
    bitmask = torch.empty((len(rows), words), dtype=torch.int32)
    for k, i in enumerate(rows):
        reqs[i].matcher.fill_bitmask(bitmask, k)
    apply_token_bitmask(logits, bitmask.to(logits.device), torch.tensor(rows, device=logits.device))


def advance_grammar(req: Req, token: int, eos_token_id: int | None) -> int | None:
    """Feed the sampled token to the request's matcher; finish the request when its grammar is
    complete and admits nothing more (generation stops, type `stop`). Returns the matcher's
    state before the token (None for an unconstrained or finished request)."""
    matcher = req.matcher
    if matcher is None or req.finished:
        return None
    before = matcher.state
    if not matcher.accept_token(token):
        raise RuntimeError(f"request {req.rid}: sampled token {token} that its grammar forbids")
    if matcher.is_terminated():
        req.finish(FinishReason.by_stop(token if token in matcher.grammar.vocab.eos_token_ids else eos_token_id))
    return before


# Why 32: a drafted run is learned once the output has spelled all of it; one that a mismatch
# cut short is finished by the next passes, a few tokens later. Past this many it is dropped.
LEARN_WITHIN_TOKENS = 32


@dataclass
class DraftOrigin:
    """Where a drafted run began: the grammar state and space guess it was drafted from, the
    output length then, and how many bytes it covered."""

    key: tuple[int, bool]
    output_pos: int
    length: int


def propose_drafts(req: Req, encode) -> list[int]:
    """Jump-forward: where the grammar forces the next characters, tokens spelling them are
    proposed as drafts; the run goes on through JSON's optional spaces, guessed from the
    output's own style. The next forward pass computes the drafts together with the last sampled
    token, and each draft is kept only if the token sampled at its position equals it (see
    token_emitter.py): the output is exactly what it would be without jump-forward, in fewer
    passes.

    The tokens: how the model itself spelled the same run before (from the same grammar state,
    in any request), else the tokenizer's own spelling of the text alone. Models often split
    text differently from the tokenizer (`language` + `s`, or ` ["` across the forced `[` and
    the free `"`), and every draft after a wrong one is computed in vain."""
    matcher = req.matcher
    if matcher is None or req.finished:
        return []
    grammar = matcher.grammar
    _learn_spellings(req)
    forced = matcher.likely_bytes()
    if not forced:
        return []
    try:
        text = forced.decode("utf-8")
    except UnicodeDecodeError:
        forced = _whole_characters(forced)
        text = forced.decode("utf-8")
    if not text:
        return []
    key = (matcher.state, matcher.spaced)
    tokens = grammar.learned_spellings.get(key)
    if tokens is None:
        tokens = encode(text)
        if b"".join(grammar.vocab.token_bytes[t] or b"" for t in tokens) != forced:
            return []  # the tokenizer would not spell these bytes back exactly
    req.draft_origins.append(DraftOrigin(key, len(req.output_ids), len(forced)))
    return tokens[: max(0, req.remaining_new_tokens - 1)]


def _learn_spellings(req: Req) -> None:
    """Record, for each drafted run the output now covers, the tokens it was spelled with (up to
    the first that reaches its end)."""
    token_bytes = req.matcher.grammar.vocab.token_bytes
    learned = req.matcher.grammar.learned_spellings
    pending = []
    for origin in req.draft_origins:
        spelled, tokens = 0, []
        for token in req.output_ids[origin.output_pos :]:
            data = token_bytes[token] if token < len(token_bytes) else None
            if not data:
                break
            tokens.append(token)
            spelled += len(data)
            if spelled >= origin.length:
                break
        if spelled >= origin.length:
            learned[origin.key] = tokens
        elif len(req.output_ids) - origin.output_pos < LEARN_WITHIN_TOKENS and len(tokens) == len(req.output_ids) - origin.output_pos:
            pending.append(origin)
    req.draft_origins = pending


def _whole_characters(data: bytes) -> bytes:
    """The longest prefix of `data` that ends on a character boundary."""
    for end in range(len(data), 0, -1):
        try:
            data[:end].decode("utf-8")
            return data[:end]
        except UnicodeDecodeError:
            continue
    return b""
