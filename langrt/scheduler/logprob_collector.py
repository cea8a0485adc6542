"""Gathering the logprobs a request asked for, from a forward pass's hidden states and logits.

Input logprobs: the logprob of prompt token p is read from the logits at position p - 1, so the
first prompt token has none (reported as null); a chunked prefill reports them chunk by chunk. Output logprobs come from the raw logits of the
step that sampled the token, before penalties and temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from langrt.request import Req
from langrt.sampling.logprobs import logprobs_of, top_logprobs

# Prompt positions turned into [N, vocab] float32 logits at once (49k vocab: ~100 MB per 512).
_LOGITS_CHUNK = 512


def collect_input_logprobs(runner, req: Req, hidden: torch.Tensor, start_row: int, chunk_start: int) -> None:
    """Record the input logprobs this extend pass makes available. The pass computed positions
    [chunk_start, req.kv_len) of the request, at rows start_row.. of `hidden`; the logprob of
    prompt token p needs the hidden state at p - 1. The scheduler never reuses cached K/V at or
    past an owed position's predecessor (`Req.max_prefix_len`), so owed positions are computed
    in order, across chunks."""
    record = req.input_logprobs
    pos = req.next_input_logprob_pos
    if pos >= req.prompt_len:
        return
    if pos == 0:
        _push(record, None, req.input_ids[0], None)
        pos = 1
    end = min(req.prompt_len, req.kv_len + 1)
    assert pos - 1 >= chunk_start, "an owed position's predecessor was not computed"
    for lo in range(pos, end, _LOGITS_CHUNK):
        hi = min(lo + _LOGITS_CHUNK, end)
        rows = torch.arange(start_row + lo - 1 - chunk_start, start_row + hi - 1 - chunk_start, device=hidden.device)
        logits = runner.compute_logits(hidden[rows])
        tokens = torch.tensor(req.input_ids[lo:hi], device=hidden.device)
        _append(record, logits, tokens, req.top_logprobs_num)


@dataclass
class OutputLogprobs:
    """Raw logits of the rows whose requests want output logprobs, captured before sampling."""

    rows: list[int]  # positions in the sampled batch
    reqs: list[Req]
    logits: torch.Tensor | None  # [len(rows), V]

    @classmethod
    def capture(cls, reqs: list[Req], logits: torch.Tensor) -> "OutputLogprobs":
        rows = [i for i, r in enumerate(reqs) if r.return_logprob]
        if not rows:
            return cls([], [], None)
        return cls(rows, [reqs[i] for i in rows], logits[rows])  # advanced indexing copies

    def record(self, next_ids: list[int]) -> None:
        """Append each wanting request's logprob of its sampled token (`next_ids` covers all rows)."""
        if self.logits is None:
            return
        tokens = torch.tensor([next_ids[i] for i in self.rows], device=self.logits.device)
        k = max(r.top_logprobs_num for r in self.reqs)
        values = logprobs_of(self.logits, tokens).tolist()
        top_values, top_ids = top_logprobs(self.logits, k) if k else (None, None)
        for j, req in enumerate(self.reqs):
            top = _top_list(top_values, top_ids, j, req.top_logprobs_num)
            _push(req.output_logprobs, values[j], int(tokens[j]), top)


def _append(record, logits: torch.Tensor, tokens: torch.Tensor, k: int) -> None:
    values = logprobs_of(logits, tokens).tolist()
    top_values, top_ids = top_logprobs(logits, k) if k else (None, None)
    for j, (value, token) in enumerate(zip(values, tokens.tolist())):
        _push(record, value, token, _top_list(top_values, top_ids, j, k))


def _top_list(values, ids, row: int, k: int) -> list[tuple[float, int]] | None:
    if not k:
        return None
    return list(zip(values[row, :k].tolist(), ids[row, :k].tolist()))


def _push(record, value: float | None, token: int, top) -> None:
    record.values.append(value)
    record.token_ids.append(token)
    record.top.append(top)
