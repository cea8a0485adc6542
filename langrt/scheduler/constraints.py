"""Constrained decoding in the scheduler: requests waiting for their grammar, and the per-step
masking and advancing of grammar matchers.

A request with a regex / JSON schema / choices waits in the GrammarQueue until its grammar is
compiled (off the scheduler thread, see constrained/service.py); only then does it join the
waiting queue. A compile failure fails that request alone.
"""

from __future__ import annotations

from concurrent.futures import Future
import torch

from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest
from langrt.scheduler.req import FinishReason, Req


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
    matcher.grammar.note_next(before, token)
    if matcher.is_terminated():
        req.finish(FinishReason.by_stop(token if token in matcher.grammar.vocab.eos_token_ids else eos_token_id))
    return before


def certain_tail(req: Req) -> list[int]:
    """The rest of the output where the grammar leaves no choice: from the request's state to
    the grammar's end, one allowed token at each step (the token any sampler must pick there,
    whatever the logits), cut at max_new_tokens. [] if some step allows more than one token, or
    if the request asks for logprobs (those need the tokens' logits)."""
    if req.matcher is None or req.finished or req.return_logprob:
        return []
    matcher, tokens = req.matcher.copy(), []
    while len(tokens) < req.remaining_new_tokens and not matcher.is_terminated():
        allowed = matcher.grammar.masks.allowed_ids(matcher.state)
        if allowed is None or allowed.numel() != 1:
            return []
        tokens.append(int(allowed[0]))
        matcher.accept_token(tokens[-1])
    return tokens  # to the grammar's end, or to max_new_tokens (the request ends by length)


def propose_drafts(req: Req, encode) -> list[int]:
    """Jump-forward: where the grammar forces the next characters, tokens spelling them are
    proposed as drafts; the run goes on through JSON's optional spaces, guessed from the
    output's own style. The next forward pass computes the drafts together with the last sampled
    token (or the prompt's last, for the output's opening text), and each draft is kept only if
    the token sampled at its position equals it (see token_emitter.py): the output is exactly
    what it would be without jump-forward, in fewer passes.

    The tokens: from each state, the token models wrote most often from there (in any request),
    else the tokenizer's own spelling of the rest of the run. Models often split text
    differently from the tokenizer (`language` + `s`, or ` ["` across the forced `[` and the
    free `"`), and from one request to the next (`em` + `ployed`, `employ` + `e` + `d`); every
    draft after a wrong one is computed in vain. Where models most often leave the run early
    (a token running on into free text, like ` false` after the forced space), drafting stops:
    the token sampled at the last draft's row comes from the model anyway."""
    matcher = req.matcher
    if matcher is None or req.finished:
        return []
    run = matcher.likely_bytes()
    budget = req.remaining_new_tokens - 1
    if not run or budget <= 0:
        return []
    grammar = matcher.grammar
    token_bytes = grammar.vocab.token_bytes
    state, tokens, pos = matcher.state, [], 0
    while pos < len(run) and len(tokens) < budget:
        seen = grammar.next_tokens.get(state)
        if not seen:
            tokens += _tokenizer_spelling(run[pos:], encode, token_bytes)
            break
        token = max(seen, key=seen.__getitem__)
        data = token_bytes[token] if token < len(token_bytes) else None
        if not data or not run.startswith(data, pos):
            break
        tokens.append(token)
        pos += len(data)
        state = grammar.dfa.walk_noting_space(state, data)[0]
    return tokens[:budget]


def _tokenizer_spelling(run: bytes, encode, token_bytes) -> list[int]:
    """The tokenizer's tokens for the whole characters of `run` ([] if they would not spell
    those bytes back exactly)."""
    run = _whole_characters(run)
    if not run:
        return []
    tokens = encode(run.decode("utf-8"))
    if b"".join(token_bytes[t] or b"" if t < len(token_bytes) else b"" for t in tokens) != run:
        return []
    return tokens


def _whole_characters(data: bytes) -> bytes:
    """The longest prefix of `data` that ends on a character boundary."""
    for end in range(len(data), max(len(data) - 4, 0), -1):
        try:
            data[:end].decode("utf-8")
            return data[:end]
        except UnicodeDecodeError:
            continue
    return b""
