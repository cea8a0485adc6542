"""Req: one generation request as the scheduler tracks it, and why it finished."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import regex  # like `re`, plus a time limit per search
import torch

from langrt.messages import RequestOptions
from langrt.tokenizer.incremental_decoder import IncrementalDecoder
from langrt.sampling.sampling_params import SamplingParams


@dataclass(frozen=True)
class FinishReason:
    """docs/serving.md, native API: type `length`, `stop` (matched string or token id) or `abort`."""

    type: str
    length: int | None = None
    matched: str | int | None = None
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == "length":
            return {"type": "length", "length": self.length}
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        return {"type": "abort", "message": self.message}

    @classmethod
    def by_length(cls, length: int) -> "FinishReason":
        return cls("length", length=length)

    @classmethod
    def by_stop(cls, matched: str | int | None) -> "FinishReason":
        return cls("stop", matched=matched)

    @classmethod
    def by_abort(cls, message: str) -> "FinishReason":
        return cls("abort", message=message)


@dataclass
class LogprobRecord:
    """Logprobs of some positions: one (logprob, token id) per position, plus the top-k lists."""

    values: list[float | None] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    top: list[list[tuple[float, int]] | None] = field(default_factory=list)


@dataclass
class SentMarks:
    """How much of a request's output has been reported (ids, logprob entries)."""

    output_ids: int = 0
    input_logprobs: int = 0
    output_logprobs: int = 0
    settings: bool = False


class ReqStatus(enum.Enum):
    """A request's place in its lifecycle:

        WAITING --admitted--> RUNNING --finished, aborted--> FINISHED
                                 |  ^
                       retracted |  | admitted again
                                 v  |
                              RETRACTED (back in the waiting queue, its prefix cached)

    A request waiting for its grammar to compile is WAITING; one admitted for a chunk of its
    prompt is RUNNING from that chunk on. Any state may go to FINISHED (an abort)."""

    WAITING = "waiting"
    RUNNING = "running"
    RETRACTED = "retracted"
    FINISHED = "finished"


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    options: RequestOptions = RequestOptions()
    status: ReqStatus = ReqStatus.WAITING

    output_ids: list[int] = field(default_factory=list)
    kv_row: int | None = None  # its row of slot ids while it runs (see mem/cache_manager.py):
    # [0, cached_len) shared through the prefix cache and locked via cache_node,
    # [cached_len, kv_len) private, the rest not computed.
    kv_len: int = 0
    cached_len: int = 0
    cache_node: Any = None
    cached_tokens: int = 0  # prompt tokens reused from the cache at first admission (reported)
    admit_seq: int = 0  # order of the latest admission (the youngest is retracted first)
    finish_reason: FinishReason | None = None
    generator: torch.Generator | None = None
    decoder: IncrementalDecoder | None = None  # only when stop strings need the text
    stop_patterns: list | None = None  # params.stop_regex, compiled on first use
    text_end: int | None = None  # a stop string matched: the output text ends here
    matcher: Any = (
        None  # a grammar matcher (constrained/backends/base.GrammarMatcherLike) when the output is constrained
    )
    draft_ids: list[int] = field(default_factory=list)  # drafts for the next pass, not yet output
    draft_source: Any = None  # the DraftSource of draft_ids, told how they fared (speculative/drafter.py)
    draft_probs: Any = None  # per draft, the [V] distribution it was sampled from (a draft model's; None: guesses)
    draft_state: dict[str, Any] = field(default_factory=dict)  # what draft sources keep per request, by source
    spec_accepted_tokens: int | None = None  # speculative drafts kept (meta_info); None: speculation off
    grammar_mask_s: float = 0.0  # time spent filling its grammar's token masks (the dashboard's)
    grammar_masks: int = 0
    input_logprobs: LogprobRecord = field(default_factory=LogprobRecord)
    output_logprobs: LogprobRecord = field(default_factory=LogprobRecord)
    sent: "SentMarks" = field(default_factory=lambda: SentMarks())
    lora: Any = None  # its LoRA adapter (langrt.lora.LoraAdapter), resolved on arrival; None: the base model
    pooled: Any = None  # an embedding request's PoolState (langrt.embeddings.decoder_embed); None: generation

    def __post_init__(self):
        assert self.input_ids, "a request needs at least one prompt token"

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is ReqStatus.FINISHED

    @property
    def return_logprob(self) -> bool:
        return self.options.return_logprob

    @property
    def top_logprobs_num(self) -> int:
        return self.options.top_logprobs_num

    @property
    def stream(self) -> bool:
        return self.options.stream

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def cache_ids(self) -> list[int]:
        """all_ids as the prefix cache keys them: under an adapter, in that adapter's own key
        space, so K/V computed with one adapter (or none) is never reused under another."""
        return self.all_ids if self.lora is None else self.lora.cache_key(self.all_ids)

    @property
    def pending_ids(self) -> list[int]:
        """Tokens the next forward pass computes: those without K/V, then any drafts."""
        return self.all_ids[self.kv_len :] + self.draft_ids

    def take_drafts(self) -> tuple[list[int], Any]:
        """The drafts of the pass just run and their distributions (None unless sampled from
        one); the request has none after."""
        drafts, probs = self.draft_ids, self.draft_probs if self.draft_ids else None
        self.draft_ids, self.draft_probs = [], None
        return drafts, probs

    @property
    def visible_output_ids(self) -> list[int]:
        """Output ids that make up the text: a matched stop token is not part of it."""
        r = self.finish_reason
        if r is not None and r.type == "stop" and self.output_ids and r.matched == self.output_ids[-1]:
            return self.output_ids[:-1]
        return self.output_ids

    @property
    def input_logprob_start(self) -> int:
        """First prompt position whose logprob is reported (== prompt_len: none)."""
        start = self.options.logprob_start_len
        if not self.return_logprob or start < 0:
            return self.prompt_len
        return min(start, self.prompt_len)

    def finish(self, reason: FinishReason, text_end: int | None = None) -> None:
        """Mark finished; `text_end`: the output text is cut there (a stop string matched)."""
        self.finish_reason = reason
        self.text_end = text_end
        self.status = ReqStatus.FINISHED

    @property
    def max_prefix_len(self) -> int:
        """Longest cached prefix this request may reuse: at least one token must be computed (to
        get logits), and positions whose input logprobs are still owed must be computed too."""
        limit = self.seq_len - 1
        owed = self.next_input_logprob_pos
        if owed < self.prompt_len:
            limit = min(limit, max(0, owed - 1))
        return limit

    @property
    def next_input_logprob_pos(self) -> int:
        """The next prompt position whose input logprob is owed (>= prompt_len: none)."""
        return self.input_logprob_start + len(self.input_logprobs.values)

    @property
    def remaining_new_tokens(self) -> int:
        return self.params.max_new_tokens - len(self.output_ids)

    def max_seq_len(self, context_len: int) -> int:
        """Tokens this request can hold at most: prompt + max_new_tokens, capped by the context."""
        return min(self.prompt_len + self.params.max_new_tokens, context_len)


# Why 50 ms: stop regexes are searched after every token, in the scheduler's loop; a pattern that
# backtracks catastrophically (`(x|x)+y`) would otherwise stall every request for hours. Sane
# patterns over a whole output take well under a millisecond. The budget covers all of a
# request's patterns at one token.
STOP_REGEX_TIMEOUT_S = 0.05


class StopChecker:
    """Decides, after each new token, whether a request is done (as docs/programs.md and docs/serving.md describe)."""

    def __init__(self, eos_token_ids: set[int], context_len: int):
        self.eos_token_ids = eos_token_ids
        self.context_len = context_len

    def update(self, req: Req, token_id: int) -> None:
        """Call after appending `token_id` to req.output_ids; finishes the request if it is done."""
        p = req.params
        n_out = len(req.output_ids)
        may_stop = n_out > p.min_new_tokens  # stops are ignored before min_new_tokens
        if may_stop and (token_id in p.stop_token_ids or (not p.ignore_eos and token_id in self.eos_token_ids)):
            req.finish(FinishReason.by_stop(token_id))  # the stop token itself is not detokenized
            return
        if req.decoder is not None:
            new_text = req.decoder.push([token_id])
            if may_stop and new_text and self._check_stop_strings(req, len(new_text)):
                return
        if n_out >= p.max_new_tokens or req.seq_len >= self.context_len:
            req.finish(FinishReason.by_length(n_out))

    def _check_stop_strings(self, req: Req, new_len: int) -> bool:
        text = req.decoder.text
        p = req.params
        hits = []
        if p.stop:
            # Only a match that overlaps the new text can be new.
            start = max(0, len(text) - new_len - max(map(len, p.stop)) + 1)
            hits = [(i, s, i + len(s)) for s in p.stop if (i := text.find(s, start)) >= 0]
        deadline = time.monotonic() + STOP_REGEX_TIMEOUT_S  # for all of the request's patterns
        for i, pattern in enumerate(p.stop_regex):
            try:
                if req.stop_patterns is None:
                    req.stop_patterns = [regex.compile(r) for r in p.stop_regex]
                m = req.stop_patterns[i].search(text, timeout=max(0.0, deadline - time.monotonic()))
            except (TimeoutError, regex.error) as e:
                why = (
                    f"is not supported: {e}"
                    if isinstance(e, regex.error)
                    else (f"took over {STOP_REGEX_TIMEOUT_S:g} s to match the output (catastrophic backtracking)")
                )
                req.finish(FinishReason.by_abort(f"stop_regex {pattern!r} {why}; simplify it"))
                return True
            if m:
                hits.append((m.start(), m.group(0), m.end()))
        if not hits:
            return False
        start, matched, end = min(hits)
        req.finish(FinishReason.by_stop(matched), text_end=len(text) if p.no_stop_trim else start)
        return True


def eos_token_ids(config, tokenizer) -> set[int]:
    """The tokens that end a request: the model config's and the tokenizer's end of text."""
    ids = set(config.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
