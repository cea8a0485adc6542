"""Draft-model drafts (--speculative-algorithm DRAFT): a smaller model with the target's
tokenizer generates each request's next tokens ahead of the target, which verifies them all in
its next pass (scheduler/token_emitter.py).

The draft model has a ModelRunner of its own, with its own paged KV pools and prefix cache (a
radix tree like the target's; none with --disable-radix-cache), run through a CacheManager as
the target's are. Each request has a `_DraftSeq` there: the tokens whose K/V the draft's pool
holds for it. Before drafting, the seq is cut back to where it agrees with the request (the
slots of rejected drafts go back to the pool), the tokens it lacks (the new output, or the whole
prompt the first time, less a cached prefix) are computed for every drafting request in one
extend pass, and each further draft costs one decode pass over them all. A request that stops
running (finished, aborted, retracted) gives its seq to the draft's cache, so a later request
with the same prefix, or the same one resuming, computes only the rest.

Drafts are chosen as the target would choose: the request's penalties, temperature, top-k/p,
min-p, early-stop bans and grammar mask (a copy of its matcher walked along the drafts) applied
to the draft's logits. Greedy requests draft the argmax; sampled ones draw from that
distribution q and hand it over with the drafts (req.draft_probs), so the target's rejection
sampling keeps its output distribution exactly the target's. How many drafts a request gets
adapts to how its drafts fare, as the n-gram source's do (ngram.DraftLength).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from langrt.constrained.bitmask import mask_with_matchers
from langrt.errors import ModelLoadError
from langrt.mem.cache_manager import CacheManager
from langrt.model.forward_batch import ForwardBatch, ForwardMode
from langrt.sampling.penalties import ban_tokens, early_stop_bans
from langrt.sampling.sampler import SamplingBatch
from langrt.request import Req
from langrt.speculative.ngram import DraftLength


@dataclass
class _DraftSeq:
    """One request on the draft model's side, in the shape a CacheManager expects of a request:
    `ids` have K/V in the draft's pool at positions [0, kv_len) (the first cached_len of them
    locked in its prefix cache), reserved slots may follow."""

    ids: list[int] = field(default_factory=list)
    kv_row: int | None = None
    kv_len: int = 0
    cached_len: int = 0
    cache_node: Any = None

    @property
    def all_ids(self) -> list[int]:
        return self.ids

    @property
    def cache_ids(self) -> list[int]:
        return self.ids


@dataclass
class _DraftState:
    """What the draft source keeps on a request (Req.draft_state)."""

    length: DraftLength
    seq: _DraftSeq | None = None


@dataclass
class _Round:
    """One request's drafting in one round: up to `n` drafts, and the distributions they were
    sampled from (sampled requests only)."""

    req: Req
    seq: _DraftSeq
    n: int
    reserved_end: int
    walker: Any  # a copy of the request's grammar matcher, walked along the drafts (or None)
    stops: set[int]
    drafts: list[int] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)
    done: bool = False

    def add(self, token: int, q: torch.Tensor) -> None:
        """Draft `token` (sampled from `q`); done at n drafts, at a stop token, or where the
        grammar ends."""
        if self.walker is not None and not self.walker.accept_token(token):
            self.done = True  # masked out: only where the grammar allows nothing at all
            return
        self.drafts.append(token)
        self.probs.append(q)
        ended = self.walker is not None and self.walker.is_terminated()
        self.done = len(self.drafts) >= self.n or token in self.stops or ended


class DraftModelDrafts:
    """--speculative-algorithm DRAFT: up to `max_drafts` tokens per request and pass, generated
    by the draft model `runner` (its pools and prefix cache its own)."""

    name = "draft_model"

    def __init__(self, runner, max_drafts: int, eos_token_ids, radix: bool = True):
        assert max_drafts >= 1
        self.runner = runner
        self.cache = CacheManager.for_runner(runner, radix=radix)
        self.max_drafts = max_drafts
        self.eos_token_ids = set(eos_token_ids)

    @classmethod
    def load(cls, args, target, tokenizer) -> "DraftModelDrafts":
        """The draft model of `args` (--speculative-draft-model-path) beside the `target`
        ModelRunner: same device, dtype, context length and pool size in tokens, whole in this
        process (under --tp-size, on rank 0, which schedules). Refused (ModelLoadError) where
        its vocabulary is not the target's `tokenizer`'s."""
        from langrt.model.model_runner import ModelRunner
        from langrt.model.source import ModelSource

        source = ModelSource.resolve(args.speculative_draft_model_path)
        config = source.model_config()
        check_same_vocabulary(target.vocab_size, tokenizer, source, config.vocab_size)
        draft_args = dataclasses.replace(
            args,
            model_path=str(source.path),
            tokenizer_path=None,
            load_format="auto",
            context_length=target.plan.context_len,
            max_total_tokens=target.plan.max_total_tokens,
            max_running_requests=target.plan.max_running_requests,
            speculative_algorithm=None,
            speculative_draft_model_path=None,
            tp_size=1,
        )
        runner = ModelRunner(draft_args, source, config, progress=False)
        eos = set(config.eos_token_ids) | set(target.config.eos_token_ids)
        if getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(tokenizer.eos_token_id)
        return cls(runner, args.speculative_num_draft_tokens, eos, radix=not args.disable_radix_cache)

    # ---- the DraftSource interface --------------------------------------------------------

    def drafts(self, req: Req) -> list[int]:
        return self.drafts_for([req])[0]

    def drafts_for(self, reqs: list[Req]) -> list[list[int]]:
        """Drafts for each request (maybe none), all requests' drafted together: one extend
        pass, then a decode pass per further draft. Sets req.draft_probs of sampled requests."""
        rounds = [self._start(req) for req in reqs]
        active = [r for r in rounds if r is not None]
        if active:
            self._choose(active, self._forward(active, [r.req.all_ids[r.seq.kv_len :] for r in active]))
        while active:
            active = [r for r in active if not r.done]
            if active:
                self._choose(active, self._forward(active, [[r.drafts[-1]] for r in active]))
        out = []
        for req, r in zip(reqs, rounds):
            if r is None:
                out.append([])
                continue
            self.cache.trim(r.seq, r.reserved_end)  # slots reserved for drafts not made
            if r.drafts and not req.params.is_greedy:
                req.draft_probs = r.probs  # rows of each pass's [B, V] distributions: no copies
            out.append(r.drafts)
        return out

    def verified(self, req: Req, proposed: int, accepted: int) -> None:
        state = req.draft_state.get(self.name)
        if state is not None:
            state.length.update(proposed, accepted)

    def release(self, req: Req) -> None:
        """The request stopped running: its seq (what agrees with its tokens) to the cache."""
        state = req.draft_state.get(self.name)
        if state is None or state.seq is None:
            return
        self._cut(state.seq, req.all_ids)
        self.cache.release(state.seq)
        state.seq = None

    def flush(self) -> bool:
        return self.cache.flush()

    # ---- one round ------------------------------------------------------------------------

    def _start(self, req: Req) -> _Round | None:
        """The request's round: its seq in step with it and slots reserved for the tokens the
        round computes; None where it gets no drafts (paused, no budget, no room)."""
        if req.finished:
            return None
        state = req.draft_state.get(self.name)
        if state is None:
            state = req.draft_state[self.name] = _DraftState(DraftLength(self.max_drafts))
        n = min(state.length.take(), req.remaining_new_tokens - 1)
        if n < 1:
            return None
        ids = req.all_ids
        if state.seq is None:
            state.seq = _DraftSeq()
            if not self.cache.open(state.seq, self.cache.match(ids[:-1])):
                state.seq = None
                return None
            state.seq.ids = list(ids[: state.seq.kv_len])
        seq = state.seq
        self._cut(seq, ids)
        needed = len(ids) - seq.kv_len + n - 1  # the tokens it lacks, and the drafts but the last
        if not self.cache.reserve(seq, seq.kv_len, needed):
            self.release(req)
            return None
        p = req.params
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_token_ids)
        walker = req.matcher.copy() if req.matcher is not None else None
        return _Round(req, seq, n, seq.kv_len + needed, walker, stops)

    def _cut(self, seq: _DraftSeq, ids: list[int]) -> None:
        """Back to the longest prefix of `seq` that agrees with `ids`, less one token at least
        (the last one's logits are the next draft's); the rest's slots to the pool."""
        keep, limit = 0, min(seq.kv_len, len(ids) - 1)
        while keep < limit and seq.ids[keep] == ids[keep]:
            keep += 1
        assert keep >= seq.cached_len, "a cached prefix is the request's own tokens"
        if keep < seq.kv_len:
            end, seq.kv_len = seq.kv_len, keep
            del seq.ids[keep:]
            self.cache.trim(seq, end)

    def _forward(self, rounds: list[_Round], new: list[list[int]]) -> torch.Tensor:
        """Compute the `new` tokens of each round's seq in one pass (into its reserved slots);
        -> [len(rounds), V] logits of each seq's last token."""
        slots, rows, seq_lens = [], [], []
        for r, tokens in zip(rounds, new):
            seq = r.seq
            slots.append(self.cache.slots(seq, seq.kv_len, seq.kv_len + len(tokens)))
            seq.ids += tokens
            seq.kv_len += len(tokens)
            rows.append(seq.kv_row)
            seq_lens.append(seq.kv_len)
        lens = [len(t) for t in new]
        mode = ForwardMode.DECODE if all(n == 1 for n in lens) else ForwardMode.EXTEND
        ids = [t for tokens in new for t in tokens]
        batch = ForwardBatch.build(mode, ids, torch.cat(slots), rows, seq_lens, lens, self.runner.device)
        hidden = self.runner.forward(batch)
        last = torch.tensor(batch.last_token_rows, device=hidden.device)
        return self.runner.compute_logits(hidden[last])

    def _choose(self, rounds: list[_Round], logits: torch.Tensor) -> None:
        """Each round's next draft from its [V] logits row, chosen as the target would choose
        the token there (its output so far followed by the drafts before it)."""
        reqs = [r.req for r in rounds]
        outputs = [r.req.output_ids + r.drafts for r in rounds]
        params = [r.params for r in reqs]
        bans = early_stop_bans(
            params, [len(o) for o in outputs], [r.walker is not None for r in rounds], self.eos_token_ids
        )
        if any(bans):
            ban_tokens(logits, bans)
        sampling = SamplingBatch.from_params(params, [r.generator for r in reqs], logits.device)
        sampling.apply_penalties(logits, [r.input_ids for r in reqs], outputs)
        mask_with_matchers([r.walker for r in rounds], logits)
        probs = sampling.distribution(logits)
        for r, token, q in zip(rounds, sampling.draw(probs).tolist(), probs):
            r.add(token, q)


def check_same_vocabulary(target_vocab_size: int, tokenizer, draft_source, draft_vocab_size: int) -> None:
    """Refuse a draft model whose vocabulary is not the target's: its logits must name the same
    tokens by the same ids (ModelLoadError naming the first difference)."""
    where = f"the draft model {draft_source.path}"
    if draft_vocab_size != target_vocab_size:
        raise ModelLoadError(
            f"{where} has a vocabulary of {draft_vocab_size} tokens, the target {target_vocab_size}: "
            "a draft model must have the target's tokenizer"
        )
    from langrt.tokenizer.text_decoder import load_text_decoder

    try:
        draft = token_table(load_text_decoder(draft_source.path))
    except Exception as e:
        raise ModelLoadError(f"{where}: cannot read its tokenizer to check it is the target's ({e})") from e
    target = token_table(tokenizer)
    if draft != target:
        differ = sorted(set(draft.items()) ^ set(target.items()), key=lambda item: item[0])
        token_id = differ[0][0]
        raise ModelLoadError(
            f"{where} has another tokenizer than the target: token id {token_id} is "
            f"{draft.get(token_id)!r} there and {target.get(token_id)!r} in the target's; "
            "a draft model must have the target's tokenizer"
        )


def token_table(tokenizer) -> dict[int, str]:
    """id -> token string of a TextDecoder or a transformers tokenizer (added tokens too)."""
    for holder in (
        tokenizer,
        getattr(tokenizer, "backend", None),
        getattr(getattr(tokenizer, "backend", None), "tokenizer", None),
    ):
        if hasattr(holder, "get_vocab"):  # transformers', TextDecoder's tokenizers backend, or the one it wraps
            return {i: token for token, i in holder.get_vocab().items()}
    raise TypeError(f"cannot list the vocabulary of {type(tokenizer).__name__}")
