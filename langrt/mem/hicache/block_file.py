"""One stored block of K/V on disk: a self-describing file whose every byte is checked on load.

Layout: MAGIC, a 4-byte little-endian header length, a JSON header, the payload (the block's
K/V, [2, layers, block_tokens, kv_heads, head_dim] in the pool's dtype, raw bytes). The header
repeats what the file name says (the key) and what the key was made from (namespace, parent key,
tokens), and carries the payload's length and CRC32: a file renamed, cut short, or changed in
any byte fails `decode_block` and is never used.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
import torch

from langrt.mem.hicache.keys import block_key

MAGIC = b"LRTKV\x00\x01\n"
_LEN = struct.Struct("<I")


class CorruptBlockFile(Exception):
    """A block file that must not be used (it is deleted); the message says why."""


@dataclass(frozen=True)
class BlockName:
    """What a block file must hold to be the block looked up."""

    namespace: bytes
    parent: bytes  # the previous block's key (the namespace for the first block)
    tokens: tuple[int, ...]
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def key(self) -> bytes:
        return block_key(self.parent, self.tokens)


def encode_block(name: BlockName, data: torch.Tensor) -> bytes:
    assert tuple(data.shape) == name.shape and data.dtype == name.dtype, "a block of the named layout"
    payload = data.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    header = {**_identity(name), "nbytes": len(payload), "crc32": zlib.crc32(payload)}
    text = json.dumps(header).encode()
    return MAGIC + _LEN.pack(len(text)) + text + payload


def decode_block(blob: bytes, name: BlockName) -> torch.Tensor:
    """The block's K/V (a CPU tensor); raises CorruptBlockFile if the file is not exactly the
    block `name` names."""
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _LEN.size:
        raise CorruptBlockFile("not a langrt KV block file (bad magic)")
    start = len(MAGIC) + _LEN.size
    (header_len,) = _LEN.unpack_from(blob, len(MAGIC))
    try:
        header = json.loads(blob[start : start + header_len])
    except ValueError as e:
        raise CorruptBlockFile(f"unreadable header: {e}") from None
    _check_header(header, name)
    payload = memoryview(blob)[start + header_len :]
    if len(payload) != header["nbytes"]:
        raise CorruptBlockFile(f"truncated: {len(payload)} payload bytes of {header['nbytes']}")
    if zlib.crc32(payload) != header["crc32"]:
        raise CorruptBlockFile("payload checksum mismatch")
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(name.dtype).reshape(name.shape)


def _identity(name: BlockName) -> dict:
    """The header fields that say which block a file holds (written, then checked on read)."""
    return {
        "namespace": name.namespace.hex(),
        "key": name.key.hex(),
        "parent": name.parent.hex(),
        "tokens": list(name.tokens),
        "dtype": str(name.dtype).removeprefix("torch."),
        "shape": list(name.shape),
    }


def _check_header(header: dict, name: BlockName) -> None:
    expected = _identity(name)
    for field, value in expected.items():
        if header.get(field) != value:
            raise CorruptBlockFile(f"header {field} does not match the block looked up")
    if not isinstance(header.get("nbytes"), int) or not isinstance(header.get("crc32"), int):
        raise CorruptBlockFile("header lacks nbytes / crc32")
