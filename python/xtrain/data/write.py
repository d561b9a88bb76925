"""write_prepared(): (split, document) pairs -> tokenizer + train/val token shards + meta.json in one
directory, and the request rules every source shares (prepare.py for files and token
directories, hub.py for the Hugging Face hub, saved.py for datasets saved with save_to_disk).

Output directory layout:
    tokenizer.json   the byte-level BPE (or the files of another tokenizer kind)
    train.bin        training tokens (see shards.py for the header)
    val.bin          validation tokens
    meta.json        what was asked, what was made: tokenizer fingerprint and vocab size, document
                     and token counts, the source; written last, so it marks completion

Decisions:
- Each document is preceded by the end-of-text id (eot d1 eot d2 ...), the llm.c convention: a
  window that starts at a boundary begins with eot, so sampling from [eot] starts a new document.
  Documents given as token ids get one too, unless they already start with it.
- The train/val split is by document, from a keyed hash of the document's text (or ids):
  deterministic for a seed, independent of file order, and duplicated documents always land on the
  same side (no leakage of a training document into validation).
- The BPE is trained on training documents only, at most BPE_TRAIN_BYTES of them.
- Two streaming passes over the source (train the tokenizer, then tokenize); memory stays bounded
  by one chunk of documents however large the corpus is.
- Idempotent: when meta.json records the same request and the files validate, the directory is
  reused untouched. A directory prepared with a different request is an error unless
  overwrite=True.
- meta.json's counts are what `xtrain prepare` reports (split_counts): documents and tokens per
  split, or for token files read in place or copied, tokens and end-of-text ids.
"""

from __future__ import annotations

import hashlib
import json
import os
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from .dataset import open_dataset, tokenizer_record
from .errors import DataError
from .layout import META_FILE, TRAIN_FILE, VAL_FILE, read_meta
from .shards import ShardWriter
from .tokenizer import Tokenizer, open_tokenizer, train_bpe

# BPE merge statistics settle long before this; training on a whole multi-GB corpus only
# costs time.
BPE_TRAIN_BYTES = 128 << 20
# Documents per encode_batch call: enough to keep the Rust thread pool busy, small in memory.
CHUNK_DOCS = 1024


def check_request(val_fraction: float, seed: int) -> None:
    """DataError for a validation fraction or seed that prepare cannot use."""
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if not isinstance(seed, int) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")


def resolve_tokenizer(spec, eot: str | None = None) -> tuple[str, Tokenizer | None]:
    """(how the request records the tokenizer, the tokenizer) for what a user names: "bpe" (or
    None; trained later, from the corpus: the tokenizer is None), "gpt2", a tokenizer file or
    directory (tokenizer.open_tokenizer), or a Tokenizer. A file is recorded by its kind and
    fingerprint, so moving it changes nothing and editing it is a new request."""
    if spec is None or (isinstance(spec, str) and spec == "bpe"):
        if eot is not None:
            raise DataError("eot applies to a tokenizer file; the trained BPE ends text with "
                            "<|endoftext|>")
        return "bpe", None
    tok = spec if isinstance(spec, Tokenizer) else open_tokenizer(spec, eot)
    return ("gpt2" if tok.kind == "gpt2" else f"{tok.kind}:{tok.fingerprint}"), tok


def write_prepared(out_dir: Path, request: dict, tok: Tokenizer | None, vocab_size: int,
                   documents: Callable[[], Iterable[tuple[str, str | list[int]]]], source: dict,
                   progress: bool, total: int, unit: str = "B", empty_hint: str = "",
                   pretokenized: bool = False) -> Path:
    """Everything after the request is known: the tokenizer, both shards and, last, meta.json.

    `documents()` yields (split, text) pairs, split "train" or "val" (with `pretokenized`, (split,
    token ids) pairs, written as they are); it is called twice when `tok` is None (a BPE of at
    most `vocab_size` ids trains on the first BPE_TRAIN_BYTES of training text, then every
    document is tokenized). The progress bar counts `total` bytes of text (unit "B") or documents
    (unit "doc").
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    # Meta goes first so an interrupted rebuild never leaves an old meta beside new shards.
    (out_dir / META_FILE).unlink(missing_ok=True)
    if tok is None:
        tok = train_bpe(_bpe_training_texts(documents), vocab_size)
    counts = _write_shards(documents, out_dir, tok, progress, total, unit, empty_hint,
                           pretokenized)
    tok.save(out_dir)
    write_meta(out_dir, {"request": request, "tokenizer": tokenizer_record(tok),
                         "counts": counts, "source": source,
                         "files": {"train": TRAIN_FILE, "val": VAL_FILE}})
    return out_dir


def write_meta(out_dir: Path, meta: dict) -> None:
    """meta.json, atomically: the last file a prepare writes."""
    tmp = out_dir / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, out_dir / META_FILE)


def split_counts(meta: dict) -> str | None:
    """One line of what a prepared directory holds per split, from its meta.json's counts, e.g.
    "train: 1,200 documents, 310,412 tokens; val: 12 documents, 3,120 tokens"; token files (no
    document count) give their end-of-text ids instead. None when meta.json has no counts."""
    counts = meta.get("counts") or {}
    parts = []
    for split in ("train", "val"):
        tokens = counts.get(f"{split}_tokens")
        if tokens is None:
            continue
        docs, eot = counts.get(f"{split}_docs"), counts.get(f"{split}_eot")
        what = (f"{_count(docs, 'document')}, " if docs is not None else "") + _count(tokens, "token")
        if docs is None and eot is not None:
            what += f" ({_count(eot, 'end-of-text id')})"
        parts.append(f"{split}: {what}")
    return "; ".join(parts) or None


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def is_val_document(text: str | bytes, seed: int, val_fraction: float) -> bool:
    """The split rule: a keyed 64-bit hash of the text (or of a document's ids as bytes), as a
    fraction of 2**64, < val_fraction."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    digest = hashlib.blake2b(data, digest_size=8, key=str(seed).encode())
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


def source_fingerprint(files: list[Path]) -> str:
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


def _write_shards(documents: Callable[[], Iterable[tuple[str, str | list[int]]]], out_dir: Path,
                  tok: Tokenizer, progress: bool, total: int, unit: str, empty_hint: str,
                  pretokenized: bool) -> dict:
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
                for (split, _), ids in zip(chunk, docs if pretokenized else tok.encode_batch(docs)):
                    if not (pretokenized and len(ids) and ids[0] == tok.eot_id):
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
