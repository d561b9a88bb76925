"""Document readers: turn a file, a directory or a list of them into a stream of text documents.

Formats, chosen by suffix:
- `.txt`: if the file contains `<|endoftext|>` anywhere it is split on that marker (the TinyStories
  text release is such a file); otherwise documents are separated by one or more blank lines.
- `.jsonl`: one JSON object per line, the document is its `text` field.
- `.parquet`: the `text` column (read with pyarrow in record batches, so memory stays bounded).

Documents are stripped of surrounding whitespace and empty ones are dropped. Directories are walked
recursively in sorted order so the document order, and hence the train/val split, is deterministic.
Text is decoded as UTF-8 with replacement: one bad byte in a web corpus should not stop a prepare.

A directory source reads only what lies inside it: a symbolic link in it whose target resolves
outside the directory is refused (DataError naming the link and its target), one that stays inside
is read once (at its target's place in the order); directory links are not walked into, and
special files (FIFOs, sockets, devices) are refused. A file named as a source must be a regular
file (a link to one is fine: the user named it).
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

from .errors import DataError

EOT_TEXT = "<|endoftext|>"
SUFFIXES = (".txt", ".jsonl", ".parquet")
TEXT_FIELD = "text"
# Read size for the streaming splitter: big enough that Python overhead per chunk is negligible.
CHUNK_CHARS = 1 << 20
# The longest document (or .jsonl line) a source may hold: far beyond any real document, and what
# bounds the memory one takes (a file with no separator would otherwise be read whole).
MAX_DOCUMENT_CHARS = 1 << 28

Source = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def list_source_files(source: Source) -> list[Path]:
    """The files a source names, in a deterministic order. Raises DataError if there are none."""
    entries = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    files: list[Path] = []
    for entry in entries:
        path = Path(entry)
        if path.is_dir():
            found = _directory_files(path)
            if not found:
                raise DataError(f"directory {path} holds no {'/'.join(SUFFIXES)} files")
            files.extend(found)
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                raise DataError(f"unsupported file type {path.suffix!r} for {path}; "
                                f"expected one of {', '.join(SUFFIXES)}")
            files.append(path)
        elif path.exists():
            raise DataError(f"source {path} is not a regular file or a directory")
        else:
            raise DataError(f"source {path} does not exist")
    if not files:
        raise DataError("empty source list")
    return files


def _directory_files(root: Path) -> list[Path]:
    """The text files inside directory `root` (see the module doc: links that leave it and
    special files refused, links inside read once), sorted."""
    top = root.resolve()
    found, seen = [], set()
    for p in sorted(root.rglob("*")):
        if p.suffix not in SUFFIXES:
            continue
        if p.is_symlink():
            try:
                target = p.resolve()
            except (RuntimeError, OSError):  # a loop of links (RuntimeError before Python 3.13)
                raise DataError(f"{p} is a symbolic link that leads nowhere (a loop); remove it from "
                                f"the source directory") from None
            if top not in target.parents:
                raise DataError(f"{p} is a symbolic link to {target}, outside the source directory "
                                f"{root}; prepare reads only files inside a directory (name the "
                                f"target as a source to read it)")
            if not target.is_file() or target.suffix not in SUFFIXES:
                continue
            p = root / target.relative_to(top)
        elif not p.is_file():
            if not p.is_dir() and p.exists():
                raise DataError(f"{p} is not a regular file (a FIFO, socket or device); remove it "
                                f"from the source directory")
            continue
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            found.append(p)
    return sorted(found)


def iter_documents(source: Source) -> Iterator[str]:
    """Yield every non-empty document of the source, in order."""
    for path in list_source_files(source):
        yield from read_file(path)


def read_file(path: Path) -> Iterator[str]:
    """Yield the documents of one file, dispatching on its suffix."""
    path = Path(path)
    if path.suffix == ".txt":
        reader = read_txt_eot if _contains_eot(path) else read_txt_paragraphs
        return reader(path)
    if path.suffix == ".jsonl":
        return read_jsonl(path)
    if path.suffix == ".parquet":
        return read_parquet(path)
    raise DataError(f"unsupported file type {path.suffix!r} for {path}")


def _contains_eot(path: Path) -> bool:
    # A C-speed byte search over the mapped file decides the format before reading it as text.
    if path.stat().st_size == 0:
        return False
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return mm.find(EOT_TEXT.encode()) >= 0


def read_txt_eot(path: Path) -> Iterator[str]:
    """Documents separated by `<|endoftext|>` (TinyStories format), streamed in chunks."""
    pending = ""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        while chunk := f.read(CHUNK_CHARS):
            pieces = (pending + chunk).split(EOT_TEXT)
            # The last piece may be a document, or a marker, cut by the chunk boundary: keep it.
            pending = pieces.pop()
            _check_length(len(pending), path)
            yield from _nonempty(pieces)
    yield from _nonempty([pending])


def read_txt_paragraphs(path: Path) -> Iterator[str]:
    """Documents separated by one or more blank (whitespace-only) lines."""
    lines: list[str] = []
    size = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in _lines(f, path):
            if line.strip():
                lines.append(line)
                size += len(line)
                _check_length(size, path)
            elif lines:
                yield from _nonempty(["".join(lines)])
                lines, size = [], 0
    yield from _nonempty(["".join(lines)])


def read_jsonl(path: Path) -> Iterator[str]:
    """One JSON object per line; the document is its `text` field (a string)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(_lines(f, path), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            text = record.get(TEXT_FIELD) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise DataError(f"{path}:{lineno}: expected an object with a string "
                                f"{TEXT_FIELD!r} field")
            yield from _nonempty([text])


def read_parquet(path: Path) -> Iterator[str]:
    """The `text` column of a parquet file, read one record batch at a time."""
    import pyarrow.parquet as pq  # imported here: only parquet sources need pyarrow

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise DataError(f"{path}: not a readable parquet file ({e})") from None
    if TEXT_FIELD not in pf.schema_arrow.names:
        raise DataError(f"{path}: no {TEXT_FIELD!r} column (columns: {pf.schema_arrow.names})")
    for batch in pf.iter_batches(columns=[TEXT_FIELD]):
        texts = [t for t in batch.column(0).to_pylist() if t is not None]
        if not all(isinstance(t, str) for t in texts):
            raise DataError(f"{path}: the {TEXT_FIELD!r} column holds "
                            f"{pf.schema_arrow.field(TEXT_FIELD).type}, not strings")
        yield from _nonempty(texts)


def _lines(f, path: Path) -> Iterator[str]:
    """The lines of text file `f`, each read with a bound (MAX_DOCUMENT_CHARS)."""
    while line := f.readline(MAX_DOCUMENT_CHARS + 1):
        _check_length(len(line), path)
        yield line


def _check_length(n: int, path: Path) -> None:
    if n > MAX_DOCUMENT_CHARS:
        raise DataError(f"{path}: a document (or line) longer than {MAX_DOCUMENT_CHARS:,} characters; split "
                        f"the file into documents (blank lines, <|endoftext|> or one JSON object a line)")


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        text = text.strip()
        if text:
            yield text
