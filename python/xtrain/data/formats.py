"""Token files of other projects, read where they lie: nanoGPT's and llm.c's data directories.

    nanoGPT   DIR/train.bin, DIR/val.bin: little-endian uint16 token ids, no header (GPT-2 ids;
              data/openwebtext ends each document with the end-of-text id)
    llm.c     DIR/*_train_*.bin, DIR/*_val_*.bin (also *_train.bin, *_val.bin), each a header of
              256 little-endian int32 (magic 20240520, version 1, token count, zeros) and then the
              tokens as uint16 (GPT-2 ids, each document preceded by the end-of-text id); a shard
              with magic 20240801 and version 7 holds uint32 tokens (llm.c's Llama 3 shards).
              Shards of a split are read in name order, as one stream of tokens.

Such a directory is a dataset as it is: `open_dataset(DIR)` reads it with GPT-2's tokenizer
(`xtrain train --data DIR` needs nothing else), and `xtrain prepare DIR --tokenizer PATH` records
another tokenizer by writing meta.json and the tokenizer's files beside the token files (the token
files are never rewritten). Nothing is re-tokenised.

Checks, each a one-line DataError: a split with no file or no tokens; a nanoGPT file of odd length;
an llm.c header with another magic, version, or a count that disagrees with the file's size; a
tokenizer with more ids than the files' integer type holds (a uint16 file written from such ids
has wrapped them); any id outside the tokenizer's vocabulary (every file is scanned once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .layout import file_sha256
from .shards import MAGIC as XTRAIN_MAGIC
from .shards import ShardHeader

NANOGPT = "nanogpt"
LLMC = "llmc"
FORMATS = (NANOGPT, LLMC)
NANOGPT_FILES = {"train": "train.bin", "val": "val.bin"}
LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = 4 * LLMC_HEADER_INTS
# magic -> (version, token dtype, the tokenizer its ids come from when the user names none)
LLMC_MAGICS = {20240520: (1, np.dtype("<u2"), "gpt2"), 20240801: (7, np.dtype("<u4"), None)}
# llm.c's names: fineweb_train_000001.bin, tiny_shakespeare_val.bin, TinyStories_train.bin
_LLMC_SPLIT = re.compile(r"(?:^|_)(train|val)(?:_[^/]*)?\.bin$")
# Scan in pieces: the max and the end-of-text count of a multi-GB file in bounded memory.
SCAN_TOKENS = 1 << 24


@dataclass(frozen=True)
class TokenFile:
    """One file of token ids: where its tokens start, their type and count."""

    name: str  # a plain file name inside the data directory
    offset: int
    dtype: np.dtype
    n_tokens: int
    tokenizer_hint: str | None  # the tokenizer the format implies ("gpt2"), None: unknown


def detect_format(directory) -> str | None:
    """NANOGPT, LLMC, or None for anything else (an xtrain dataset included)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    if any((directory / n).is_file() for n in NANOGPT_FILES.values()):
        train = directory / NANOGPT_FILES["train"]
        if train.is_file():
            with open(train, "rb") as f:
                if f.read(len(XTRAIN_MAGIC)) == XTRAIN_MAGIC:
                    return None  # an xtrain shard: a prepared dataset (or what is left of one)
        return NANOGPT
    if any(_LLMC_SPLIT.search(p.name) for p in directory.glob("*.bin")):
        return LLMC
    return None


def token_files(directory, fmt: str) -> dict[str, list[TokenFile]]:
    """The files of each split ("train", "val"), validated against their sizes."""
    directory = Path(directory)
    if fmt == NANOGPT:
        found = {split: [name] for split, name in NANOGPT_FILES.items()
                 if (directory / name).is_file()}
        reader = _nanogpt_file
    elif fmt == LLMC:
        found = {}
        for p in sorted(directory.glob("*.bin")):
            m = _LLMC_SPLIT.search(p.name)
            if m and p.is_file():
                found.setdefault(m.group(1), []).append(p.name)
        reader = _llmc_file
    else:
        raise DataError(f"unknown token file format {fmt!r} (known: {', '.join(FORMATS)})")
    for split in ("train", "val"):
        if split not in found:
            example = NANOGPT_FILES[split] if fmt == NANOGPT else f"*_{split}_*.bin"
            raise DataError(f"{directory} holds {fmt} token files but no {split} split "
                            f"({example})")
    files = {split: [reader(directory, name) for name in names] for split, names in found.items()}
    for split, group in files.items():
        if sum(f.n_tokens for f in group) == 0:
            raise DataError(f"the {split} split of {directory} holds no tokens")
        if len({(f.dtype, f.tokenizer_hint) for f in group}) > 1:
            raise DataError(f"the {split} files of {directory} mix llm.c shard kinds (magic and "
                            f"version differ)")
    return files


def tokenizer_hint(files: dict[str, list[TokenFile]]) -> str | None:
    """The tokenizer the files' format implies ("gpt2"), None when the user must name one."""
    hints = {f.tokenizer_hint for group in files.values() for f in group}
    return hints.pop() if len(hints) == 1 else None


def check_tokenizer_fits(directory, files: dict[str, list[TokenFile]], tokenizer) -> None:
    """DataError when the tokenizer has ids the files' integer type cannot hold."""
    for group in files.values():
        for f in group:
            limit = 1 << (8 * f.dtype.itemsize)
            if tokenizer.vocab_size > limit:
                raise DataError(f"{Path(directory) / f.name} stores {f.dtype.name} ids, which "
                                f"hold at most {limit}, but tokenizer {tokenizer.name} has "
                                f"{tokenizer.vocab_size}: its larger ids cannot be in this file "
                                f"(they would have wrapped when it was written)")


def scan(directory, files: dict[str, list[TokenFile]], tokenizer,
         with_hashes: bool = False) -> dict:
    """Read every token once: DataError on an id outside the vocabulary. Returns per file its
    size in bytes (and sha256 with `with_hashes`), and per split the tokens and end-of-text ids."""
    directory = Path(directory)
    listing, counts = {}, {}
    for split, group in files.items():
        counts[f"{split}_tokens"] = sum(f.n_tokens for f in group)
        counts[f"{split}_eot"] = 0
        for f in group:
            path = directory / f.name
            tokens = _memmap(path, f)
            for start in range(0, f.n_tokens, SCAN_TOKENS):
                piece = np.asarray(tokens[start:start + SCAN_TOKENS])
                top = int(piece.max())
                if top >= tokenizer.vocab_size:
                    where = start + int(np.argmax(piece >= tokenizer.vocab_size))
                    raise DataError(f"{path} holds id {top} (token {where}), outside the "
                                    f"vocabulary of tokenizer {tokenizer.name} (ids < "
                                    f"{tokenizer.vocab_size}): are these its ids?")
                counts[f"{split}_eot"] += int(np.count_nonzero(piece == tokenizer.eot_id))
            del tokens
            record = {"bytes": path.stat().st_size}
            if with_hashes:
                record["sha256"] = file_sha256(path)
            listing[f.name] = record
    return {"files": listing, "counts": counts}


def open_split(directory, files: list[TokenFile], vocab_size: int, eot_id: int,
               fingerprint: str):
    """(header, tokens) of one split: a ShardHeader standing for the files' tokenizer and count,
    and the memory-mapped tokens (several files read as one)."""
    directory = Path(directory)
    arrays = [_memmap(directory / f.name, f) for f in files if f.n_tokens]
    tokens = arrays[0] if len(arrays) == 1 else ConcatTokens(arrays)
    header = ShardHeader(sum(f.n_tokens for f in files), files[0].dtype, vocab_size, eot_id,
                         fingerprint)
    return header, tokens


def read_file(directory, fmt: str, name: str) -> TokenFile:
    """One listed file of a split, validated again (it may have changed since it was listed)."""
    directory = Path(directory)
    if not (directory / name).is_file():
        raise DataError(f"{directory / name} is missing (listed in {directory / 'meta.json'})")
    return (_nanogpt_file if fmt == NANOGPT else _llmc_file)(directory, name)


class ConcatTokens:
    """Several token arrays read as one: slicing crosses file boundaries (llm.c's shards of one
    split are one stream, each document preceded by its end-of-text id)."""

    def __init__(self, arrays: list):
        self.arrays = arrays
        self.starts = np.cumsum([0] + [len(a) for a in arrays])
        self.dtype = arrays[0].dtype

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index):
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("ConcatTokens supports contiguous slices only")
        start, stop, _ = index.indices(len(self))
        pieces = []
        k = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            first = start - int(self.starts[k])
            take = min(stop - start, len(self.arrays[k]) - first)
            pieces.append(self.arrays[k][first:first + take])
            start, k = start + take, k + 1
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=self.dtype)


def _nanogpt_file(directory: Path, name: str) -> TokenFile:
    size = (directory / name).stat().st_size
    if size % 2:
        raise DataError(f"{directory / name} has {size} bytes, an odd number: not uint16 tokens "
                        f"(nanoGPT's format)")
    return TokenFile(name, 0, np.dtype("<u2"), size // 2, "gpt2")


def _llmc_file(directory: Path, name: str) -> TokenFile:
    path = directory / name
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(LLMC_HEADER_BYTES)
    if len(raw) < LLMC_HEADER_BYTES:
        raise DataError(f"{path} is not an llm.c token shard: {size} bytes, smaller than its "
                        f"{LLMC_HEADER_BYTES}-byte header")
    magic, version, count = (int(v) for v in np.frombuffer(raw, dtype="<i4", count=3))
    if magic not in LLMC_MAGICS:
        raise DataError(f"{path} is not an llm.c token shard (magic {magic}, expected "
                        f"{' or '.join(map(str, LLMC_MAGICS))})")
    want_version, dtype, hint = LLMC_MAGICS[magic]
    if version != want_version:
        raise DataError(f"{path}: llm.c shard version {version} with magic {magic}; this xtrain "
                        f"reads version {want_version}")
    expected = LLMC_HEADER_BYTES + count * dtype.itemsize
    if count < 0 or size != expected:
        kind = "truncated" if size < expected else "longer than its header says"
        raise DataError(f"{path} is {kind}: {size} bytes on disk, its header promises {count} "
                        f"tokens x {dtype.itemsize} bytes + {LLMC_HEADER_BYTES} = {expected}")
    return TokenFile(name, LLMC_HEADER_BYTES, dtype, count, hint)


def _memmap(path: Path, f: TokenFile):
    if f.n_tokens == 0:
        return np.zeros(0, dtype=f.dtype)
    return np.memmap(path, dtype=f.dtype, mode="r", offset=f.offset, shape=(f.n_tokens,))


