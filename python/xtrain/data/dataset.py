"""open_dataset(): load a data directory and prove its parts belong together.

The training loop calls this once. A directory made by prepare() holds meta.json, the tokenizer's
files and two shards: they must agree on the tokenizer fingerprint and vocabulary size (shards
from another tokenizer, or a tokenizer.json swapped in later, raise DataError). A directory of
another project's token files (formats.py) is read in place: with the tokenizer recorded in its
meta.json when `xtrain prepare` wrote one there, else with the tokenizer its format implies
(GPT-2), after one scan proving every id fits it. Optionally the model's vocabulary is checked to
hold every id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import formats
from .errors import DataError
from .layout import META_FILE, TRAIN_FILE, VAL_FILE, read_meta
from .loader import TokenLoader, check_shard_tokenizer
from .shards import ShardHeader, TokenSplit, open_shard, read_header
from .tokenizer import Tokenizer, gpt2_unavailable_reason, load_tokenizer, open_tokenizer

SPLITS = {"train": TRAIN_FILE, "val": VAL_FILE}


@dataclass(frozen=True)
class Dataset:
    path: Path
    meta: dict
    tokenizer: Tokenizer

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eot_id(self) -> int:
        return self.tokenizer.eot_id

    @property
    def format(self) -> str:
        """"xtrain" (token shards written by prepare), or the format of files read in place."""
        return self.meta.get("format", "xtrain")

    def shard_path(self, split: str) -> Path:
        """The xtrain shard of a split (`split()` reads every format)."""
        _check_split(split)
        if self.format != "xtrain":
            raise DataError(f"{self.path} is read in place ({self.format} token files), it has "
                            f"no xtrain shards: use Dataset.split({split!r})")
        return self.path / SPLITS[split]

    def split(self, split: str) -> TokenSplit:
        """The tokens of a split, memory-mapped, with a header describing them."""
        _check_split(split)
        if self.format == "xtrain":
            path = self.shard_path(split)
            return TokenSplit(str(path), *open_shard(path))
        files = [formats.read_file(self.path, self.format, name)
                 for name in self.meta["files"][split]]
        _check_listed_sizes(self.path, self.meta, files)
        tok = self.tokenizer
        header, tokens = formats.open_split(self.path, files, tok.vocab_size, tok.eot_id,
                                            tok.fingerprint)
        return TokenSplit(f"{self.path} ({split}: {', '.join(f.name for f in files)})", header,
                          tokens)

    def loader(self, split: str, batch: int, seq: int, seed: int, rank: int = 0,
               world_size: int = 1) -> TokenLoader:
        return TokenLoader(self.split(split), batch, seq, seed, rank=rank,
                           world_size=world_size, tokenizer=self.tokenizer)

    def check_vocab(self, model_vocab_size: int) -> None:
        """DataError if a model with this vocabulary cannot embed every token id."""
        if model_vocab_size < self.vocab_size:
            raise DataError(f"model vocab_size {model_vocab_size} is smaller than the "
                            f"tokenizer's {self.vocab_size} ({self.tokenizer.name} in "
                            f"{self.path}); ids up to {self.vocab_size - 1} would be out of range")


def is_dataset_dir(path: str | os.PathLike) -> bool:
    """Whether open_dataset reads `path` as it is: a prepared directory, or another project's
    token files."""
    path = Path(path)
    return path.is_dir() and ((path / META_FILE).is_file() or
                              formats.detect_format(path) is not None)


def open_dataset(path: str | os.PathLike, model_vocab_size: int | None = None) -> Dataset:
    """Open a directory made by prepare(), or of nanoGPT/llm.c token files, validating
    tokenizer, meta and tokens together."""
    path = Path(path)
    if not (path / META_FILE).is_file() and formats.detect_format(path) is not None:
        dataset = open_token_dir(path)
    else:
        dataset = _open_prepared(path)
    if model_vocab_size is not None:
        dataset.check_vocab(model_vocab_size)
    return dataset


def open_token_dir(path: Path, tokenizer: Tokenizer | None = None) -> Dataset:
    """Another project's token directory read in place, with `tokenizer` or the one its format
    implies; every file is scanned once (ids within the vocabulary). Writes nothing."""
    fmt = formats.detect_format(path)
    files = formats.token_files(path, fmt)
    if tokenizer is None:
        tokenizer = format_tokenizer(path, fmt, files)
    formats.check_tokenizer_fits(path, files, tokenizer)
    scanned = formats.scan(path, files, tokenizer)
    meta = token_dir_meta(fmt, files, tokenizer, scanned, request={}, source={"dir": str(path)})
    return Dataset(path, meta, tokenizer)


def format_tokenizer(path: Path, fmt: str, files: dict) -> Tokenizer:
    """The tokenizer a token directory's format implies (GPT-2), or a DataError saying how to
    name one."""
    hint = formats.tokenizer_hint(files)
    if hint is None:
        raise DataError(f"the {fmt} token files in {path} do not say which tokenizer made them; "
                        f"run `xtrain prepare {path} --tokenizer PATH` first")
    reason = gpt2_unavailable_reason() if hint == "gpt2" else None
    if reason is not None:
        raise DataError(f"the {fmt} token files in {path} hold GPT-2 ids, and GPT-2's tokenizer "
                        f"is unavailable: {reason}; or name a tokenizer file with the same ids: "
                        f"`xtrain prepare {path} --tokenizer PATH`")
    return open_tokenizer(hint)


def token_dir_meta(fmt: str, files: dict, tokenizer: Tokenizer, scanned: dict, request: dict,
                   source: dict) -> dict:
    """meta.json of a token directory read in place: the files of each split, in order, with
    their sizes (and hashes), what the scan counted, and the tokenizer."""
    return {"request": request, "format": fmt, "tokenizer": tokenizer_record(tokenizer),
            "counts": scanned["counts"], "source": source,
            "files": {split: [f.name for f in group] for split, group in files.items()},
            "listing": scanned["files"]}


def tokenizer_record(tok: Tokenizer) -> dict:
    return {"kind": tok.kind, "name": tok.name, "fingerprint": tok.fingerprint,
            "vocab_size": tok.vocab_size, "eot_id": tok.eot_id}


def _open_prepared(path: Path) -> Dataset:
    meta = read_meta(path)
    recorded = meta.get("tokenizer", {})
    tok = load_tokenizer(path, recorded.get("kind"))
    if (recorded.get("fingerprint"), recorded.get("vocab_size")) != (tok.fingerprint,
                                                                      tok.vocab_size):
        raise DataError(f"the tokenizer in {path} ({tok.name}, fingerprint {tok.fingerprint}) is "
                        f"not the one the shards were made with ({recorded.get('name')}, "
                        f"fingerprint {recorded.get('fingerprint')}); re-run prepare")
    dataset = Dataset(path, meta, tok)
    if dataset.format == "xtrain":
        for name in SPLITS.values():
            header: ShardHeader = read_header(path / name)
            check_shard_tokenizer(str(path / name), header, tok)
    else:
        for split in SPLITS:
            dataset.split(split)  # headers, sizes against the listing
    return dataset


def _check_listed_sizes(path: Path, meta: dict, files) -> None:
    listing = meta.get("listing") or {}
    for f in files:
        recorded = listing.get(f.name, {}).get("bytes")
        size = (path / f.name).stat().st_size
        if recorded is not None and recorded != size:
            raise DataError(f"{path / f.name} has changed since it was prepared: {size} bytes, "
                            f"{recorded} recorded; re-run prepare")


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise DataError(f"split must be one of {tuple(SPLITS)}, got {split!r}")
