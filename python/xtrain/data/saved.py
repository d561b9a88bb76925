"""A Hugging Face `datasets` dataset saved with `save_to_disk` -> a prepared directory.

    DIR/dataset_dict.json + DIR/SPLIT/...   a DatasetDict: --split (default train) is trained on,
                                            --val-split (default: validation or val when there)
                                            validated on, else the hash split of prepare()
    DIR/dataset_info.json + DIR/state.json  a Dataset: split by the hash of each document

The column, first of: --text-column when given (tokenized); an `input_ids` column (lists of ids,
written as they are, with the tokenizer that made them named by --tokenizer: nothing is
re-tokenised); a `text` column (tokenized). Every document is preceded by the end-of-text id as in
any prepared directory (ids already starting with it are left alone); an id outside the
tokenizer's vocabulary is a DataError naming the row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import DataError
from .layout import FORMAT_VERSION
from .write import is_val_document, resolve_tokenizer, reusable, write_prepared

IDS_COLUMN = "input_ids"
TEXT_COLUMN = "text"
VAL_SPLITS = ("validation", "val")
READ_BATCH = 1000
INSTALL_HINT = "pip install datasets (or: pip install 'xtrain[hub]')"


def is_saved_dataset(path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or
                              ((path / "dataset_info.json").is_file() and
                               (path / "state.json").is_file()))


def prepare_saved(path: Path, out_dir: Path, vocab_size: int, tokenizer, eot: str | None,
                  val_fraction: float, seed: int, overwrite: bool, progress: bool,
                  text_column: str | None = None, split: str | None = None,
                  val_split: str | None = None) -> Path:
    try:
        import datasets
    except ImportError:
        raise DataError(f"reading the saved dataset {path} needs the `datasets` library, which "
                        f"is not installed: {INSTALL_HINT}") from None
    if not progress:
        datasets.disable_progress_bars()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:  # FileNotFoundError, arrow errors, JSON errors: all "not readable"
        raise DataError(f"{path}: not a readable saved dataset ({_first_line(e)})") from None
    train, val, names = _splits(loaded, path, split, val_split)
    column = _column(train, path, text_column)
    ids = column == IDS_COLUMN and text_column is None
    if ids and (tokenizer is None or tokenizer == "bpe"):
        raise DataError(f"{path} holds token ids ({IDS_COLUMN}): name the tokenizer that made "
                        f"them with --tokenizer (gpt2, a tokenizer.json or a .model); a BPE "
                        f"cannot be trained on ids")
    if val is not None and column not in val.column_names:
        raise DataError(f"{path}: split {names[1]!r} has no column {column!r}")
    record, tok = resolve_tokenizer(tokenizer, eot)
    request = {"format_version": FORMAT_VERSION, "saved": str(path.resolve()),
               "splits": names, "column": column, "tokenizer": record,
               "vocab_size": vocab_size if tok is None else None,
               "val_fraction": None if val is not None else val_fraction, "seed": seed,
               "data_fingerprint": [getattr(d, "_fingerprint", None) for d in (train, val) if d]}
    if reusable(out_dir, request, overwrite):
        return out_dir
    read = _id_rows if ids else _texts

    def documents() -> Iterator[tuple[str, str | np.ndarray]]:
        for doc in read(train, column, path, tok):
            if val is not None:
                yield "train", doc
            else:
                key = doc if isinstance(doc, str) else doc.tobytes()
                yield ("val" if is_val_document(key, seed, val_fraction) else "train"), doc
        if val is not None:
            for doc in read(val, column, path, tok):
                yield "val", doc

    rows = train.num_rows + (val.num_rows if val is not None else 0)
    source = {"saved": request["saved"], "splits": {n: d.num_rows for n, d in
                                                    zip(names, (train, val)) if d is not None}}
    hint = (f"the {names[1]!r} split is empty" if val is not None else
            f"the dataset is too small for val_fraction={val_fraction}")
    return write_prepared(out_dir, request, tok, vocab_size, documents, source, progress,
                          total=rows, unit="doc", empty_hint=hint, pretokenized=ids)


def _splits(loaded, path: Path, split: str | None, val_split: str | None):
    """(train table, val table or None, [train name, val name or None])."""
    if not hasattr(loaded, "keys"):  # a Dataset: no splits to choose from
        if split is not None or val_split is not None:
            raise DataError(f"{path} is a Dataset saved without splits: --split and --val-split "
                            f"do not apply")
        return loaded, None, [None, None]
    split = split or "train"
    if val_split is None:
        val_split = next((s for s in VAL_SPLITS if s in loaded and s != split), None)
    for name in (split, val_split):
        if name is not None and name not in loaded:
            raise DataError(f"{path} has no split {name!r} (splits: {', '.join(loaded)})")
    return loaded[split], (loaded[val_split] if val_split else None), [split, val_split]


def _column(table, path: Path, text_column: str | None) -> str:
    if text_column is not None:
        if text_column not in table.column_names:
            raise DataError(f"{path} has no column {text_column!r} (columns: "
                            f"{', '.join(table.column_names)})")
        return text_column
    for name in (IDS_COLUMN, TEXT_COLUMN):
        if name in table.column_names:
            return name
    raise DataError(f"{path} has neither a {TEXT_COLUMN!r} nor an {IDS_COLUMN!r} column "
                    f"(columns: {', '.join(table.column_names)}); pick one with --text-column")


def _texts(table, column: str, path: Path, tok) -> Iterator[str]:
    """The non-empty stripped strings of one column, read in batches."""
    for start, batch in _batches(table, column):
        for i, text in enumerate(batch):
            if text is not None and not isinstance(text, str):
                raise DataError(f"{path}: column {column!r} holds a {type(text).__name__} in row "
                                f"{start + i}, not text")
            if text and (text := text.strip()):
                yield text


def _id_rows(table, column: str, path: Path, tok) -> Iterator[np.ndarray]:
    """Each non-empty row of ids as an int64 array, checked against the tokenizer's vocabulary."""
    for start, batch in _batches(table, column):
        for i, row in enumerate(batch):
            try:
                ids = np.asarray(row if row is not None else [], dtype=np.int64)
            except (TypeError, ValueError):
                ids = None
            if ids is None or ids.ndim != 1:
                raise DataError(f"{path}: row {start + i} of {column!r} is not a list of token ids")
            if ids.size and (ids.min() < 0 or ids.max() >= tok.vocab_size):
                bad = int(ids.max() if ids.max() >= tok.vocab_size else ids.min())
                raise DataError(f"{path}: row {start + i} of {column!r} holds id {bad}, outside "
                                f"the vocabulary of tokenizer {tok.name} (ids < {tok.vocab_size}): "
                                f"is it the tokenizer that made them?")
            if ids.size:
                yield ids


def _batches(table, column: str):
    start = 0
    for batch in table.select_columns([column]).iter(batch_size=READ_BATCH):
        values = batch[column]
        yield start, values
        start += len(values)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
