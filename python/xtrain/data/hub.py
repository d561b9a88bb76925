"""Datasets from the Hugging Face hub -> a prepared directory (`xtrain prepare tinystories`,
`xtrain prepare hf:ORG/NAME --text-column text --split train`).

Loading goes through `datasets.load_dataset`, which downloads once into the Hugging Face cache
($HF_HOME, default ~/.cache/huggingface), resumes an interrupted download, shows its own progress
bars, and reads a local directory laid out like a hub repository (data/train-00000-of-00002.parquet,
data/validation-....parquet, ...) through the same code; that is how the tests run it, offline.
Tokenizing and writing the shards is prepare.write_prepared, as for local files.

Decisions:
- Offline, say so in one line. `datasets` retries an unreachable hub for half a minute before it
  gives up, so the hub's host is probed first (a TCP connect, a few seconds at most); when it
  cannot be reached the load runs in offline mode, from the cache alone, and a dataset that is not
  there is one DataError naming what is missing and how to get it. `datasets` itself missing is
  the same kind of one-line DataError.
- Validation is the dataset's own held-out split when it has one (TinyStories: "validation", so
  losses compare with the published ones), else the same keyed hash of the text as prepare().
- Idempotent like prepare(): the request records the dataset, splits, column, tokenizer and the
  `datasets` fingerprint of the loaded data; a matching directory is reused.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

from .errors import DataError
from .layout import FORMAT_VERSION
from .write import check_request, is_val_document, resolve_tokenizer, reusable, write_prepared

HUB_PREFIX = "hf:"
DEFAULT_ENDPOINT = "https://huggingface.co"
# A reachable hub answers a TCP connect in well under a second; DNS failure returns at once.
PROBE_TIMEOUT_S = 3.0
# Rows per batch read from the Arrow table.
READ_BATCH = 1000
INSTALL_HINT = "pip install 'xtrain[hub]' (or: pip install datasets)"


@dataclass(frozen=True)
class HubSource:
    repo: str                       # "roneneldan/TinyStories", or a local directory in hub layout
    text_column: str = "text"
    split: str = "train"
    val_split: str | None = None    # None: split off val_fraction of `split` by hash

    @property
    def is_local(self) -> bool:
        return Path(self.repo).is_dir()


# Named datasets: `xtrain prepare NAME`.
ALIASES = {
    "tinystories": HubSource("roneneldan/TinyStories", "text", "train", "validation"),
}


def hub_source(name: str, text_column: str | None = None, split: str | None = None,
               val_split: str | None = None) -> HubSource | None:
    """The HubSource a `prepare` argument names ("tinystories", "hf:ORG/NAME"), None otherwise.
    Given options override the alias's."""
    if name in ALIASES:
        base = ALIASES[name]
    elif name.startswith(HUB_PREFIX) and len(name) > len(HUB_PREFIX):
        base = HubSource(name[len(HUB_PREFIX):])
    else:
        return None
    overrides = {k: v for k, v in (("text_column", text_column), ("split", split),
                                   ("val_split", val_split)) if v is not None}
    return replace(base, **overrides)


def default_out_dir(name: str) -> Path:
    """data/tinystories, data/ORG--NAME for hf:ORG/NAME."""
    stem = name[len(HUB_PREFIX):] if name.startswith(HUB_PREFIX) else name
    return Path("data") / stem.strip("/").replace("/", "--")


def prepare_hub(src: HubSource, out_dir: str | os.PathLike, vocab_size: int = 4096,
                tokenizer=None, val_fraction: float = 0.01, seed: int = 0,
                overwrite: bool = False, progress: bool = True, eot: str | None = None) -> Path:
    """Load `src` (downloading it once into the Hugging Face cache) and prepare it into out_dir.
    `tokenizer` and `eot` as for prepare() (default: the BPE trained on the text)."""
    out_dir = Path(out_dir)
    check_request(val_fraction, seed)
    online = src.is_local or hub_reachable()
    datasets = _import_datasets(src, online, progress)
    if tokenizer == "gpt2" and online:
        _fetch_gpt2_files()
    record, tok = resolve_tokenizer(tokenizer, eot)
    train = _load_split(datasets, src, src.split, online)
    val = _load_split(datasets, src, src.val_split, online) if src.val_split else None
    request = {
        "format_version": FORMAT_VERSION,
        "hub": src.repo if not src.is_local else str(Path(src.repo).resolve()),
        "split": src.split, "val_split": src.val_split, "text_column": src.text_column,
        "tokenizer": record, "vocab_size": vocab_size if tok is None else None,
        "val_fraction": None if val is not None else val_fraction, "seed": seed,
        "data_fingerprint": [getattr(d, "_fingerprint", None) for d in (train, val) if d],
    }
    if reusable(out_dir, request, overwrite):
        return out_dir

    def documents() -> Iterator[tuple[str, str]]:
        for text in _texts(train, src.text_column):
            if val is not None:
                yield "train", text
            else:
                yield ("val" if is_val_document(text, seed, val_fraction) else "train"), text
        if val is not None:
            for text in _texts(val, src.text_column):
                yield "val", text

    rows = train.num_rows + (val.num_rows if val is not None else 0)
    source = {"hub": request["hub"], "splits": {src.split: train.num_rows,
                                                **({src.val_split: val.num_rows} if val else {})}}
    hint = (f"the {src.val_split!r} split has no text" if val is not None else
            f"the dataset is too small for val_fraction={val_fraction}")
    return write_prepared(out_dir, request, tok, vocab_size, documents, source, progress,
                          total=rows, unit="doc", empty_hint=hint)


def _texts(table, column: str) -> Iterator[str]:
    """The non-empty stripped strings of one column, read in batches."""
    for batch in table.iter(batch_size=READ_BATCH):
        for text in batch[column]:
            if isinstance(text, str) and (text := text.strip()):
                yield text


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE asks for the Hugging Face cache alone."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def hub_cache() -> str:
    """The Hugging Face cache, as messages name it."""
    return os.environ.get("HF_HOME") or "~/.cache/huggingface"


def hub_reachable() -> bool:
    """Whether a TCP connection to the hub can be opened (False too when HF_HUB_OFFLINE is set)."""
    if hub_offline():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def _import_datasets(src: HubSource, online: bool, progress: bool):
    if not online:
        # Read before `datasets` and `huggingface_hub` are imported: use the cache, never retry.
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError:
        raise DataError(f"loading {src.repo} needs the `datasets` library, which is not "
                        f"installed: {INSTALL_HINT}") from None
    if not online:  # already imported earlier in this process: set the switches it read then
        datasets.config.HF_HUB_OFFLINE = True
        hub_constants = sys.modules.get("huggingface_hub.constants")
        if hub_constants is not None:
            hub_constants.HF_HUB_OFFLINE = True
    datasets.logging.set_verbosity_error()  # its download bars stay (unless progress=False)
    if not progress:
        datasets.disable_progress_bars()
    return datasets


def _load_split(datasets, src: HubSource, split: str, online: bool):
    try:
        table = datasets.load_dataset(src.repo, split=split)
    except ConnectionError as e:
        if online:
            raise DataError(f"could not download {src.repo} from the Hugging Face hub: "
                            f"{_first_line(e)}") from None
        raise DataError(_offline_message(src)) from None
    except ValueError as e:  # an unknown split names the ones there are
        raise DataError(f"{src.repo}: {_first_line(e)}") from None
    except FileNotFoundError as e:
        raise DataError(_offline_message(src) if not online else
                        f"{src.repo}: no such dataset on the Hugging Face hub, or it is private "
                        f"or gated (log in with `huggingface-cli login`): {_first_line(e)}") \
            from None
    if src.text_column not in table.column_names:
        raise DataError(f"{src.repo} split {split!r} has no column {src.text_column!r} (columns: "
                        f"{', '.join(table.column_names)}); pick one with --text-column")
    return table


def _offline_message(src: HubSource) -> str:
    cache = hub_cache()
    return (f"cannot download {src.repo}: the Hugging Face hub is unreachable (offline?) and the "
            f"dataset is not in the cache {cache}; run the same `xtrain prepare` on a machine "
            f"with network and copy {cache} here (HF_HOME picks another cache)")


def _fetch_gpt2_files() -> None:
    """Online: let tiktoken download its GPT-2 files into its cache (prepare never downloads)."""
    try:
        import tiktoken
    except ImportError:
        return  # prepare's gpt2_tokenizer() says what is missing
    try:
        tiktoken.get_encoding("gpt2")
    except Exception as e:  # network errors of several types
        raise DataError(f"tiktoken could not fetch the GPT-2 tokenizer: {_first_line(e)}") \
            from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
