"""Data-parallel training: one Python process with a thread per GPU (launch), or one process per
GPU started by torchrun, srun or mpirun (run_process); both give fn the same context.

    def work(ctx):                                    # runs once per GPU, each in its own thread
        model = TinyTransformer(config, device=ctx.device)
        broadcast_parameters(model.parameters(), ctx)  # every rank starts from rank 0's weights
        for step in range(steps):
            ctx.check()                                # stop promptly when another rank failed
            _, loss = model(*batch_for(ctx.rank))
            loss.backward()
            all_reduce_gradients(model.parameters(), ctx)   # average: every rank steps alike
            ...
    results = launch(work, devices="all")             # [work(ctx) of rank 0, of rank 1, ...]

Design (docs/distributed.md has the why):
- launch() creates one NCCL communicator for all the devices (xtrain._C.dist.Communicator), starts
  one thread per device, makes that device the thread's current one (xtrain.cuda.set_device) and
  calls fn(ctx). Every op releases the GIL while it runs, and each (thread, device) pair has its
  own stream and cuBLAS handle, so the GPUs run side by side; Python itself runs one thread at a
  time, which only costs what the host spends between launches.
- Collectives run on the rank's stream, asynchronously: all_reduce_gradients is one NCCL launch
  for all the gradients (large ones reduced in place, small ones packed into one buffer).
  DataParallelAdamW is the training loop's step: gradients born in one flat buffer, then
  reduce-scatter, clip and AdamW on each rank's chunk, all-gather (ZeRO stage 1).
- Failure: when fn raises on one rank, launch() sets a shared stop flag (ctx.check() raises
  RankStopped on the other ranks) and aborts the communicator, so a rank blocked in NCCL, or on
  a stream waiting for NCCL, returns; every thread is joined with a timeout and launch() raises
  the original exception. A collective that never completes (a rank gone, mismatched calls)
  aborts the communicator after `timeout` seconds (the communicator's watchdog), so nothing
  waits forever.
- Each rank synchronises its device before its thread ends, so tensors fn returns are complete
  when launch() returns them.

Process per GPU (run_process, docs/distributed.md "Process per GPU"): the launcher's environment
(xtrain.launch.env) gives the rank; the ranks meet through xtrain.launch.rendezvous (TCP at MASTER_ADDR,
a shared file, or MPI), which brings rank 0's NCCL unique id to every process and then watches
them: each process builds a one-rank communicator (_C.dist.Communicator.join) and fn gets a
ProcessContext, with RankContext's interface. A rank that dies, hangs or raises makes every other
process abort its communicator and stop, with a message naming it.

`xtrain train --devices N` runs xtrain.trainer.train's one training loop on every rank
(xtrain.trainer.train.train_data_parallel), `torchrun ... -m xtrain train` on every process
(xtrain.trainer.train.train_processes), with rank-disjoint data, averaged gradients and rank 0 alone
writing logs, checkpoints, the plot and the sample.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

import xtrain
from xtrain import _C
from xtrain.launch import rendezvous
from xtrain.optim import step_guard
from xtrain.launch.rendezvous import RankStopped

# A collective unfinished this long after it was queued aborts every rank (PyTorch's default).
# Longer than anything a healthy run waits for: rank 0 writing a checkpoint while the other ranks
# already wait in the next step's all-reduce.
DEFAULT_TIMEOUT = 600.0
# After a rank failed, how long launch() waits for the others to stop before it gives up on them.
# They stop at their next ctx.check() or NCCL call, which the abort makes fail at once.
DEFAULT_STOP_TIMEOUT = 30.0
# Process per GPU: when this rank's communicator fails, how long to wait for the rendezvous to
# name a peer that failed first (its death reaches NCCL and the connection at about the same time).
PEER_GRACE = 2.0


class _Collectives:
    """A rank context's collectives, on its communicator handle `self.comm` (asynchronous, on the
    rank's stream)."""

    def all_reduce(self, tensors, op: str = "avg") -> None:
        """In-place all-reduce of float32/bf16 tensors on this rank's device (asynchronous)."""
        self.comm.all_reduce(_as_list(tensors), op)

    def broadcast(self, tensors, root: int = 0) -> None:
        self.comm.broadcast(_as_list(tensors), root)

    def barrier(self) -> None:
        """Sync point: returns once every rank got here."""
        self.comm.barrier()


@dataclass
class RankContext(_Collectives):
    """What fn(ctx) gets on each rank's thread."""
    rank: int
    world_size: int
    device: str                       # "cuda:N", already this thread's current device
    comm: Any                         # xtrain._C.dist.RankComm: this rank's collectives
    _launch: "_Launch" = field(repr=False)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs, evaluates output and saves."""
        return self.rank == 0

    @property
    def devices(self) -> list:
        """The GPU indices of every rank, in rank order."""
        return list(self._launch.devices)

    def describe(self) -> str:
        return f"{self.world_size} GPUs ({', '.join(f'cuda:{d}' for d in self.devices)})"

    def should_stop(self) -> bool:
        return self._launch.stop.is_set()

    def check(self) -> None:
        """Raise RankStopped when another rank has failed (call it between steps)."""
        if self._launch.stop.is_set():
            origin = self._launch.origin
            raise RankStopped(f"rank {self.rank} stopped because rank {origin} failed"
                              if origin is not None else f"rank {self.rank} stopped")

    def exchange(self, key: str, value) -> list:
        """Every rank passes its `value` under `key`; returns all ranks' values in rank order, once
        every rank has called it (a barrier). The ranks share one process, so this is a shared
        list, not a collective over the data; rank 0 uses it, e.g., to save every rank's RNG."""
        shared = self._launch.shared
        # Rounds: the k-th call with `key` on every rank meets in slot (key, k), so a rank that
        # is already at its next call cannot overwrite a value another rank has yet to read.
        # Round k - 2 is dropped here: every rank passed barrier k - 1, so all have read it.
        k = shared.get((key, "round", self.rank), 0)
        shared[(key, "round", self.rank)] = k + 1
        slot = shared.setdefault((key, k), [None] * self.world_size)
        shared.pop((key, k - 2), None)
        slot[self.rank] = value
        self.barrier()
        return list(slot)


class LocalContext:
    """The context of a single-device run: rank 0 of 1, whose collectives do nothing, so the
    training loop (xtrain.trainer.train) treats one device as a group of one."""
    rank = 0
    world_size = 1
    is_main = True
    owns_process = True

    def __init__(self, device: str):
        self.device = device

    def describe(self) -> str:
        return self.device

    def check(self) -> None:
        pass

    def all_reduce(self, tensors, op: str = "avg") -> None:
        pass

    def broadcast(self, tensors, root: int = 0) -> None:
        pass

    def exchange(self, key: str, value) -> list:
        return [value]


class ProcessContext(_Collectives):
    """RankContext's interface for one process of a process group (torchrun, srun, mpirun): this
    process is rank `rank` and drives one GPU; the collectives go through its one-rank NCCL
    communicator, exchange() and the failure watch through its rendezvous channel."""
    owns_process = True     # the process's generators are this rank's alone (resume restores them)

    def __init__(self, env, device: str, comm, channel, hosts: list | None = None):
        self.env, self.device, self.comm, self.channel = env, device, comm, channel
        self.rank, self.world_size = env.rank, env.world_size
        self.hosts = hosts or []   # "host cuda:N" of every rank, in rank order

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def devices(self) -> list:
        """Where every rank runs, in rank order ("host cuda:N")."""
        return list(self.hosts)

    def describe(self) -> str:
        nodes = len({h.rsplit(" ", 1)[0] for h in self.hosts}) or 1
        return (f"{self.world_size} processes ({self.env.launcher}, {nodes} machine{'s' * (nodes > 1)}; "
                f"rank {self.rank} on {self.device})")

    def should_stop(self) -> bool:
        return self.channel.failure is not None

    def check(self) -> None:
        """Raise RankStopped when another rank has failed (call it between steps)."""
        self.channel.check()

    def exchange(self, key: str, value, timeout: float | None = None) -> list:
        """Every rank's `value` under `key`, in rank order, through the rendezvous connection (a
        collective). Values travel as JSON: numbers, strings, lists, dicts; tuples come back as
        lists. timeout: how long to wait for the slowest rank (default: the collective timeout;
        math.inf to wait as long as every rank is alive)."""
        return self.channel.exchange(key, value, timeout)


def run_process(fn: Callable[[ProcessContext], Any], env=None, *, rendezvous_method: str | None = None,
                timeout: float = DEFAULT_TIMEOUT, device: str | None = None, communicator=None,
                unique_id: Callable[[], bytes] | None = None):
    """Run fn(ctx) as this process's rank of a process group; returns what fn returns.

    env: the launch (xtrain.launch.env.detect() by default); rendezvous_method: tcp, tcp:HOST:PORT,
    file:PATH or mpi (default: the launcher's, LaunchEnv.default_rendezvous). timeout: seconds a
    collective may stay unfinished (and the communicator take to connect, and exchange() wait).
    device, communicator and unique_id replace the GPU, the NCCL communicator and its id (tests run
    the rendezvous on the CPU with stand-ins): communicator(device, env, id, timeout) returns an
    object with rank(r), wait_ready(), abort(reason), close() and `aborted`; rank 0's unique_id()
    is the id every rank receives.

    If fn raises, the other ranks are told (and stop, raising RankStopped that names this rank),
    this process's communicator is aborted and the exception propagates. If another rank fails
    first, this rank's communicator is aborted at once and RankStopped is raised here."""
    from xtrain.launch import env as launch_env

    env = env if env is not None else launch_env.detect()
    if env is None:
        raise RuntimeError("run_process: no launcher environment (torchrun, srun or mpirun) is set")
    method = rendezvous_method or env.default_rendezvous()
    if communicator is None:
        require_available("xtrain.launch.distributed.run_process")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (docs/distributed.md)
        index = pick_device(env)
        xtrain.cuda.set_device(index)
        device = f"cuda:{index}"
        communicator, unique_id = _nccl_communicator, _C.dist.unique_id
    channel, uid = rendezvous.join(env, method, payload=(unique_id or bytes)() if env.rank == 0 else None)
    channel.wait_timeout = float(timeout)
    comm = None
    try:
        comm = communicator(device, env, uid, float(timeout))
        channel.on_failure(lambda origin, reason: comm.abort(f"rank {origin} failed: {reason}"))
        comm.wait_ready()
        hosts = channel.exchange("hosts", f"{socket.gethostname()} {device}")
        ctx = ProcessContext(env, device, comm.rank(env.rank), channel, hosts)
        result = fn(ctx)
        if device.startswith("cuda"):
            xtrain.cuda.synchronize(device)  # sync point: what fn returns is complete
        comm.close()
        channel.finish()  # every rank done (or RankStopped: one failed at the end)
        return result
    except BaseException as e:
        if channel.failure is None and getattr(comm, "aborted", False):
            # The communicator failed, perhaps because a peer died: let the watch say who, first.
            deadline = time.monotonic() + PEER_GRACE
            while channel.failure is None and time.monotonic() < deadline:
                time.sleep(0.05)
        failure = channel.failure
        if failure is None or failure.origin == env.rank:
            channel.report_failure(f"{type(e).__name__}: {_first_line(e)}")
        if comm is not None:
            comm.abort(f"rank {env.rank} failed: {type(e).__name__}: {_first_line(e)}")
        failure = channel.failure
        if failure.origin != env.rank and not isinstance(e, RankStopped):
            raise RankStopped(f"rank {env.rank} stopped because rank {failure.origin} failed: "
                              f"{failure.reason}") from e
        raise
    finally:
        channel.close()


def pick_device(env, available: int | None = None) -> int:
    """The GPU of this process: the only one it sees (a launcher that gives each rank one, e.g.
    srun --gpus-per-task or CUDA_VISIBLE_DEVICES), else the one at its local rank."""
    available = xtrain.cuda.device_count() if available is None else available
    if available == 0:
        raise RuntimeError(f"rank {env.rank}: no CUDA device is visible to this process")
    if available == 1:
        return 0
    if env.local_rank >= available:
        raise RuntimeError(f"rank {env.rank} is local rank {env.local_rank} on its machine, but this process "
                           f"sees {available} GPUs (cuda:0..{available - 1}): start at most {available} ranks "
                           f"per machine")
    return env.local_rank


def _nccl_communicator(device: str, env, unique_id: bytes, timeout: float):
    return _C.dist.Communicator.join(int(device.split(":")[1]), env.world_size, env.rank, unique_id, timeout)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---- launching

def is_available() -> bool:
    """True when launch() can run here: an NCCL build and at least one visible GPU."""
    return bool(_C.dist.is_available()) and xtrain.cuda.is_available()


def resolve_devices(devices, available: int | None = None) -> list[int]:
    """"all" -> every visible GPU; N (int) -> the first N; a sequence of indices or "cuda:N"
    strings -> those. `available` is the number of visible GPUs (default: xtrain.cuda's count)."""
    if available is None:
        available = xtrain.cuda.device_count()
    if isinstance(devices, str) and devices.strip().lower() == "all":
        if available == 0:
            raise RuntimeError("devices='all' but no CUDA device is visible")
        return list(range(available))
    if isinstance(devices, bool):
        raise TypeError(f"devices must be 'all', an int or a list of device indices, got {devices!r}")
    if isinstance(devices, int):
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        if devices > available:
            raise RuntimeError(f"{devices} GPUs requested but {available} visible")
        return list(range(devices))
    if isinstance(devices, str) or not isinstance(devices, Sequence) or not devices:
        raise TypeError(f"devices must be 'all', an int or a non-empty list of device indices, "
                        f"got {devices!r}")
    out = []
    for d in devices:
        if isinstance(d, str) and d.startswith("cuda:"):
            d = d[len("cuda:"):]
        try:
            idx = int(d)
        except (TypeError, ValueError):
            raise TypeError(f"devices: {d!r} is not a device index or 'cuda:N'") from None
        if not 0 <= idx < available:
            raise RuntimeError(f"devices: cuda:{idx} requested but {available} GPU(s) visible")
        if idx in out:
            raise ValueError(f"devices: cuda:{idx} appears twice (one rank per GPU)")
        out.append(idx)
    return out


def launch(fn: Callable[[RankContext], Any], devices="all", *, timeout: float = DEFAULT_TIMEOUT,
           stop_timeout: float = DEFAULT_STOP_TIMEOUT) -> list:
    """Run fn(ctx) on one thread per GPU; return [result of rank 0, rank 1, ...].

    If any rank raises, every rank is stopped (stop flag + communicator abort) and the first
    exception is raised here, with its traceback. `timeout`: seconds a collective may stay
    unfinished before the communicator aborts; `stop_timeout`: seconds to wait for the other
    ranks once one has failed."""
    require_available()
    devs = resolve_devices(devices)
    # NVLink multicast (NVLS) stays off on the shared multi-GPU machines (docs/distributed.md).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    comm = _C.dist.Communicator(devs, float(timeout))
    return _Launch(comm, devs, stop_timeout).run(fn)


def require_available(what: str = "xtrain.launch.distributed.launch") -> None:
    """RuntimeError saying why `what` (launch(), run_process()) cannot run here (no NCCL in this
    build, or no GPU)."""
    if not _C.dist.is_available():
        raise RuntimeError(f"{what}: {_C.dist.UNAVAILABLE_REASON}")
    if not xtrain.cuda.is_available():
        raise RuntimeError(f"{what} needs CUDA GPUs, but none is usable here "
                           f"(xtrain.cuda.is_available() is False: {xtrain.cuda.runtime_info()})")


# Note [Objects of a rank thread]: on a GPU what a rank makes is tied to its thread: the tensors'
# blocks to the thread's stream, a CUDA graph to the stream it was captured on (both stream and
# cuBLAS handle go when the thread ends). Such an object should die on its thread, or at least
# while no rank runs, not in a garbage collection on another rank's thread: a thread started later
# gets the ended one's thread id (the C library reuses it), and a graph that told its capturer by
# that id took the new thread for it and synchronised the ended thread's stream, a handle
# destroyed with it (a segmentation fault inside the collector; a Graph now tells its capturer by
# a serial number that is never reused, csrc/core/cuda/graph.cpp). Objects stay alive past their thread in
# reference cycles, and a rank has more than its own: a frame that a library leaves in a cycle
# (matplotlib's mathtext parser, plotting the loss curve, leaves several) holds every frame below
# it, so the whole run of the rank. Hence: the run releases its graphs on its thread (the
# step's, StepGraphs.close; the one generate() keeps on the model, release_decode), and launch()
# collects what the ranks left in cycles once they have all ended, on the caller's thread, while
# the communicator is still open.


class _Launch:
    """One launch: the threads, the stop flag and what each rank returned or raised. The
    communicator only needs rank(r), abort(reason) and close(), so the failure handling is
    testable without GPUs."""

    def __init__(self, comm, devices: list[int], stop_timeout: float):
        self.comm, self.devices, self.stop_timeout = comm, devices, float(stop_timeout)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.origin: int | None = None       # the rank that failed first
        n = len(devices)
        self.results: list = [None] * n
        self.errors: list[BaseException | None] = [None] * n
        self.shared: dict = {}                # RankContext.exchange's slots

    def run(self, fn) -> list:
        threads = [threading.Thread(target=self._rank_main, args=(fn, r), name=f"xtrain-rank{r}",
                                    daemon=True)  # daemon: a rank that never stops cannot block exit
                   for r in range(len(self.devices))]
        for t in threads:
            t.start()
        try:
            stuck = self._join(threads)
        except BaseException as e:  # KeyboardInterrupt in the caller's thread
            self._fail(None, e)
            stuck = self._join(threads)
            self._add_note(e, stuck)
            raise
        if self.origin is not None:
            err = self.errors[self.origin]
            self._add_note(err, stuck)
            raise err
        gc.collect()  # what the ranks left in reference cycles (Note [Objects of a rank thread])
        self.comm.close()  # every rank finished: orderly teardown
        return self.results

    def _rank_main(self, fn, rank: int) -> None:
        device = self.device_name(self.devices[rank])
        try:
            self.enter_device(self.devices[rank])
            ctx = RankContext(rank, len(self.devices), device, self.comm.rank(rank), self)
            self.results[rank] = fn(ctx)
            self.leave_device(self.devices[rank])  # sync point: results are complete on return
        except BaseException as e:
            self.errors[rank] = e
            self._fail(rank, e)
            try:
                self.leave_device(self.devices[rank])  # after the abort this returns promptly
            except Exception:
                pass

    def device_name(self, index: int) -> str:
        return f"cuda:{index}"

    def enter_device(self, index: int) -> None:
        xtrain.cuda.set_device(index)

    def leave_device(self, index: int) -> None:
        xtrain.cuda.synchronize(f"cuda:{index}")

    def _fail(self, rank: int | None, e: BaseException) -> None:
        with self.lock:
            first = self.origin is None and not self.stop.is_set()
            if first and rank is not None:
                self.origin = rank
            self.stop.set()
        if first:
            who = f"rank {rank} ({'cuda:%d' % self.devices[rank]})" if rank is not None else "the caller"
            self.comm.abort(f"{who} raised {type(e).__name__}: {e}")

    def _join(self, threads) -> list[int]:
        """Wait for every rank; once one failed, wait at most stop_timeout for the rest.
        Returns the ranks still running at the end."""
        deadline = None
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.05)
            if self.stop.is_set() and deadline is None:
                deadline = time.monotonic() + self.stop_timeout
            if deadline is not None and time.monotonic() > deadline:
                break
        return [r for r, t in enumerate(threads) if t.is_alive()]

    def _add_note(self, err: BaseException, stuck: list[int]) -> None:
        if not hasattr(err, "add_note"):  # Python < 3.11
            return
        if self.origin is not None:
            err.add_note(f"(raised on rank {self.origin}, cuda:{self.devices[self.origin]}, "
                         f"of {len(self.devices)}; the other ranks were stopped)")
        if stuck:
            err.add_note(f"ranks {stuck} did not stop within {self.stop_timeout:g} s and were left "
                         f"running as daemon threads")


# ---- helpers for the training step

def broadcast_parameters(params, ctx: RankContext, root: int = 0) -> None:
    """Overwrite every rank's parameters with rank `root`'s (once, before training)."""
    params = list(params)
    if not params:
        raise ValueError("broadcast_parameters: no parameters")
    ctx.comm.broadcast(params, root)


def all_reduce_gradients(params, ctx: RankContext, extra=()) -> None:
    """Average the gradients of `params` over the ranks, in place, in one NCCL launch. `extra`:
    more float32/bf16 tensors to average in the same launch (the step's detached loss, say).
    Every parameter needs a gradient: ranks must reduce the same list."""
    grads = []
    for i, p in enumerate(params):
        g = p.grad
        if g is None:
            raise ValueError(f"all_reduce_gradients: parameter {i} (shape {tuple(p.shape)}) has no "
                             f"gradient on rank {ctx.rank}; every rank must reduce the same tensors")
        grads.append(g)
    ctx.comm.all_reduce(grads + list(extra), "avg")


# Gradient bucket size for the overlapped reduction (PyTorch DDP's default): about one dim768
# layer, large enough for full NVLink bandwidth per launch, small enough that the first bucket
# starts early in the backward.
DEFAULT_BUCKET_MB = 25.0


class GradientReducer:
    """Averages the gradients of `params` over the ranks while backward runs.

        reducer = GradientReducer(model.parameters(), ctx)
        for step ...:
            _, loss = model(x, y)
            reducer.backward(loss, extra=[loss.detach()])   # backward + all-reduce, overlapped
            clip_grad_norm_(...); opt.step(); opt.zero_grad()

    The parameters are grouped into buckets of about `bucket_mb` MB in reverse order (backward
    finishes the last layers first); as soon as every gradient of the next bucket is final, the
    tape's gradient-ready hook queues that bucket's all-reduce on a second stream of the rank, so
    it overlaps the backward of the earlier layers. Small tensors (norm weights) and `extra` are
    averaged in one packed launch at the end. The result is what all_reduce_gradients gives after
    backward; only the timing differs. No host waits: the rank's stream is ordered after the side
    stream, so clipping and the optimizer see the averaged gradients."""

    def __init__(self, params, ctx: RankContext, bucket_mb: float = DEFAULT_BUCKET_MB):
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be positive, got {bucket_mb}")
        self.params = list(params)
        if not self.params:
            raise ValueError("GradientReducer: no parameters")
        self._native = _C.dist.GradReducer(ctx.comm, self.params, int(bucket_mb * 2**20))

    @property
    def num_buckets(self) -> int:
        return self._native.num_buckets

    @property
    def launched_during_backward(self) -> int:
        """How many buckets the last backward launched before it returned (the overlapped ones)."""
        return self._native.launched_during_backward

    def backward(self, loss, extra=()) -> None:
        """loss.backward(), with each bucket's average launched as soon as it is ready, then the
        rest and `extra` (float32/bf16 tensors, the detached loss say) averaged in place."""
        self._native.arm()
        try:
            loss.backward()
        except BaseException:
            self._native.disarm()
            raise
        self._native.finish(_as_list(extra))


class DataParallelAdamW:
    """The optimizer step of data-parallel training on the parameter store's flat buffers:
    gradient average, global-norm clipping and AdamW, with one collective for all the gradients.

        model = TinyTransformer(config, device=ctx.device)      # parameters in model.store
        opt = AdamW(model.named_parameters(), ...)               # moments in the store's layout
        dp = DataParallelAdamW(opt, ctx)
        for step ...:
            _, loss = model(x, y)
            loss.backward()                                      # gradients land in store.grads
            norm = dp.step(max_norm=1.0, extra=[loss.detach()])  # average, clip, AdamW, zero grads
        dp.gather_state()    # every rank, before reading the weights or the optimizer's moments

    shard=True (ZeRO stage 1, the default): the gradients are reduce-scattered (averaged) rather
    than all-reduced, so each rank holds the average of its 1/N chunk of every region only (the
    store pads its regions so they split evenly, xtrain.store.SHARD_MULTIPLE); each rank clips
    (the global norm: its chunks' sum of squares, all-reduced as one scalar) and runs AdamW on its
    chunks, then the updated weights are all-gathered. Per element this is the arithmetic of the
    unsharded step, so the same bits (the global norm is summed in another order, which can move
    the clipping factor by an ulp). With a bf16 model the ranks gather the bf16 compute copies of
    the Linear weights instead of their float32 values: each rank casts its updated chunk (the
    kernel the store's own cast runs, so the same bits) and the all-gather moves half the bytes;
    the store marks the copies current, and its float32 Linear weights are then current only in
    this rank's chunk until gather_state() (the store refuses to re-cast from them meanwhile). A
    store that casts on use (the lean presets) is switched to the flat copies for this.
    Each rank keeps the AdamW moments of its chunks only (AdamW.keep_moments: 1/N of the moments'
    memory); gather_state() gathers a full copy to the host for a checkpoint, and a loaded state
    (AdamW.load_state_dict) gives each rank its chunks.

    shard=False: one all-reduce of the whole gradient buffer, then clipping and AdamW over all of
    it on every rank (the optimizer's own step)."""

    def __init__(self, optimizer, ctx: RankContext, shard: bool = True):
        store = optimizer.store
        if store is None:
            raise ValueError("DataParallelAdamW needs an AdamW over every parameter of one ParamStore, in its "
                             "order (e.g. AdamW(model.named_parameters()) of a TinyTransformer)")
        self.opt, self.ctx, self.shard, self.store = optimizer, ctx, bool(shard), store
        store.use_flat_grads()  # the collectives reduce one buffer
        self._region_grads = store.region_views(store.grads)
        self._region_params = store.region_views(store.params)
        # This rank's chunk of each region, the gradient views over them, and the AdamW ranges in them.
        self.chunks = []
        if self.shard:
            try:
                self.chunks = store.chunks(ctx.rank, ctx.world_size)
            except ValueError as e:
                raise ValueError(f"DataParallelAdamW: {e}") from None
        self.grad_chunks = [store.grads._storage_view(lo, (hi - lo,)) for lo, hi in self.chunks]
        self._runs = [run for lo, hi in self.chunks for run in optimizer.runs(lo, hi)]
        self._cast = bool(store.compute_dtype is not None and self.shard and store.regions[0].used)
        if self._cast:  # the ranks gather the bf16 copies the forward then uses (not cast on use)
            store.use_compute_copies()
        if self.shard:  # ZeRO-1: this rank's moments only (already so for AdamW(..., shard=(rank, world)))
            optimizer.keep_moments(self.chunks)

    def step(self, max_norm: float | None, extra=(), guard=None, prepared: bool = False,
             zero_grad: bool = True):
        """Average the gradients over the ranks, clip them to `max_norm` (None or <= 0: no clip),
        update the parameters and clear the gradients. `extra`: float32/bf16 tensors (the step's
        detached loss) averaged in the same launch. guard: a scalar tensor (the loss, once averaged
        as one of `extra`): the update is skipped on every rank when it or the global norm is not
        finite (AdamW.step's guard). prepared: AdamW.prepare_step() already advanced the step count
        and wrote its constants to the device (the step captured into a CUDA graph,
        xtrain.graphs.StepGraphs). zero_grad=False leaves the gradients set (the capture: the
        gradients must still be there should the step have to run eagerly after all). Returns the
        global gradient norm before clipping (a device scalar; no host sync)."""
        opt, store, comm = self.opt, self.store, self.ctx.comm
        missing = store.sync_grads()
        if missing:
            raise ValueError(f"DataParallelAdamW.step: parameter {missing[0]} has no gradient on rank "
                             f"{self.ctx.rank}; every rank must reduce every parameter")
        extra = _as_list(extra)
        if not self.shard:
            comm.all_reduce([store.grads, *extra], "avg")
            norm = opt.clip_and_step(max_norm, guard, prepared=prepared)
            if zero_grad:
                opt.zero_grad(set_to_none=True)
            return norm
        comm.reduce_scatter(self._region_grads, "avg", extra)
        norm = _C.optim.global_norm(self.grad_chunks)
        if self.ctx.world_size > 1:  # the global norm from every rank's sum of squares
            sq = xtrain.ops.mul(norm, norm)
            comm.all_reduce([sq], "sum")
            norm = xtrain.ops.sqrt(sq)
        clip = (norm, float(max_norm)) if max_norm is not None and max_norm > 0 else (None, 0.0)
        opt.begin_step(prepared)  # AdamW reads the chunk's gradients clipped (one pass: no clip kernel)
        opt._step_flat(store.params, store.grads, self._runs, step_guard(norm, guard), clip)
        if self._cast:
            lo, hi = self.chunks[0]  # region 0: the Linear weights, gathered as their bf16 copies
            store.compute_region_chunk(lo, hi).copy_(store.params._storage_view(lo, (hi - lo,)))
            comm.all_gather([store.compute, *self._region_params[1:]])
            store.mark_compute_current(partial=True)
        else:
            comm.all_gather(self._region_params)
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        return norm

    def replayed(self) -> None:
        """After a replay of the captured step (xtrain.graphs.StepGraphs): the moments changed
        without the host seeing it (a gathered copy is stale), and the watchdog times the replay's
        collectives, which the capture did not track."""
        self.opt._gathered = None
        self.ctx.comm.note_replay()

    def gather_state(self, root: int | None = None) -> None:
        """Make the weights complete on every rank and bring a full copy of the moments to the host
        of rank `root` (None: of every rank), where the optimizer's moment_arrays() and state_dict()
        read it until the next step. A collective: call it on every rank before reading the weights
        (a checkpoint, a comparison) or the moments. No-op when unsharded.

        Sync point (the moments come to the host). Each moment is gathered in turn into a
        temporary full-size buffer, so a checkpoint needs one moment's worth of memory for a moment."""
        if not self.shard:
            return
        comm, opt = self.ctx.comm, self.opt
        if self._cast:
            comm.all_gather([self._region_params[0]])  # the float32 Linear weights
            self.store.mark_compute_current(partial=False)
        hosts = []
        for which in ("exp_avg", "exp_avg_sq"):
            full = opt.full_moment(which)
            comm.all_gather(self.store.region_views(full))
            hosts.append(np.array(full.numpy(), dtype=np.float32) if root in (None, self.ctx.rank) else None)
            del full
        opt.set_gathered(*hosts)


class DataParallelMuon:
    """The optimizer step of data-parallel training with Muon (xtrain.optim.Muon over every
    parameter of the model's store): the gradients (and `extra`) averaged by one all-reduce of the
    flat gradient buffer; on every rank the global norm, the guard and AdamW's part; Muon's
    matrices split among the ranks, each rank orthogonalising and updating its share (whole
    matrices: shares(), a fixed function of the shapes, balanced by Newton-Schulz FLOPs); then
    each rank's updated matrices broadcast from it (one broadcast per rank). Per matrix this is
    the arithmetic of one device's step (its Newton-Schulz GEMMs batched with fewer matrices of
    its shape: on the CPU the same bits, each batch entry being one BLAS call).

    AdamW's part (embeddings, head, norms, biases) is split too: each rank updates its share of
    those parameters' elements (AdamW.share_chunks: consecutive pieces of nearly equal size) and
    sends it with its matrices, in the same broadcast. Per element this is one device's AdamW
    arithmetic, so the same bits.

    ZeRO-1 for the whole state: each rank keeps the momentum buffers of its own matrices
    (Muon.keep_momentum) and AdamW's two moments of its share of the other parameters
    (AdamW.keep_moments) only: about 1/N of each; already so for Muon(..., shard=(rank,
    world_size)), which never holds the rest. gather_state() brings a full copy of both to the
    host for a checkpoint (each rank's buffers broadcast from it in turn), and a loaded state
    (Muon.load_state_dict) gives each rank its share. The interface is DataParallelAdamW's (step,
    replayed, gather_state), so the training loop and its CUDA graphs drive either;
    --no-shard-optimizer changes nothing here (the gradients are always all-reduced, the state
    always sharded)."""

    def __init__(self, optimizer, ctx: RankContext):
        store = optimizer.store
        if store is None:
            raise ValueError("DataParallelMuon needs a Muon over every parameter of one ParamStore, in its order")
        self.opt, self.ctx, self.store = optimizer, ctx, store
        store.use_flat_grads()  # the collectives reduce one buffer
        self._cast = False  # the weights are complete on every rank after a step (graphs.StepGraphs reads it)
        owners = self.shares(optimizer, ctx.world_size)
        self._by_rank = [[i for i in optimizer.matrices if owners[i] == r] for r in range(ctx.world_size)]
        adamw = optimizer.adamw
        # Each rank's share of AdamW's part ([(lo, hi)] of the store's layout; one rank: none split).
        self._adamw_by_rank = [adamw.share_chunks(r, ctx.world_size) if ctx.world_size > 1 else []
                               for r in range(ctx.world_size)]
        try:
            optimizer.keep_momentum(self._by_rank[ctx.rank])
            if ctx.world_size > 1 and adamw.updated:
                adamw.keep_moments(self._adamw_by_rank[ctx.rank])
        except ValueError as e:
            raise ValueError(f"DataParallelMuon (rank {ctx.rank} of {ctx.world_size}): {e}") from None
        weights = store.views(store.params)
        # What each rank sends after its update: its matrices and its share of AdamW's part.
        self._sent = [[weights[i] for i in idx] + [store.params._storage_view(lo, (hi - lo,)) for lo, hi in chunks]
                      for idx, chunks in zip(self._by_rank, self._adamw_by_rank)]

    @staticmethod
    def shares(optimizer, world_size: int) -> dict:
        """{parameter index: owning rank} for Muon's matrices (Muon.shares: whole matrices,
        balanced by Newton-Schulz FLOPs, a function of the shapes)."""
        return optimizer.shares(world_size)

    def step(self, max_norm: float | None, extra=(), guard=None, prepared: bool = False,
             zero_grad: bool = True):
        """Average the gradients, clip, update (this rank's matrices with Muon, its share of the
        other parameters with AdamW), broadcast each rank's updated parameters from it, clear the
        gradients; arguments and result as DataParallelAdamW.step's."""
        opt, store, comm = self.opt, self.store, self.ctx.comm
        missing = store.sync_grads()
        if missing:
            raise ValueError(f"DataParallelMuon.step: parameter {missing[0]} has no gradient on rank "
                             f"{self.ctx.rank}; every rank must reduce every parameter")
        comm.all_reduce([store.grads, *_as_list(extra)], "avg")
        norm = opt.clip_and_step(max_norm, guard, prepared=prepared)
        if self.ctx.world_size > 1:
            for rank, sent in enumerate(self._sent):  # each rank's updated parameters, from it
                if sent:
                    comm.broadcast(sent, rank)
        if zero_grad:
            opt.zero_grad(set_to_none=True)
        return norm

    def replayed(self) -> None:
        """After a replay of the captured step: the optimizer's state changed without the host
        seeing it (a gathered copy is stale), and the watchdog times the replay's collectives."""
        self.opt.set_gathered(None)
        self.opt.adamw.set_gathered(None, None)
        self.ctx.comm.note_replay()

    def gather_state(self, root: int | None = None) -> None:
        """Bring a full copy of the optimizer's state (the matrices' momentum, AdamW's moments of
        the other parameters) to the host of rank `root` (None: of every rank), where the
        optimizer's state_arrays() and state_dict() read it until the next step. A collective:
        every rank calls it. The weights are always complete.

        Sync point (the state comes to the host). Each rank's buffers are broadcast from it in
        turn, into a temporary of their size on the others: a checkpoint needs one rank's share of
        memory for a moment."""
        opt, comm = self.opt, self.ctx.comm
        if self.ctx.world_size == 1:  # every buffer is here
            return
        here = root is None or root == self.ctx.rank
        full = {}
        for rank, idx in enumerate(self._by_rank):
            if not idx:
                continue
            offsets, total = opt.momentum_layout(idx)
            host = self._from_rank(opt.flat_momentum, total, rank, here)
            if here:
                for o, i in zip(offsets, idx):
                    p = opt.params[i]
                    full[i] = host[o:o + p.numel()].reshape(tuple(p.shape))
        opt.set_gathered([(opt.names[i], full[i]) for i in opt.matrices] if here else None)
        adamw = opt.adamw
        if not adamw.sharded:  # no AdamW part
            return
        moments = [np.zeros(self.store.numel, dtype=np.float32) if here else None for _ in range(2)]
        for rank, chunks in enumerate(self._adamw_by_rank):
            total = sum(hi - lo for lo, hi in chunks)
            if not total:
                continue
            for flat, whole in zip((adamw.flat_m, adamw.flat_v), moments):
                host = self._from_rank(flat, total, rank, here)
                if here:
                    base = 0
                    for lo, hi in chunks:  # the rank's chunks lie end to end in its buffers
                        whole[lo:hi] = host[base:base + hi - lo]
                        base += hi - lo
        adamw.set_gathered(*moments)

    def _from_rank(self, mine, total: int, rank: int, here: bool):
        """Rank `rank`'s buffer of `total` float32 elements (`mine` on that rank), broadcast from
        it to every rank; a host copy where `here`, else None."""
        buffer = mine if rank == self.ctx.rank else \
            xtrain.zeros((total,), dtype="float32", device=self.store.params.device)
        self.ctx.comm.broadcast([buffer], rank)
        return np.array(buffer.numpy(), dtype=np.float32) if here else None  # a copy: the buffer lives on


def _as_list(tensors) -> list:
    return [tensors] if isinstance(tensors, xtrain.Tensor) else list(tensors)
