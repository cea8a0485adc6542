"""The disk tier: evicted K/V blocks as files in a directory, bounded in bytes, least recently
used removed first, found again by a server started later.

Files are named `<key hex>.kv` (keys.py: the key names the model and the whole token prefix up
to the block's end). Writes go to `<key hex>.kv.tmp.<pid>` and are renamed into place once
complete, so a writer killed mid-write leaves only a temporary file, which no lookup reads and
the next start removes (if its writer is gone). A block file is trusted only after
`decode_block` checks it; a bad one is deleted and counted in `rejected`.

The LRU order survives restarts through the files' mtimes (a hit touches its file). Several
servers may share a directory: each bounds what it indexes, and a file another one removed is
just a miss.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from pathlib import Path

import torch

from langrt.mem.hicache.block_file import BlockName, CorruptBlockFile, decode_block, encode_block

logger = logging.getLogger(__name__)

_BLOCK_FILE = re.compile(r"^([0-9a-f]{32})\.kv$")
_TMP_FILE = re.compile(r"^[0-9a-f]{32}\.kv\.tmp\.(\d+)$")


class DiskTier:
    def __init__(self, directory: str | Path, capacity_bytes: int):
        assert capacity_bytes > 0, "a disk tier needs room for at least one block"
        self.directory = Path(directory).expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity_bytes
        self._files: OrderedDict[bytes, int] = OrderedDict()  # key -> file size, LRU first
        self.used = 0
        self.rejected = 0  # files found bad (wrong key, truncated, corrupt) and deleted
        self.writes = 0
        self._scan()

    def _scan(self) -> None:
        """Index the block files already there (oldest mtime first); remove dead writers' temps."""
        found = []
        for entry in os.scandir(self.directory):
            tmp = _TMP_FILE.match(entry.name)
            if tmp and not _alive(int(tmp.group(1))):
                _unlink(entry.path)
            block = _BLOCK_FILE.match(entry.name)
            if block and entry.is_file():
                stat = entry.stat()
                found.append((stat.st_mtime_ns, bytes.fromhex(block.group(1)), stat.st_size))
        for _, key, size in sorted(found):
            self._files[key] = size
            self.used += size
        self._make_room(0)

    def __contains__(self, key: bytes) -> bool:
        return key in self._files

    def __len__(self) -> int:
        return len(self._files)

    def path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}.kv"

    def put(self, name: BlockName, data: torch.Tensor) -> None:
        """Store a block (no-op if stored already, or if it alone exceeds the capacity)."""
        key = name.key
        if key in self._files:
            self._files.move_to_end(key)
            return
        blob = encode_block(name, data)
        if len(blob) > self.capacity:
            return
        self._make_room(len(blob))
        final = self.path(key)
        tmp = final.with_name(f"{final.name}.tmp.{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
            os.replace(tmp, final)  # atomic: readers see the whole file or none
        except OSError as e:
            _unlink(tmp)
            logger.warning("hicache: could not write %s (%s); the block stays uncached on disk", final, e)
            return
        self._files[key] = len(blob)
        self.used += len(blob)
        self.writes += 1

    def get(self, name: BlockName) -> torch.Tensor | None:
        """The block's K/V (CPU), or None if absent or bad (a bad file is deleted)."""
        key = name.key
        if key not in self._files:
            return None
        path = self.path(key)
        try:
            data = decode_block(path.read_bytes(), name)
        except FileNotFoundError:  # another server sharing the directory removed it
            self._forget(key)
            return None
        except (OSError, CorruptBlockFile) as e:
            logger.warning("hicache: ignoring and removing %s: %s", path, e)
            self.rejected += 1
            self._remove(key)
            return None
        self._files.move_to_end(key)
        _touch(path)
        return data

    def _make_room(self, nbytes: int) -> None:
        while self._files and self.used + nbytes > self.capacity:
            self._remove(next(iter(self._files)))

    def _remove(self, key: bytes) -> None:
        _unlink(self.path(key))
        self._forget(key)

    def _forget(self, key: bytes) -> None:
        self.used -= self._files.pop(key)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # LRU order across restarts is best effort
