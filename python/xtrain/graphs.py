"""The training step as CUDA graphs: captured once after warm-up, then replayed (docs/training.md,
"CUDA graphs"; the capture facility itself is xtrain.cuda.Graph, docs/cuda.md).

A step is two graphs, replayed in order on the thread's stream:
  1. forward + backward of every micro-batch, from the static input buffers (ids, targets) into
     the gradients (each allocated in the graph's pool as backward makes it, at the addresses
     graph 2 reads; with data parallelism the store's flat gradient slots); its output is the
     step's mean loss (device scalar);
  2. clip + AdamW (AdamW.clip_and_step: the norm, the non-finite guard, the update; with Muon,
     Muon.clip_and_step: AdamW's update of the other parameters and Muon's of the matrices)
     reading the step's constants (learning rate, bias corrections; Muon's decay and learning
     rate) from device memory; its output is the gradient norm.
Between the two the host reads the previous step's loss and norm (the train loop's settle(): a
skipped non-finite step takes its count back before this step's constants are written), then
writes this step's constants (AdamW.prepare_step: one 24-byte host-to-device copy). Before graph
1 the batch is copied into the static buffers (two host-to-device copies from pinned memory).
So a replayed step is the eager step's kernels with the eager step's values, in the eager step's
order: bitwise the same results.

Per-step values a captured kernel would otherwise freeze, and where each comes from:
  - learning rate, AdamW step count / bias corrections: AdamW.hyper_dev, written before graph 2
    (Muon: also Muon.muon_hyper_dev, [1 - lr * wd, lr], by the same prepare_step);
  - the batch: the static ids/targets buffers, written before graph 1;
  - the accumulation seed 1/accum: a constant tensor made once, before the capture;
  - the bf16 weight copies: the cast is captured (forced at capture), so every replay recasts;
  - dropout's Philox (seed, offset): during the capture the device's default generator is in
    capture mode (Note [Random draws in captured graphs], core/generator.h), so the captured
    kernels add their offsets to two device words; before graph 1 the host writes the
    generator's (seed, offset) into them (a 16-byte host-to-device copy, only when the step draws)
    and advances the generator by the step's draws, as an eager step would;
  - the loss/norm log read: read_async of the graphs' output tensors after the replay (their
    addresses are fixed), never inside a capture.

Host state the eager step changes and a replay does not, restored by hand: AdamW.step_count
(prepare_step), the leaves' .grad (None after the step, as zero_grad(set_to_none=True) leaves
it), and the store's record of which float32 weights its bf16 copies were cast from (set stale
after each replay, so an eager forward such as evaluation recasts; sharded data parallel with
bf16 copies: marked current, the update graph having gathered them).

Falls back to the eager step, saying why, when: the device is not CUDA, graphs are switched off,
the batch shape differs from the captured one (that step only), or the capture fails, on this
rank or (data parallel) on another (for the rest of the run).
"""

from __future__ import annotations

import numpy as np

import xtrain

# Eager steps before the capture: the first creates the cuBLAS handle and its workspace, the
# optimizer's moments and the allocator's blocks; the second runs in steady state.
WARMUP_STEPS = 2


def _no_note(message: str) -> None:
    """A closed StepGraphs' note (it says nothing more)."""


def graph_blockers(device: str) -> str | None:
    """Why the training step on `device` cannot be captured, or None when it can."""
    if not str(device).startswith("cuda"):
        return "not a CUDA device"
    if not xtrain.cuda.is_available():
        return "CUDA is not available"
    return None


def _rows(x, accum: int) -> list:
    """`accum` equal row blocks of x (a device tensor: views, no copy; a numpy array: np.split)."""
    if isinstance(x, xtrain.Tensor):
        rows, seq = x.shape
        b = rows // accum
        return [x._storage_view(i * b * seq, (b, seq)) for i in range(accum)]
    return np.split(x, accum)


def forward_backward(model, x, y, accum: int, seed=None):
    """Forward and backward over `accum` equal micro-batches of the rows of x, y; the gradients
    sum in the leaves' .grad (the first backward writes them, the next add). Returns the mean
    loss, detached, on the device. x, y: int64 (accum x B, S) numpy arrays or device tensors.
    seed: the 1/accum upstream gradient as a device scalar (made here when None)."""
    if accum == 1:
        _, loss = model(x, y)
        loss.backward()
        return loss.detach()
    if seed is None:
        seed = xtrain.tensor(np.float32(1.0 / accum), device=model.device)
    total = None
    for xs, ys in zip(_rows(x, accum), _rows(y, accum)):
        _, loss = model(xs, ys)
        loss.backward_seeded(seed)
        total = loss.detach() if total is None else xtrain.ops.add(total, loss.detach())
    return xtrain.ops.scale(total, 1.0 / accum)


class StepGraphs:
    """The two graphs of a training step and their static buffers, for one model and optimizer on
    one GPU. step() returns None when the caller must run this step eagerly (warm-up, another
    batch shape, graphs off), else (loss, norm): device scalars at fixed addresses, overwritten
    by the next replay (read them with xtrain.cuda.read_async before the next step).

    Data parallel (dp: xtrain.launch.distributed's DataParallelAdamW or DataParallelMuon): the
    second graph is dp.step (the gradient average, clipping and the update, with their NCCL
    collectives), and every rank captures at the same step (the same warm-up, the same batch
    shapes). Each capture's outcome is agreed over the ranks (dp.ctx.exchange) before anything
    captured runs: NCCL requires a collective to be launched from a graph on every rank or on
    none. A capture that failed on any rank makes every rank run that part of the step eagerly (a
    captured graph is dropped unlaunched; the captured update leaves the gradients set for that),
    and all stay eager after."""

    def __init__(self, model, optimizer, accum: int, max_norm: float | None, *,
                 warmup: int = WARMUP_STEPS, note=print, blocked: str | None = None, dp=None):
        self.model, self.opt, self.accum, self.max_norm = model, optimizer, int(accum), max_norm
        self.dp = dp
        self.warmup, self.note = int(warmup), note
        self.disabled = blocked            # why graphs are off, or None
        self.eager_steps = 0               # eager steps run so far (the warm-up)
        self.shape = None                  # the captured batch shape
        self.fwd = self.upd = None         # xtrain.cuda.Graph: forward+backward, clip+AdamW
        self.x = self.y = self.seed = None  # static inputs
        self.rng = None                    # device words [seed, offset] of the captured draws (dropout)
        self.draws = 0                     # generator counters one replay draws
        self.loss = self.norm = None       # the graphs' outputs
        self._shape_noted = False

    @property
    def active(self) -> bool:
        return self.fwd is not None and self.upd is not None

    @property
    def num_nodes(self) -> int:
        """Nodes (kernel launches, copies, memsets) of one replayed step, 0 before the capture."""
        return (self.fwd.num_nodes + self.upd.num_nodes) if self.active else 0

    @property
    def memsets_as_kernels(self) -> int:
        """Of num_nodes, the captured memsets replayed as kernel nodes (Note [Memset nodes as kernels])."""
        return (self.fwd.memsets_as_kernels + self.upd.memsets_as_kernels) if self.active else 0

    @property
    def replays(self) -> int:
        return self.upd.replays if self.active else 0

    def close(self) -> None:
        """Drop the captured graphs, their buffers and every reference this object holds; any
        later step runs eagerly. Call it on the thread that captured them once the steps are done:
        their memory is bound to that thread's stream, and (data parallel) NCCL keeps a
        communicator alive while a graph holding its collectives exists (destroying the
        communicator waits for those graphs), so the rank's graphs must go before the launcher
        destroys it, not whenever the garbage collector frees them. The model, optimizer, `dp` and
        `note` go too: a `note` that refers to the owner of this object (the training loop's run)
        would otherwise keep the owner, and all it holds, in a reference cycle that only the
        garbage collector frees, later, on whichever thread it happens to run."""
        if self.disabled is None:
            self.disabled = "closed after the run's steps"
        self.fwd = self.upd = None
        self.loss = self.norm = None
        self.x = self.y = self.seed = self.rng = None
        self.model = self.opt = self.dp = None
        self.note = _no_note

    def eager(self) -> None:
        """The caller ran a step eagerly (counts towards the warm-up)."""
        self.eager_steps += 1

    def step(self, x, y, settle=None):
        """One optimizer step through the graphs (capturing them first when the warm-up is done):
        copy the batch in, graph 1, settle(), AdamW.prepare_step(), graph 2. Returns (loss, norm),
        or None when nothing of this step ran and the caller runs it eagerly."""
        if self.disabled is not None:
            return None
        shape = tuple(x.shape)
        if self.active:
            if shape != self.shape:
                if not self._shape_noted:
                    self.note(f"xtrain: a batch of shape {shape} (captured: {self.shape}) runs eagerly")
                    self._shape_noted = True
                return None
            return self._replay(x, y, settle)
        if self.eager_steps < self.warmup:
            return None
        return self._capture(x, y, shape, settle)

    # ---- replay

    def _upload(self, x, y) -> None:
        with xtrain.no_grad():  # into the static buffers, on the stream (pinned staging, no wait)
            for dst, src in ((self.x, x), (self.y, y)):
                if not isinstance(src, xtrain.Tensor):
                    src = xtrain.tensor(np.ascontiguousarray(src, dtype=np.int64), device="cpu")
                dst.copy_(src)

    def _draw(self) -> None:
        """The replay's random draws: the generator's (seed, offset) into the device words the
        captured dropout kernels read, then the generator advanced past them (an eager step draws
        the same counters)."""
        if self.rng is None:
            return
        gen = xtrain.default_generator(self.model.device)
        seed, offset = gen.get_state()
        words = np.array([seed, offset], dtype=np.uint64).view(np.int64)
        with xtrain.no_grad():
            self.rng.copy_(xtrain.tensor(words, device="cpu"))
        gen.set_state((seed, offset + self.draws))

    def _replay(self, x, y, settle):
        self._upload(x, y)
        self._draw()
        self.fwd.replay()
        if settle is not None:
            settle()               # the previous step's values (and its skip) before this update
        self.opt.prepare_step()    # step count + this step's constants into device memory
        self.upd.replay()
        self._weights_changed()
        if self.dp is not None:
            self.dp.replayed()
        return self.loss, self.norm

    def _update(self, loss, prepared: bool):
        """The second graph's work (clip + AdamW; data parallel: with the gradient average)."""
        if self.dp is None:
            return self.opt.clip_and_step(self.max_norm, loss, prepared=prepared)
        return self.dp.step(self.max_norm, extra=[loss], guard=loss, prepared=prepared, zero_grad=not prepared)

    def _agreed(self, stage: str, ok: bool) -> bool:
        """Data parallel: True when every rank's capture of `stage` succeeded (a host exchange,
        every rank calls it); one device: ok."""
        if self.dp is None:
            return ok
        return all(self.dp.ctx.exchange(f"xtrain.graphs:{stage}", bool(ok)))

    def _gathers_copies(self) -> bool:
        """Sharded data parallel with bf16 copies: the update gathers the copies, and the float32
        weights are then current in this rank's chunk only (DataParallelAdamW._cast)."""
        return self.dp is not None and self.dp._cast

    def _weights_changed(self) -> None:
        # The update wrote the float32 weights on the device without the host seeing it. One
        # device: the bf16 copies must be cast again by the next eager forward (the replayed graph
        # always casts). Sharded data parallel with bf16 copies: the update gathered the copies
        # themselves (only this rank's chunk of the float32 weights is current), as an eager
        # step leaves them, whatever gather_state() made of the store's record in between.
        store = getattr(self.model, "store", None)
        if store is None:
            return
        if self._gathers_copies():
            store.mark_compute_current(partial=True)
        else:
            store._compute_version = None

    # ---- capture

    def _capture(self, x, y, shape, settle):
        model, opt = self.model, self.opt
        device = model.device
        index = int(str(device).split(":")[1]) if ":" in str(device) else 0
        stage = "forward and backward"
        gen = xtrain.default_generator(device)
        rng_state = gen.get_state()  # restored when the capture fails: the step then runs eagerly
        try:
            # The warm-up's cached activations go back to the driver, so the graph's pool takes
            # their place instead of adding to them (a sync point, once); first, so the buffers
            # made below get allocations of their own and no cached piece of a large one keeps it
            # from going back (Note [Splitting large blocks], core/allocator.cpp).
            xtrain.cuda.empty_cache(device)
            opt.use_device_hyper()
            if self.x is None:
                self.x = xtrain.zeros(shape, dtype="int64", device=device)
                self.y = xtrain.zeros(shape, dtype="int64", device=device)
                if self.accum > 1:
                    self.seed = xtrain.tensor(np.float32(1.0 / self.accum), device=device)
            self._upload(x, y)
            if self.rng is None:
                self.rng = xtrain.zeros((2,), dtype="int64", device=device)
            self.draws = 0
            self._draw()  # the words this step's draws add to (draws 0: the generator stays)
            opt.zero_grad(set_to_none=True)   # the first backward writes the gradients (=), as eagerly
            store = getattr(model, "store", None)
            if store is not None and not self._gathers_copies():
                store._compute_version = None  # the bf16 cast is part of every replay
            elif store is not None and store._compute_version != store._params_version():
                # sharded bf16: the forward graph reads the copies the update gathers and must not
                # cast (every replay would cast from float32 weights current in one chunk only)
                raise RuntimeError("the bf16 weight copies are not current before the capture")
            fwd = xtrain.cuda.Graph(index)
            gen.begin_capture(self.rng)  # Note [Random draws in captured graphs]
            try:
                with xtrain.cuda.graph(fwd):
                    loss = forward_backward(model, self.x, self.y, self.accum, self.seed)
            finally:
                self.draws = gen.end_capture()
        except Exception as e:  # nothing of this step ran: the caller runs it eagerly
            gen.set_state(rng_state)
            self.rng, self.draws = None, 0
            self._give_up(stage, e)
            self._agreed(stage, False)
            return None
        if not self._agreed(stage, True):  # another rank's capture failed: all run it eagerly
            gen.set_state(rng_state)
            self.rng, self.draws = None, 0
            self._give_up(stage, RuntimeError("another rank's capture failed"))
            return None
        gen.set_state((rng_state[0], rng_state[1] + self.draws))  # past this step's draws, as eagerly
        if self.draws == 0:
            self.rng = None  # nothing to write before a replay
        fwd.replay()
        if settle is not None:
            settle()
        opt.prepare_step()
        stage = "clip + AdamW" if self.dp is None else "gradient average + clip + AdamW"
        failure = None
        try:
            upd = xtrain.cuda.Graph(index, share_pool_with=fwd)
            with xtrain.cuda.graph(upd):
                norm = self._update(loss, prepared=True)
        except Exception as e:
            failure = e
        if not self._agreed(stage, failure is None) and failure is None:
            # NCCL: whether a collective runs from a graph must be the same on every rank, so a
            # graph whose capture succeeded here is dropped unlaunched when another rank's failed
            failure = RuntimeError("another rank's capture failed")
        if failure is not None:
            # forward and backward ran (graph 1): finish the step eagerly, from its gradients
            self._give_up(stage, failure, keep_grads=True)
            # the exception's traceback holds this frame, which holds the exception: a cycle that
            # would keep both graphs (and their pool) alive until a garbage collection
            failure = upd = None
            opt.step_count -= 1
            norm = self._update(loss, prepared=False)
            if self.dp is None:
                opt.zero_grad(set_to_none=True)
            del fwd
            return loss, norm
        upd.replay()
        opt.zero_grad(set_to_none=True)  # host state as after an eager step: .grad is None
        self._weights_changed()
        if self.dp is not None:
            self.dp.replayed()
        self.fwd, self.upd, self.shape, self.loss, self.norm = fwd, upd, shape, loss, norm
        self.note(f"xtrain: CUDA graphs: step captured after {self.eager_steps} eager steps, "
                  f"{self.num_nodes} nodes per replay ({self.memsets_as_kernels} memsets as kernels; graph memory "
                  f"{xtrain.memory_stats(device)['pool_bytes.current'] / 2**20:,.0f} MiB)")
        return loss, norm

    def _give_up(self, stage: str, e: Exception, keep_grads: bool = False) -> None:
        self.disabled = f"capture of the {stage} failed: {type(e).__name__}: {e}"
        if not keep_grads:  # a captured backward set them, but never ran
            self.opt.zero_grad(set_to_none=True)
        store = getattr(self.model, "store", None)
        if store is not None and not store._partial:  # (sharded bf16: the copies are as they were)
            store._compute_version = None
        self.note(f"xtrain: CUDA graphs off, the steps run eagerly ({self.disabled})")
