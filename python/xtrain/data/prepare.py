"""prepare(): source documents -> tokenizer + train/val token shards + meta.json in one directory.

Output directory layout:
    tokenizer.json   the byte-level BPE (or tiktoken.json naming the GPT-2 encoding)
    train.bin        training tokens (see shards.py for the header)
    val.bin          validation tokens
    meta.json        what was asked, what was made: tokenizer fingerprint and vocab size, document
                     and token counts, the source files; written last, so it marks completion

Decisions:
- Each document is preceded by the end-of-text id (eot d1 eot d2 ...), the llm.c convention: a
  window that starts at a boundary begins with eot, so sampling from [eot] starts a new document.
- The train/val split is by document, from a keyed hash of the document's text: deterministic for a
  seed, independent of file order, and duplicated documents always land on the same side (no
  leakage of a training document into validation).
- The BPE is trained on training documents only, at most BPE_TRAIN_BYTES of them.
- Two streaming passes over the source (train the tokenizer, then tokenize); memory stays bounded
  by one chunk of documents however large the corpus is.
- Idempotent: when meta.json records the same request (source files by name, size and mtime;
  tokenizer; vocab size; split) and the files validate, the directory is reused untouched. A
  directory prepared with a different request is an error unless overwrite=True.
- Everything after the request is write_prepared(), which takes (split, text) pairs: prepare()
  feeds it files split by hash, hub.py the tables of a Hugging Face dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from .dataset import open_dataset
from .errors import DataError
from .layout import FORMAT_VERSION, META_FILE, TRAIN_FILE, VAL_FILE, read_meta
from .readers import Source, iter_documents, list_source_files
from .shards import ShardWriter
from .tokenizer import Tokenizer, gpt2_tokenizer, train_bpe

TOKENIZER_KINDS = ("bpe", "gpt2")
# BPE merge statistics settle long before this; training on a whole multi-GB corpus only
# costs time.
BPE_TRAIN_BYTES = 128 << 20
# Documents per encode_batch call: enough to keep the Rust thread pool busy, small in memory.
CHUNK_DOCS = 1024


def prepare(source: Source, out_dir: str | os.PathLike, vocab_size: int = 4096,
            tokenizer: str = "bpe", val_fraction: float = 0.01, seed: int = 0,
            overwrite: bool = False, progress: bool = True) -> Path:
    """Tokenize `source` into `out_dir` and return `out_dir`; reuse it if already prepared.

    `vocab_size` is the BPE's upper bound (ignored for gpt2, whose vocabulary is fixed).
    """
    out_dir = Path(out_dir)
    check_request(tokenizer, val_fraction, seed)
    files = list_source_files(source)
    request = {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer,
        "vocab_size": vocab_size if tokenizer == "bpe" else None,
        "val_fraction": val_fraction,
        "seed": seed,
        "source_fingerprint": _source_fingerprint(files),
    }
    if reusable(out_dir, request, overwrite):
        return out_dir

    def documents() -> Iterator[tuple[str, str]]:
        for doc in iter_documents(source):
            yield ("val" if is_val_document(doc, seed, val_fraction) else "train"), doc

    n_bytes = sum(p.stat().st_size for p in files)
    return write_prepared(out_dir, request, tokenizer, vocab_size, documents,
                          {"files": [str(p.resolve()) for p in files], "bytes": n_bytes},
                          progress, total=n_bytes, unit="B",
                          empty_hint=f"the source is too small for val_fraction={val_fraction}")


def check_request(tokenizer: str, val_fraction: float, seed: int) -> None:
    """DataError for a tokenizer kind, validation fraction or seed that prepare cannot use."""
    if tokenizer not in TOKENIZER_KINDS:
        raise DataError(f"tokenizer must be one of {TOKENIZER_KINDS}, got {tokenizer!r}")
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if not isinstance(seed, int) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")


def write_prepared(out_dir: Path, request: dict, tokenizer: str, vocab_size: int,
                   documents: Callable[[], Iterable[tuple[str, str]]], source: dict,
                   progress: bool, total: int, unit: str = "B", empty_hint: str = "") -> Path:
    """Everything after the request is known: the tokenizer, both shards and, last, meta.json.

    `documents()` yields (split, text) pairs, split "train" or "val"; it is called twice (the BPE
    trains on the first BPE_TRAIN_BYTES of training text, then every document is tokenized).
    The progress bar counts `total` bytes of text (unit "B") or documents (unit "doc").
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    # Meta goes first so an interrupted rebuild never leaves an old meta beside new shards.
    (out_dir / META_FILE).unlink(missing_ok=True)
    if tokenizer == "gpt2":
        tok: Tokenizer = gpt2_tokenizer()
    else:
        tok = train_bpe(_bpe_training_texts(documents), vocab_size)
    counts = _write_shards(documents, out_dir, tok, progress, total, unit, empty_hint)
    tok.save(out_dir)
    meta = {
        "request": request,
        "tokenizer": {"kind": tok.kind, "name": tok.name, "fingerprint": tok.fingerprint,
                      "vocab_size": tok.vocab_size, "eot_id": tok.eot_id},
        "counts": counts,
        "source": source,
        "files": {"train": TRAIN_FILE, "val": VAL_FILE},
    }
    tmp = out_dir / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, out_dir / META_FILE)
    return out_dir


def is_val_document(text: str, seed: int, val_fraction: float) -> bool:
    """The split rule: a keyed 64-bit hash of the text, as a fraction of 2**64, < val_fraction."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=str(seed).encode())
    return int.from_bytes(digest.digest(), "little") < val_fraction * 2**64


def reusable(out_dir: Path, request: dict, overwrite: bool) -> bool:
    if not (out_dir / META_FILE).is_file():
        return False
    meta = read_meta(out_dir)
    if meta.get("request") != request:
        if overwrite:
            return False
        diff = {k: (meta.get("request", {}).get(k), v) for k, v in request.items()
                if meta.get("request", {}).get(k) != v}
        raise DataError(f"{out_dir} holds a dataset prepared with other settings "
                        f"(existing, requested): {diff}; use another out_dir or overwrite=True")
    try:
        open_dataset(out_dir)
    except DataError:
        return False  # same request, damaged files: rebuild them
    return True


def _source_fingerprint(files: list[Path]) -> str:
    # Name, size and mtime rather than content: hashing a multi-GB corpus on every run would cost
    # more than the check is worth, and any rewrite of a file changes its mtime.
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _bpe_training_texts(documents: Callable[[], Iterable[tuple[str, str]]]) -> Iterator[str]:
    seen = 0
    for split, doc in documents():
        if split != "train":
            continue
        yield doc
        seen += len(doc)
        if seen >= BPE_TRAIN_BYTES:
            return


def _write_shards(documents: Callable[[], Iterable[tuple[str, str]]], out_dir: Path,
                  tok: Tokenizer, progress: bool, total: int, unit: str, empty_hint: str) -> dict:
    from tqdm import tqdm

    counts = {"train_docs": 0, "val_docs": 0, "train_tokens": 0, "val_tokens": 0}
    writers = {split: ShardWriter(out_dir / name, tok.vocab_size, tok.eot_id, tok.fingerprint)
               for split, name in (("train", TRAIN_FILE), ("val", VAL_FILE))}
    try:
        with tqdm(total=total, unit=unit, unit_scale=True, desc="tokenizing",
                  disable=not progress) as bar:
            for chunk in _chunks(documents(), CHUNK_DOCS):
                # One array per split per chunk: per-document numpy calls would dominate on
                # millions of short stories.
                parts: dict[str, list[int]] = {"train": [], "val": []}
                docs = [doc for _, doc in chunk]
                for (split, _), ids in zip(chunk, tok.encode_batch(docs)):
                    parts[split].append(tok.eot_id)
                    parts[split].extend(ids)
                    counts[f"{split}_docs"] += 1
                for split, ids in parts.items():
                    writers[split].write(np.array(ids, dtype=np.int64))
                    counts[f"{split}_tokens"] += len(ids)
                # Progress counts characters as bytes: exact for ASCII, close enough otherwise.
                done = sum(len(d) for d in docs) if unit == "B" else len(docs)
                bar.update(min(done, total - bar.n))
            bar.update(total - bar.n)
        for split in ("train", "val"):
            if counts[f"{split}_docs"] == 0:
                raise DataError(f"the {split} split is empty ({counts['train_docs']} train, "
                                f"{counts['val_docs']} val documents); {empty_hint}")
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for w in writers.values():
        w.close()
    return counts


def _chunks(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while chunk := list(islice(it, n)):
        yield chunk
