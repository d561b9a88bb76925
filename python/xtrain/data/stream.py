"""The built-in stories as an endless stream: fresh stories tokenized on the fly by worker
processes, a fixed held-out set, and prepared finite copies for benchmarks that need a file.

A stream directory (made once by `open_stream`, under a lock):
    tokenizer.json   byte-level BPE trained on the first BPE_STORIES stories of the flat corpus
    val.bin          the held-out set: stories keyed "SEED:val:i", i = 0, 1, ..., eot before each,
                     until VAL_TOKENS tokens
    val.digests      a 64-bit digest of every held-out text (little-endian u64): training skips any
                     story whose text has one of them, so no held-out story is ever trained on
    meta.json        kind "stream", story version, seed, tokenizer, counts; written last

Note [Lanes and blocks]: how the training stream is laid out.
- The global batch has G = world_size * batch rows, the lanes. Steps are grouped in blocks of
  BLOCK_STEPS. In block e, lane g reads the stories keyed "SEED:tLOADERSEED:e:g:m" for
  m = 0, 1, ..., each preceded by the end-of-text id, until it holds BLOCK_STEPS * seq + 1 tokens;
  the rest of its last story is dropped (about half a story per block and lane, under 1% at seq
  256).
- Step k (block e = k // BLOCK_STEPS, j = k % BLOCK_STEPS) gives lane g the window
  [j*seq, j*seq + seq + 1) of its block: inputs and targets shifted by one, every token a target
  once, and no story key is used twice, so training never sees a story again.
- Rank r takes lanes [r*batch, (r+1)*batch). A lane's block is a pure function of the seeds, e, g
  and seq, so a rank computes only its own lanes, 2 ranks with batch B see exactly the rows of 1
  rank with batch 2B, and the loader's whole state is the step count: resuming recomputes the
  current block, on any world size with the same global batch.
- Workers (processes: the generator is pure Python and holds the GIL) compute whole lane-blocks;
  the loader asks for the current block and `prefetch` blocks ahead and slices rows out of them.
  The worker count changes who computes a block, never its tokens.

Finite copies (`write_stream_copy`, `default_dataset`): train.bin holds the flat corpus (stories
"SEED:0", "SEED:1", ..., the held-out texts skipped) up to a token count; val.bin and the tokenizer
are the stream's, so losses on a copy and on the stream are measured on the same held-out set.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import threading
import types
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from xtrain import settings

from .dataset import Dataset, open_dataset
from .errors import DataError
from .layout import FORMAT_VERSION, META_FILE, TRAIN_FILE, VAL_FILE, read_meta
from .shards import ShardWriter, dtype_for_vocab
from .stories import DEFAULT_SEED, STORY_VERSION, make_story, tell
from .tokenizer import BPE_FILE, Tokenizer, load_tokenizer, train_bpe

STREAM_DIR = "stream"
DIGESTS_FILE = "val.digests"
STATE_VERSION = 1
# The tokenizer: an upper bound; the stories fill 2794 ids (about one per word). Trained on ~1.1M
# tokens of text, in which every word of the tables occurs (more only costs time on first use).
DEFAULT_VOCAB_SIZE = 4096
BPE_STORIES = 4000
# Held-out tokens: 20 eval batches of 32 x 256 take 164K; larger batches get fewer eval batches.
VAL_TOKENS = 1 << 18
# Steps per block: larger wastes less of each lane's last story, smaller makes a block (what a
# resume recomputes, and the first step waits for) cheaper. At seq 256 a lane-block is 16K tokens.
BLOCK_STEPS = 64
# Blocks computed ahead of the one being read.
PREFETCH_BLOCKS = 2
# `workers="auto"`: one process per two cores of the rank's share, at most this many. One
# process makes ~300K tokens/s (docs/data.md), the H200 takes at most ~340K.
MAX_AUTO_WORKERS = 4
# The prepared finite copy default_dataset() makes: about the size of the corpus it replaces.
DEFAULT_COPY_TOKENS = 1_200_000
# Flat-corpus stories per worker task when writing a copy.
COPY_TASK_STORIES = 2000


# ---- the stream directory

@dataclass(frozen=True)
class StreamDataset(Dataset):
    """A stream directory: `loader("train", ...)` is the endless StreamLoader, `loader("val",
    ...)` the held-out shard (a TokenLoader, as for a prepared dataset)."""

    seed: int = DEFAULT_SEED
    workers: int | str = "auto"

    def shard_path(self, split: str) -> Path:
        if split == "train":
            raise DataError(f"the built-in stream in {self.path} has no train shard: its training "
                            f"stories are generated on the fly (write_stream_copy makes one)")
        return super().shard_path(split)

    def loader(self, split: str, batch: int, seq: int, seed: int, rank: int = 0,
               world_size: int = 1):
        if split != "train":
            return super().loader(split, batch, seq, seed, rank, world_size)
        return StreamLoader(self, batch, seq, seed, rank=rank, world_size=world_size,
                            workers=self.workers)


def default_cache_dir() -> Path:
    return Path(settings.get("XTRAIN_CACHE") or Path.home() / ".cache" / "xtrain" / "default")


def open_stream(path: str | os.PathLike | None = None, seed: int | None = None,
                workers: int | str = "auto", progress: bool = True) -> StreamDataset:
    """The stream directory `path` (default: `default_cache_dir()/stream`), made on first use,
    remade when the story generator has changed or another `seed` is asked for (None: the
    directory's seed, else DEFAULT_SEED)."""
    path = Path(path) if path is not None else default_cache_dir() / STREAM_DIR
    _check_workers(workers)
    path.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        if seed is None:
            seed = read_meta(path).get("seed", DEFAULT_SEED) if is_stream_dir(path) \
                else DEFAULT_SEED
        if not _stream_ready(path, seed):
            _make_stream(path, seed, progress)
    meta = read_meta(path)
    tok = load_tokenizer(path)
    if meta["tokenizer"]["fingerprint"] != tok.fingerprint:
        raise DataError(f"the tokenizer in {path} is not the one its held-out set was made with; "
                        f"delete {path} to rebuild it")
    dataset = StreamDataset(path, meta, tok, seed=seed, workers=workers)
    dataset.loader("val", 1, 1, 0)  # validates val.bin against the tokenizer
    return dataset


def is_stream_dir(path: str | os.PathLike) -> bool:
    meta = Path(path) / META_FILE
    try:
        return json.loads(meta.read_text()).get("kind") == "stream"
    except (OSError, json.JSONDecodeError):
        return False


def _stream_ready(path: Path, seed: int) -> bool:
    if not is_stream_dir(path):
        return False
    meta = read_meta(path)
    return (meta.get("story_version"), meta.get("seed")) == (STORY_VERSION, seed) and \
        (path / DIGESTS_FILE).is_file()


def _make_stream(path: Path, seed: int, progress: bool) -> None:
    from tqdm import tqdm

    (path / META_FILE).unlink(missing_ok=True)
    tok = train_bpe((make_story(seed, i) for i in range(BPE_STORIES)), DEFAULT_VOCAB_SIZE)
    writer = ShardWriter(path / VAL_FILE, tok.vocab_size, tok.eot_id, tok.fingerprint)
    digests, n_tokens = [], 0
    with tqdm(total=VAL_TOKENS, unit="tok", unit_scale=True, desc="held-out stories",
              disable=not progress) as bar:
        try:
            while n_tokens < VAL_TOKENS:
                text = tell(f"{seed}:val:{len(digests)}").text()
                ids = [tok.eot_id] + tok.encode(text)
                writer.write(np.array(ids, dtype=np.int64))
                digests.append(text_digest(text))
                n_tokens += len(ids)
                bar.update(len(ids))
        except BaseException:
            writer.abort()
            raise
    writer.close()
    tmp = path / (DIGESTS_FILE + ".tmp")
    tmp.write_bytes(np.array(digests, dtype="<u8").tobytes())
    os.replace(tmp, path / DIGESTS_FILE)
    tok.save(path)
    meta = {"kind": "stream", "format_version": FORMAT_VERSION, "story_version": STORY_VERSION,
            "seed": seed,
            "tokenizer": {"kind": tok.kind, "name": tok.name, "fingerprint": tok.fingerprint,
                          "vocab_size": tok.vocab_size, "eot_id": tok.eot_id},
            "counts": {"val_docs": len(digests), "val_tokens": n_tokens,
                       "bpe_training_stories": BPE_STORIES},
            "files": {"val": VAL_FILE, "val_digests": DIGESTS_FILE}}
    _write_json(path / META_FILE, meta)


def text_digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


# ---- what workers compute (and the loader itself when it has none)

_WORKER_STATE: dict[str, tuple[Tokenizer, frozenset, np.dtype]] = {}


def _stream_state(stream_dir: str) -> tuple[Tokenizer, frozenset, np.dtype]:
    """(tokenizer, held-out digests, token dtype) of a stream directory, loaded once a process."""
    state = _WORKER_STATE.get(stream_dir)
    if state is None:
        tok = load_tokenizer(stream_dir)
        digests = frozenset(np.fromfile(Path(stream_dir) / DIGESTS_FILE, dtype="<u8").tolist())
        state = _WORKER_STATE[stream_dir] = (tok, digests, dtype_for_vocab(tok.vocab_size))
    return state


def _story_tokens(tok: Tokenizer, held_out: frozenset, key: str) -> list[int] | None:
    """eot + the tokens of story `key`, or None when its text is a held-out one."""
    text = tell(key).text()
    if text_digest(text) in held_out:
        return None
    return [tok.eot_id] + tok.encode(text)


def lane_block(stream_dir: str, key: str, n_tokens: int) -> np.ndarray:
    """The first n_tokens tokens of the stories `key:0`, `key:1`, ... (held-out texts skipped)."""
    tok, held_out, dtype = _stream_state(stream_dir)
    ids: list[int] = []
    m = 0
    while len(ids) < n_tokens:
        ids += _story_tokens(tok, held_out, f"{key}:{m}") or []
        m += 1
    return np.array(ids[:n_tokens], dtype=dtype)


def flat_stories(stream_dir: str, seed: int, start: int, stop: int) -> tuple[np.ndarray, int]:
    """(tokens, story count) of flat-corpus stories start..stop-1 (held-out texts skipped)."""
    tok, held_out, dtype = _stream_state(stream_dir)
    ids: list[int] = []
    n = 0
    for i in range(start, stop):
        story = _story_tokens(tok, held_out, f"{seed}:{i}")
        if story is not None:
            ids += story
            n += 1
    return np.array(ids, dtype=dtype), n


class _Inline:
    """A future for the no-worker case: computed in this process when its result is asked for."""

    def __init__(self, fn: Callable, args: tuple):
        self._call: tuple | None = (fn, args)
        self._value = None

    def result(self):
        if self._call is not None:
            fn, args = self._call
            self._value, self._call = fn(*args), None
        return self._value

    def cancel(self) -> None:
        self._call = None


class _Pending:
    """A future for a task sent to StoryWorkers."""

    def __init__(self, pool: "StoryWorkers", task_id: int):
        self._pool, self._id = pool, task_id

    def result(self):
        return self._pool.result(self._id)

    def cancel(self) -> None:
        self._pool.forget(self._id)


class StoryWorkers:
    """`submit(fn, *args)` runs fn(*args) in one of `n` worker processes (lazily in this process
    when n = 0) and returns a future with `result()` and `cancel()`.

    Workers take tasks from one queue as they become free and put results on another; which
    worker ran a task never matters (results are matched by task id). They are spawned, not
    forked (the parent may hold CUDA, NCCL or tokenizer threads), and without re-running the
    parent's main script: a user script that lacks the `if __name__ == "__main__"` guard still
    works. Daemon processes: they die with the parent.
    """

    def __init__(self, n: int):
        self.n = n
        if n == 0:
            # Stories made in the training process: the tokenizer's Rust thread pool (rayon, one
            # thread per core) would fight the training threads for the cores (tiny preset on 2
            # cores: ~1,950 -> ~12,000 tok/s with one thread; docs/cpu.md). Read when the pool
            # starts, at the first tokenization; a value the user set is kept.
            os.environ.setdefault("RAYON_NUM_THREADS", "1")
        self._procs: list = []
        self._next_id = 0
        self._inbox = _Inbox()

    def submit(self, fn: Callable, *args):
        if self.n == 0:
            return _Inline(fn, args)
        if not self._procs:
            self._start()
        task_id, self._next_id = self._next_id, self._next_id + 1
        self._tasks.put((task_id, fn, args))
        return _Pending(self, task_id)

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._tasks, self._results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        with _main_script_hidden():
            for _ in range(self.n):
                proc = ctx.Process(target=_worker_loop, args=(self._tasks, self._results, stop),
                                   daemon=True)
                proc.start()
                self._procs.append(proc)
        # Results are taken off the pipe as they arrive, by a thread of this process: a block's
        # lanes are then ready when the training loop reaches it, instead of being received and
        # unpickled all at once between two steps (a pause of ~0.1-0.4 s every block).
        collector = threading.Thread(target=_collect, args=(self._results, self._inbox, stop),
                                     name="xtrain-story-results", daemon=True)
        collector.start()
        self._finalizer = weakref.finalize(self, _stop_workers, self._procs, self._tasks, stop,
                                           collector)

    def result(self, task_id: int):
        inbox = self._inbox
        with inbox.ready:
            while task_id not in inbox.done:
                if not inbox.ready.wait(timeout=1.0):
                    dead = [p.exitcode for p in self._procs if not p.is_alive()]
                    if dead:
                        raise DataError(f"a story worker process died (exit code {dead[0]}); "
                                        f"with little memory, use fewer workers") from None
            ok, value = inbox.done.pop(task_id)
        if not ok:
            raise DataError(f"a story worker failed: {value}")
        return value

    def forget(self, task_id: int) -> None:
        """The result of task_id is not wanted: drop it when it arrives."""
        inbox = self._inbox
        with inbox.ready:
            if inbox.done.pop(task_id, None) is None:
                inbox.forgotten.add(task_id)

    def close(self) -> None:
        if self._procs:
            self._finalizer()
            self._procs = []
            self._inbox = _Inbox()


def _worker_loop(tasks, results, stop) -> None:
    # Parallelism comes from the processes; a Rust thread pool in each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Exit without flushing results nobody will read (a full pipe would block the exit).
    results.cancel_join_thread()
    while not stop.is_set() and (task := tasks.get()) is not None:
        task_id, fn, args = task
        try:
            results.put((task_id, True, fn(*args)))
        except Exception as e:  # reported to the parent, which raises it as a DataError
            results.put((task_id, False, f"{type(e).__name__}: {e}"))


class _Inbox:
    """Results received from the workers, by task id, and the ids nobody will ask for."""

    def __init__(self):
        self.ready = threading.Condition()
        self.done: dict[int, tuple[bool, object]] = {}
        self.forgotten: set[int] = set()


def _collect(results, inbox: _Inbox, stop) -> None:
    """The result-collecting thread: moves each result from the pipe into the inbox."""
    import queue

    while not stop.is_set():
        try:
            got_id, ok, value = results.get(timeout=0.2)
        except queue.Empty:
            continue
        except (EOFError, OSError):  # the queue was closed under us at shutdown
            return
        with inbox.ready:
            if got_id in inbox.forgotten:
                inbox.forgotten.discard(got_id)
            else:
                inbox.done[got_id] = (ok, value)
                inbox.ready.notify_all()


def _stop_workers(procs: list, tasks, stop, collector=None) -> None:
    stop.set()  # queued tasks are skipped; idle workers wake on the None; the collector exits
    for _ in procs:
        tasks.put(None)
    for proc in procs:
        proc.join(timeout=5.0)
        if proc.is_alive():
            proc.terminate()
            proc.join()
    if collector is not None:
        collector.join(timeout=5.0)


# Rank threads of one process may start their loaders' workers at the same time.
_MAIN_SWAP = threading.Lock()


@contextlib.contextmanager
def _main_script_hidden():
    """While processes start: spawn re-imports the parent's `__main__` in each child (to find
    functions defined there); ours run only xtrain.data functions, so show it an empty one."""
    with _MAIN_SWAP:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


def resolve_workers(workers: int | str, world_size: int = 1) -> int:
    """A worker count: `workers` itself, or for "auto" $XTRAIN_DATA_WORKERS when set, else one
    per two of this rank's cores minus one for the training thread, at most MAX_AUTO_WORKERS
    (so 0, stories made in the training process, on a two-core machine)."""
    _check_workers(workers)
    if workers != "auto":
        return int(workers)
    try:
        env = settings.get("XTRAIN_DATA_WORKERS")
    except ValueError as e:
        raise DataError(str(e)) from None
    if env is not None:
        return env
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(0, min(MAX_AUTO_WORKERS, (cores or 1) // (2 * world_size) - 1))


def _check_workers(workers) -> None:
    if workers != "auto" and not (isinstance(workers, (int, np.integer)) and workers >= 0):
        raise DataError(f"workers must be 'auto' or an integer >= 0, got {workers!r}")


# ---- the training loader

class StreamLoader:
    """This rank's (inputs, targets) of every global step of the endless story stream; see
    Note [Lanes and blocks]. The interface of TokenLoader's training side: next_batch, iteration,
    state_dict / load_state_dict; plus close() to stop the workers."""

    def __init__(self, stream: StreamDataset, batch: int, seq: int, seed: int, rank: int = 0,
                 world_size: int = 1, workers: int | str = 0, block_steps: int = BLOCK_STEPS,
                 prefetch: int = PREFETCH_BLOCKS):
        for name, value in (("batch", batch), ("seq", seq), ("world_size", world_size),
                            ("block_steps", block_steps)):
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise DataError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= rank < world_size:
            raise DataError(f"rank must be in [0, {world_size}), got {rank}")
        self.stream, self.batch, self.seq, self.seed = stream, batch, seq, seed
        self.rank, self.world_size = rank, world_size
        self.block_steps, self.prefetch = block_steps, prefetch
        self.workers = StoryWorkers(resolve_workers(workers, world_size))
        self.step = 0
        self._blocks: dict[int, list] = {}  # block -> one future (then array) per lane of mine

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch

    @property
    def lanes(self) -> range:
        return range(self.rank * self.batch, (self.rank + 1) * self.batch)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (inputs, targets) for the next global step, each int64 (batch, seq)."""
        block, j = divmod(self.step, self.block_steps)
        for ahead in range(block, block + self.prefetch + 1):
            self._submit(ahead)
        for old in [b for b in self._blocks if b < block]:
            del self._blocks[old]
        lanes = self._blocks[block]
        for i, lane in enumerate(lanes):
            if not isinstance(lane, np.ndarray):
                lanes[i] = lane.result()  # waits for the worker when it is behind
        rows = np.stack([lane[j * self.seq:(j + 1) * self.seq + 1] for lane in lanes])
        rows = rows.astype(np.int64)
        self.step += 1
        return np.ascontiguousarray(rows[:, :-1]), np.ascontiguousarray(rows[:, 1:])  # (B, S)

    def __iter__(self) -> "StreamLoader":
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        return self.next_batch()

    def _submit(self, block: int) -> None:
        if block in self._blocks:
            return
        n_tokens = self.block_steps * self.seq + 1
        prefix = f"{self.stream.seed}:t{self.seed}:{block}"
        self._blocks[block] = [self.workers.submit(lane_block, str(self.stream.path),
                                                   f"{prefix}:{g}", n_tokens)
                               for g in self.lanes]

    def _identity(self) -> dict:
        return {"kind": "stream", "story_version": STORY_VERSION, "story_seed": self.stream.seed,
                "seq": self.seq, "global_batch": self.global_batch,
                "block_steps": self.block_steps, "fingerprint": self.stream.tokenizer.fingerprint}

    def state_dict(self) -> dict:
        """The position in the stream: JSON-safe, the same on every rank."""
        return {"version": STATE_VERSION, "step": self.step, "seed": self.seed,
                **self._identity()}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where the loader that produced `state` stopped."""
        if state.get("kind") != "stream" or state.get("version") != STATE_VERSION:
            raise DataError(f"loader state is not a version-{STATE_VERSION} stream state (kind "
                            f"{state.get('kind', 'shard')!r}, version {state.get('version')}); "
                            f"was the checkpoint trained on another dataset?")
        for key, mine in self._identity().items():
            if state.get(key) != mine:
                raise DataError(f"loader state does not match this loader: {key} is "
                                f"{state.get(key)!r} in the state, {mine!r} here")
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise DataError(f"loader state has an invalid step {step!r}")
        self.close()
        self.step, self.seed = step, state["seed"]  # the stream the checkpoint was reading

    def close(self) -> None:
        """Drop prefetched blocks and stop the workers (they restart if more batches are asked)."""
        for lanes in self._blocks.values():
            for lane in lanes:
                if not isinstance(lane, np.ndarray):
                    lane.cancel()
        self._blocks.clear()
        self.workers.close()

    def __enter__(self) -> "StreamLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- prepared finite copies

def write_stream_copy(stream: StreamDataset, out_dir: str | os.PathLike, n_tokens: int,
                      workers: int | str = "auto", progress: bool = True) -> Path:
    """A prepared dataset (open_dataset reads it) of the stream's first `n_tokens` flat-corpus
    tokens (whole stories), with the stream's tokenizer and held-out set. Reused when it exists."""
    out_dir = Path(out_dir)
    request = {"format_version": FORMAT_VERSION, "source": "stories-stream",
               "story_version": STORY_VERSION, "seed": stream.seed, "n_tokens": n_tokens,
               "tokenizer": stream.tokenizer.fingerprint}
    if (out_dir / META_FILE).is_file() and read_meta(out_dir).get("request") == request:
        try:
            open_dataset(out_dir)
            return out_dir
        except DataError:
            pass  # damaged: rebuild
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILE).unlink(missing_ok=True)
    docs, tokens = _write_flat_train(stream, out_dir, n_tokens, resolve_workers(workers), progress)
    shutil.copyfile(stream.shard_path("val"), out_dir / VAL_FILE)
    shutil.copyfile(stream.path / BPE_FILE, out_dir / BPE_FILE)
    tok = stream.tokenizer
    meta = {"request": request,
            "tokenizer": {"kind": tok.kind, "name": tok.name, "fingerprint": tok.fingerprint,
                          "vocab_size": tok.vocab_size, "eot_id": tok.eot_id},
            "counts": {"train_docs": docs, "train_tokens": tokens,
                       "val_docs": stream.meta["counts"]["val_docs"],
                       "val_tokens": stream.meta["counts"]["val_tokens"]},
            "source": {"stream": str(stream.path)},
            "files": {"train": TRAIN_FILE, "val": VAL_FILE}}
    _write_json(out_dir / META_FILE, meta)
    return out_dir


def _write_flat_train(stream: StreamDataset, out_dir: Path, n_tokens: int, workers: int,
                      progress: bool) -> tuple[int, int]:
    from tqdm import tqdm

    tok = stream.tokenizer
    writer = ShardWriter(out_dir / TRAIN_FILE, tok.vocab_size, tok.eot_id, tok.fingerprint)
    pool = StoryWorkers(workers)
    pending, next_start = [], 0
    docs = tokens = 0
    try:
        with tqdm(total=n_tokens, unit="tok", unit_scale=True, desc="writing stories",
                  disable=not progress) as bar:
            while tokens < n_tokens:
                while len(pending) < max(2 * workers, 1):  # keep every worker busy, in order
                    # Small tasks near the end (~270 tokens a story): what is cut, not the task
                    # size, decides the copy.
                    size = min(COPY_TASK_STORIES, (n_tokens - tokens) // 128 + 16)
                    pending.append(pool.submit(flat_stories, str(stream.path), stream.seed,
                                               next_start, next_start + size))
                    next_start += size
                ids, n = pending.pop(0).result()
                # Whole stories: those that start before n_tokens (the last one crosses it).
                starts = np.flatnonzero(ids == tok.eot_id)
                keep = int(np.searchsorted(starts, n_tokens - tokens, side="left"))
                if keep < len(starts):
                    ids, n = ids[:starts[keep]], keep
                writer.write(ids)
                docs, tokens = docs + n, tokens + len(ids)
                bar.update(len(ids))
    except BaseException:
        writer.abort()
        raise
    finally:
        for f in pending:
            f.cancel()
        pool.close()
    writer.close()
    return docs, tokens


@contextlib.contextmanager
def _locked(directory: Path):
    """Serialise processes preparing the same directory (several ranks or runs at once)."""
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write_json(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


# ---- the default prepared copy

def default_dataset(cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """A prepared finite copy of the built-in stories (DEFAULT_COPY_TOKENS training tokens, the
    stream's tokenizer and held-out set), made once; returns its directory.

    The directory is `cache_dir`, else `$XTRAIN_CACHE`, else `~/.cache/xtrain/default`; the stream
    lives in its `stream/` subdirectory. Concurrent callers are serialised by a lock file.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    stream = open_stream(cache_dir / STREAM_DIR, progress=progress)
    with _locked(cache_dir):
        for stale in cache_dir.glob("stories-v*.txt"):  # the text corpus of earlier versions
            stale.unlink()
        return write_stream_copy(stream, cache_dir, DEFAULT_COPY_TOKENS, workers=0,
                                 progress=progress)
