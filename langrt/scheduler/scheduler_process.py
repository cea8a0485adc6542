"""The scheduler process: the only one that touches the model.

Loop: take every waiting message without blocking (block only when idle) -> one scheduler step
-> send the requests' progress to the detokenizer. It never waits on the network.
"""

from __future__ import annotations

import logging
import sys
import time

import zmq

from langrt.errors import InvalidRequest, ModelLoadError
from langrt.ipc import Endpoints, PullQueue, PushQueue
from langrt.child_setup import configure_logging, exit_with_parent
from langrt.tokenizer.incremental_decoder import CONTEXT_TOKENS
from langrt.request import Req
from langrt.lora.registry import lora_control
from langrt.scheduler.scheduler import Scheduler
from langrt.scheduler.snapshot import live_counts, scheduler_snapshot
from langrt.mem.host_malloc import keep_freed_memory, release_freed_memory
from langrt.messages import (
    AbortRequest,
    ControlReply,
    LoraRequest,
    ControlRequest,
    DecodeSettings,
    EmbedRequest,
    GenerateRequest,
    RequestFailed,
    SchedulerReady,
    SnapshotReply,
    SnapshotRequest,
    TokenUpdate,
    TokenUpdates,
)
from langrt.server_args import ServerArgs
from langrt.embeddings.checks import serves_encoder
from langrt.embeddings.decoder_embed import DecoderEmbedder, decoder_args, decoder_pooling
from langrt.model.source import ModelSource

logger = logging.getLogger(__name__)


def run_scheduler_process(args: ServerArgs, endpoints: Endpoints, parent_pid: int) -> None:
    """Entry point of the scheduler process (spawned)."""
    exit_with_parent(parent_pid, endpoints.directory)
    configure_logging(args.log_level, "scheduler")
    if not args.disable_malloc_tuning:
        keep_freed_memory()
    context = zmq.Context()
    inbox: PullQueue = PullQueue(context, endpoints.scheduler)
    outbox: PushQueue = PushQueue(context, endpoints.detokenizer)
    try:
        args = args.resolve()
        if serves_encoder(args):  # BERT family: no KV cache, its own loop (langrt.embeddings)
            from langrt.embeddings.encoder_loop import run_encoder_loop

            return run_encoder_loop(args, ModelSource.resolve(args.model_path), inbox, outbox)
        args = decoder_args(args)
        scheduler = build_scheduler(args, _rank_zero(args, endpoints))
        release_freed_memory()  # what loading left behind (kept by keep_freed_memory otherwise)
        outbox.put(ready_message(scheduler, args))
        SchedulerLoop(scheduler, inbox, outbox).run()
    except ModelLoadError as e:  # the model's own problem, which its message names: no traceback
        logger.error("the model could not be loaded: %s", e)
        sys.exit(1)
    except Exception:
        logger.exception("the scheduler failed")
        sys.exit(1)


def _rank_zero(args: ServerArgs, endpoints: Endpoints):
    """Under --tp-size N: this process is rank 0 of the tensor-parallel group (langrt.parallel)."""
    if args.tp_size == 1:
        return None
    from langrt.parallel.group import TensorParallel
    from langrt.parallel.worker import init_file

    return TensorParallel(0, args.tp_size, args.device, init_file(endpoints.directory))


def build_scheduler(args: ServerArgs, tp=None) -> Scheduler:
    from langrt.model.gguf_reader import cached_headers
    from langrt.model.loader import ModelSource
    from langrt.model.model_runner import ModelRunner
    from langrt.tokenizer.text_decoder import deferred_text_decoder

    start = time.perf_counter()
    with cached_headers():  # a GGUF file's header read once for the config, tokenizer and weights
        source = ModelSource.resolve(args.model_path)
        config = source.model_config(args.model_impl)
        tokenizer = deferred_text_decoder(args.tokenizer_path or source.path)  # built when idle
        runner = ModelRunner(args, source, config, progress=args.log_level in ("debug", "info"), tp=tp)
    logger.info("model and pools %.2f s", time.perf_counter() - start)
    return Scheduler(runner, tokenizer, args)


def ready_message(scheduler: Scheduler, args: ServerArgs) -> SchedulerReady:
    runner = scheduler.runner
    return SchedulerReady(
        args=args,
        context_len=runner.plan.context_len,
        vocab_size=runner.vocab_size,
        max_total_tokens=runner.plan.max_total_tokens,
        max_running_requests=runner.plan.max_running_requests,
    )


class SchedulerLoop:
    def __init__(self, scheduler: Scheduler, inbox: PullQueue, outbox: PushQueue):
        self.scheduler = scheduler
        self.inbox = inbox
        self.outbox = outbox
        self.handlers = {
            GenerateRequest: self._on_generate,
            AbortRequest: self._on_abort,
            ControlRequest: self._on_control,
            SnapshotRequest: self._on_snapshot,
            LoraRequest: self._on_lora,
            EmbedRequest: self._on_embed,
        }
        args = scheduler.runner.args
        self.embedder = DecoderEmbedder(decoder_pooling(args)) if args.is_embedding else None
        self.busy_s = 0.0  # in steps: what the dashboard's snapshots are measured against
        self.steps = 0
        self.snapshot_s = 0.0

    def run(self) -> None:
        while True:
            self.run_once(block=not self.scheduler.has_runnable_work)

    def run_once(self, block: bool) -> None:
        messages = self.inbox.drain()
        if not messages and block:
            messages = self._wait_idle()
        for message in messages:
            self.handlers[type(message)](message)
        if self.scheduler.has_work:
            start = time.perf_counter()
            changed = self.scheduler.step()
            self.busy_s += time.perf_counter() - start
            self.steps += 1
            self._send(changed)
        for req, error in self.scheduler.take_failed():
            self.outbox.put(RequestFailed(req.rid, error.message, 400, error.param))

    def _wait_idle(self) -> list:
        """Nothing to compute: commit KV pages, build the tokenizer, or wait for a message (briefly
        while grammars compile, since their requests become runnable without a message)."""
        prefault = self.scheduler.cache.prefault
        if prefault is not None and not prefault.done and not self.scheduler.has_work:
            prefault.step()
            return []
        if not self.scheduler.has_work and not getattr(self.scheduler.tokenizer, "loaded", True):
            first = self.inbox.get(timeout_s=1.0)  # a client's first request, sent once ready, first
            if first is not None:
                return [first] + self.inbox.drain()
            start = time.perf_counter()
            self.scheduler.tokenizer.load()  # a GGUF file's, deferred at start-up (text_decoder)
            release_freed_memory()  # what building it left behind
            logger.info("tokenizer built while idle in %.2f s", time.perf_counter() - start)
            return []
        first = self.inbox.get(timeout_s=0.005 if self.scheduler.has_work else 1.0)
        return ([first] if first is not None else []) + self.inbox.drain()

    def _on_generate(self, m: GenerateRequest) -> None:
        req = Req(rid=m.rid, input_ids=list(m.input_ids), params=m.params, options=m.options)
        try:
            self.scheduler.add_request(req)
        except InvalidRequest as e:
            self.outbox.put(RequestFailed(m.rid, e.message, 400, e.param))

    def _on_abort(self, m: AbortRequest) -> None:
        req = self.scheduler.abort(m.rid, m.message)
        if req is not None:
            self._send([req])

    def _on_control(self, m: ControlRequest) -> None:
        if m.kind == "flush_cache":
            payload = self.scheduler.flush_cache()
        else:
            payload = {**self.scheduler.cache_stats(), **live_counts(self.scheduler)}
            payload["cpu_path"] = self.scheduler.runner.cpu_path
        self.outbox.put(ControlReply(m.kind, m.request_id, payload))

    def _on_lora(self, m: LoraRequest) -> None:
        self.outbox.put(ControlReply("lora", m.request_id, lora_control(self.scheduler.loras, m.name, m.path)))

    def _on_snapshot(self, m: SnapshotRequest) -> None:
        """The dashboard's state; its cost, sending included, is counted in `snapshot_s` (the
        sending of this one is reported by the next reply)."""
        start = time.perf_counter()
        state = scheduler_snapshot(self.scheduler, m)
        self.snapshot_s += time.perf_counter() - start
        start = time.perf_counter()
        self.outbox.put(SnapshotReply(m.request_id, state, self.busy_s, self.steps, self.snapshot_s))
        self.snapshot_s += time.perf_counter() - start

    def _on_embed(self, m: EmbedRequest) -> None:
        if self.embedder is None:
            why = "this server generates text; embeddings need a server started with --is-embedding"
            self.outbox.put(ControlReply("embed", m.request_id, {"error": why}))
            return
        refused = self.embedder.submit(m, self.scheduler)
        if refused is not None:
            self.outbox.put(refused)

    def _send(self, reqs: list[Req]) -> None:
        if self.embedder is not None:  # embedding requests answer with one reply per EmbedRequest
            for reply in self.embedder.finish(reqs):
                self.outbox.put(reply)
            reqs = [r for r in reqs if r.pooled is None]
        updates = [token_update(r) for r in reqs if r.stream or r.finished]
        if updates:
            self.outbox.put(TokenUpdates(updates))


def token_update(req: Req) -> TokenUpdate:
    """What `req` produced since its last update (and marks it sent)."""
    sent = req.sent
    visible = req.visible_output_ids
    update = TokenUpdate(
        rid=req.rid,
        new_ids=req.output_ids[sent.output_ids :],
        visible_new_ids=visible[sent.output_ids :],
        prompt_tokens=req.prompt_len,
        cached_tokens=req.cached_tokens,
        spec_accepted_tokens=req.spec_accepted_tokens,
        completion_tokens=len(req.output_ids),
        finish_reason=req.finish_reason.to_json() if req.finished else None,
        text_end=req.text_end,
        input_logprobs=_entries(req.input_logprobs, sent.input_logprobs),
        output_logprobs=_entries(req.output_logprobs, sent.output_logprobs),
    )
    if not sent.settings:
        p = req.params
        hold = max(map(len, p.stop), default=1) - 1
        update.settings = DecodeSettings(
            req.input_ids[-CONTEXT_TOKENS:], p.skip_special_tokens, p.spaces_between_special_tokens, hold
        )
        sent.settings = True
    sent.output_ids = len(req.output_ids)
    sent.input_logprobs = len(req.input_logprobs.values)
    sent.output_logprobs = len(req.output_logprobs.values)
    return update


def _entries(record, start: int) -> list:
    return list(zip(record.values[start:], record.token_ids[start:], record.top[start:]))
