"""Drive a ModelRunner directly (no scheduler): allocate rows/slots, prefill, decode, extend."""

from __future__ import annotations

import torch

from langrt.model.forward_batch import ForwardBatch, ForwardMode
from langrt.model.source import ModelSource
from langrt.model.model_runner import ModelRunner
from langrt.server_args import ServerArgs


def make_runner(model_path, dtype="float32", **kw) -> ModelRunner:
    args = ServerArgs(model_path=str(model_path), dtype=dtype, device="cpu", **kw).resolve()
    source = ModelSource.resolve(args.model_path)
    return ModelRunner(args, source, source.model_config(), progress=False)


def make_scheduler(model_path, dtype="float32", **kw):
    """A Scheduler in this process (no child processes), to step by hand."""
    from langrt.scheduler.scheduler import Scheduler
    from langrt.tokenizer.loader import load_tokenizer

    runner = make_runner(model_path, dtype=dtype, **kw)
    return Scheduler(runner, load_tokenizer(model_path), runner.args)


def run_requests(scheduler, reqs, stagger: bool = True) -> list[list[int]]:
    """Requests join while others decode (continuous batching: every second one after a step),
    then all run to the end; -> their output ids."""
    for i, req in enumerate(reqs):
        scheduler.add_request(req)
        if stagger and i % 2:
            scheduler.step()
    while scheduler.has_work:
        scheduler.step()
    return [r.output_ids for r in reqs]


class RunnerDriver:
    """Tracks each sequence's row, length and tokens; returns logits for every new token."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        self.rows: list[int] = []
        self.seqs: list[list[int]] = []

    def prefill(self, prompts: list[list[int]], prefix_from: list[tuple[int, int] | None] | None = None):
        """New sequences. prefix_from[i] = (seq index j, n): reuse the first n tokens of seq j's
        K/V instead of computing them (they must equal prompts[i][:n]). -> list of [len_i, V]."""
        prefix_from = prefix_from or [None] * len(prompts)
        ids, locs, rows, seq_lens, ext = [], [], [], [], []
        for prompt, reuse in zip(prompts, prefix_from):
            row = self.runner.req_pool.alloc()
            prefix = 0
            if reuse is not None:
                j, prefix = reuse
                assert self.seqs[j][:prefix] == prompt[:prefix]
                self.runner.req_pool.write(row, 0, self.runner.req_pool.slots(self.rows[j], prefix))
            slots = self.runner.kv_pool.alloc(len(prompt) - prefix)
            self.runner.req_pool.write(row, prefix, slots)
            ids += prompt[prefix:]
            locs.append(slots)
            rows.append(row)
            seq_lens.append(len(prompt))
            ext.append(len(prompt) - prefix)
            self.rows.append(row)
            self.seqs.append(list(prompt))
        batch = ForwardBatch.build(ForwardMode.EXTEND, ids, torch.cat(locs), rows, seq_lens, ext, self.runner.device)
        logits = self.runner.compute_logits(self.runner.forward(batch))
        return [logits[s : s + n] for s, n in zip(batch.extend_starts, batch.extend_lens)]

    def decode(self, indices: list[int], tokens: list[int]) -> torch.Tensor:
        """Append one token to each listed sequence; -> [B, V] logits."""
        slots = self.runner.kv_pool.alloc(len(indices))
        for k, (i, t) in enumerate(zip(indices, tokens)):
            self.runner.req_pool.write(self.rows[i], len(self.seqs[i]), slots[k : k + 1])
            self.seqs[i].append(t)
        batch = ForwardBatch.build(
            ForwardMode.DECODE, tokens, slots, [self.rows[i] for i in indices],
            [len(self.seqs[i]) for i in indices], [1] * len(indices), self.runner.device,
        )  # fmt: skip
        return self.runner.compute_logits(self.runner.forward(batch))

    def extend(self, indices: list[int], tokens: list[list[int]]) -> list[torch.Tensor]:
        """Append several tokens to each listed sequence in one pass (as a token with its drafts
        rides); -> per sequence [n_i, V] logits."""
        lens = [len(t) for t in tokens]
        slots = self.runner.kv_pool.alloc(sum(lens))
        start = 0
        for i, new, n in zip(indices, tokens, lens):
            self.runner.req_pool.write(self.rows[i], len(self.seqs[i]), slots[start : start + n])
            self.seqs[i] += new
            start += n
        batch = ForwardBatch.build(
            ForwardMode.EXTEND, [t for new in tokens for t in new], slots, [self.rows[i] for i in indices],
            [len(self.seqs[i]) for i in indices], lens, self.runner.device, decoding=True,
        )  # fmt: skip
        logits = self.runner.compute_logits(self.runner.forward(batch))
        return [logits[s : s + n] for s, n in zip(batch.extend_starts, batch.extend_lens)]
