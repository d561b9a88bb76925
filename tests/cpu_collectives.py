"""NCCL's in-place collectives for CPU tensors, as stand-ins for the tests that run the data-parallel
code without GPUs: between rank threads of one process (ThreadCollectives, xtrain.launch.distributed's
thread launcher) or between processes through files in a shared directory (FileCollectives,
xtrain.launch.distributed.run_process). The average is the sum over ranks in rank order, then / ranks,
in float32, as the tests' references compute it. Results are written with copy_, so in-place
writes bump the tensors' versions as NCCL's do."""

import os
import threading
import time
from pathlib import Path

import numpy as np

import xtrain


class RankCollectives:
    """One rank's collectives over `gather(key, array) -> [array of every rank]`."""

    def __init__(self, gather, rank, world):
        self._gather, self.me, self.world, self.calls = gather, rank, world, []

    def _reduce(self, arrays, op):
        total = np.sum(np.stack(arrays), axis=0, dtype=np.float32)
        return total / np.float32(len(arrays)) if op == "avg" else total

    def all_reduce(self, tensors, op="avg"):
        self.calls.append("all_reduce")
        for i, t in enumerate(listed(tensors)):
            _write(t, self._reduce(self._gather(("ar", i), _host(t)), op))

    def reduce_scatter(self, flats, op="avg", extra=()):
        self.calls.append("reduce_scatter")
        for k, flat in enumerate(listed(flats)):
            n = flat.numel() // self.world
            mine = slice(self.me * n, (self.me + 1) * n)
            parts = self._gather(("rs", k), _host(flat))
            host = _host(flat)
            host[mine] = self._reduce([p[mine] for p in parts], op)
            _write(flat, host)
        for i, t in enumerate(extra):
            _write(t, self._reduce(self._gather(("rsx", i), _host(t)), op))

    def all_gather(self, flats):
        self.calls.append("all_gather")
        for k, flat in enumerate(listed(flats)):
            n = flat.numel() // self.world
            host = _host(flat)
            parts = self._gather(("ag", k), host.copy())
            for r, p in enumerate(parts):
                host[r * n:(r + 1) * n] = p[r * n:(r + 1) * n]
            _write(flat, host)

    def broadcast(self, tensors, root=0):
        self.calls.append("broadcast")
        for i, t in enumerate(listed(tensors)):
            _write(t, self._gather(("bc", i), _host(t))[root])

    def barrier(self):
        self._gather(("barrier",), np.zeros(1, np.float32))

    def note_replay(self):
        """A replayed graph's collectives (RankComm.note_replay): nothing to time here."""
        self.calls.append("note_replay")


class ThreadCollectives:
    """The shared side for `world` rank threads; rank(r) is rank r's RankCollectives. abort() and
    close() make it a communicator for xtrain.launch.distributed._Launch."""

    def __init__(self, world):
        self.world, self.barrier, self.slots = world, threading.Barrier(world, timeout=30), {}
        self.reasons = []

    def _gather(self, rank, key, value):
        self.slots[(key, rank)] = value
        self.barrier.wait()
        out = [self.slots[(key, r)] for r in range(self.world)]
        self.barrier.wait()
        return out

    def rank(self, r):
        return RankCollectives(lambda key, value: self._gather(r, key, value), r, self.world)

    def abort(self, reason):
        self.reasons.append(reason)
        self.barrier.abort()

    def close(self):
        pass


def run_rank_threads(shared, fn, timeout=60):
    """fn(rank) on one thread per rank of `shared` (a ThreadCollectives; threads named rank0,
    rank1, ...); returns the results in rank order. A rank that raises breaks the others'
    collectives (their barrier aborts); the first exception is re-raised."""
    results, errors = [None] * shared.world, []

    def main(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            shared.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,), name=f"rank{r}") for r in range(shared.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    return results


class FileCollectives(RankCollectives):
    """This process's rank, exchanging arrays as .npy files in `directory` (call k of rank r writes
    k.r.npy and waits for every rank's k.*.npy). Also the communicator run_process wants: made by
    FileCollectives.factory(directory)(device, env, unique_id, timeout)."""

    def __init__(self, directory, rank, world, timeout=60.0):
        super().__init__(self._files_gather, rank, world)
        self.dir, self.timeout, self.k = Path(directory), float(timeout), 0
        self.reason = None

    @classmethod
    def factory(cls, directory):
        return lambda device, env, unique_id, timeout: cls(directory, env.rank, env.world_size)

    @property
    def aborted(self):
        return self.reason is not None

    def wait_ready(self):
        self.dir.mkdir(parents=True, exist_ok=True)

    def rank(self, r):
        return self

    def abort(self, reason):
        self.reason = self.reason or reason

    def close(self):
        pass

    def _files_gather(self, key, value):
        k, self.k = self.k, self.k + 1
        tmp = self.dir / f".{k}.{self.me}.tmp.npy"
        np.save(tmp, np.asarray(value))
        os.replace(tmp, self.dir / f"{k}.{self.me}.npy")
        (self.dir / f"{k - 2}.{self.me}.npy").unlink(missing_ok=True)  # every rank has read call k - 2
        deadline = time.monotonic() + self.timeout
        paths = [self.dir / f"{k}.{r}.npy" for r in range(self.world)]
        while not all(p.exists() for p in paths):
            if self.reason is not None:
                raise RuntimeError(f"all_reduce: the communicator was aborted: {self.reason}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"collective {k} {key}: not every rank arrived within {self.timeout:g} s")
            time.sleep(0.001)
        return [np.load(p) for p in paths]


def listed(tensors):
    return [tensors] if isinstance(tensors, xtrain.Tensor) else list(tensors)


def _host(t):
    """A float32 (or the tensor's integer dtype) host copy."""
    return np.array(t.numpy(), copy=True)


def _write(t, values):
    with xtrain.no_grad():
        t.copy_(xtrain.tensor(np.ascontiguousarray(values).reshape(tuple(t.shape)), dtype=t.dtype))
