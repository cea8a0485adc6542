"""All-reduce of small CPU tensors through shared memory, for tensor-parallel ranks on one machine.

A decode step sums two activations per layer over the ranks; over gloo's loopback TCP each sum
costs a round of thread hand-offs in both processes: ~0.8 ms on a busy 2-core machine (SmolLM2:
61 per step), where through shared memory it takes ~45 us. Each rank copies its tensor into its
slot and publishes a sequence number; once every rank's number is there, each sums the slots in
rank order (so every rank gets the same bits). Two sets of slots alternate, so a rank can write
the next sum while a slower one still reads this one. Waiting spins, yielding the CPU (the ranks
may share cores), and checks now and then that the other ranks are still alive.

Used on x86-64 Linux (stores are seen in program order, which the sequence numbers rely on)
where /dev/shm exists; LANGRT_TP_SHM=0 keeps every sum on torch.distributed. Tensors larger
than a slot go there too.
"""

from __future__ import annotations

import mmap
import os
import platform
import time

import torch
import torch.distributed as dist

from langrt import envs

ENV = envs.LANGRT_TP_SHM.name
_FLAG_BYTES = 64  # one cache line per rank and parity
_ALIVE_CHECK_S = 0.5


def usable() -> bool:
    return bool(envs.LANGRT_TP_SHM.get()) and platform.machine() in ("x86_64", "AMD64") and os.path.isdir("/dev/shm")


# Bytes per rank and parity: a decode step's activations (SmolLM2: 2,304 per request; a
# hidden size of 4,096, 64 requests); 2 x ranks of them in all (4 MB for 2 ranks: Docker's
# default /dev/shm is 64 MB). Larger sums, long prompts' among them, take torch.distributed.
SLOT_BYTES = 1 << 20


def create(rank: int, size: int, name: str, slot_bytes: int = SLOT_BYTES) -> "ShmAllReduce | None":
    """Collective (every rank calls it): the shared segment, or None on every rank where one
    cannot be made (no room in /dev/shm, say). Rank 0 creates it with its pages reserved (no
    SIGBUS later), the others map it, then it is unlinked: nothing is left behind."""
    if not usable():
        return None
    path, total = f"/dev/shm/{name}", 2 * size * (_FLAG_BYTES + slot_bytes)
    fd, created, mapped = -1, False, None
    if rank == 0:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.posix_fallocate(fd, 0, total)
            created = True
        except OSError:
            pass
    made = _agree(created, all_ranks=False)
    try:
        if made and rank != 0:
            fd = os.open(path, os.O_RDWR)
        if made:
            mapped = mmap.mmap(fd, total)
    except OSError:
        pass
    finally:
        if fd >= 0:
            os.close(fd)
    ok = _agree(mapped is not None, all_ranks=True)
    if rank == 0 and fd >= 0:
        os.unlink(path)
    return ShmAllReduce(rank, size, slot_bytes, mapped) if ok else None


def _agree(ok: bool, all_ranks: bool) -> bool:
    """Rank 0's answer (all_ranks=False) or whether every rank's is yes, on every rank."""
    flag = torch.tensor([int(ok)])
    if all_ranks:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    else:
        dist.broadcast(flag, src=0)
    return bool(flag.item())


class ShmAllReduce:
    def __init__(self, rank: int, size: int, slot_bytes: int, mapped: mmap.mmap):
        self.rank, self.size, self.slot_bytes = rank, size, slot_bytes
        self._map = mapped
        buffer = torch.frombuffer(mapped, dtype=torch.uint8)
        self._flags = buffer[: 2 * size * _FLAG_BYTES].view(torch.int64).view(2, size, _FLAG_BYTES // 8)
        self._slots = buffer[2 * size * _FLAG_BYTES :].view(2, size, slot_bytes)
        pids = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
        dist.all_gather(pids, torch.tensor([os.getpid()]))
        self._peers = [int(p) for r, p in enumerate(pids) if r != rank]
        self._seq = 0

    def fits(self, x: torch.Tensor) -> bool:
        """By size and device only: every rank must decide alike for the same shapes."""
        return x.device.type == "cpu" and x.numel() * x.element_size() <= self.slot_bytes

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place (in rank order: every rank gets the same bits); returns x."""
        self._seq += 1
        parity, nbytes = self._seq & 1, x.numel() * x.element_size()
        slots = self._slots[parity, :, :nbytes].view(x.dtype)
        slots[self.rank].copy_(x.reshape(-1))
        self._flags[parity, self.rank, 0] = self._seq
        self._wait(parity)
        total = slots.sum(dim=0) if x.dtype == torch.float32 else slots.float().sum(dim=0)  # bf16: rounded once
        return x.copy_(total.view(x.shape))

    def _wait(self, parity: int) -> None:
        flags = self._flags[parity, :, 0]
        spins, checked = 0, time.monotonic()
        while int(flags.min()) < self._seq:
            spins += 1
            if spins > 64:
                os.sched_yield()
            if spins % 4096 == 0 and time.monotonic() - checked > _ALIVE_CHECK_S:
                checked = time.monotonic()
                self._check_peers()

    def _check_peers(self) -> None:
        for pid in self._peers:
            if not _alive(pid):
                raise RuntimeError(f"tensor-parallel peer process {pid} has exited")


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
