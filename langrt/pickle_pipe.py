"""Length-prefixed pickles over a pipe: how the main processes talk to their grammar workers
(`python -m langrt.constrained.byte_dfa`, `python -m langrt.server.grammar_check`).

A message is its pickle's length (8 bytes, little-endian) then the pickle. The parent reads
under a time limit (a worker stuck on a pathological grammar is killed, not waited for); the
worker reads blocking, until its parent closes the pipe.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

_HEADER = struct.Struct("<Q")


def send(stream: BinaryIO, message: Any) -> None:
    """Write one message to `stream` and flush it (BrokenPipeError if the reader is gone)."""
    data = pickle.dumps(message, protocol=5)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def receive(stream: BinaryIO | int, timeout_s: float) -> Any:
    """One message from `stream` (a pipe's read end, or its fd) within `timeout_s`. Raises
    TimeoutError past it, EOFError if the writer closed its end before the whole message."""
    fd = stream if isinstance(stream, int) else stream.fileno()
    deadline = time.monotonic() + timeout_s
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exactly(fd, size, deadline))


def messages(stream: BinaryIO) -> Iterator[Any]:
    """The messages of a blocking `stream`, until it ends (or ends inside a header). A stream
    that ends inside a pickle makes unpickling it raise."""
    while len(header := stream.read(_HEADER.size)) == _HEADER.size:
        yield pickle.loads(stream.read(_HEADER.unpack(header)[0]))


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError
        chunk = os.read(fd, n - got)
        if not chunk:
            raise EOFError("the pipe's writer closed it")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
