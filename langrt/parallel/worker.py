"""Ranks 1..N-1 of `--tp-size N`: model workers driven by rank 0, the scheduler.

Rank 0 schedules alone (its radix cache, pools' free lists, grammars); before each collective
step of the model it broadcasts what the other ranks need: a command header, then its tensors.

- FORWARD: the batch (its mode, token ids, positions, KV slots to write, lengths) and, per request, the
  slots of its whole sequence (its row of the req_to_token table up to its length), so a worker
  keeps no request state: its table rows are overwritten before every pass that reads them.
- LOGITS: the hidden rows whose logits rank 0 wants (each rank computes its vocabulary rows;
  rank 0 gathers them).
- LOGITS_OF: hidden rows and one token id each (each rank fills the ids in its vocabulary).

A worker serves until rank 0 goes away (gloo reports the closed connection; then it exits) or
its parent process does (`exit_with_parent`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import torch

from langrt.model.forward_batch import ForwardBatch, ForwardMode
from langrt.parallel.group import TensorParallel

logger = logging.getLogger(__name__)

FORWARD, LOGITS, LOGITS_OF = 1, 2, 3
_HEADER = 5  # int64s: command, then its sizes


class RankZero:
    """Rank 0's side: tell the workers what the next collective step is."""

    def __init__(self, tp: TensorParallel):
        self.tp = tp

    def _header(self, *values: int) -> None:
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[: len(values)] = torch.tensor(values, dtype=torch.int64)
        self.tp.broadcast(header)

    def forward(self, batch: ForwardBatch, req_to_token: torch.Tensor) -> None:
        rows = [req_to_token[r, :n] for r, n in zip(batch.req_pool_indices, batch.seq_lens)]
        lists = torch.tensor([*batch.req_pool_indices, *batch.seq_lens, *batch.extend_lens], dtype=torch.int64)
        parts = [
            batch.input_ids.cpu(),
            batch.positions.cpu(),
            batch.out_cache_loc.cpu(),
            lists,
            torch.cat(rows).cpu().long(),
        ]
        mode = (1 if batch.mode is ForwardMode.DECODE else 0) + 2 * batch.decoding
        self._header(FORWARD, mode, batch.num_tokens, batch.batch_size, sum(batch.seq_lens))
        self.tp.broadcast(torch.cat(parts))

    def logits(self, hidden: torch.Tensor) -> None:
        self._header(LOGITS, hidden.shape[0])
        self.tp.broadcast(hidden.to("cpu").contiguous())

    def logits_of(self, hidden: torch.Tensor, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
        """`hidden`: the rows that `rows` index (each once), `token_ids` one per entry of `rows`."""
        self._header(LOGITS_OF, hidden.shape[0], rows.shape[0])
        self.tp.broadcast(hidden.to("cpu").contiguous())
        self.tp.broadcast(torch.cat([rows.cpu(), token_ids.cpu()]).to(torch.int64))


def receive_batch(tp: TensorParallel, header: list[int], req_to_token: torch.Tensor, device) -> ForwardBatch:
    """A FORWARD's batch; its requests' table rows are written into this rank's `req_to_token`."""
    _, mode, tokens, size, table = header
    head = 3 * tokens + 3 * size
    payload = tp.broadcast(torch.empty(head + table, dtype=torch.int64))
    ids, positions, slots = (payload[i * tokens : (i + 1) * tokens] for i in range(3))
    lists = payload[3 * tokens : head].tolist()
    rows, seq_lens, extend_lens = lists[:size], lists[size : 2 * size], lists[2 * size :]
    offset = head
    for row, n in zip(rows, seq_lens):
        req_to_token[row, :n] = payload[offset : offset + n].to(torch.int32)
        offset += n
    return ForwardBatch(
        ForwardMode.DECODE if mode & 1 else ForwardMode.EXTEND,
        ids.to(device),
        positions.to(device),
        slots.to(device),
        rows,
        seq_lens,
        extend_lens,
        decoding=bool(mode & 2),
    )


def serve(runner) -> None:
    """A worker's loop: run what rank 0 broadcasts, until it goes away."""
    tp = runner.tp
    hidden_size = runner.config.hidden_size
    while True:
        header = tp.broadcast(torch.empty(_HEADER, dtype=torch.int64)).tolist()
        command, count = header[0], header[1]
        if command == FORWARD:
            runner.forward(receive_batch(tp, header, runner.req_pool.req_to_token, runner.device))
            continue
        hidden = tp.broadcast(torch.empty((count, hidden_size), dtype=runner.dtype)).to(runner.device)
        if command == LOGITS:
            runner.compute_logits(hidden)
        elif command == LOGITS_OF:
            rows_and_ids = tp.broadcast(torch.empty(2 * header[2], dtype=torch.int64)).to(runner.device)
            runner.compute_logits_of(hidden, *rows_and_ids.chunk(2))
        else:
            raise RuntimeError(f"unknown tensor-parallel command {command}")


def run_worker_process(args, endpoints, parent_pid: int, rank: int) -> None:
    """Entry point of rank `rank` (1..tp_size-1): load this rank's part of the model, then serve."""
    from langrt.mem.host_malloc import keep_freed_memory
    from langrt.model.model_runner import ModelRunner
    from langrt.model.source import ModelSource
    from langrt.child_setup import configure_logging, exit_with_parent

    exit_with_parent(parent_pid, endpoints.directory)
    # Exit at once, without the interpreter's shutdown: gloo's threads, torn down while rank 0
    # closes its side too, sometimes abort the process ("terminate called ...").
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    configure_logging(args.log_level, f"tp rank {rank}")
    if not args.disable_malloc_tuning:
        keep_freed_memory()
    try:
        args = args.resolve()
        tp = TensorParallel(rank, args.tp_size, args.device, init_file(endpoints.directory))
        source = ModelSource.resolve(args.model_path)
        runner = ModelRunner(args, source, source.model_config(), progress=False, tp=tp)
    except Exception:
        logger.exception("tensor-parallel rank %d failed to load", rank)
        sys.exit(1)
    try:
        serve(runner)
    except Exception as e:  # rank 0 has gone (gloo: connection closed), or this rank failed
        logger.error(
            "tensor-parallel rank %d stopped: %s", rank, str(e).splitlines()[0] if str(e) else type(e).__name__
        )
        logging.shutdown()
        os._exit(1)


def init_file(ipc_directory: str) -> str:
    """The rendezvous file of the ranks, in the server's private ipc directory."""
    return f"{ipc_directory}/tp_rendezvous"
