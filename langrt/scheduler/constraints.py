"""Constrained decoding in the scheduler: requests waiting for their grammar, and the per-step
masking and advancing of grammar matchers.

A request with a regex / JSON schema / choices waits in the GrammarQueue until its grammar is
compiled (off the scheduler thread, by the --grammar-backend engine: constrained/backends/);
only then does it join the waiting queue. A compile failure fails that request alone.

Jump-forward asks the request's matcher (constrained/jump_forward.py) and adds what belongs to
the request: its budget (max_new_tokens), whether it is finished, whether it wants logprobs.
Matchers of the other engines draft nothing, so their requests decode token by token.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

from langrt.constrained.bitmask import mask_with_matchers
from langrt.constrained.reasoning import ThinkTokens, think_then
from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest
from langrt.request import FinishReason, Req


COMPILE_LOG = 64  # compiled grammars remembered for the dashboard
logger = logging.getLogger("langrt.scheduler")
T = TypeVar("T")


@dataclass(frozen=True)
class CompileRecord:
    """One grammar the backend compiled: its kind (regex, json_schema, ...), the start of its
    text, and the seconds from submission to result (queueing behind other compiles included)."""

    kind: str
    text: str
    seconds: float
    ok: bool


class GrammarQueue:
    def __init__(self, make_service):
        self._make_service = make_service  # built on first use: the vocabulary takes ~0.3 s
        self._service = None
        self._pending: list[tuple[Req, Future]] = []
        self.compiles: deque[CompileRecord] = deque(maxlen=COMPILE_LOG)
        self.cache_hits = 0  # requests whose grammar was compiled (or compiling) already

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, req: Req, spec: GrammarSpec) -> None:
        if self._service is None:
            self._service = self._make_service()
        future = self._service.submit(spec)
        if future.done() or any(f is future for _, f in self._pending):
            self.cache_hits += 1
        else:
            start = time.perf_counter()
            future.add_done_callback(lambda f: self._record(spec, f, time.perf_counter() - start))
        self._pending.append((req, future))

    def _record(self, spec: GrammarSpec, future: Future, seconds: float) -> None:
        """On the compile thread: deque appends are atomic, so no lock."""
        self.compiles.append(CompileRecord(spec.kind, str(spec.text)[:80], seconds, future.exception() is None))

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


class MaskPrefetch:
    """The token masks a pass's sampling will read, computed on a thread while the model runs
    the pass: each constrained request's allowed tokens at its grammar state and along its
    drafts (matcher.prefetch; matchers without it are skipped). The forward pass spends its
    time in torch's kernels and the masks theirs in numpy and C++, all of which release the GIL,
    so a state's first mask (a trie walk over the vocabulary) no longer adds to the step; a
    memoized one was a lookup anyway. The thread only reads the matchers, and only while the pass runs:
    `during` returns once it is done."""

    def __init__(self, enabled: bool = True):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="langrt-masks") if enabled else None

    def during(self, reqs: list[Req], forward: Callable[[], T]) -> T:
        """forward()'s result, the masks `reqs` will read computed meanwhile (see the class)."""
        work = [(r.matcher.prefetch, list(r.draft_ids)) for r in reqs if _prefetchable(r)]
        job = self._pool.submit(_prefetch_all, work) if self._pool is not None and work else None
        try:
            return forward()
        finally:
            if job is not None:
                job.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _prefetchable(req: Req) -> bool:
    return req.matcher is not None and not req.finished and hasattr(req.matcher, "prefetch")


def _prefetch_all(work: list) -> None:
    """A failure here is left to the scheduler thread, which computes the same mask itself and
    fails the request that needs it as it would have without prefetching."""
    for prefetch, drafts in work:
        try:
            prefetch(drafts)
        except Exception:  # noqa: BLE001 - see the docstring
            logger.debug("mask prefetch failed; the step computes it", exc_info=True)


def mask_logits(reqs: list[Req], logits: torch.Tensor) -> None:
    """Disallowed tokens of constrained requests' rows -> -inf, in place."""
    mask_with_matchers([r.matcher for r in reqs], logits, timed=reqs)


def advance_grammar(req: Req, token: int, eos_token_id: int | None) -> None:
    """Feed the sampled token to the request's matcher (langrt's learns it as its grammar's
    spelling there, for jump-forward drafts); finish the request when its grammar is complete
    and admits nothing more (generation stops, type `stop`). Nothing for an unconstrained or
    finished request."""
    matcher = req.matcher
    if matcher is None or req.finished:
        return
    if not matcher.accept_sampled(token):
        raise RuntimeError(f"request {req.rid}: sampled token {token} that its grammar forbids")
    if matcher.is_terminated():
        req.finish(FinishReason.by_stop(token if token in matcher.grammar.vocab.eos_token_ids else eos_token_id))


def think_first(req: Req, tokens: ThinkTokens | None) -> None:
    """A reasoning request (params.reasoning) gets a matcher that lets it think before its
    grammar applies (constrained/reasoning.py), and one that bounds its thinking where it has
    no grammar but a budget. Nothing for other requests."""
    p = req.params
    if not p.reasoning or (req.matcher is None and p.max_reasoning_tokens is None):
        return
    assert tokens is not None, "validation refuses reasoning requests on a server without --reasoning-parser"
    req.matcher = think_then(tokens, req.matcher, p.max_reasoning_tokens)


def certain_tail(req: Req) -> list[int]:
    """The rest of the request's output where its grammar leaves no choice, cut at
    max_new_tokens (GrammarMatcher.certain_tail). [] if the request asks for logprobs (those
    need the tokens' logits)."""
    if req.matcher is None or req.finished or req.return_logprob:
        return []
    return req.matcher.certain_tail(req.remaining_new_tokens)


class GrammarDrafts:
    """Jump-forward's draft source (see token_emitter.DraftSource): where the request's grammar
    forces the next characters, the tokens likely spelling them (GrammarMatcher.propose_drafts:
    as models spelled them before, else as the tokenizer would), leaving room for the token
    sampled after them within max_new_tokens."""

    def __init__(self, encode: Callable[[str], list[int]]):
        self.encode = encode

    def drafts(self, req: Req) -> list[int]:
        if req.matcher is None or req.finished:
            return []
        return req.matcher.propose_drafts(req.remaining_new_tokens - 1, self.encode)


def allowed_ids_along_drafts(req: Req, drafts: list[int], n_rows: int) -> list[torch.Tensor | None]:
    """Per row of a request (its drafts' rows and the row after them): the ids its grammar
    state allows there (the state after the drafts before the row;
    GrammarMatcher.allowed_ids_along), or None where the row needs its full logits (penalized
    requests, logprobs asked for, no grammar, or too many tokens allowed)."""
    if req.matcher is None or req.return_logprob or req.params.needs_penalties:
        return [None] * n_rows
    return req.matcher.allowed_ids_along(drafts, n_rows)
