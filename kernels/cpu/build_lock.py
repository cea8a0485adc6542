"""A lock between the processes that would build the same CPU-kernel library at once.

Why not torch's own (cpp_extension's FileBaton): its `lock` file is made with O_EXCL and removed
by its owner, so an owner killed mid-build leaves it, and every later process waits on it in
silence, for ever. This lock is an flock(2) on a file that records its owner (host, pid, and the
process's start time, which tells a reused pid from the one that wrote it). The kernel drops an
flock when its owner dies, however it dies, so a killed build never blocks a later one. The
record serves the messages, and one more case: an flock still held although the process it names
is gone (its descriptor kept by a forked child) is stale, and is broken by unlinking the file.
A wait has a bound: past it, BuildLockTimeout names the lock file, its owner and what to do.

Only the standard library here: tests and `langrt doctor` use it without torch.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Callable

logger = logging.getLogger("langrt.kernels.cpu")

# Filesystems without flock (some NFS set-ups): the build goes on unlocked, which is safe (each
# build writes its own directory, see build_cache) and costs at worst a duplicate build.
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class BuildLockTimeout(TimeoutError):
    """Another live process held the build lock for longer than the wait allows."""


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who holds (or held) a lock: written into the lock file by its holder."""

    host: str
    pid: int
    started: str  # field 22 of /proc/<pid>/stat; "" where unknown
    since: float  # time.time() when it took the lock

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), _proc_start(os.getpid()) or "", time.time())

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        try:
            record = json.loads(text)
            return cls(str(record["host"]), int(record["pid"]), str(record.get("started", "")), float(record["since"]))
        except (ValueError, KeyError, TypeError):
            return None  # empty (its writer is between open and write) or not ours

    def dumps(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    def gone(self) -> bool:
        """Whether the process this names has ended (a zombie counts; so does a pid taken by a
        newer process). A process on another host cannot be asked: never gone."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # alive, another user's
        stat = _proc_stat(self.pid)
        if stat is None:
            return False
        state, started = stat
        return state in ("Z", "X") or (bool(self.started) and started != self.started)

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, for {max(0.0, time.time() - self.since):.0f} s"


class BuildLock:
    """`with BuildLock(path, timeout_s):` holds the lock for the block; raises BuildLockTimeout
    when a live holder keeps it past timeout_s. on_wait(owner) is called once, when a wait starts."""

    def __init__(
        self, path: Path, timeout_s: float, poll_s: float = 0.2, on_wait: Callable[[Owner | None], None] | None = None
    ):
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.on_wait = on_wait
        self._fd: int | None = None

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        waited = False
        while not self._try_acquire():
            owner, inode = self._read_owner()
            if owner is not None and owner.gone():
                self._break(owner, inode)
                continue
            if not waited and self.on_wait is not None:
                self.on_wait(owner)
            waited = True
            if time.monotonic() >= deadline:
                raise BuildLockTimeout(self._timeout_message(owner))
            time.sleep(self.poll_s)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)  # before the flock goes: a waiter then sees a new file (see _try_acquire)
        except FileNotFoundError:
            pass
        os.close(self._fd)  # drops the flock
        self._fd = None

    def _try_acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            logger.warning(
                "no file locks on %s (%s): building the CPU kernels unlocked", self.path.parent, exc.strerror
            )
        if not _same_file(fd, self.path):  # its holder unlinked it on release (or it was broken): lock the new one
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, Owner.me().dumps().encode(), 0)
        self._fd = fd
        return True

    def _read_owner(self) -> tuple[Owner | None, int | None]:
        return read_owner(self.path)

    def _break(self, owner: Owner, inode: int | None) -> None:
        try:
            if os.stat(self.path).st_ino == inode:  # still the file that named the dead owner
                os.unlink(self.path)
                logger.warning("broke the stale lock %s: its owner (%s) is gone", self.path, owner.describe())
        except FileNotFoundError:
            pass

    def _timeout_message(self, owner: Owner | None) -> str:
        holder = owner.describe() if owner is not None else "a process that has not said who it is"
        kill = f"end it (kill {owner.pid}) " if owner is not None else "end it "
        return (
            f"waited {self.timeout_s:g} s for the lock {self.path}, held by {holder}, which is still building the "
            f"CPU kernels; if that process is stuck, {kill}and start again (the lock goes with it); "
            f"LANGRT_KERNEL_BUILD_TIMEOUT sets this wait, LANGRT_CPU_KERNELS=0 runs without the kernels"
        )


def read_owner(path: Path) -> tuple[Owner | None, int | None]:
    """The owner a lock file names (None where it names none) and the file's inode."""
    try:
        with open(path) as record:
            return Owner.parse(record.read()), os.fstat(record.fileno()).st_ino
    except FileNotFoundError:
        return None, None


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process from /proc; None where there is no /proc entry."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, IndexError):
        return None
    return fields[0], fields[19]


def _proc_start(pid: int) -> str | None:
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]
