"""TokenLoader: random training windows and sequential eval windows over one memory-mapped shard.

Training semantics:
- Each call draws one *global* step: `world_size * batch` window starts from a seeded PCG64
  generator, uniform over every position where a window of `seq + 1` tokens fits. Rank r keeps
  starts [r*batch, (r+1)*batch). So all ranks advance the same generator in lockstep, their windows
  are distinct draws, and a 2-rank run with batch B sees exactly the windows of a 1-rank run with
  batch 2B (the global batch is what defines the data stream).
- A window w gives inputs w[:-1] and targets w[1:], int64, shape (batch, seq).
- `state_dict()` is the generator state plus the step count (JSON-serialisable: plain ints and
  strings), so a resumed run draws bit-exactly the windows the uninterrupted run would have.
  Because the state is per global step, a run may even resume on another world size as long as
  world_size * batch is unchanged.

Eval semantics (`iter_eval`): windows at stride `seq` from the start of the shard (every token is a
target exactly once), grouped in global batches of `world_size * batch` split by rank like training.
Only full global batches are produced so every rank runs the same number of eval steps (a rank
that ran one more would wait forever in the loss all-reduce).
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from .errors import DataError
from .shards import TokenSplit, open_shard

STATE_VERSION = 1


class TokenLoader:
    """Windows over one split: an xtrain shard given by its path, or a TokenSplit (Dataset.split:
    a shard, or another project's token files read in place)."""

    def __init__(self, source: str | os.PathLike | TokenSplit, batch: int, seq: int, seed: int,
                 rank: int = 0, world_size: int = 1, tokenizer=None):
        _check_positive(batch=batch, seq=seq, world_size=world_size)
        if not 0 <= rank < world_size:
            raise DataError(f"rank must be in [0, {world_size}), got {rank}")
        if not isinstance(source, TokenSplit):
            source = TokenSplit(os.fspath(source), *open_shard(source))
        self.path, self.header, self.tokens = source.name, source.header, source.tokens
        if tokenizer is not None:
            check_shard_tokenizer(self.path, self.header, tokenizer)
        self.batch, self.seq, self.seed = batch, seq, seed
        self.rank, self.world_size = rank, world_size
        self.n_tokens = self.header.n_tokens
        if self.n_tokens < seq + 1:
            raise DataError(f"shard {self.path} has {self.n_tokens} tokens, fewer than one "
                            f"window of seq+1 = {seq + 1}")
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.step = 0

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (inputs, targets) for the next global step, each int64 (batch, seq)."""
        # High is exclusive: the last start is n - seq - 1, whose window ends at the last token.
        starts = self.rng.integers(0, self.n_tokens - self.seq, size=self.global_batch)
        self.step += 1
        mine = starts[self.rank * self.batch:(self.rank + 1) * self.batch]
        return self._windows(mine, self.seq)

    def __iter__(self) -> "TokenLoader":
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        return self.next_batch()

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "seed": self.seed,
            "seq": self.seq,
            "global_batch": self.global_batch,
            "n_tokens": self.n_tokens,
            "fingerprint": self.header.fingerprint,
            "bit_generator": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where the loader that produced `state` stopped."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"loader state version {state.get('version')} is not "
                            f"{STATE_VERSION}")
        # A different shard or window geometry would silently give a different data stream.
        for key, mine in (("n_tokens", self.n_tokens), ("fingerprint", self.header.fingerprint),
                          ("seq", self.seq), ("global_batch", self.global_batch)):
            if state.get(key) != mine:
                raise DataError(f"loader state does not match this loader: {key} is "
                                f"{state.get(key)!r} in the state, {mine!r} here")
        rng = np.random.Generator(np.random.PCG64())
        try:
            rng.bit_generator.state = state["bit_generator"]
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"loader state has an invalid generator state ({e})") from None
        self.rng, self.step, self.seed = rng, int(state["step"]), state["seed"]

    def eval_batches(self, batch: int, seq: int) -> int:
        """How many batches `iter_eval(batch, seq)` yields on each rank with no cap."""
        _check_positive(batch=batch, seq=seq)
        n_windows = (self.n_tokens - 1) // seq
        return n_windows // (self.world_size * batch)

    def iter_eval(self, batch: int, seq: int,
                  max_batches: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Deterministic sequential (inputs, targets) batches; does not touch the train stream."""
        n_batches = self.eval_batches(batch, seq)
        if n_batches == 0:
            raise DataError(f"shard {self.path} has {self.n_tokens} tokens, too few for one eval "
                            f"batch of {self.world_size} x {batch} windows of {seq + 1} tokens")
        if max_batches is not None:
            n_batches = min(n_batches, max_batches)
        global_batch = self.world_size * batch
        for k in range(n_batches):
            first = k * global_batch + self.rank * batch
            starts = np.arange(first, first + batch, dtype=np.int64) * seq
            yield self._windows(starts, seq)

    def _windows(self, starts: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray]:
        # Contiguous slices read sequential pages of the memmap; one copy converts to int64.
        rows = np.stack([self.tokens[s:s + seq + 1] for s in starts]).astype(np.int64)
        return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])  # (B, S)


def check_shard_tokenizer(path: str, header, tokenizer) -> None:
    """DataError unless the shard was written with `tokenizer`."""
    if header.fingerprint != tokenizer.fingerprint or header.vocab_size != tokenizer.vocab_size:
        raise DataError(
            f"shard {path} was made with another tokenizer: shard has vocab_size "
            f"{header.vocab_size}, fingerprint {header.fingerprint}; tokenizer {tokenizer.name} "
            f"has vocab_size {tokenizer.vocab_size}, fingerprint {tokenizer.fingerprint}. "
            f"Re-run prepare with this tokenizer or load the tokenizer saved beside the shards.")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value <= 0:
            raise DataError(f"{name} must be a positive integer, got {value!r}")
