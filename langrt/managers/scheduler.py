"""The scheduler: owns the waiting queue and the running batch, and drives the ModelRunner.

Each `step()` runs one forward pass: a prefill (extend) batch of newly admitted requests when
any can be admitted, else one decode step of every running request. Requests join and leave the
running batch at every step (continuous batching).

Admission is first-come-first-served and reserves, for every admitted request, KV room for its
whole prompt plus `max_new_tokens`, so a decode step always finds free slots.
"""

from __future__ import annotations

import logging
from collections import deque

import torch

from langrt.errors import CapacityExceeded, InvalidRequest
from langrt.managers.incremental_decoder import IncrementalDecoder
from langrt.managers.logprob_collector import collect_input_logprobs, OutputLogprobs
from langrt.managers.req import Req, StopChecker, FinishReason
from langrt.model.forward_batch import ForwardBatch, ForwardMode
from langrt.model.model_runner import ModelRunner
from langrt.sampling.penalties import ban_tokens
from langrt.sampling.sampler import SamplingBatch, make_generator
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, runner: ModelRunner, tokenizer, args: ServerArgs):
        self.runner = runner
        self.tokenizer = tokenizer
        self.context_len = runner.plan.context_len
        self.max_prefill_tokens = args.max_prefill_tokens
        self.stop_checker = StopChecker(eos_token_ids(runner.config, tokenizer), self.context_len)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        torch.manual_seed(args.random_seed)

    # ---- requests in -------------------------------------------------------------------

    def validate(self, req: Req) -> None:
        """Refuse what can never run: raise InvalidRequest / CapacityExceeded naming the cause."""
        vocab = self.runner.vocab_size
        if any(not 0 <= t < vocab for t in req.input_ids):
            raise InvalidRequest(f"input_ids contain token ids outside [0, {vocab})", param="input_ids")
        if req.prompt_len >= self.context_len:
            raise InvalidRequest(
                f"the prompt has {req.prompt_len} tokens; the context length is {self.context_len}", param="prompt"
            )
        if req.prompt_len + req.params.max_new_tokens > self.context_len:
            raise InvalidRequest(
                f"prompt ({req.prompt_len} tokens) + max_new_tokens ({req.params.max_new_tokens}) "
                f"exceeds the context length {self.context_len}",
                param="max_new_tokens",
            )
        if req.max_seq_len(self.context_len) > self.runner.kv_pool.size:
            raise CapacityExceeded(
                f"the request needs up to {req.max_seq_len(self.context_len)} KV slots; "
                f"the pool holds {self.runner.kv_pool.size} (raise --max-total-tokens)"
            )

    def add_request(self, req: Req) -> None:
        self.validate(req)
        p = req.params
        req.decoder = IncrementalDecoder(
            self.tokenizer, req.input_ids, p.skip_special_tokens, p.spaces_between_special_tokens
        )
        if p.seed is not None and not p.is_greedy:
            req.generator = make_generator(p.seed, self.runner.device)
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step ----------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Req]:
        """Run one forward pass; return the requests that finished in it."""
        admitted = self._admit()
        touched = self._run_extend(admitted) if admitted else self._run_decode(self.running)
        finished = [r for r in touched if r.finished]
        for req in finished:
            self._release(req)
        self.running = [r for r in self.running + admitted if not r.finished]
        return finished

    def _admit(self) -> list[Req]:
        """Pop waiting requests FCFS while their reserved KV room and the prefill budget allow."""
        kv = self.runner.kv_pool
        free = kv.available_size - sum(r.max_seq_len(self.context_len) - r.kv_len for r in self.running)
        budget = self.max_prefill_tokens
        admitted: list[Req] = []
        while self.waiting:
            req = self.waiting[0]
            need = req.max_seq_len(self.context_len)
            new_tokens = req.seq_len - req.kv_len
            if need > free or (admitted and new_tokens > budget) or self.runner.req_pool.available_size == 0:
                break
            self.waiting.popleft()
            self._allocate(req, new_tokens)
            admitted.append(req)
            free -= need
            budget -= new_tokens
        return admitted

    def _allocate(self, req: Req, new_tokens: int) -> None:
        req.req_pool_idx = self.runner.req_pool.alloc()
        slots = self.runner.kv_pool.alloc(new_tokens)
        assert req.req_pool_idx is not None and slots is not None, "admission checked room for both"
        self.runner.req_pool.write(req.req_pool_idx, req.kv_len, slots)

    def _release(self, req: Req) -> None:
        pools = self.runner
        pools.kv_pool.free(pools.req_pool.slots(req.req_pool_idx, req.kv_len))
        pools.req_pool.free(req.req_pool_idx)
        req.req_pool_idx = None

    # ---- forward passes ----------------------------------------------------------------

    def _run_extend(self, reqs: list[Req]) -> list[Req]:
        ids, lens = [], []
        for req in reqs:
            new = req.all_ids[req.kv_len :]
            ids += new
            lens.append(len(new))
        slots = torch.cat([self.runner.req_pool.slots(r.req_pool_idx, r.seq_len, r.kv_len) for r in reqs])
        batch = ForwardBatch.build(
            ForwardMode.EXTEND, ids, slots, [r.req_pool_idx for r in reqs], [r.seq_len for r in reqs], lens,
            self.runner.device,
        )  # fmt: skip
        hidden = self.runner.forward(batch)
        for req, start in zip(reqs, batch.extend_starts):
            collect_input_logprobs(self.runner, req, hidden, start)
            req.kv_len = req.seq_len
        for req in reqs:
            if req.params.max_new_tokens == 0:
                req.finish(FinishReason.by_length(0))
        sampling = [(r, row) for r, row in zip(reqs, batch.last_token_rows) if not r.finished]
        if sampling:
            rows = torch.tensor([row for _, row in sampling], device=hidden.device)
            self._sample([r for r, _ in sampling], self.runner.compute_logits(hidden[rows]))
        return reqs

    def _run_decode(self, reqs: list[Req]) -> list[Req]:
        if not reqs:
            return []
        slots = self.runner.kv_pool.alloc(len(reqs))
        assert slots is not None, "admission reserved a slot for every decode step"
        for i, req in enumerate(reqs):
            self.runner.req_pool.write(req.req_pool_idx, req.kv_len, slots[i : i + 1])
        batch = ForwardBatch.build(
            ForwardMode.DECODE, [r.output_ids[-1] for r in reqs], slots, [r.req_pool_idx for r in reqs],
            [r.kv_len + 1 for r in reqs], [1] * len(reqs), self.runner.device,
        )  # fmt: skip
        logits = self.runner.compute_logits(self.runner.forward(batch))
        for req in reqs:
            req.kv_len += 1
        self._sample(reqs, logits)
        return reqs

    def _sample(self, reqs: list[Req], logits: torch.Tensor) -> None:
        """Pick each request's next token from its [V] logits row, then check stops."""
        logprobs = OutputLogprobs.capture(reqs, logits)  # raw model logprobs, before penalties
        self._ban_early_stops(reqs, logits)
        params = [r.params for r in reqs]
        sampling = SamplingBatch.from_params(params, [r.generator for r in reqs], logits.device)
        sampling.apply_penalties(logits, [r.input_ids for r in reqs], [r.output_ids for r in reqs])
        next_ids = sampling.sample(logits).tolist()
        logprobs.record(next_ids)
        for req, token in zip(reqs, next_ids):
            req.output_ids.append(token)
            self.stop_checker.update(req, token)

    def _ban_early_stops(self, reqs: list[Req], logits: torch.Tensor) -> None:
        """Before min_new_tokens, EOS and stop token ids cannot be sampled."""
        eos = self.stop_checker.eos_token_ids
        banned = [
            list(set(r.params.stop_token_ids) | (set() if r.params.ignore_eos else eos))
            if len(r.output_ids) < r.params.min_new_tokens
            else []
            for r in reqs
        ]
        if any(banned):
            ban_tokens(logits, banned)


def eos_token_ids(config, tokenizer) -> set[int]:
    ids = set(config.eos_token_ids)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
