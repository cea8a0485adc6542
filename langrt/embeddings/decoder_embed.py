"""Embeddings from a decoder model (--is-embedding on Qwen2, Llama ...), through the scheduler.

Each input becomes a prompt-only request (max_new_tokens 0) in the ordinary scheduler, so inputs
share batches with each other and the radix cache serves repeated prefixes. The scheduler hands
each prompt chunk's final-norm hidden states to the request's PoolState; when every input of an
EmbedRequest has finished, one ControlReply carries their vectors.

Last-token pooling only needs the last prompt token, which the scheduler always computes. Mean
pooling needs every token's hidden state, which a prefix cache hit skips: the radix cache is off
for it (see `decoder_args`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch

from langrt.embeddings.pooling import Pooling
from langrt.errors import InvalidRequest
from langrt.messages import ControlReply, EmbedRequest
from langrt.model.source import ModelSource
from langrt.sampling.sampling_params import SamplingParams
from langrt.request import Req
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# What decoder embedding models (gte-Qwen2, e5-mistral) use without a modules.json of their own.
DECODER_DEFAULT_POOLING = Pooling("last", normalize=True)
_PROMPT_ONLY = SamplingParams(max_new_tokens=0)


def decoder_pooling(args: ServerArgs) -> Pooling:
    return Pooling.of_model(ModelSource.resolve(args.model_path).path, args.pooling, DECODER_DEFAULT_POOLING)


def decoder_args(args: ServerArgs) -> ServerArgs:
    """--is-embedding settings for the scheduler: mean or cls pooling of a decoder turn the radix
    cache off (a cached prefix has no hidden states to pool)."""
    if not args.is_embedding or args.disable_radix_cache or decoder_pooling(args).mode == "last":
        return args
    logger.info(
        "--is-embedding with %s pooling: the radix cache is off (only last-token pooling can reuse prefixes)",
        decoder_pooling(args).mode,
    )
    return dataclasses.replace(args, disable_radix_cache=True)


@dataclass
class PoolState:
    """One input's running pool over the prompt chunks computed so far."""

    pooling: Pooling
    total: torch.Tensor | None = None  # sum of the rows seen (mean)
    count: int = 0
    first: torch.Tensor | None = None  # cls
    last: torch.Tensor | None = None

    def add(self, rows: torch.Tensor) -> None:
        rows = rows.float()
        self.total = rows.sum(0) if self.total is None else self.total + rows.sum(0)
        self.first = rows[0] if self.first is None else self.first
        self.last = rows[-1]
        self.count += rows.shape[0]

    def vector(self) -> torch.Tensor:
        mode = self.pooling.mode
        pooled = self.total / self.count if mode == "mean" else self.first if mode == "cls" else self.last
        return torch.nn.functional.normalize(pooled, dim=-1) if self.pooling.normalize else pooled


@dataclass
class _Pending:
    request_id: int
    reqs: list[Req]
    failed: str | None = None


@dataclass
class DecoderEmbedder:
    """The SchedulerLoop's embedding requests in flight."""

    pooling: Pooling
    pending: dict[str, _Pending] = field(default_factory=dict)  # by each input's rid

    def submit(self, m: EmbedRequest, scheduler) -> ControlReply | None:
        """Queue each input; a reply at once where one is refused."""
        reqs = [
            Req(rid=f"embed-{m.request_id}-{i}", input_ids=list(ids), params=_PROMPT_ONLY)
            for i, ids in enumerate(m.inputs)
        ]
        for req in reqs:
            req.pooled = PoolState(self.pooling)
        try:
            for req in reqs:
                scheduler.validate(req)
        except InvalidRequest as e:
            return ControlReply("embed", m.request_id, {"error": e.message})
        pending = _Pending(m.request_id, reqs)
        for req in reqs:
            scheduler.add_request(req)
            self.pending[req.rid] = pending
        return None

    def finish(self, changed: list[Req]) -> list[ControlReply]:
        """Replies for the EmbedRequests whose inputs have all finished."""
        replies = []
        for req in changed:
            pending = self.pending.get(req.rid)
            if pending is None or not all(r.finished for r in pending.reqs):
                continue
            for r in pending.reqs:
                self.pending.pop(r.rid, None)
            vectors = torch.stack([r.pooled.vector() for r in pending.reqs]).cpu().numpy()
            payload = {
                "embeddings": vectors,
                "cached_tokens": [r.cached_tokens for r in pending.reqs],
                "normalized": self.pooling.normalize,
            }
            replies.append(ControlReply("embed", pending.request_id, payload))
        return replies
