"""The scheduler: owns the waiting queue and the running batch, and drives the ModelRunner.

Each `step()` runs one forward pass over:
- one decode token of every running request (continuous batching: requests join and leave at
  every step), and
- a prefill batch of waiting requests admitted by policy (`schedule_policy`) within the token
  budget and memory (`prefill_adder`), possibly a chunk of a long prompt.
Both share the pass, so a long prompt never stalls the decoding requests.

Memory pressure: decode needs one free slot per running request each step. The scheduler evicts
unlocked cached prefixes first; if that is not enough it retracts the most recently admitted
requests: their computed tokens go to the prefix cache, they return to the front of the waiting
queue, and they resume later (usually re-matching what they computed). No request is dropped.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import torch

from langrt.constrained.backends.base import prechecked
from langrt.constrained.reasoning import think_tokens_for
from langrt.constrained.spec import GrammarSpec
from langrt.errors import InvalidRequest
from langrt.scheduler.constraints import GrammarQueue, MaskPrefetch, think_first
from langrt.tokenizer.incremental_decoder import IncrementalDecoder
from langrt.scheduler.logprob_collector import collect_input_logprobs
from langrt.scheduler.prefill_adder import PrefillAdder, PrefillItem, reserved_tokens
from langrt.request import FinishReason, Req, ReqStatus, StopChecker, eos_token_ids
from langrt.scheduler.schedule_policy import SchedulePolicy
from langrt.validation import Limits, validate_request
from langrt.lora.registry import LoraRegistry
from langrt.mem.cache_manager import CacheManager
from langrt.mem.hicache import create_tiers
from langrt.model.forward_batch import ForwardBatch, ForwardMode
from langrt.model.model_runner import ModelRunner
from langrt.scheduler.token_emitter import Emission, TokenEmitter
from langrt.sampling.sampler import make_generator
from langrt.speculative.drafter import make_speculative_sources
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# Expected share of max_new_tokens a request will really generate, used to reserve room at
# admission. Starts cautious, decays as decode steps succeed, resets after a retraction.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.002


@dataclass
class SchedulerStats:
    prompt_tokens: int = 0  # over first admissions
    cached_tokens: int = 0
    retractions: int = 0
    forward_passes: int = 0
    forward_tokens: int = 0  # tokens the passes computed (prompts, decodes and drafts)
    drafted_tokens: int = 0  # drafts computed (jump-forward's and speculative ones)
    jump_forward_tokens: int = 0  # jump-forward drafts kept (the rest were computed in vain)
    spec_verifications: int = 0  # a request's speculative drafts checked in one pass
    spec_draft_tokens: int = 0  # speculative drafts computed
    spec_accepted_tokens: int = 0  # speculative drafts kept
    certain_tail_tokens: int = 0  # output with no pass at all: the grammar's certain ends

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def spec_accept_rate(self) -> float:
        """Speculative drafts kept of those computed (SGLang's spec_accept_rate)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_accept_length(self) -> float:
        """Tokens a request got from a pass that verified its speculative drafts, on average: the
        kept drafts plus the token sampled after them (SGLang's spec_accept_length; 0: none yet)."""
        n = self.spec_verifications
        return (self.spec_accepted_tokens + n) / n if n else 0.0


class Scheduler:
    def __init__(self, runner: ModelRunner, tokenizer, args: ServerArgs):
        self.runner = runner
        self.tokenizer = tokenizer
        self.context_len = runner.plan.context_len
        tiers = create_tiers(args, runner)  # --hicache-*: where evicted prefixes go
        self.cache = CacheManager.for_runner(runner, radix=not args.disable_radix_cache, tiers=tiers)
        self.limits = Limits(self.context_len, runner.vocab_size, self.cache.size)
        self.token_budget = args.chunked_prefill_size if args.chunked_prefill_size > 0 else float("inf")
        self.stop_checker = StopChecker(eos_token_ids(runner.config, tokenizer), self.context_len)
        self.policy = SchedulePolicy(args.schedule_policy, self.cache, seed=args.random_seed)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.chunked: Req | None = None  # mid-prompt between steps
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.grammar_queue = GrammarQueue(self._make_grammar_service)
        self.grammar_timeout_s = args.grammar_compile_timeout
        self.grammar_backend = args.grammar_backend
        self.masks_ahead = MaskPrefetch(not args.disable_mask_prefetch)  # filled during the pass
        self.think_tokens = think_tokens_for(
            args.reasoning_parser, tokenizer.encode, runner.vocab_size, self.stop_checker.eos_token_ids
        )
        self.failed: list[tuple[Req, InvalidRequest]] = []  # refused after arrival (grammar errors)
        self.loras = LoraRegistry.for_runner(runner, args)
        self.stats = SchedulerStats()
        self.emitter = TokenEmitter(
            self.stop_checker,
            tokenizer,
            not args.disable_jump_forward,
            self.stats,
            speculative=make_speculative_sources(args, runner, tokenizer),
        )
        self._admit_seq = 0
        torch.manual_seed(args.random_seed)

    # ---- requests in -------------------------------------------------------------------

    def validate(self, req: Req) -> None:
        """Refuse what can never run: raise InvalidRequest / CapacityExceeded naming the cause."""
        validate_request(req.input_ids, req.params, self.limits, grammar=prechecked(self.grammar_backend))
        if req.params.reasoning and self.think_tokens is None:
            raise InvalidRequest("reasoning needs a server started with --reasoning-parser", param="reasoning")

    def add_request(self, req: Req) -> None:
        self.validate(req)
        req.lora = self.loras.resolve(req.options.lora_path)
        if self.emitter.drafter.speculative:
            req.spec_accepted_tokens = 0
        p = req.params
        if p.stop or p.stop_regex:  # only stop strings need the text here
            req.decoder = IncrementalDecoder(
                self.tokenizer, req.input_ids, p.skip_special_tokens, p.spaces_between_special_tokens
            )
        if p.seed is not None and not p.is_greedy:
            req.generator = make_generator(p.seed, self.runner.device)
        spec = GrammarSpec.from_params(p)
        if spec is None:
            think_first(req, self.think_tokens)
            self.waiting.append(req)
        else:
            self.grammar_queue.add(req, spec)

    def _make_grammar_service(self):
        from langrt.constrained.backends.base import create_grammar_service
        from langrt.constrained.vocab import vocabulary_from_decoder

        eos = self.stop_checker.eos_token_ids
        vocab = vocabulary_from_decoder(self.tokenizer, self.runner.vocab_size, eos)
        return create_grammar_service(self.grammar_backend, vocab, self.tokenizer.encode, self.grammar_timeout_s)

    @property
    def has_work(self) -> bool:
        return self.has_runnable_work or bool(self.grammar_queue)

    @property
    def has_runnable_work(self) -> bool:
        """Work a forward pass can do now (not counting requests waiting for grammars)."""
        return bool(self.waiting or self.running or self.chunked)

    def take_failed(self) -> list[tuple[Req, InvalidRequest]]:
        failed, self.failed = self.failed, []
        return failed

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False while requests are queued or running."""
        if self.has_work or not self.cache.flush():
            return False
        self.emitter.drafter.flush()
        return True

    def abort(self, rid: str, message: str) -> Req | None:
        """Finish request `rid` now with an abort reason, releasing what it holds (between
        steps). None if no such request is queued or running."""
        queued = self.grammar_queue.remove(rid)
        if queued is not None:
            queued.finish(FinishReason.by_abort(message))
            return queued
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish(FinishReason.by_abort(message))
                return req
        for req in self.running + ([self.chunked] if self.chunked else []):
            if req.rid == rid:
                req.finish(FinishReason.by_abort(message))
                self._release(req)
                if req is self.chunked:
                    self.chunked = None
                else:
                    self.running.remove(req)
                return req
        return None

    # ---- one step ----------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Req]:
        """Run one forward pass; return the requests whose output changed in it (a new token,
        input logprobs, or finishing)."""
        ready, failed = self.grammar_queue.collect()
        for req in ready:
            think_first(req, self.think_tokens)
        self.waiting.extend(ready)
        self.failed += failed
        decode, retracted = self._prepare_decode()
        prefill = [] if retracted else self._admit()
        if not decode and not prefill:
            return []
        self._draft_after_prompts(prefill)
        batch = self._build_batch(decode, prefill)
        sampled = decode + [item.req for item in prefill if item.completes_prompt]
        hidden = self.masks_ahead.during(sampled, lambda: self.runner.forward(batch))
        self.stats.forward_passes += 1
        self.stats.forward_tokens += batch.num_tokens
        self.stats.drafted_tokens += sum(len(r.draft_ids) for r in decode) + sum(len(i.req.draft_ids) for i in prefill)
        return self._process(batch, hidden, decode, prefill)

    def _draft_after_prompts(self, prefill: list[PrefillItem]) -> None:
        """Jump-forward from the first token: where a request's grammar forces its output's
        opening text (`{"name": "`), the drafts ride in the pass that ends its prompt, as they
        would in a decode pass, and save the request one pass. Slots permitting."""
        completing = [item for item in prefill if item.completes_prompt]
        self.emitter.propose_all([item.req for item in completing])
        for item in completing:
            req = item.req
            n = len(req.draft_ids)
            if n and not self.cache.reserve(req, item.chunk_start + item.extend_len, n):
                req.draft_ids = []

    def _prepare_decode(self) -> tuple[list[Req], bool]:
        """Give every running request slots for its uncomputed tokens (the last sampled one, and
        any jump-forward added), evicting or retracting."""
        retracted = False
        if not self.cache.make_room(sum(len(r.pending_ids) for r in self.running)):
            for req in self.running:  # drafts are the first thing given up
                req.draft_ids = []
        while not self.cache.make_room(sum(len(r.pending_ids) for r in self.running)):
            victim = self.chunked or max(self.running, key=lambda r: r.admit_seq, default=None)
            if victim is None or (victim is not self.chunked and len(self.running) == 1):
                raise RuntimeError("the KV pool cannot hold even one running request (admission should prevent this)")
            self._retract(victim)
            retracted = True
        if not self.running:
            return [], retracted
        for req in self.running:
            reserved = self.cache.reserve(req, req.kv_len, len(req.pending_ids))
            assert reserved, "make_room freed them"
        if not retracted:
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        # one-token decodes first, then those with drafts: attention takes each kind in a block
        return sorted(self.running, key=lambda r: bool(r.draft_ids)), retracted

    def _retract(self, req: Req) -> None:
        """Back to the waiting queue's front; its computed tokens stay in the prefix cache."""
        logger.debug("retracting %s at %d tokens", req.rid, req.kv_len)
        self._release(req)
        req.kv_len = 0
        req.draft_ids, req.draft_probs = [], None
        req.status = ReqStatus.RETRACTED
        if req is self.chunked:
            self.chunked = None
        else:
            self.running.remove(req)
        self.waiting.appendleft(req)
        self.stats.retractions += 1
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO

    def _admit(self) -> list[PrefillItem]:
        reserved = sum(reserved_tokens(r, self.new_token_ratio) for r in self.running)
        if self.chunked is not None:
            reserved += reserved_tokens(self.chunked, self.new_token_ratio)
        adder = PrefillAdder(self.cache, self.token_budget, reserved, self.new_token_ratio)
        if self.chunked is not None:
            adder.add_continuing(self.chunked)
            self.chunked = None
        if self.waiting and not adder.exhausted:
            ordered, matches = self.policy.order(list(self.waiting))
            ordered = self.loras.within_cap(ordered, self.running + [item.req for item in adder.items])
            admitted = set()
            for req in ordered:
                if adder.exhausted:
                    break
                if adder.try_add(req, matches.get(id(req))):
                    admitted.add(id(req))
                    self._on_admitted(req)
            self.waiting = deque(r for r in self.waiting if id(r) not in admitted)
        self.chunked = adder.chunked
        return adder.items

    def _on_admitted(self, req: Req) -> None:
        self._admit_seq += 1
        req.admit_seq = self._admit_seq
        returning = req.status is ReqStatus.RETRACTED
        req.status = ReqStatus.RUNNING
        if returning:  # counted at its first admission
            return
        req.cached_tokens = req.cached_len  # what adopt() reused
        self.stats.prompt_tokens += req.prompt_len
        self.stats.cached_tokens += req.cached_tokens

    def _build_batch(self, decode: list[Req], prefill: list[PrefillItem]) -> ForwardBatch:
        pending = [r.pending_ids for r in decode]
        ids = [t for p in pending for t in p]
        reqs = list(decode)
        seq_lens = [r.kv_len + len(p) for r, p in zip(decode, pending)]
        extend_lens = [len(p) for p in pending]
        for item in prefill:
            req = item.req
            ids += req.all_ids[item.chunk_start : item.chunk_start + item.extend_len] + req.draft_ids
            reqs.append(req)
            seq_lens.append(item.chunk_start + item.extend_len + len(req.draft_ids))
            extend_lens.append(item.extend_len + len(req.draft_ids))
        slots = torch.cat([self.cache.slots(r, end - n, end) for r, end, n in zip(reqs, seq_lens, extend_lens)])
        rows = [r.kv_row for r in reqs]
        mode = ForwardMode.EXTEND if prefill or len(ids) > len(rows) else ForwardMode.DECODE
        adapters = [r.lora for r in reqs] if any(r.lora is not None for r in reqs) else None
        return ForwardBatch.build(
            mode, ids, slots, rows, seq_lens, extend_lens, self.runner.device, not prefill, adapters
        )

    # ---- after the forward pass --------------------------------------------------------

    def _process(self, batch: ForwardBatch, hidden, decode: list[Req], prefill: list[PrefillItem]) -> list[Req]:
        emissions = []
        for req, start, n in zip(decode, batch.extend_starts, batch.extend_lens):
            drafts, probs = req.take_drafts()
            emissions.append(Emission(req, list(range(start + n - 1 - len(drafts), start + n)), drafts, probs))
        computed = list(zip(decode, [r.kv_len + n for r, n in zip(decode, batch.extend_lens)]))
        for item, start, n in zip(prefill, batch.extend_starts[len(decode) :], batch.extend_lens[len(decode) :]):
            req = item.req
            req.kv_len = item.chunk_start + item.extend_len
            collect_input_logprobs(self.runner, req, hidden, start, item.chunk_start)
            if req.pooled is not None:  # an embedding request pools its prompt's hidden states
                req.pooled.add(hidden[start : start + item.extend_len])
            if not item.completes_prompt:
                continue
            drafts, probs = req.take_drafts()
            if drafts:
                computed.append((req, req.kv_len + len(drafts)))
            if req.remaining_new_tokens <= 0:
                req.finish(FinishReason.by_length(len(req.output_ids)))
            else:
                emissions.append(Emission(req, list(range(start + n - 1 - len(drafts), start + n)), drafts, probs))
        if emissions:
            self.emitter.emit(emissions, hidden, self.runner)
        for req, end in computed:
            # K/V is valid up to the last output token (which has none yet); drafts past the
            # first mismatch were computed in vain and give their slots back.
            req.kv_len = req.seq_len - 1
            self.cache.trim(req, end)
        self.emitter.propose_all([e.req for e in emissions])
        return self._settle(decode, prefill)

    def _settle(self, decode: list[Req], prefill: list[PrefillItem]) -> list[Req]:
        """Finished requests leave (their tokens to the cache); new prefixes become shared."""
        changed = list(decode)
        for item in prefill:
            if item.completes_prompt or item.req.return_logprob:
                changed.append(item.req)
        for req in changed:
            if req.finished:
                self._release(req)
        for item in prefill:
            if not item.req.finished:
                self.cache.share(item.req)
        newly_running = [i.req for i in prefill if i.completes_prompt and not i.req.finished]
        self.running = [r for r in self.running if not r.finished] + newly_running
        return changed

    def _release(self, req: Req) -> None:
        """`req` stops running: its KV slots (and any a draft model holds for it) go."""
        self.cache.release(req)
        self.emitter.drafter.release(req)

    # ---- introspection -----------------------------------------------------------------

    def cache_stats(self) -> dict:
        return {
            **self.cache.stats(),
            "cache_hit_rate": self.stats.cache_hit_rate,
            "prompt_tokens": self.stats.prompt_tokens,
            "cached_prompt_tokens": self.stats.cached_tokens,
            "retractions": self.stats.retractions,
            "forward_passes": self.stats.forward_passes,
            "forward_tokens": self.stats.forward_tokens,
            "drafted_tokens": self.stats.drafted_tokens,
            "jump_forward_tokens": self.stats.jump_forward_tokens,
            "spec_verifications": self.stats.spec_verifications,
            "spec_draft_tokens": self.stats.spec_draft_tokens,
            "spec_accepted_tokens": self.stats.spec_accepted_tokens,
            "spec_accept_rate": self.stats.spec_accept_rate,
            "spec_accept_length": self.stats.spec_accept_length,
            "certain_tail_tokens": self.stats.certain_tail_tokens,
            "running_requests": len(self.running) + (self.chunked is not None),
            "waiting_requests": len(self.waiting),
        }
