"""The scheduler process's loop when it serves an encoder model (--is-embedding, BERT family).

Every EmbedRequest waiting when a pass starts is computed together (EncoderRunner sorts and packs
them by length), so concurrent clients share passes the way generation requests share batches.
Generation requests are refused with a 400 naming why.
"""

from __future__ import annotations

import logging
import time

from langrt.embeddings.encoder_runner import EncoderRunner
from langrt.ipc import PullQueue, PushQueue
from langrt.messages import (
    AbortRequest,
    ControlReply,
    ControlRequest,
    EmbedRequest,
    GenerateRequest,
    LoraRequest,
    RequestFailed,
    SchedulerReady,
    SnapshotReply,
    SnapshotRequest,
)
from langrt.model.source import ModelSource
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def run_encoder_loop(args: ServerArgs, source: ModelSource, inbox: PullQueue, outbox: PushQueue) -> None:
    runner = EncoderRunner(args, source, source.model_config("langrt"))
    outbox.put(
        SchedulerReady(
            args, runner.context_len, runner.config.vocab_size, runner.max_batch_tokens, args.max_running_requests
        )
    )
    EncoderLoop(runner, inbox, outbox).run()


class EncoderLoop:
    def __init__(self, runner: EncoderRunner, inbox: PullQueue, outbox: PushQueue):
        self.runner = runner
        self.inbox = inbox
        self.outbox = outbox
        self.busy_s = 0.0
        self.passes = 0
        self.embedded = 0  # inputs embedded so far

    def run(self) -> None:
        while True:
            self.run_once(timeout_s=1.0)

    def run_once(self, timeout_s: float) -> None:
        first = self.inbox.get(timeout_s=timeout_s)
        messages = ([first] if first is not None else []) + self.inbox.drain()
        embeds = [m for m in messages if isinstance(m, EmbedRequest)]
        for message in messages:
            if not isinstance(message, EmbedRequest):
                self._on_other(message)
        if embeds:
            self._embed(embeds)

    def _embed(self, requests: list[EmbedRequest]) -> None:
        start = time.perf_counter()
        vectors = self.runner.encode([ids for r in requests for ids in r.inputs]).numpy()
        self.busy_s += time.perf_counter() - start
        self.passes += 1
        row = 0
        for r in requests:
            payload = {
                "embeddings": vectors[row : row + len(r.inputs)],
                "cached_tokens": [0] * len(r.inputs),
                "normalized": self.runner.pooling.normalize,
            }
            self.outbox.put(ControlReply("embed", r.request_id, payload))
            row += len(r.inputs)
        self.embedded += row

    def _on_other(self, message) -> None:
        if isinstance(message, GenerateRequest):
            why = (
                "this server serves an encoder model for embeddings (/v1/embeddings, /encode); it cannot generate text"
            )
            self.outbox.put(RequestFailed(message.rid, why, 400))
        elif isinstance(message, ControlRequest):
            payload = True if message.kind == "flush_cache" else self._stats()
            self.outbox.put(ControlReply(message.kind, message.request_id, payload))
        elif isinstance(message, LoraRequest):
            payload = {"error": "LoRA adapters are not served with an encoder model"}
            self.outbox.put(ControlReply("lora", message.request_id, payload))
        elif isinstance(message, SnapshotRequest):
            self.outbox.put(SnapshotReply(message.request_id, self._stats(), self.busy_s, self.passes, 0.0))
        else:
            assert isinstance(message, AbortRequest), f"unexpected message {type(message).__name__}"

    def _stats(self) -> dict:
        return {
            "embedding_passes": self.passes,
            "embedded_inputs": self.embedded,
            "running_requests": 0,
            "waiting_requests": 0,
        }
