"""Checkpoints: save and resume a training run, bit-exactly.

A checkpoint is a directory:
    model.safetensors   parameters by name, float32 (the master weights)
    optim.safetensors   the optimizer's state_arrays() as "<kind>.<param>", float32: AdamW's
                        "exp_avg.*" and "exp_avg_sq.*"; Muon's the same for the parameters
                        AdamW updates and "momentum_buffer.<matrix>"
    tokenizer.json      the run's tokenizer: the files its kind saves (tokenizer.json, tiktoken.json,
                        tokenizer.model, tokenizer_config.json), so sample/export need nothing else
    state.json          written last: format version, model config, step, optimizer step and
                        hyper-parameters, RNG states of xtrain's default generators, the data
                        loader state, tokenizer fingerprint, the dataset path, the run's arguments,
                        and the size and sha256 of every other file

Decisions:
- No pickle (loading a checkpoint never runs code): tensors in safetensors, everything else in sorted JSON.
- Atomic replacement. save() writes everything into NAME.tmp beside the target, fsyncs each file
  and the directory, then renames NAME -> NAME.old, NAME.tmp -> NAME, fsyncs the parent and
  removes NAME.old. A crash at any point leaves a loadable checkpoint: before the first rename NAME
  is untouched; between the renames only NAME.old exists and load() falls back to it; after the
  second NAME is complete. Stale NAME.tmp directories are ignored and cleared by the next save; a
  save that fails (a full disk included) removes its NAME.tmp at once.
- Never a non-finite checkpoint: save() refuses weights or moments holding NaN or Inf before it
  writes anything (NonFiniteError), so a diverged run cannot replace its last good checkpoint.
  A caller's `suspect` check (the training loop's divergence rule) may also send a finite save
  aside: it is written to NAME.suspect instead and DivergedError says where; NAME is untouched.
- Readers and writers agree: a save publishes (its renames and the removal of NAME.old) under an
  exclusive flock(2) on the checkpoint's parent directory; `reading(path)` holds a shared one, so
  a reader that reads under it (sample, export) sees one complete checkpoint, never files of two
  saves. A Checkpoint remembers the directory it verified; a later read of it outside `reading()`
  that finds another directory there (a save replaced it) is a CheckpointError, not mixed files.
  A reader that reads in parts (a resume: the state first, the weights and moments once the data
  are ready) loads with pin=True instead: load() opens every listed file under the lock it
  verifies them under, and the later reads take those open files, which a save's rename and
  removal leave readable (POSIX keeps an unlinked file while a descriptor holds it).
- History (`--keep N`): a save given `keep_previous=DIR` moves the checkpoint it replaces to DIR
  (a rename within the parent, under the same lock) instead of removing it; the training loop
  names those OUT/ckpt-STEP and removes the oldest beyond N (rundir.checkpoint_history).
- Integrity: state.json records the byte size and sha256 of each file, checked on load, so a
  truncated or altered file raises CheckpointError (a ValueError) instead of loading garbage.
  Before that, the whole of state.json is checked against its schema (schema.py), and after
  it the tensor headers against the config, so an edited state.json is refused before anything is
  allocated. A checkpoint reads only the plain, regular files its integrity list names.
- Resume is bit-exact because everything that decides the next step is restored exactly: float32
  weights and moments, the step (the LR schedule is a function of it), the loader's PCG64 state and
  the default generators' (seed, offset) states (in data-parallel runs every rank's, "rank_rng").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import xtrain
from xtrain.io import schema
from xtrain.models import TinyTransformer, config_from_dict, model_class
from xtrain.data.layout import file_sha256
from xtrain.io.rundir import RUN_MARKERS, ensure_dir, staging_dir, writing

FORMAT = "xtrain-checkpoint"
VERSION = 1
MODEL_FILE = schema.MODEL_FILE
OPTIM_FILE = schema.OPTIM_FILE
STATE_FILE = "state.json"
TMP_SUFFIX = ".tmp"
OLD_SUFFIX = ".old"
SUSPECT_SUFFIX = ".suspect"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt, or does not match what it is loaded into."""


class NonFiniteError(CheckpointError):
    """Weights or optimizer moments hold NaN or Inf: such a checkpoint is never written."""


class DivergedError(CheckpointError):
    """save()'s `suspect` check found the weights diverged: the checkpoint went to `aside`
    (NAME.suspect) and NAME still holds the previous one."""

    def __init__(self, message: str, aside: Path):
        super().__init__(message)
        self.aside = aside


# ---- save

def save(path, model: TinyTransformer, optimizer=None, step: int = 0, *, loader_state=None,
         tokenizer=None, dataset: str | None = None, train_args: dict | None = None,
         rank_rng: list | None = None, suspect=None, keep_previous: Path | None = None) -> Path:
    """Write a checkpoint of the run at `step` (steps completed) to directory `path`, atomically.

    rank_rng: in data-parallel runs, each rank's device generator state in rank order (ranks
    draw their own dropout masks), saved as "rank_rng" and restored per rank on resume.

    Refuses (NonFiniteError, before writing anything) weights or moments holding NaN or Inf. On
    any failure the partial NAME.tmp is removed and the previous checkpoint stays as it was; a
    full disk raises an OSError saying so. `suspect(params)` (name -> array, on the host), when
    given, returns None or why these weights must not replace NAME: then the checkpoint is saved
    as NAME.suspect and DivergedError raised. `keep_previous`: where the checkpoint this save
    replaces goes instead of being removed (a directory beside it; one already there is replaced);
    a suspect save replaces nothing and keeps nothing."""
    path = Path(path)
    # Sync point: parameters and moments come to the host (one copy of each flat buffer).
    params = model.store.state_arrays()
    _refuse_non_finite(path, params, "weight")
    why = suspect(params) if suspect is not None else None
    target = path.with_name(path.name + SUSPECT_SUFFIX) if why else path
    moments, optim_meta = None, None
    if optimizer is not None:
        moments = {f"{kind}.{n}": a for kind, arrays in optimizer.state_arrays().items() for n, a in arrays.items()}
        _refuse_non_finite(path, moments, "optimizer moment")
        optim_meta = {"step": optimizer.step_count, "hyper": optimizer.hyper(), "names": list(optimizer.names)}
    ensure_dir(path.parent)
    previous = "the previous checkpoint is intact" if exists(path) else "no checkpoint was written"
    with staging_dir(target.with_name(target.name + TMP_SUFFIX), f"checkpoint {target} ({previous})") as tmp:
        files = {MODEL_FILE: _write_safetensors(tmp / MODEL_FILE, params)}
        if moments is not None:
            files[OPTIM_FILE] = _write_safetensors(tmp / OPTIM_FILE, moments)
        tok_meta = None
        if tokenizer is not None:
            main = tokenizer.save(tmp)
            for name in tokenizer.files:
                _fsync_file(tmp / name)
                files[name] = _file_record(tmp / name)
            tok_meta = {"kind": tokenizer.kind, "name": tokenizer.name, "file": main.name,
                        "fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                        "eot_id": tokenizer.eot_id}
        devices = sorted({"cpu", model.device})
        state = {
            "format": FORMAT,
            "version": VERSION,
            "step": int(step),
            "config": model.config.to_dict(),
            "optimizer": optim_meta,
            "rng": {d: _rng_to_json(xtrain.get_rng_state(d)) for d in devices},
            "rank_rng": None if rank_rng is None else [_rng_to_json(s) for s in rank_rng],
            "data": loader_state,
            "dataset": None if dataset is None else str(dataset),
            "tokenizer": tok_meta,
            "train_args": train_args,
            "files": files,
        }
        write_synced(tmp / STATE_FILE, (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
        fsync_dir(tmp)
    _promote(tmp, target, None if why else keep_previous)
    if why:
        kept = f"{path} keeps step {step_of(path)}" if exists(path) else f"{path} was not written"
        raise DivergedError(f"step {step}: {why}; this checkpoint was saved aside as {target} and {kept}",
                            target)
    return path


def max_abs(tensors: dict) -> float:
    """The largest |value| of the arrays in `tensors` (0 for none)."""
    return max((float(np.max(np.abs(a))) for a in tensors.values() if a.size), default=0.0)


def copy(src, dst) -> Path:
    """Checkpoint `src` copied to directory `dst`, atomically as save() writes (the training loop
    keeps RUN/best this way). The files are hard links where the filesystem allows: a checkpoint's
    files are never rewritten in place (a save replaces the whole directory), so the two
    directories may share them."""
    src, dst = resolve(src), Path(dst)
    with staging_dir(dst.with_name(dst.name + TMP_SUFFIX), f"checkpoint {dst}") as tmp:
        for f in src.iterdir():
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copy2(f, tmp / f.name)
        fsync_dir(tmp)
    _promote(tmp, dst)
    return dst


def step_of(path) -> int | None:
    """The step of the checkpoint at `path` (its state.json only, unverified), or None when there
    is no readable one."""
    try:
        return int(json.loads((resolve(path) / STATE_FILE).read_text())["step"])
    except (CheckpointError, OSError, ValueError, KeyError, TypeError):
        return None


def non_finite(tensors: dict):
    """(name, count) of the first array in `tensors` holding NaN or Inf, else None."""
    for name, a in tensors.items():
        bad = a.size - int(np.count_nonzero(np.isfinite(a)))
        if bad:
            return name, bad
    return None


def _refuse_non_finite(path: Path, tensors: dict, kind: str) -> None:
    found = non_finite(tensors)
    if found:
        raise NonFiniteError(f"refusing to save checkpoint {path}: {kind} {found[0]} holds "
                             f"{found[1]} non-finite values (NaN or Inf); "
                             f"{'the previous checkpoint is kept' if exists(path) else 'nothing was written'}")


def _promote(tmp: Path, path: Path, keep_previous: Path | None = None) -> None:
    """NAME.tmp -> NAME, keeping a loadable checkpoint at every instant (see module doc), under
    the exclusive lock of the parent directory, so no reader holding reading() sees it happen.
    The replaced NAME is removed, or renamed to `keep_previous`."""
    old = path.with_name(path.name + OLD_SUFFIX)
    with _parent_lock(path, fcntl.LOCK_EX):
        if path.exists():
            if old.exists():
                shutil.rmtree(old)
            os.rename(path, old)
            fsync_dir(path.parent)
        os.rename(tmp, path)
        fsync_dir(path.parent)
        if old.exists():
            if keep_previous is not None and (old / STATE_FILE).is_file():
                if keep_previous.exists():
                    shutil.rmtree(keep_previous)
                os.rename(old, keep_previous)
                fsync_dir(path.parent)
            else:
                shutil.rmtree(old)


def remove(path) -> None:
    """Remove checkpoint directory `path` under its parent's exclusive lock: no reader holding
    reading() has it vanish under its reads (the training loop prunes its history this way)."""
    path = Path(path)
    with _parent_lock(path, fcntl.LOCK_EX):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)


@contextlib.contextmanager
def reading(path):
    """Hold off every save into the directory of checkpoint `path` (its run folder) while the
    block reads it: a save waits to publish until the block ends (a shared flock(2) on the parent
    directory; saves take it exclusively). Take it around load() and the reads that follow."""
    with _parent_lock(Path(path), fcntl.LOCK_SH):
        yield


@contextlib.contextmanager
def _parent_lock(path: Path, mode: int):
    try:
        fd = os.open(path.absolute().parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # no parent directory yet: nothing to read or replace there
        fd = None
    if fd is None:
        yield
        return
    try:
        try:
            fcntl.flock(fd, mode)
        except OSError as e:  # a filesystem without flock (NFS emulates it with fcntl locks, which
            # refuse an exclusive lock on a read-only descriptor): unlocked, as before
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


# ---- load

@dataclass
class Checkpoint:
    path: Path
    meta: dict
    identity: tuple | None = None  # (st_dev, st_ino) of the directory load() verified
    # load(pin=True): file name -> a descriptor opened under the lock load() verified under
    pinned: dict | None = field(default=None, repr=False, compare=False)

    @property
    def step(self) -> int:
        return self.meta["step"]

    @property
    def config(self):
        """The model config the checkpoint records (TransformerConfig, or the config of the
        architecture it names: xtrain.models.config_from_dict)."""
        try:
            return config_from_dict(self.meta["config"])
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{self.path / STATE_FILE}: invalid model config ({e})") from None

    @property
    def loader_state(self) -> dict | None:
        return self.meta.get("data")

    def model_tensors(self) -> dict:
        with self._reading():
            return _read_safetensors(self._file(MODEL_FILE))

    def _file(self, name: str) -> Path:
        """Where to read file `name` of this checkpoint: its pinned descriptor when load() pinned
        it (the file verified, even if a save has replaced the directory since), else the path."""
        if self.pinned is not None and name in self.pinned:
            return Path(f"/proc/self/fd/{self.pinned[name]}")
        return self.path / name

    def _pin(self) -> None:
        if not Path("/proc/self/fd").is_dir():  # no /proc (not Linux): the reads go by path, unpinned
            return
        fds = {}
        try:
            for name in self.meta["files"]:
                fds[name] = os.open(self.path / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as e:
            _close_all(fds)
            raise CheckpointError(f"{self.path}: cannot open {e.filename}: {e.strerror}") from None
        self.pinned = fds
        weakref.finalize(self, _close_all, fds)

    @contextlib.contextmanager
    def _reading(self):
        """reading() this checkpoint, and CheckpointError when a save has replaced the directory
        load() verified (its files are another step's) and load() did not pin its files."""
        with reading(self.path):
            if self.pinned is None and self.identity is not None and _identity(self.path) != self.identity:
                raise CheckpointError(f"{self.path} was replaced by a newer save while it was being read; "
                                      f"run the command again")
            yield

    def build_model(self, device: str = "cpu", **overrides):
        """The model of the recorded config (with `overrides`, e.g. bf16/recompute) and weights:
        a TinyTransformer, or the model of the architecture the record names."""
        config = self.config
        if overrides:
            config = type(config).from_dict({**config.to_dict(), **overrides})
        with xtrain.no_grad():
            model = model_class(config)(config, device=device)
        tensors = self.model_tensors()
        try:
            model.load_state_dict(tensors, strict=True)
        except (KeyError, ValueError) as e:
            raise CheckpointError(f"{self.path / MODEL_FILE} does not match the model config "
                                  f"in {STATE_FILE}: {_msg(e)}") from None
        return model

    def load_optimizer(self, optimizer) -> None:
        meta = self.meta.get("optimizer")
        if meta is None:
            raise CheckpointError(f"{self.path} holds no optimizer state")
        with self._reading():
            tensors = _read_safetensors(self._file(OPTIM_FILE))
        state = {"step": meta["step"], "hyper": meta["hyper"]}
        for key, t in tensors.items():  # "<kind>.<parameter name>": the optimizer's state_arrays()
            kind, _, name = key.partition(".")
            state.setdefault(kind, {})[name] = t
        try:
            optimizer.load_state_dict(state)
        except (KeyError, ValueError) as e:
            raise CheckpointError(f"{self.path / OPTIM_FILE} does not match the optimizer: "
                                  f"{_msg(e)}") from None

    def restore_rng(self, rank: int | None = None, device: str | None = None, cpu: bool | None = None) -> None:
        """Put xtrain's default generators back where they were at save time.

        Without `rank`: every generator saved in "rng" (the CPU's and the device's). With `rank`
        (a data-parallel rank on `device`): that rank's own device generator from "rank_rng",
        and the CPU's where `cpu` (default: on rank 0; thread ranks share one CPU generator, each
        process of a process group has its own). A checkpoint without "rank_rng" (single-device,
        or older) restores "rng" on rank 0 only."""
        per_rank = self.meta.get("rank_rng")
        if rank is None or not per_rank:
            if rank is None or rank == 0:
                for dev, s in self.meta["rng"].items():
                    if dev == "cpu" or xtrain.cuda.is_available():
                        xtrain.set_rng_state(_rng_from_json(s), dev)
            return
        if (rank == 0 if cpu is None else cpu) and "cpu" in self.meta["rng"]:
            xtrain.set_rng_state(_rng_from_json(self.meta["rng"]["cpu"]), "cpu")
        if rank < len(per_rank):  # a resume on more GPUs: the extra ranks keep their seeding
            xtrain.set_rng_state(_rng_from_json(per_rank[rank]), device)

    @property
    def tokenizer_meta(self) -> dict:
        """state.json's record of the run's tokenizer; CheckpointError when there is none."""
        tok_meta = self.meta.get("tokenizer")
        if tok_meta is None:
            raise CheckpointError(f"{self.path} holds no tokenizer")
        return tok_meta

    def tokenizer(self):
        from xtrain.data.tokenizer import load_tokenizer

        tok_meta = self.tokenizer_meta
        with self._reading():
            tok = load_tokenizer(self.path, tok_meta["kind"])
        if tok.fingerprint != tok_meta["fingerprint"]:
            raise CheckpointError(f"the tokenizer in {self.path} (fingerprint {tok.fingerprint}) "
                                  f"is not the one recorded ({tok_meta['fingerprint']})")
        return tok


def resolve(path) -> Path:
    """The directory to load for `path`: itself, or NAME.old when a save crashed between its
    two renames. CheckpointError when neither holds a checkpoint."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    old = path.with_name(path.name + OLD_SUFFIX)
    if not path.exists() and (old / STATE_FILE).is_file():
        return old
    if path.is_dir():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    run = path.parent
    if path.name == "ckpt" and any((run / name).exists() for name in RUN_MARKERS):
        raise CheckpointError(f"no checkpoint at {path}: the run in {run} saved none (it stopped before its "
                              f"first save); start it again with --overwrite")
    raise CheckpointError(f"no checkpoint at {path}")


def exists(path) -> bool:
    try:
        resolve(path)
        return True
    except CheckpointError:
        return False


def load(path, verify: bool = True, pin: bool = False) -> Checkpoint:
    """Open a checkpoint: parse state.json and check it against the schema (xtrain.io.schema),
    check every listed file's size and (verify=True) sha256, then the tensor headers against the
    config. Nothing is allocated from an unchecked number. Runs under reading(path), so a save
    cannot swap the files between the checks. pin=True: also open every listed file under that
    lock; the Checkpoint's later reads take those files, whatever a save does meanwhile."""
    with reading(Path(path)):
        ckpt = _load(resolve(path), verify)
        if pin:
            ckpt._pin()
        return ckpt


def _close_all(fds: dict) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass


def _load(path: Path, verify: bool) -> Checkpoint:
    identity = _identity(path)
    state_file = path / STATE_FILE
    _check_plain_file(state_file)
    if state_file.stat().st_size > schema.MAX_STATE_BYTES:
        raise CheckpointError(f"{state_file} is {state_file.stat().st_size} bytes, more than a "
                              f"checkpoint's state ever needs ({schema.MAX_STATE_BYTES})")
    try:
        meta = json.loads(state_file.read_bytes())
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, huge ints
        raise CheckpointError(f"{state_file}: invalid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{state_file} is not an xtrain checkpoint")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {schema._show(meta.get('version'))}; "
                              f"this xtrain reads version {VERSION}")
    try:
        schema.check_state(meta)
    except schema.SchemaError as e:
        raise CheckpointError(f"{state_file}: {e}") from None
    for name, rec in meta["files"].items():
        f = path / name
        _check_plain_file(f)
        size = f.stat().st_size
        if size != rec["bytes"]:
            raise CheckpointError(f"{f} is truncated or altered: {size} bytes, "
                                  f"{rec['bytes']} recorded")
        if verify and file_sha256(f) != rec["sha256"]:
            raise CheckpointError(f"{f} is corrupt: its sha256 differs from the recorded one")
    for name in schema.TOKENIZER_FILE_NAMES:
        if name not in meta["files"] and os.path.lexists(path / name):
            raise CheckpointError(f"{path / name} is not listed in {STATE_FILE}; refusing to read "
                                  f"an unverified file")
    try:
        schema.check_tensor_files(path, meta)
    except schema.SchemaError as e:
        raise CheckpointError(f"{path}: the tensors do not match the model config in {STATE_FILE}: "
                              f"{e}") from None
    ckpt = Checkpoint(path, meta, identity)
    ckpt.config  # noqa: B018 -- validates the recorded config now
    return ckpt


def _check_plain_file(f: Path) -> None:
    """A file a checkpoint reads must be a regular file in its directory: not a symlink."""
    if f.is_symlink():
        raise CheckpointError(f"{f} is a symbolic link; a checkpoint's files must be plain files")
    if not f.is_file():
        raise CheckpointError(f"{f} is missing" if not f.exists() else f"{f} is not a regular file")


# ---- helpers

def _identity(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _write_safetensors(path: Path, tensors: dict) -> dict:
    from safetensors.numpy import save

    data = save(tensors, metadata={"format": "np"})
    write_synced(path, data)
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _read_safetensors(path: Path) -> dict:
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error type for malformed files
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def write_synced(path: Path, data: bytes) -> None:
    """Write `data` to a new file and fsync it (the caller publishes it with a rename)."""
    with writing(path), open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _file_record(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_to_json(state):
    if isinstance(state, (tuple, list)):
        return [int(v) for v in state]
    if isinstance(state, dict):
        return {k: int(v) for k, v in state.items()}
    return int(state)


def _rng_from_json(state):
    return tuple(state) if isinstance(state, list) else state


def _msg(e: Exception) -> str:
    return e.args[0] if isinstance(e, KeyError) and e.args else str(e)
