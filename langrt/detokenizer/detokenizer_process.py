"""The detokenizer process: token ids -> text, incrementally, off the scheduler's path.

Per request it keeps an IncrementalDecoder (the same class the scheduler uses for stop strings,
fed the same ids, so their texts agree and the scheduler's `text_end` cuts this text at the same
place). While a request runs, the last `stop_hold_chars` characters are withheld from streams:
a stop string may still begin there, and streamed text is never taken back.
Everything that is not a TokenUpdates message is passed through to the main process in order.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import zmq

from langrt.ipc import Endpoints, PullQueue, PushQueue
from langrt.tokenizer.incremental_decoder import IncrementalDecoder
from langrt.child_setup import configure_logging, exit_with_parent
from langrt.mem.host_malloc import release_freed_memory
from langrt.messages import TextUpdate, TextUpdates, TokenUpdate, TokenUpdates
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    decoder: IncrementalDecoder
    hold: int
    emitted: int = 0  # characters already sent


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.streams: dict[str, _Stream] = {}

    def text_update(self, u: TokenUpdate) -> TextUpdate:
        stream = self.streams.get(u.rid)
        if stream is None:
            s = u.settings
            assert s is not None, f"first update of {u.rid} carries no decode settings"
            decoder = IncrementalDecoder(
                self.tokenizer, s.prompt_tail, s.skip_special_tokens, s.spaces_between_special_tokens
            )
            stream = self.streams[u.rid] = _Stream(decoder, s.stop_hold_chars)
        stream.decoder.push(u.visible_new_ids)
        if u.finish_reason is not None:
            stream.decoder.flush()
            del self.streams[u.rid]
            text = stream.decoder.text
            end = len(text) if u.text_end is None else u.text_end
        else:
            text = stream.decoder.text
            end = max(stream.emitted, len(text) - stream.hold)
        delta = text[stream.emitted : end]
        stream.emitted = end
        return TextUpdate(u, delta)


def run_detokenizer_process(args: ServerArgs, endpoints: Endpoints, parent_pid: int) -> None:
    """Entry point of the detokenizer process (spawned)."""
    exit_with_parent(parent_pid, endpoints.directory)
    configure_logging(args.log_level, "detokenizer")
    from langrt.model.source import ModelSource

    context = zmq.Context()
    inbox: PullQueue = PullQueue(context, endpoints.detokenizer)
    outbox: PushQueue = PushQueue(context, endpoints.main)
    path = args.tokenizer_path or ModelSource.resolve(args.model_path).path
    # The tokenizer is built on a thread while this loop relays what needs no text, the
    # scheduler's ready message among them: the start never waits on this process.
    with ThreadPoolExecutor(1, thread_name_prefix="langrt-tokenizer") as pool:
        tokenizer = pool.submit(_load_tokenizer, path)
        detokenizer = None
        while True:
            message = inbox.get()
            if isinstance(message, TokenUpdates):
                detokenizer = detokenizer or Detokenizer(tokenizer.result())
                message = TextUpdates([detokenizer.text_update(u) for u in message.updates])
            outbox.put(message)


def _load_tokenizer(path):
    from langrt.tokenizer.text_decoder import load_text_decoder

    tokenizer = load_text_decoder(path)
    release_freed_memory()  # what building it left behind
    return tokenizer
