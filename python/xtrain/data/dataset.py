"""open_dataset(): load a prepared directory and prove its parts belong together.

The training loop calls this once. It checks that meta.json, the tokenizer file and both shard
headers agree on the tokenizer fingerprint and vocabulary size (shards from another tokenizer, or a
tokenizer.json swapped in later, raise DataError), and optionally that the model's vocabulary can
hold every id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError
from .loader import TokenLoader, check_shard_tokenizer
from .layout import TRAIN_FILE, VAL_FILE, read_meta
from .shards import ShardHeader, read_header
from .tokenizer import Tokenizer, load_tokenizer

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

    def shard_path(self, split: str) -> Path:
        if split not in SPLITS:
            raise DataError(f"split must be one of {tuple(SPLITS)}, got {split!r}")
        return self.path / SPLITS[split]

    def loader(self, split: str, batch: int, seq: int, seed: int, rank: int = 0,
               world_size: int = 1) -> TokenLoader:
        return TokenLoader(self.shard_path(split), batch, seq, seed, rank=rank,
                           world_size=world_size, tokenizer=self.tokenizer)

    def check_vocab(self, model_vocab_size: int) -> None:
        """DataError if a model with this vocabulary cannot embed every token id."""
        if model_vocab_size < self.vocab_size:
            raise DataError(f"model vocab_size {model_vocab_size} is smaller than the "
                            f"tokenizer's {self.vocab_size} ({self.tokenizer.name} in "
                            f"{self.path}); ids up to {self.vocab_size - 1} would be out of range")


def open_dataset(path: str | os.PathLike, model_vocab_size: int | None = None) -> Dataset:
    """Open a directory made by prepare(), validating tokenizer, meta and shards together."""
    path = Path(path)
    meta = read_meta(path)
    tok = load_tokenizer(path)
    recorded = meta.get("tokenizer", {})
    if (recorded.get("fingerprint"), recorded.get("vocab_size")) != (tok.fingerprint,
                                                                      tok.vocab_size):
        raise DataError(f"the tokenizer in {path} ({tok.name}, fingerprint {tok.fingerprint}) is "
                        f"not the one the shards were made with ({recorded.get('name')}, "
                        f"fingerprint {recorded.get('fingerprint')}); re-run prepare")
    for name in SPLITS.values():
        header: ShardHeader = read_header(path / name)
        check_shard_tokenizer(str(path / name), header, tok)
    dataset = Dataset(path, meta, tok)
    if model_vocab_size is not None:
        dataset.check_vocab(model_vocab_size)
    return dataset
