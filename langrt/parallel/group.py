"""The tensor-parallel process group over torch.distributed: gloo on CPU, NCCL on CUDA (with a
gloo group beside it for the batch descriptions rank 0 broadcasts, which live on the CPU).

Rendezvous is a file in the server's private ipc directory (mode 0700), not a TCP store; gloo's
own connections are bound to the loopback interface unless GLOO_SOCKET_IFNAME says otherwise
(they carry tensors, never pickles). Ranks are processes on one machine; on CPU the small sums
of a decode step go through shared memory instead (langrt.parallel.shm), ~20x faster.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
from typing import TYPE_CHECKING, Callable

import torch
import torch.distributed as dist

from langrt import envs
from langrt.parallel import shm
from langrt.parallel.layout import ShardLayout

if TYPE_CHECKING:
    from langrt.model.config import ModelConfig
    from langrt.parallel.worker import RankZero

logger = logging.getLogger(__name__)

# Ranks 1.. wait in a broadcast while the server is idle, and torch.distributed times such waits
# out: effectively never here. A rank that dies is seen at once anyway (gloo reports the closed
# connection; the server's process watch reports the exit).
_IDLE_TIMEOUT = datetime.timedelta(days=3650)


class TensorParallel:
    def __init__(self, rank: int, size: int, device: str, init_file: str):
        self.rank, self.size = rank, size
        self.cuda = device == "cuda"
        if self.cuda:
            torch.cuda.set_device(rank % torch.cuda.device_count())
        else:
            envs.GLOO_SOCKET_IFNAME.setdefault("lo")
        dist.init_process_group(
            "nccl" if self.cuda else "gloo",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=size,
            timeout=_IDLE_TIMEOUT,
        )
        self.cpu_group = dist.new_group(backend="gloo", timeout=_IDLE_TIMEOUT) if self.cuda else None
        # Small CPU sums through shared memory (langrt.parallel.shm); None: all on torch.distributed.
        name = "langrt-tp-" + os.path.basename(os.path.dirname(init_file))
        self.shm = None if self.cuda else shm.create(rank, size, name)
        self.layout: ShardLayout | None = None  # set by take_part once the model's config is known

    def take_part(self, config: ModelConfig, dtype: torch.dtype) -> tuple[RankZero | None, ModelConfig, Callable]:
        """This rank's part of a model with `config` (the ModelRunner asks, so model/ needs no
        import of parallel/): sets `layout`; returns rank 0's sender to the other ranks (None
        elsewhere), this rank's config, and the loader's sharding of the checkpoint."""
        from langrt.parallel.shard import shard_weights
        from langrt.parallel.worker import RankZero

        self.layout = layout = ShardLayout.create(config, self.rank, self.size)
        logger.info(
            "tensor parallel rank %d of %d: query heads %d..%d, KV heads %s, intermediate rows %s, vocabulary rows %s",
            self.rank,
            self.size,
            layout.q_heads[0],
            layout.q_heads[-1],
            layout.kv_heads,
            layout.ffn,
            layout.vocab,
        )
        shard = functools.partial(shard_weights, config=config, layout=layout, dtype=dtype)
        return RankZero(self) if self.rank == 0 else None, layout.local_config(config), shard

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place; returns x."""
        if self.shm is not None and self.shm.fits(x):
            return self.shm.all_reduce(x)
        dist.all_reduce(x)
        return x

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device="cuda" if self.cuda else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def gather_vocab(self, local: torch.Tensor) -> torch.Tensor | None:
        """Each rank's [N, its vocabulary rows] -> on rank 0 the whole [N, vocab] (None elsewhere)."""
        widths = self.layout.vocab_per_rank
        padded = torch.zeros((local.shape[0], max(widths)), dtype=local.dtype, device=local.device)
        padded[:, : local.shape[1]] = local
        parts = [torch.empty_like(padded) for _ in widths] if self.rank == 0 else None
        dist.gather(padded, parts, dst=0)
        if self.rank != 0:
            return None
        return torch.cat([part[:, :width] for part, width in zip(parts, widths)], dim=1)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's `tensor` into every rank's (CPU tensors, over gloo); returns it."""
        dist.broadcast(tensor, src=0, group=self.cpu_group)
        return tensor

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
