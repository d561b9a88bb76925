"""The files of a prepared data directory: their names, the format version, and meta.json.

    DIR/meta.json    what was prepared (request), the tokenizer, token counts, and the files
    DIR/train.bin    token shards (xtrain.data.shards)
    DIR/val.bin
    DIR/tokenizer.json (or tiktoken.json)

Invariant: the files meta.json names are plain file names inside DIR (a dataset never reads
outside its directory); read_meta checks that before anything uses them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import DataError

META_FILE = "meta.json"
TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
FORMAT_VERSION = 1


def read_meta(data_dir: str | os.PathLike) -> dict:
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        raise DataError(f"{data_dir} is not a prepared dataset (no {META_FILE}); "
                        f"run `xtrain prepare` on it first")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON ({e.msg})") from None
    _check_meta(meta, path)
    return meta


def _check_meta(meta, path: Path) -> None:
    """meta.json is an object of objects, and the files it names are plain names inside its
    directory (never a path: a dataset reads nothing outside itself)."""
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k, {}), dict)
                                             for k in ("request", "tokenizer", "counts", "files")):
        raise DataError(f"{path}: malformed (expected a JSON object of objects)")
    for name in meta.get("files", {}).values():
        if not (isinstance(name, str) and name == Path(name).name and name not in ("", ".", "..")
                and not name.startswith(".")):
            raise DataError(f"{path}: {name!r} is not a plain file name inside {path.parent}")
