"""What names a block of evicted K/V: the model it came from and the tokens before and in it.

A block is `block_tokens` consecutive positions of one token sequence, starting at a multiple
of `block_tokens`. Its key chains the keys of the blocks before it:

    key[0] = H(namespace, tokens[0:B]),   key[i] = H(key[i - 1], tokens[iB:(i + 1)B])

so two sequences with a common prefix share the keys (and the stored blocks) of every block
inside it, and a key names the whole prefix up to its block's end, not just the block's tokens.
The namespace hashes everything else the K/V depends on (`KVIdentity`): the model's files, the
settings that change its numbers, and the pool's layout, so K/V of another model, dtype or
quantization is never found.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

KEY_BYTES = 16  # blake2b digest size: 128 bits, so keys of different prefixes never collide in practice
# How much of each weight file is hashed: its header (safetensors' JSON, GGUF's metadata and
# tensor table) and the first tensors. Hashing whole multi-GB files would delay every start.
HEAD_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
# Part of the namespace: bump it when the stored layout or the keys change meaning.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class KVIdentity:
    """Everything that decides what K/V a token prefix gets, besides the tokens."""

    model_files: tuple[tuple[str, int, int, str], ...]  # (path, size, mtime_ns, head hash) each
    settings: tuple[tuple[str, str], ...]  # serving settings that change the numbers
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_tokens: int

    @property
    def namespace(self) -> bytes:
        text = json.dumps({**asdict(self), "format": FORMAT_VERSION}, sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES).digest()


def model_files(path: Path) -> tuple[tuple[str, int, int, str], ...]:
    """The identity of a model's files: a .gguf file, or an HF directory's config and weights."""
    path = path.expanduser().resolve()
    if path.is_file():
        files = [path]
    else:
        names = [p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES or p.name == "config.json"]
        files = sorted(p for p in names if p.is_file())
    return tuple(_file_identity(p) for p in files)


def _file_identity(path: Path) -> tuple[str, int, int, str]:
    stat = path.stat()
    with open(path, "rb") as f:
        head = hashlib.blake2b(f.read(HEAD_BYTES), digest_size=KEY_BYTES).hexdigest()
    return (str(path), stat.st_size, stat.st_mtime_ns, head)


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of the block holding `tokens` after the prefix whose key is `parent` (for the
    first block, the namespace)."""
    h = hashlib.blake2b(parent, digest_size=KEY_BYTES)
    h.update(array("q", tokens).tobytes())
    return h.digest()


def chain_keys(namespace: bytes, ids: Sequence[int], num_blocks: int, block_tokens: int) -> list[bytes]:
    """The keys of the first `num_blocks` whole blocks of `ids`."""
    keys, parent = [], namespace
    for b in range(num_blocks):
        parent = block_key(parent, ids[b * block_tokens : (b + 1) * block_tokens])
        keys.append(parent)
    return keys
