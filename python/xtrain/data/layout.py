"""The files of a prepared data directory: their names, the format version, and meta.json.

    DIR/meta.json    what was prepared (request), the tokenizer, token counts, and the files
    DIR/train.bin    token shards (xtrain.data.shards)
    DIR/val.bin
    DIR/tokenizer.json (or the files of another tokenizer kind: tokenizer.TOKENIZER_FILES)

A directory of another project's token files (formats.py) prepared in place has no shards: its
meta.json has "format" ("nanogpt", "llmc"), lists each split's files in order under "files" and
their sizes (and sha256) under "listing".

Invariant: the files meta.json names are plain file names inside DIR (a dataset never reads
outside its directory); read_meta checks that before anything uses them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .bounded import MAX_JSON_BYTES, read_text_bounded
from .errors import DataError

META_FILE = "meta.json"
TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
FORMAT_VERSION = 1
# "xtrain": token shards written by prepare; the others are read in place (formats.py).
DATA_FORMATS = ("xtrain", "nanogpt", "llmc")


def read_meta(data_dir: str | os.PathLike) -> dict:
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise DataError(f"{data_dir} is not a prepared dataset (no {META_FILE}); "
                        f"run `xtrain prepare` on it first")
    try:
        meta = json.loads(read_text_bounded(path, MAX_JSON_BYTES, "dataset description"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise DataError(f"{path}: invalid JSON (nested too deeply)") from None
    _check_meta(meta, path)
    return meta


def _check_meta(meta, path: Path) -> None:
    """meta.json is an object of objects, and the files it names are plain names inside its
    directory (never a path: a dataset reads nothing outside itself)."""
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k, {}), dict) for k in
                                             ("request", "tokenizer", "counts", "files", "listing")):
        raise DataError(f"{path}: malformed (expected a JSON object of objects)")
    fmt = meta.get("format", "xtrain")
    if fmt not in DATA_FORMATS:
        raise DataError(f"{path}: unknown data format {fmt!r} (known: {', '.join(DATA_FORMATS)})")
    for split, names in meta.get("files", {}).items():
        if fmt == "xtrain":
            names = [names]
        if not isinstance(names, list) or not names:
            raise DataError(f"{path}: files.{split} must be a non-empty list of file names")
        for name in names:
            _check_plain_name(name, path)
    for name, record in meta.get("listing", {}).items():
        _check_plain_name(name, path)
        if not (isinstance(record, dict) and type(record.get("bytes")) is int):
            raise DataError(f"{path}: listing.{name} must record the file's bytes")
    if fmt != "xtrain" and set(meta.get("files", {})) != {"train", "val"}:
        raise DataError(f"{path}: files must list the train and val splits")


def _check_plain_name(name, path: Path) -> None:
    if not (isinstance(name, str) and name == Path(name).name and name not in ("", ".", "..")
            and not name.startswith(".")):
        raise DataError(f"{path}: {name!r} is not a plain file name inside {path.parent}")


_HASH_CHUNK = 16 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file, read in 16 MiB chunks (data listings and checkpoints record it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()
