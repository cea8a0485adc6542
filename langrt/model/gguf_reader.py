"""Reading a GGUF file's header: key/value metadata and the table of tensors.

A GGUF file is a header (key/value metadata, then one record per tensor: name, dims, ggml type,
offset) followed by the aligned tensor data. The header is parsed with `struct` over a memory
map rather than with `gguf.GGUFReader`, which builds a numpy view per array element (20x slower
on a 49k-token vocabulary, see benchmarks/README.md). GGUF lists dims innermost first
(ne0 = row length), so a tensor's torch shape is the reverse of its dims.
"""

from __future__ import annotations

import math
import os
import mmap
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from langrt.errors import ModelLoadError

_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
# GGUF metadata value types (gguf.GGUFValueType) -> struct format / numpy dtype.
_STRING, _ARRAY = 8, 9
_SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_ARRAY_DTYPES = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lies in the file. `shape` is in torch order (the GGUF dims reversed)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return gguf.GGMLQuantizationType(self.ggml_type).name


class GGUFHeaderParser:
    """Sequential reader of the GGUF header; raises ModelLoadError on anything malformed."""

    def __init__(self, buf: mmap.mmap, path: Path):
        self.buf, self.path, self.pos = buf, path, 0

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path} is not a valid GGUF file: {what} (at byte {self.pos})")

    def take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > len(self.buf):
            raise self.fail(f"needs {n} more bytes but the file ends at {len(self.buf)}")
        self.pos = start + n
        return start

    def scalar(self, fmt: str) -> Any:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        start = self.take(n)
        return self.buf[start : start + n].decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        raise self.fail(f"unknown metadata value type {vtype}")

    def array(self) -> list[Any]:
        itype, count = self.scalar("<I"), self.scalar("<Q")
        if itype in _ARRAY_DTYPES:
            dtype = np.dtype(_ARRAY_DTYPES[itype])
            start = self.take(count * dtype.itemsize)
            return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).tolist()
        if itype == _STRING:
            # The hot loop of the header (vocabularies, merges): keep it free of method calls.
            if count * 8 > len(self.buf) - self.pos:
                raise self.fail(f"string array of {count} items cannot fit in the file")
            buf, pos, end, out = self.buf, self.pos, len(self.buf), []
            unpack = struct.Struct("<Q").unpack_from
            for _ in range(count):
                (n,) = unpack(buf, pos)
                pos += 8
                if pos + n > end:
                    self.pos = pos
                    raise self.fail("a string runs past the end of the file")
                out.append(buf[pos : pos + n].decode("utf-8", errors="replace"))
                pos += n
            self.pos = pos
            return out
        return [self.value(itype) for _ in range(count)]

    def header(self) -> tuple[dict[str, Any], list[GGUFTensorInfo]]:
        if self.buf[:4] != _MAGIC:
            raise self.fail("bad magic (expected b'GGUF')")
        self.take(4)
        version = self.scalar("<I")
        if version & 0xFFFF == 0:
            raise ModelLoadError(f"{self.path} is a big-endian GGUF file, which langrt does not read")
        if version not in _SUPPORTED_VERSIONS:
            raise ModelLoadError(f"{self.path} is GGUF version {version}; langrt reads versions 2 and 3")
        n_tensors, n_kv = self.scalar("<Q"), self.scalar("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self.string()
            metadata[key] = self.value(self.scalar("<I"))
        records = [self.tensor_record() for _ in range(n_tensors)]
        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise self.fail(f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-self.pos // alignment) * alignment
        return metadata, [self.tensor_info(*record, data_start) for record in records]

    def tensor_info(self, name: str, dims: list[int], ggml_type: int, offset: int, data_start: int) -> GGUFTensorInfo:
        try:
            qtype = gguf.GGMLQuantizationType(ggml_type)
        except ValueError:
            raise ModelLoadError(f"{self.path}: tensor {name} has unknown ggml type id {ggml_type}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if dims and dims[0] % block:
            raise self.fail(f"tensor {name}: rows of {dims[0]} do not split into {qtype.name} blocks of {block}")
        nbytes = math.prod(dims) // block * type_size
        start = data_start + offset
        if start + nbytes > len(self.buf):
            raise ModelLoadError(
                f"{self.path} is truncated: tensor {name} needs bytes up to {start + nbytes} "
                f"but the file has {len(self.buf)}"
            )
        return GGUFTensorInfo(name, tuple(reversed(dims)), int(qtype), start, nbytes)

    def tensor_record(self) -> tuple[str, list[int], int, int]:
        name = self.string()
        n_dims = self.scalar("<I")
        if n_dims > 8:
            raise self.fail(f"tensor {name} claims {n_dims} dimensions")
        dims = [self.scalar("<Q") for _ in range(n_dims)]
        return name, dims, self.scalar("<I"), self.scalar("<Q")


# Headers parsed inside `cached_headers()`, by (path, size, modification time); None outside.
_headers: dict[tuple, tuple[dict[str, Any], list[GGUFTensorInfo]]] | None = None


@contextmanager
def cached_headers():
    """Within this block each file's header is parsed once: a process's start-up reads it for the
    config, the tokenizer and the weights (~0.3 s each for a 151k-token vocabulary). The parsed
    metadata is shared, so callers must not change it; it is dropped when the block ends (it
    holds the vocabulary as Python strings, ~30 MB)."""
    global _headers
    outer = _headers
    _headers = {} if outer is None else outer
    try:
        yield
    finally:
        _headers = outer


def read_header(path: Path) -> tuple[mmap.mmap, dict[str, Any], list[GGUFTensorInfo]]:
    """Map the file (copy-on-write) and parse its header: (mapping, metadata, tensors)."""
    if not path.is_file():
        raise ModelLoadError(f"GGUF file not found: {path}")
    try:
        with open(path, "rb") as f:
            # Copy-on-write: numpy/torch views of it are writable (no read-only warnings),
            # and nothing can ever be written back to the file.
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            stat = os.fstat(f.fileno())
    except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
        raise ModelLoadError(f"cannot read GGUF file {path}: {e}") from e
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if _headers is not None and key in _headers:
        return (mapping, *_headers[key])
    metadata, tensors = GGUFHeaderParser(mapping, path).header()
    if _headers is not None:
        _headers[key] = (metadata, tensors)
    return mapping, metadata, tensors
