"""Data-parallel training on the GPUs of one machine: one Python process, one thread per GPU.

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

train_data_parallel(cfg, devices) is `xtrain train --devices N`: the training loop of
xtrain.train on every rank, with rank-disjoint data, averaged gradients and rank 0 alone writing
logs, checkpoints, the plot and the sample.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import xtrain
from xtrain import _C

# A collective unfinished this long after it was queued aborts every rank (PyTorch's default).
# Longer than anything a healthy run waits for: rank 0 writing a checkpoint while the other ranks
# already wait in the next step's all-reduce.
DEFAULT_TIMEOUT = 600.0
# After a rank failed, how long launch() waits for the others to stop before it gives up on them.
# They stop at their next ctx.check() or NCCL call, which the abort makes fail at once.
DEFAULT_STOP_TIMEOUT = 30.0


class RankStopped(RuntimeError):
    """Raised in a rank by ctx.check() when another rank failed and the run is stopping."""


@dataclass
class RankContext:
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

    def should_stop(self) -> bool:
        return self._launch.stop.is_set()

    def check(self) -> None:
        """Raise RankStopped when another rank has failed (call it between steps)."""
        if self._launch.stop.is_set():
            origin = self._launch.origin
            raise RankStopped(f"rank {self.rank} stopped because rank {origin} failed"
                              if origin is not None else f"rank {self.rank} stopped")

    def all_reduce(self, tensors, op: str = "avg") -> None:
        """In-place all-reduce of float32/bf16 tensors on this rank's device (asynchronous)."""
        self.comm.all_reduce(_as_list(tensors), op)

    def broadcast(self, tensors, root: int = 0) -> None:
        self.comm.broadcast(_as_list(tensors), root)

    def barrier(self) -> None:
        """Sync point: returns once every rank got here."""
        self.comm.barrier()

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
    # GPU.md: NVLink multicast (NVLS) must stay off on the shared multi-GPU machines.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    comm = _C.dist.Communicator(devs, float(timeout))
    return _Launch(comm, devs, stop_timeout).run(fn)


def require_available() -> None:
    """RuntimeError saying why launch() cannot run here (no NCCL in this build, or no GPU)."""
    if not _C.dist.is_available():
        raise RuntimeError(f"xtrain.distributed.launch: {_C.dist.UNAVAILABLE_REASON}")
    if not xtrain.cuda.is_available():
        raise RuntimeError("xtrain.distributed.launch needs CUDA GPUs, but none is usable here "
                           f"(xtrain.cuda.is_available() is False: {xtrain.cuda.runtime_info()})")


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
        self.comm.close()  # every rank finished: orderly teardown
        return self.results

    def _rank_main(self, fn, rank: int) -> None:
        device = f"cuda:{self.devices[rank]}"
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


# Offsets in the flat buffers are multiples of this many elements (256 bytes of float32, the
# caching allocator's block alignment), so kernels see parameters as aligned as before.
FLAT_ALIGN = 64


class DataParallelAdamW:
    """The optimizer step of data-parallel training on flat buffers: gradient average, global-norm
    clipping and AdamW, with one collective for all the gradients.

        dp = DataParallelAdamW(optimizer, ctx, model=model)   # after optimizer.load_state_dict
        for step ...:
            _, loss = model(x, y)
            loss.backward()
            norm = dp.step(max_norm=1.0, extra=[loss.detach()])   # average, clip, AdamW, zero grads
        dp.gather_state()    # every rank, before reading the weights or optimizer.state_dict()

    At construction the parameters, their moments and a gradient buffer are laid out in flat
    float32 buffers of one layout (each tensor at a multiple of FLAT_ALIGN elements): the
    parameters and moments are moved there (every holder of them, the model included, then uses
    the flat memory), and each parameter gets a view of the gradient buffer as its grad buffer,
    where backward puts its gradient (a bf16 weight's cast backward writes its float32 gradient
    straight into it; other gradients are copied in).

    shard=True (ZeRO stage 1, the default): the gradients are reduce-scattered (averaged) rather
    than all-reduced, so each rank holds the average of its 1/N chunk only; each rank clips (the
    global norm: its chunk's sum of squares, all-reduced as one scalar) and runs AdamW on its chunk,
    then the updated weights are all-gathered. Per element this is the arithmetic of the unsharded
    step, so the same bits (the global norm is summed in another order, which can move the
    clipping factor by an ulp). AdamW's work per rank is 1/N; the moments stay full-size on every
    rank, but only each rank's chunk is current until gather_state().

    With `model` (a bf16 TinyTransformer) the ranks gather the bf16 copies of the weights the
    forward casts instead of their float32 values: each rank casts its updated chunk (the cast
    kernel the forward runs, so the same bits) and the all-gather moves half the bytes; the model
    takes the gathered copies instead of casting (model.set_cast_cache). Those float32 weights are
    then current only in each rank's own chunk until gather_state() gathers them. Write weights
    only through step(), or call refresh() after writing them (the forward then casts the float32
    weights again, which must then be the same on every rank).

    shard=False: one all-reduce of the whole gradient buffer, then clip and AdamW over all of it on
    every rank (the optimizer's own step)."""

    def __init__(self, optimizer, ctx: RankContext, shard: bool = True, model=None):
        self.opt, self.ctx, self.shard = optimizer, ctx, bool(shard)
        params = optimizer.params
        device = params[0].device
        world, rank = ctx.world_size, ctx.rank
        # Regions of the flat layout, each split into equal chunks (rank r owns chunk r of each):
        # with a cast cache, the weights the model casts (in its cast order), then the rest.
        cast = model.cast_parameters() if (model is not None and self.shard) else []
        index = {p.data_ptr(): i for i, p in enumerate(params)}
        missing = [t for t in cast if t.data_ptr() not in index]
        if missing:
            raise ValueError(f"DataParallelAdamW: the model casts a weight of shape {tuple(missing[0].shape)} "
                             f"that the optimizer does not hold")
        first = [index[t.data_ptr()] for t in cast]
        taken = set(first)
        regions = [r for r in (first, [i for i in range(len(params)) if i not in taken]) if r]
        self.offsets = [0] * len(params)
        self._regions, total = [], 0   # (start, numel) per region
        for members in regions:
            start = total
            for i in members:
                self.offsets[i] = total
                total += -(-params[i].numel() // FLAT_ALIGN) * FLAT_ALIGN
            total = start + -(-(total - start) // (world * FLAT_ALIGN)) * (world * FLAT_ALIGN)
            self._regions.append((start, total - start))
        self.numel = total

        def flat(dtype="float32", n=total):
            return xtrain.zeros((n,), dtype=dtype, device=device)

        self.flat_params, self.flat_grads, self.flat_m, self.flat_v = flat(), flat(), flat(), flat()
        self._views = lambda buf: [buf._storage_view(o, tuple(p.shape)) for o, p in zip(self.offsets, params)]
        for p, dst in zip(params, self._views(self.flat_params)):
            p._move_into(dst)
        self._adopt_moments()
        self._grad_views = self._views(self.flat_grads)
        for p, buf in zip(params, self._grad_views):
            p._grad_buffer = buf
        _C._grads_into_buffers([p for p in params if p.grad is not None])

        def region_views(buf):
            return [buf._storage_view(start, (n,)) for start, n in self._regions]

        self._region_grads, self._region_params = region_views(self.flat_grads), region_views(self.flat_params)
        self._region_moments = region_views(self.flat_m) + region_views(self.flat_v)
        chunks = [(start + rank * (n // world), start + (rank + 1) * (n // world)) for start, n in self._regions]
        self.grad_chunks = [self.flat_grads._storage_view(lo, (hi - lo,)) for lo, hi in chunks]
        # This rank's part of each parameter (and of its gradient and moments), per AdamW group;
        # the norm is summed over the gradient parts in parameter order, as clip_grad_norm_ sums
        # the gradients, so with one rank the two give the same bits.
        decay = set(optimizer.decay)
        self._groups = {True: ([], [], [], []), False: ([], [], [], [])}
        self._grad_parts = []
        for i, (o, p) in enumerate(zip(self.offsets, params)):
            for lo, hi in chunks:
                a, b = max(o, lo), min(o + p.numel(), hi)
                if a >= b:
                    continue
                lists = self._groups[i in decay]
                for lst, buf in zip(lists, (self.flat_params, self.flat_grads, self.flat_m, self.flat_v)):
                    lst.append(buf._storage_view(a, (b - a,)))
                self._grad_parts.append(lists[1][-1])

        # The cast cache: bf16 copies of the cast weights (region 0), gathered after each step.
        self.model, self._cache_valid = None, False
        if cast:
            start, n = self._regions[0]
            lo, hi = chunks[0]
            self.flat_cast = flat("bfloat16", n)
            self._cast_views = [self.flat_cast._storage_view(self.offsets[i] - start, tuple(params[i].shape))
                                for i in first]
            self._cast_chunk = self.flat_cast._storage_view(lo - start, (hi - lo,))
            self._cast_source = self.flat_params._storage_view(lo, (hi - lo,))
            self.model = model
            model.set_cast_cache(self._cached_casts)

    def _cached_casts(self):
        return self._cast_views if self._cache_valid else None

    def _adopt_moments(self) -> None:
        """Move the optimizer's moments into the flat buffers (again after load_state_dict, which
        replaces them)."""
        opt = self.opt
        for moments, buf in ((opt.exp_avg, self.flat_m), (opt.exp_avg_sq, self.flat_v)):
            for t, dst in zip(moments, self._views(buf)):
                t._move_into(dst)
        self._moment_lists = (opt.exp_avg, opt.exp_avg_sq)

    def _check_moments(self) -> None:
        if self._moment_lists[0] is not self.opt.exp_avg or self._moment_lists[1] is not self.opt.exp_avg_sq:
            self._adopt_moments()

    def step(self, max_norm: float | None, extra=()):
        """Average the gradients over the ranks, clip them to `max_norm` (None or <= 0: no clip),
        update the parameters and clear the gradients. `extra`: float32/bf16 tensors (the step's
        detached loss) averaged in the same launch. Returns the global gradient norm before
        clipping (a device scalar; no host sync)."""
        opt, comm = self.opt, self.ctx.comm
        self._check_moments()
        missing = _C._grads_into_buffers(opt.params)
        if missing:
            i = missing[0]
            raise ValueError(f"DataParallelAdamW.step: parameter {opt.names[i]} has no gradient on rank "
                             f"{self.ctx.rank}; every rank must reduce every parameter")
        extra = _as_list(extra)
        clip = max_norm is not None and max_norm > 0
        if not self.shard:
            comm.all_reduce([self.flat_grads, *extra], "avg")
            norm = _C.optim.global_norm(self._grad_views)
            if clip:
                _C.optim.clip_by_norm_([self.flat_grads], norm, float(max_norm))
            opt.step()
            opt.zero_grad(set_to_none=True)
            return norm
        comm.reduce_scatter(self._region_grads, "avg", extra)
        norm = _C.optim.global_norm(self._grad_parts)
        if self.ctx.world_size > 1:  # the global norm from every rank's sum of squares
            sq = xtrain.ops.mul(norm, norm)
            comm.all_reduce([sq], "sum")
            norm = xtrain.ops.sqrt(sq)
        if clip:
            _C.optim.clip_by_norm_(self.grad_chunks, norm, float(max_norm))
        opt.step_count += 1
        b1, b2 = opt.betas
        for decays, (ps, gs, ms, vs) in self._groups.items():
            if ps:
                _C.optim.adamw_step(ps, gs, ms, vs, opt.lr, b1, b2, opt.eps,
                                    opt.weight_decay if decays else 0.0, opt.step_count)
        if self.model is None:
            comm.all_gather(self._region_params)
        else:
            self._cast_chunk.copy_(self._cast_source)  # the forward's cast kernel, on this rank's chunk
            comm.all_gather([self.flat_cast, *self._region_params[1:]])
            self._cache_valid = True
        opt.zero_grad(set_to_none=True)
        return norm

    def gather_state(self) -> None:
        """Make the weights and the moments complete on every rank (each rank's chunks to all); a
        collective: call it on every rank before reading the weights (a checkpoint, a comparison)
        or optimizer.state_dict(). No-op when unsharded."""
        self._check_moments()
        if self.shard:
            flats = list(self._region_moments)
            if self.model is not None:
                flats.append(self._region_params[0])  # the float32 cast weights
            self.ctx.comm.all_gather(flats)

    def refresh(self) -> None:
        """Forget the gathered bf16 copies (after writing the weights other than through step()):
        the forward casts the float32 weights again until the next step()."""
        self._cache_valid = False

    def release(self) -> None:
        """Detach the grad buffers and the model's cast cache (the parameters and moments keep
        living in the flat buffers). With a cast cache, call gather_state() first."""
        for p in self.opt.params:
            p._grad_buffer = None
        if self.model is not None:
            self.model.set_cast_cache(None)
            self.model = None


def _as_list(tensors) -> list:
    return [tensors] if isinstance(tensors, xtrain.Tensor) else list(tensors)


# ---- the training loop on several GPUs (`xtrain train --devices N`)

def train_data_parallel(cfg, devices="all", *, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """xtrain.train.train(cfg) on several GPUs with the same global batch semantics as one GPU:
    each rank takes cfg.batch sequences of every global step (global batch = batch x GPUs),
    gradients are averaged before clipping and AdamW, so every rank holds the same model. The
    data are prepared, the checkpoint read and the generators seeded once, on the calling
    thread, before the rank threads start; every rank then runs the one training loop."""
    from xtrain import state as ckpt_state
    from xtrain import train as single

    devs = resolve_devices(devices)
    if cfg.device not in ("auto", "cuda"):
        raise ValueError(f"--device {cfg.device} picks one device; with --devices the GPUs are "
                         f"cuda:{', cuda:'.join(map(str, devs))}")
    require_available()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_state.load(cfg.resume) if cfg.resume else None
    dataset = single.open_data(cfg.data, out, cfg.vocab_size, cfg.progress)
    single.check_tokenizer(ckpt, dataset)
    if ckpt is None:
        xtrain.manual_seed(cfg.seed)  # process-wide: once, before the rank threads start
    results = launch(lambda ctx: single.train(cfg, ctx=ctx, prepared=(dataset, ckpt)), devs, timeout=timeout)
    return results[0]
