"""Token shards: one flat array of token ids in a binary file with a fixed 64-byte header.

Header layout (little-endian):

    offset size  field
    0      8     magic b"XTRNTOK1"
    8      4     u32 format version (1)
    12     4     u32 dtype code: bytes per token, 2 (uint16) or 4 (uint32)
    16     8     u64 token count
    24     4     u32 tokenizer vocab size
    28     4     u32 end-of-text id
    32     16    tokenizer fingerprint (the 32 hex digits as 16 raw bytes)
    48     16    reserved, zero

Tokens follow at offset 64 (aligned for memmap). uint16 is used whenever every id fits
(vocab_size <= 65536), halving disk and page-cache use. The header is written last by the writer
(the count is only known at the end), into a temporary file renamed on close, so a shard on disk is
either complete or absent. The reader checks magic, version, dtype and that the file size is exactly
header + count * itemsize: a truncated or padded file raises DataError instead of yielding garbage.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError

MAGIC = b"XTRNTOK1"
VERSION = 1
HEADER_SIZE = 64
_HEADER = struct.Struct("<8sIIQII16s16x")
assert _HEADER.size == HEADER_SIZE
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The narrowest token dtype holding ids 0 .. vocab_size-1."""
    if not 0 < vocab_size < 2**32:
        raise DataError(f"vocab_size must be in (0, 2**32), got {vocab_size}")
    return _DTYPES[2] if vocab_size <= 2**16 else _DTYPES[4]


@dataclass(frozen=True)
class ShardHeader:
    n_tokens: int
    dtype: np.dtype
    vocab_size: int
    eot_id: int
    fingerprint: str


@dataclass(frozen=True)
class TokenSplit:
    """The tokens of one split however they are stored: an xtrain shard, or token files of another
    project read in place (formats.py). `tokens` is a memory-mapped array, or an object slicing
    like one; `header` describes them (count, dtype, tokenizer vocab size, eot id, fingerprint)."""

    name: str  # for messages: the shard's path, or the directory and its files
    header: ShardHeader
    tokens: Any


class ShardWriter:
    """Append token arrays to a new shard; `close()` (or leaving the `with`) publishes it."""

    def __init__(self, path: str | os.PathLike, vocab_size: int, eot_id: int, fingerprint: str):
        self.path = Path(path)
        self.dtype = dtype_for_vocab(vocab_size)
        self.vocab_size, self.eot_id, self.fingerprint = vocab_size, eot_id, fingerprint
        _fingerprint_bytes(fingerprint)  # fail before writing anything
        self.n_tokens = 0
        self._tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self._tmp, "wb")
        self._file.write(b"\0" * HEADER_SIZE)  # placeholder until the count is known

    def write(self, tokens) -> None:
        tokens = np.asarray(tokens)
        if tokens.size == 0:
            return
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            raise DataError(f"token ids must be in [0, {self.vocab_size}), got range "
                            f"[{tokens.min()}, {tokens.max()}]")
        self._file.write(tokens.astype(self.dtype, copy=False).tobytes())
        self.n_tokens += tokens.size

    def close(self) -> None:
        if self._file.closed:
            return
        header = ShardHeader(self.n_tokens, self.dtype, self.vocab_size, self.eot_id,
                             self.fingerprint)
        self._file.seek(0)
        self._file.write(pack_header(header))
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the partial file; the destination is left untouched."""
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_shard(path: str | os.PathLike, tokens, vocab_size: int, eot_id: int,
                fingerprint: str) -> Path:
    """Write one array of token ids as a shard."""
    with ShardWriter(path, vocab_size, eot_id, fingerprint) as w:
        w.write(tokens)
    return Path(path)


def pack_header(h: ShardHeader) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, h.dtype.itemsize, h.n_tokens, h.vocab_size,
                        h.eot_id, _fingerprint_bytes(h.fingerprint))


def read_header(path: str | os.PathLike) -> ShardHeader:
    """Read and validate a shard's header against the file size."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"shard {path} does not exist")
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise DataError(f"shard {path} is truncated: {size} bytes, smaller than the "
                        f"{HEADER_SIZE}-byte header")
    magic, version, code, n_tokens, vocab_size, eot_id, fp = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise DataError(f"{path} is not an xtrain token shard (magic {magic!r}, "
                        f"expected {MAGIC!r})")
    if version != VERSION:
        raise DataError(f"shard {path} has format version {version}; this xtrain reads "
                        f"version {VERSION}. Re-run prepare.")
    if code not in _DTYPES:
        raise DataError(f"shard {path} has unknown dtype code {code} (expected 2 or 4)")
    expected = HEADER_SIZE + n_tokens * code
    if size != expected:
        kind = "truncated" if size < expected else "longer than its header says"
        raise DataError(f"shard {path} is {kind}: {size} bytes on disk, header promises "
                        f"{n_tokens} tokens x {code} bytes + {HEADER_SIZE} = {expected}")
    return ShardHeader(n_tokens, _DTYPES[code], vocab_size, eot_id, fp.hex())


def open_shard(path: str | os.PathLike) -> tuple[ShardHeader, np.ndarray]:
    """Validate a shard and memory-map its tokens (read-only, nothing is loaded up front)."""
    header = read_header(path)
    if header.n_tokens == 0:
        return header, np.zeros(0, dtype=header.dtype)
    tokens = np.memmap(path, dtype=header.dtype, mode="r", offset=HEADER_SIZE,
                       shape=(header.n_tokens,))
    return header, tokens


def _fingerprint_bytes(fingerprint: str) -> bytes:
    try:
        raw = bytes.fromhex(fingerprint)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise DataError(f"tokenizer fingerprint must be 32 hex digits, got {fingerprint!r}")
    return raw
