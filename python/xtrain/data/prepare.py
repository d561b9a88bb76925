"""prepare(): a source -> a data directory the training loop opens (open_dataset).

What a source is decides what prepare does:
- text files (.txt, .jsonl, .parquet, directories of them): split by document, tokenize with the
  trained BPE, GPT-2 or a given tokenizer file, write train/val shards (write.write_prepared);
- a directory of nanoGPT or llm.c token files (formats.py): nothing is re-tokenised. Into the
  directory itself (out_dir == source, the default of `xtrain prepare DIR`), only meta.json and
  the tokenizer's files are written and the token files are read in place; into another
  directory, the tokens are copied into xtrain shards (a copy with a header, ids unchanged);
- a Hugging Face `datasets` dataset saved with save_to_disk (saved.py): its text column is
  tokenized, or its `input_ids` column written as it is.

Idempotent like every prepare: when meta.json records the same request (the source's files by
name, size and mtime; the tokenizer by kind and fingerprint; the split) and the files validate,
the directory is reused untouched; another request on it is an error unless overwrite=True.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from . import formats
from .dataset import SPLITS, format_tokenizer, token_dir_meta, tokenizer_record
from .errors import DataError
from .layout import FORMAT_VERSION, META_FILE, read_meta
from .readers import Source, iter_documents, list_source_files
from .saved import is_saved_dataset, prepare_saved
from .shards import ShardWriter
from .tokenizer import TOKENIZER_FILES, Tokenizer
from .write import (check_request, is_val_document, resolve_tokenizer, reusable,
                    source_fingerprint, write_meta, write_prepared)

# Tokens per copy when a token directory is converted into shards.
COPY_TOKENS = 1 << 24


def prepare(source: Source, out_dir: str | os.PathLike, vocab_size: int = 4096,
            tokenizer: str | os.PathLike | Tokenizer | None = None, val_fraction: float = 0.01,
            seed: int = 0, overwrite: bool = False, progress: bool = True,
            eot: str | None = None, **saved_options) -> Path:
    """Prepare `source` into `out_dir` and return `out_dir`; reuse it if already prepared.

    `tokenizer`: "bpe" (trained on the corpus, at most `vocab_size` ids; the default for text),
    "gpt2", a Hugging Face tokenizer.json, a SentencePiece .model or a directory holding one, or
    a Tokenizer. None: "bpe" for text, the tokenizer the format implies for token files (GPT-2).
    `eot` names the end-of-text token of a tokenizer file (tokenizer.find_eot). `saved_options`
    (text_column, split, val_split) apply to a saved `datasets` dataset.
    """
    out_dir = Path(out_dir)
    check_request(val_fraction, seed)
    single = source if isinstance(source, (str, os.PathLike)) else None
    if single is not None and formats.detect_format(single) is not None:
        return prepare_token_dir(Path(single), out_dir, tokenizer, eot, overwrite, progress)
    if single is not None and is_saved_dataset(single):
        return prepare_saved(Path(single), out_dir, vocab_size, tokenizer, eot, val_fraction,
                             seed, overwrite, progress, **saved_options)
    if saved_options:
        raise DataError(f"{', '.join(saved_options)} apply to a dataset saved with "
                        f"save_to_disk only")
    files = list_source_files(source)
    record, tok = resolve_tokenizer(tokenizer, eot)
    request = {
        "format_version": FORMAT_VERSION,
        "tokenizer": record,
        "vocab_size": vocab_size if tok is None else None,
        "val_fraction": val_fraction,
        "seed": seed,
        "source_fingerprint": source_fingerprint(files),
    }
    if reusable(out_dir, request, overwrite):
        return out_dir

    def documents() -> Iterator[tuple[str, str]]:
        for doc in iter_documents(source):
            yield ("val" if is_val_document(doc, seed, val_fraction) else "train"), doc

    n_bytes = sum(p.stat().st_size for p in files)
    return write_prepared(out_dir, request, tok, vocab_size, documents,
                          {"files": [str(p.resolve()) for p in files], "bytes": n_bytes},
                          progress, total=n_bytes, unit="B",
                          empty_hint=f"the source is too small for val_fraction={val_fraction}")


def prepare_token_dir(source: Path, out_dir: Path, tokenizer=None, eot: str | None = None,
                      overwrite: bool = False, progress: bool = True) -> Path:
    """nanoGPT or llm.c token files: recorded in place (out_dir == source) or copied into
    xtrain shards in out_dir; either way with `tokenizer` (default: the format's, GPT-2)."""
    fmt = formats.detect_format(source)
    files = formats.token_files(source, fmt)
    if isinstance(tokenizer, str) and tokenizer == "bpe":
        raise DataError(f"{source} holds {fmt} token ids: name the tokenizer that made them "
                        f"(gpt2, a tokenizer.json or a SentencePiece .model); a BPE cannot be "
                        f"trained on ids")
    if tokenizer is None:
        tokenizer = format_tokenizer(source, fmt, files)
    record, tok = resolve_tokenizer(tokenizer, eot)
    formats.check_tokenizer_fits(source, files, tok)
    in_place = out_dir.resolve() == source.resolve()
    all_files = [source / f.name for group in files.values() for f in group]
    request = {"format_version": FORMAT_VERSION, "format": fmt, "tokenizer": record,
               "in_place": in_place, "source_fingerprint": source_fingerprint(all_files)}
    if reusable(out_dir, request, overwrite):
        return out_dir
    if in_place:
        _clear_tokenizer_files(source, tok)
        (source / META_FILE).unlink(missing_ok=True)
        scanned = formats.scan(source, files, tok, with_hashes=True)
        tok.save(source)
        write_meta(source, token_dir_meta(fmt, files, tok, scanned, request,
                                          {"dir": str(source.resolve())}))
        return source
    return _copy_to_shards(source, out_dir, fmt, files, tok, request, progress)


def _clear_tokenizer_files(directory: Path, tok: Tokenizer) -> None:
    """Before a tokenizer is saved beside token files: remove those of the tokenizer xtrain
    recorded there before, and never replace a file xtrain did not write (a tokenizer.json or
    tokenizer_config.json of the user's own, in a directory xtrain has not prepared)."""
    if (directory / META_FILE).is_file():
        old = read_meta(directory).get("tokenizer", {}).get("kind")
        for name in TOKENIZER_FILES.get(old, ()):
            if name not in tok.files:
                (directory / name).unlink(missing_ok=True)
        return
    for name in tok.files:
        if (directory / name).exists():
            raise DataError(f"{directory / name} exists and was not written by xtrain; prepare "
                            f"into another directory with --out (the tokens are copied, not "
                            f"re-tokenised)")


def _copy_to_shards(source: Path, out_dir: Path, fmt: str, files: dict, tok: Tokenizer,
                    request: dict, progress: bool) -> Path:
    from tqdm import tqdm

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILE).unlink(missing_ok=True)
    counts = {}
    total = sum(f.n_tokens for group in files.values() for f in group)
    with tqdm(total=total, unit="tok", unit_scale=True, desc="copying tokens",
              disable=not progress) as bar:
        for split, name in SPLITS.items():
            header, tokens = formats.open_split(source, files[split], tok.vocab_size, tok.eot_id,
                                                tok.fingerprint)
            eot = 0
            with ShardWriter(out_dir / name, tok.vocab_size, tok.eot_id, tok.fingerprint) as w:
                for start in range(0, header.n_tokens, COPY_TOKENS):
                    piece = tokens[start:start + COPY_TOKENS]
                    w.write(piece)  # checks every id against the vocabulary
                    eot += int(np.count_nonzero(np.asarray(piece) == tok.eot_id))
                    bar.update(len(piece))
            counts[f"{split}_tokens"] = header.n_tokens
            counts[f"{split}_eot"] = eot  # as a directory read in place counts them (formats.scan)
    tok.save(out_dir)
    write_meta(out_dir, {"request": request, "tokenizer": tokenizer_record(tok), "counts": counts,
                         "source": {"dir": str(source.resolve()), "format": fmt},
                         "files": {"train": SPLITS["train"], "val": SPLITS["val"]}})
    return out_dir
