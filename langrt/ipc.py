"""ZMQ transport between langrt's processes: private ipc:// endpoints and typed queues.

Endpoints are files in a fresh temporary directory of mode 0700, so only this user can connect;
the messages are pickles, which must never come from a stranger. The receiver of each queue
binds, senders connect. One codec (pickle, protocol 5) for everything.
"""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import zmq
import zmq.asyncio

T = TypeVar("T")


def encode(message: object) -> bytes:
    return pickle.dumps(message, protocol=5)


def decode(frame: bytes) -> object:
    return pickle.loads(frame)


@dataclass(frozen=True)
class Endpoints:
    """The three inboxes: each process binds its own and pushes to the next one's."""

    directory: str
    scheduler: str
    detokenizer: str
    main: str

    @classmethod
    def create(cls) -> "Endpoints":
        directory = tempfile.mkdtemp(prefix="langrt-ipc-")  # mode 0700
        mode = stat.S_IMODE(os.stat(directory).st_mode)
        assert mode == 0o700, f"ipc directory {directory} has mode {oct(mode)}, expected 0o700"
        return cls(
            directory=directory,
            scheduler=f"ipc://{directory}/scheduler",
            detokenizer=f"ipc://{directory}/detokenizer",
            main=f"ipc://{directory}/main",
        )

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def exists(self) -> bool:
        return Path(self.directory).exists()


class PushQueue(Generic[T]):
    def __init__(self, context: zmq.Context, endpoint: str):
        self.socket = context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)

    def put(self, message: T) -> None:
        self.socket.send(encode(message), copy=False)

    def close(self) -> None:
        self.socket.close()


class PullQueue(Generic[T]):
    """Blocking receiver (scheduler and detokenizer processes)."""

    def __init__(self, context: zmq.Context, endpoint: str):
        self.socket = context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)

    def get(self, timeout_s: float | None = None) -> T | None:
        """The next message; None if `timeout_s` passes first (None: wait forever)."""
        timeout_ms = None if timeout_s is None else int(timeout_s * 1000)
        if self.socket.poll(timeout_ms) == 0:
            return None
        return decode(self.socket.recv(copy=False).bytes)

    def drain(self) -> list[T]:
        """Every message already waiting, without blocking."""
        out = []
        while True:
            try:
                out.append(decode(self.socket.recv(zmq.NOBLOCK, copy=False).bytes))
            except zmq.Again:
                return out

    def close(self) -> None:
        self.socket.close()


class AsyncPullQueue(Generic[T]):
    """Receiver for the asyncio main process."""

    def __init__(self, context: zmq.asyncio.Context, endpoint: str):
        self.socket = context.socket(zmq.PULL)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)

    async def get(self) -> T:
        return decode(await self.socket.recv())

    def close(self) -> None:
        self.socket.close()
