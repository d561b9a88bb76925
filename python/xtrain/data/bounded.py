"""Reading a file that came from outside (a config.json, a tokenizer, an index, a TOML file) with
its size bounded before a byte is read.

Invariant: no external file is read whole unless it is a regular file (a FIFO or a device would
block or never end) whose size on disk is within the limit its kind is given here; the error names
the file, its size and the limit. The limits are far above any real file of the kind and far below
what would hurt a machine to read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import DataError

# JSON documents that describe something (config.json, tokenizer_config.json, a safetensors index,
# meta.json, a tiktoken record): a few KB in practice, an index of a huge model a few MB.
MAX_JSON_BYTES = 64 << 20
# A tokenizer's own file (tokenizer.json of ~250K merges is ~30 MB; SentencePiece models less).
MAX_TOKENIZER_BYTES = 512 << 20
# A safetensors header (about 100 bytes per tensor).
MAX_HEADER_BYTES = 64 << 20
# A --config TOML file of options.
MAX_TOML_BYTES = 1 << 20


def read_bounded(path, limit: int, what: str, error=DataError) -> bytes:
    """The bytes of regular file `path`, at most `limit` of them; `error` (an exception type)
    naming `what` and the file otherwise. Reads through one descriptor, so the file checked is the
    file read (and one that grows meanwhile is refused, never read past its checked size)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise error(f"{what} {path}: no such file") from None
    except OSError as e:
        raise error(f"{what} {path}: cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path} is not a regular file")
        if st.st_size > limit:
            raise error(f"{what} {path} is {st.st_size:,} bytes, more than such a file ever needs "
                        f"({limit:,}); refusing to read it")
        # read(n) sets n bytes aside first: ask for the size on disk (and one byte to see growth)
        data = f.read(st.st_size + 1)
        if len(data) > st.st_size:
            raise error(f"{what} {path} grew while it was read; refusing it")
    return data


def read_text_bounded(path, limit: int, what: str, error=DataError) -> str:
    """read_bounded as UTF-8 text; `error` when it is not UTF-8."""
    data = read_bounded(path, limit, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
