"""Output directories: exclusive locks, the checks that keep one command from destroying another's
files, and staged writes that leave nothing behind when they fail.

- DirLock(path): an exclusive lock on a directory (a run's --out, a prepared-data directory),
  held through the lock file PATH/.xtrain.lock. It is taken with flock(2) on that file, so the
  kernel decides between two starters (atomic, no window) and frees the lock when its holder
  exits in any way, SIGKILL included: a lock file left behind by a dead process is taken over
  (and reported in `took_over`), never mistaken for a live one. The file records the holder's
  pid, host and start time, which is what a refusal names. Leaving the `with` block removes it.
- check_run_dir(): `xtrain train` starts in a directory holding another run only with --resume
  (continue it) or --overwrite (replace it).
- check_export_dir(): export never writes into a checkpoint directory, nor into a non-empty
  directory without overwrite.
- check_prepare_dir(), enclosing_run(): prepare never writes into a checkpoint directory (nor
  under a run's checkpoint names), and one into a run's folder (RUN/data) takes the run's lock as
  well as its own, so it cannot replace the data of a run that is training.
- staging_dir(): a temporary directory for files that are published together; on any failure it
  is removed, and a full disk becomes one OSError that says so.

Every refusal is a RunDirError (a ValueError), which the CLI prints as one `xtrain: error:` line.
The CLI takes the locks (`train` on --out, `prepare` on --out), so library calls stay lock-free.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

LOCK_FILE = ".xtrain.lock"
# What `xtrain train` writes into its --out; the first three mark a directory as holding a run.
# (OUT/data, raw data prepared by a run, is a reusable cache and stays on --overwrite.)
RUN_MARKERS = ("ckpt", "ckpt.old", "log.jsonl")
RUN_OUTPUTS = RUN_MARKERS + ("ckpt.tmp", "best", "best.tmp", "best.old", "ckpt.suspect", "ckpt.suspect.tmp",
                             "log.jsonl.tmp", "loss.png", "sample.txt")
# `--keep N`: the checkpoints a save replaced, OUT/ckpt-STEP (and their staging names).
HISTORY_PREFIX = "ckpt-"
_HISTORY_NAME = re.compile(r"ckpt-(\d{1,18})(\.tmp|\.old)?")
# The files of a checkpoint directory that identify it as one (xtrain.io.state writes both).
_CKPT_FILES = ("state.json", "model.safetensors")
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_TOO_LARGE = (errno.EFBIG,)  # a file size limit (ulimit -f, RLIMIT_FSIZE) or the filesystem's


class RunDirError(ValueError):
    """A directory cannot be used as asked: it is locked, holds another run, or is a file."""


class LockedError(RunDirError):
    """Another live process holds the directory's lock."""


class DirLock:
    """`with DirLock(path, "train run"):` -- hold path's exclusive lock (creating path and its
    missing parents, and removing those again on release if they are still empty)."""

    def __init__(self, path, what: str = "xtrain"):
        self.path = Path(path)
        self.what = what
        self.took_over: dict | None = None  # the record of a dead holder whose lock was taken
        self._fd: int | None = None
        self._created: list[Path] = []  # directories acquire() made, deepest first

    def __enter__(self) -> "DirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        missing = self.path.absolute()
        self._created = []
        while not missing.exists():
            self._created.append(missing)
            missing = missing.parent
        ensure_dir(self.path)
        lock = self.path / LOCK_FILE
        while True:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd)
                os.close(fd)
                self._drop_created()
                raise LockedError(f"{self.path} is in use by {_describe(holder)}; wait for it to "
                                  f"finish or use another directory") from None
            # The holder may have released (and removed the file) between our open and flock:
            # then we hold a lock on an orphan inode, and try again on the current file.
            if _same_file(fd, lock):
                break
            os.close(fd)
        self.took_over = _read_record(fd)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "what": self.what,
                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            with writing(lock):
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError:  # a full disk, a file size limit: no lock, and no empty lock file left
            lock.unlink(missing_ok=True)
            os.close(fd)
            self._drop_created()
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            (self.path / LOCK_FILE).unlink(missing_ok=True)  # still holding it: nobody races us
        finally:
            os.close(self._fd)
            self._fd = None
        self._drop_created()

    def _drop_created(self) -> None:
        for d in self._created:
            try:
                d.rmdir()  # only if still empty
            except OSError:
                break


def ensure_dir(path) -> Path:
    """Create directory `path` (and parents); RunDirError when it exists as something else."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise RunDirError(f"{path}: {p} exists and is not a directory")
        if p.is_dir():
            break
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- runs

@contextlib.contextmanager
def claim_run(out, resume=None, overwrite: bool = False):
    """Lock run directory `out` for a `train` run, check it may be used (check_run_dir) and, with
    overwrite, remove the previous run's outputs. Yields the DirLock."""
    with DirLock(out, "xtrain train") as lock:
        check_run_dir(out, resume, overwrite)
        if overwrite:
            clear_run(out)
        yield lock


def check_run_dir(out, resume=None, overwrite: bool = False) -> None:
    """RunDirError unless a run may start in `out`: it holds no run, or `resume` continues the
    run it holds, or `overwrite` replaces it (but never the checkpoint `resume` reads)."""
    out = Path(out)
    existing = [name for name in RUN_MARKERS if (out / name).exists()]
    if resume is not None and overwrite:
        if _is_within(resume, out):
            raise RunDirError(f"--overwrite would delete the checkpoint --resume {resume} "
                              f"continues from; drop --overwrite")
        return
    if not existing or overwrite:
        return
    if resume is None:
        if not any((out / name / _CKPT_FILES[0]).is_file() for name in ("ckpt", "ckpt.old")):
            raise RunDirError(f"{out} holds the log of a run that saved no checkpoint ({', '.join(existing)}): "
                              f"there is nothing to resume; pass --overwrite to start again, or choose "
                              f"another --out")
        raise RunDirError(f"{out} already holds a run ({', '.join(existing)}); pass --resume to "
                          f"continue it or --overwrite to replace it")
    own = {(out / name).resolve() for name in ("ckpt", "ckpt.old", "best", "ckpt.suspect")}
    own |= {p.resolve() for p in checkpoint_history(out)}
    if Path(resume).resolve() not in own:
        raise RunDirError(f"{out} holds another run ({', '.join(existing)}) than the checkpoint "
                          f"--resume {resume} continues; pass --overwrite to replace it or "
                          f"choose another --out")


def is_run_output(name: str) -> bool:
    """Whether a `train` run writes an entry of this name into its --out (RUN_OUTPUTS, or a
    checkpoint of its history)."""
    return name in RUN_OUTPUTS or _HISTORY_NAME.fullmatch(name) is not None


def history_name(step: int) -> str:
    """The name under which `--keep` keeps the checkpoint of `step` once a newer save replaces it."""
    return f"{HISTORY_PREFIX}{int(step)}"


def checkpoint_history(out) -> list[Path]:
    """The run's older checkpoints (OUT/ckpt-STEP holding a state.json), oldest save first (by
    the time their state.json was written; a resumed run's abandoned later steps are older saves
    than its new ones)."""
    out = Path(out)
    try:
        entries = list(out.iterdir())
    except OSError:
        return []
    found = []
    for p in entries:
        m = _HISTORY_NAME.fullmatch(p.name)
        if m is None or m.group(2) or p.is_symlink() or not (p / _CKPT_FILES[0]).is_file():
            continue
        found.append(((p / _CKPT_FILES[0]).stat().st_mtime_ns, int(m.group(1)), p))
    return [p for _, _, p in sorted(found)]


def clear_run(out) -> None:
    """Remove what a previous `train` run wrote into `out` (RUN_OUTPUTS and its checkpoint
    history; OUT/data stays)."""
    out = Path(out)
    names = list(RUN_OUTPUTS)
    if out.is_dir():
        names += sorted(p.name for p in out.iterdir() if _HISTORY_NAME.fullmatch(p.name))
    for name in names:
        p = out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


# ---- prepared data

def check_prepare_dir(out) -> None:
    """RunDirError when prepare may not write into `out`: it is (or lies inside) a checkpoint
    directory, or it takes one of the names a run in its parent writes (ckpt, best, ...)."""
    out = Path(out)
    target = out.resolve()
    for p in (target, *target.parents):
        if all((p / f).is_file() for f in _CKPT_FILES):
            raise RunDirError(f"refusing to prepare data into {out}: it is inside the checkpoint directory "
                              f"{p}, whose files it would replace; choose another --out")
    if is_run_output(target.name) and _holds_run(target.parent):
        raise RunDirError(f"refusing to prepare data into {out}: {target.parent} holds a run, which writes "
                          f"{target.name} itself; use {target.parent / 'data'} or another --out")


def enclosing_run(out) -> Path | None:
    """The directory `out` lies in when it holds a run (its outputs or a lock file: RUN/data), or
    None: a prepare into `out` must hold that directory's lock too."""
    parent = Path(out).absolute().parent
    return parent if _holds_run(parent) else None


def _holds_run(p: Path) -> bool:
    return (p / LOCK_FILE).exists() or any((p / name).exists() for name in RUN_MARKERS)


# ---- exports

def check_export_dir(ckpt_dir, out, overwrite: bool = False, ignore=()) -> None:
    """RunDirError when export may not write into `out`: it is (or lies inside) a checkpoint
    directory, it is a file, or it is not empty (names in `ignore` aside) and overwrite is off."""
    out = Path(out)
    ckpt_dir = Path(ckpt_dir).resolve()
    target = out.resolve()
    for p in (target, *target.parents):
        if p == ckpt_dir or all((p / f).is_file() for f in _CKPT_FILES):
            raise RunDirError(f"refusing to export into {out}: it is inside the checkpoint "
                              f"directory {p}; export writes a separate directory")
    if out.exists() and not out.is_dir():
        raise RunDirError(f"export target {out} exists and is not a directory")
    if out.is_dir() and not overwrite:
        present = sorted(p.name for p in out.iterdir() if p.name not in ignore)
        if present:
            raise RunDirError(f"export target {out} is not empty ({', '.join(present[:4])}"
                              f"{', ...' if len(present) > 4 else ''}); pass --overwrite to "
                              f"replace the files an export writes, or choose another directory")


# ---- writes

@contextlib.contextmanager
def staging_dir(tmp, what: str):
    """A fresh, empty directory `tmp` to write `what` into. If the block fails, `tmp` is removed;
    a full disk (ENOSPC/EDQUOT) is re-raised as an OSError whose message says so plainly."""
    tmp = Path(tmp)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in _NO_SPACE:
            raise OSError(e.errno, f"no space left on device while writing {what}; the partial "
                                   f"files were removed") from e
        if isinstance(e, OSError) and e.errno in _TOO_LARGE:
            raise OSError(e.errno, f"file too large (a file size limit: ulimit -f?) while writing {what}; "
                                   f"the partial files were removed") from e
        raise


@contextlib.contextmanager
def writing(path):
    """Name `path` in an OSError of the block that names no file (a write() failing with ENOSPC
    or EFBIG names none), so the one error line says which file could not be written."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, f"{e.strerror or e} (while writing it)", str(path)) from e


# ---- helpers

def _read_record(fd: int) -> dict | None:
    try:
        raw = os.pread(fd, 4096, 0)
        record = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _describe(record: dict | None) -> str:
    if not record:
        return "another process (its lock record is unreadable)"
    return (f"{record.get('what', 'another command')} (pid {record.get('pid')} on "
            f"{record.get('host')}, since {record.get('since')})")


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _is_within(path, directory) -> bool:
    path, directory = Path(path).resolve(), Path(directory).resolve()
    return path == directory or directory in path.parents
