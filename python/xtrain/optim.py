"""AdamW on the fused C++ step, Muon beside it for 2-D matrices, and global-norm gradient
clipping (the LR schedules are the trainer's: xtrain.trainer.schedule).

- AdamW follows torch.optim.AdamW (decoupled weight decay, bias correction) and nanoGPT's grouping:
  tensors with 2 or more dims (linear and embedding weights) decay, the rest (norm weights) do not.
  A step is one call of `_C.optim.adamw_step` with a weight-decay flag per tensor (or per range of
  the store's flats), which updates both groups in one fused launch. Parameters, gradients and both
  moments are float32 on one device.
- Sharded moments (ZeRO-1's memory half): AdamW(..., shard=(rank, world_size)), or keep_moments()
  afterwards (the sharded data-parallel step calls it), keeps the moments of this rank's chunks of
  the store's layout only (1/N of them); the step reads them at their place in the chunk buffers,
  with the same arithmetic. A full copy exists only
  when DataParallelAdamW.gather_state() gathers one for a checkpoint (host arrays, until the next
  step); load_state_dict() takes this rank's chunks of a full state (the scatter of a resume).
- Per-step constants in device memory (use_device_hyper(), for CUDA graphs): each step writes
  the learning rate's and the step count's constants (_C.optim.adamw_consts: decay, step size,
  bias correction; one small host-to-device copy) into a 3-float device buffer that the kernels
  read, instead of taking them as launch arguments, so a captured update replays with the
  current step's values. prepare_step() advances the count and writes them without launching
  (before a replay); step(prepared=True) then launches without doing it again (what a capture
  records). The arithmetic is the same: the kernel reads the same float32 values.
- Muon (torch.optim.Muon's update: Nesterov momentum, Newton-Schulz in bf16 on the engine's
  GEMMs, decoupled decay, adjust_lr_fn) for the matrices it is given, AdamW (only=the rest) for
  the rest, one learning rate and weight decay. Memory: one float32 momentum per matrix element,
  two moments per other element (AdamW over everything: two per element). Its state holds
  "momentum_buffer" beside AdamW's moments, "optimizer": "muon" in the hyper-parameters
  (docs/training.md, "Muon"; docs/state-format.md). Data parallel, Muon(..., shard=(rank,
  world_size)), or keep_momentum() and AdamW.keep_moments(), keeps the momentum of a rank's share
  of the matrices and AdamW's moments of its piece of the other parameters only
  (DataParallelMuon: ZeRO-1's memory half for Muon's state).
- clip_grad_norm_ computes the global L2 norm on the device and scales the gradients by
  min(1, max_norm / (norm + 1e-6)) there too: it returns the norm as a device Tensor and never
  waits for the device (read it with .item() only when logging). A non-finite norm leaves the
  gradients untouched; the step must then be skipped by the caller.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

import xtrain
from xtrain import _C
from xtrain.store import ParamStore


class AdamW:
    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1, shard: tuple[int, int] | None = None,
                 only=None):
        """params: tensors, or (name, tensor) pairs such as model.named_parameters() (names key
        the moments in state_dict; plain tensors are named "0", "1", ...).

        When params are every parameter of one ParamStore, in its order (a TinyTransformer's
        named_parameters()), the moments take the store's layout and a step runs over whole
        regions of the flats; otherwise they live in flat buffers of their own and a step runs
        over the tensors one by one (the same arithmetic per element).

        shard=(rank, world_size): allocate only the moments of that rank's chunks of the store's
        layout, for DataParallelAdamW's sharded step with those ranks (keep_moments, without
        ever holding the full moments). With `only` (Muon's AdamW part, DataParallelMuon): that
        rank's share of the parameters of `only` instead (share_chunks()).

        only: the names of the parameters this AdamW updates and keeps moments for (None: all);
        the others are someone else's (Muon's matrices) and have no moments here. With a store
        the moments of `only` sit in compact buffers, each run of neighbouring parameters of the
        layout at an aligned offset."""
        named = [(str(i), p) if isinstance(p, xtrain.Tensor) else (str(p[0]), p[1])
                 for i, p in enumerate(params)]
        if not named:
            raise ValueError("AdamW got an empty parameter list")
        if len({n for n, _ in named}) != len(named):
            raise ValueError("AdamW parameter names must be unique")
        for n, p in named:
            if p.dtype != "float32":
                raise TypeError(f"AdamW keeps float32 master weights; parameter {n} is {p.dtype}")
            if p.device != named[0][1].device:
                raise ValueError(f"AdamW parameters must share one device: {n} is on {p.device}, "
                                 f"{named[0][0]} on {named[0][1].device}")
        _check_hyper(lr, betas, eps, weight_decay)
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), tuple(map(float, betas)), \
            float(eps), float(weight_decay)
        self.decay = [i for i, p in enumerate(self.params) if len(p.shape) >= 2]
        self.no_decay = [i for i, p in enumerate(self.params) if len(p.shape) < 2]
        self.updated = _indices_of(self.names, only, "AdamW")  # the parameters with moments here
        self.store = _store_of(self.params)
        device = self.params[0].device
        if self.store is not None:
            offsets = [s.offset for s in self.store.slots]
            total = self.store.numel
        else:  # only the updated parameters' moments, one after the other
            offsets, total = [None] * len(self.params), 0
            for i in self.updated:
                offsets[i] = total
                total += -(-self.params[i].numel() // _ALIGN) * _ALIGN
        self.offsets = offsets
        self.step_count = 0
        self.hyper_dev = None      # use_device_hyper(): float32 (6,) on the device, or None
        # Moments of part of the store's layout: [(lo, hi, base)]: store elements [lo, hi) sit at
        # flat_m[base:base + hi - lo]. sharded: those are this data-parallel rank's chunks.
        self.moment_chunks: list | None = None
        self.sharded = False
        self._gathered = None      # (exp_avg, exp_avg_sq) host arrays of the full layout, until a step
        if shard is not None:
            if self.store is None:
                raise ValueError("AdamW(shard=...) needs every parameter of one ParamStore, in its order")
            chunks = self.store.chunks(*shard) if len(self.updated) == len(self.params) else \
                self.share_chunks(*_check_shard(shard, "AdamW"))
            self._shard_layout(chunks, device, sharded=True)
            return
        if self.store is not None and len(self.updated) != len(self.params):
            self._shard_layout(self._cover(self.updated), device)
            return
        self.flat_m = xtrain.zeros((max(total, 1),), dtype="float32", device=device)
        self.flat_v = xtrain.zeros((max(total, 1),), dtype="float32", device=device)
        self.exp_avg, self.exp_avg_sq = ([None if o is None else flat._storage_view(o, tuple(p.shape))
                                          for o, p in zip(offsets, self.params)]
                                         for flat in (self.flat_m, self.flat_v))

    def keep_moments(self, chunks) -> None:
        """Keep only the moments of `chunks` ((lo, hi) element ranges of the store's layout, this
        rank's share in the sharded data-parallel step), with their current values; the full-size
        buffers go. Afterwards the optimizer steps through DataParallelAdamW only."""
        if self.store is None:
            raise ValueError("AdamW.keep_moments needs the moments in a ParamStore's layout")
        chunks = [(int(lo), int(hi)) for lo, hi in chunks]
        if any(not 0 <= lo < hi <= self.store.numel for lo, hi in chunks) or \
                any(a[1] > b[0] for a, b in zip(chunks, chunks[1:])):
            raise ValueError(f"AdamW.keep_moments: chunks {chunks} are not ordered, disjoint ranges of the "
                             f"{self.store.numel} elements")
        if self.sharded:
            if [(lo, hi) for lo, hi, _ in self.moment_chunks] == chunks:
                return
            raise ValueError("AdamW.keep_moments: the moments are already kept for other chunks (another "
                             "rank's share, or another world size)")
        if self.moment_chunks is not None and \
                any(not any(a <= lo and hi <= b for a, b, _ in self.moment_chunks) for lo, hi in chunks):
            raise ValueError("AdamW.keep_moments: with `only`, the chunks must lie within the moments kept here "
                             "(share_chunks())")
        old = (self.flat_m, self.flat_v, self.moment_chunks)
        self._shard_layout(chunks, self.flat_m.device, sharded=True)
        with xtrain.no_grad():
            for flat, was in zip((self.flat_m, self.flat_v), old[:2]):
                for lo, hi, base in self.moment_chunks:
                    flat._storage_view(base, (hi - lo,)).copy_(_chunk_view(was, old[2], lo, hi))

    def share_chunks(self, rank: int, world_size: int) -> list:
        """Rank `rank`'s share of the parameters this AdamW updates, for a data-parallel step that
        all-reduces the gradients and splits the update (DataParallelMuon): the store's ranges that
        hold them (_cover) cut into `world_size` consecutive pieces of nearly equal elements, each
        cut at a 64-element boundary of the layout; [(lo, hi)], possibly empty. A function of the
        layout and `only`: every rank computes every rank's share alike."""
        if self.store is None:
            raise ValueError("AdamW.share_chunks needs every parameter of one ParamStore, in its order")
        rank, world_size = _check_shard((rank, world_size), "AdamW.share_chunks")
        cover = self._cover(self.updated)
        total = sum(hi - lo for lo, hi in cover)

        def cut(k):  # the layout offset where share k starts (k elements-shares into the cover)
            want, seen = k * total // world_size, 0
            for lo, hi in cover:
                if want < seen + hi - lo:
                    return min(lo + (want - seen) // _ALIGN * _ALIGN, hi)
                seen += hi - lo
            return cover[-1][1] if cover else 0

        a, b = cut(rank), cut(rank + 1)
        return [(max(lo, a), min(hi, b)) for lo, hi in cover if max(lo, a) < min(hi, b)]

    def _cover(self, indices) -> list:
        """[(lo, hi)]: the store's element ranges that hold the parameters `indices`, neighbours in
        the layout (no other parameter, nor more than the alignment gap, between them) in one."""
        out, last, indices = [], None, set(indices)
        for rank, (o, n, i) in enumerate(sorted((o, p.numel(), i) for i, (o, p) in
                                                enumerate(zip(self.offsets, self.params)))):
            if i not in indices:
                continue
            if out and last == rank - 1 and o - out[-1][1] < _ALIGN:
                out[-1] = (out[-1][0], o + n)
            else:
                out.append((o, o + n))
            last = rank
        return out

    def _shard_layout(self, chunks, device, sharded: bool = False) -> None:
        """Zero moment buffers for `chunks` of the store's layout, one after the other: a data-
        parallel rank's chunks end to end (the gathers' layout), the cover of `only` each at an
        aligned offset."""
        layout, base = [], 0
        for lo, hi in chunks:
            layout.append((lo, hi, base))
            base += hi - lo if sharded else -(-(hi - lo) // _ALIGN) * _ALIGN
        self.flat_m = xtrain.zeros((max(base, 1),), dtype="float32", device=device)
        self.flat_v = xtrain.zeros((max(base, 1),), dtype="float32", device=device)
        self.moment_chunks, self.sharded = layout, sharded
        if sharded:  # no per-parameter views: a rank holds pieces of parameters' moments
            self.exp_avg = self.exp_avg_sq = None
            return
        updated = set(self.updated)
        self.exp_avg, self.exp_avg_sq = ([None if i not in updated else
                                          self._moment_view(flat, o, o + p.numel(), tuple(p.shape))
                                          for i, (o, p) in enumerate(zip(self.offsets, self.params))]
                                         for flat in (self.flat_m, self.flat_v))

    def _moment_view(self, flat, a: int, b: int, shape=None):
        """Elements [a, b) of the store's layout in moment buffer `flat` (full, or its chunks kept
        here), flat or as `shape`."""
        return _chunk_view(flat, self.moment_chunks, a, b, shape)

    def full_moment(self, which: str):
        """A full-size device buffer of the store's layout holding this rank's chunks of the moment
        ("exp_avg" or "exp_avg_sq") and zeros elsewhere: what a gather fills in."""
        flat = self.flat_m if which == "exp_avg" else self.flat_v
        full = xtrain.zeros((self.store.numel,), dtype="float32", device=flat.device)
        with xtrain.no_grad():
            for lo, hi, base in self.moment_chunks:
                full._storage_view(lo, (hi - lo,)).copy_(flat._storage_view(base, (hi - lo,)))
        return full

    def set_gathered(self, exp_avg, exp_avg_sq) -> None:
        """The full moments (float32 host arrays of the store's layout) that a gather brought here,
        read by moment_arrays() and state_dict() until the next step; None, None: none here."""
        self._gathered = None if exp_avg is None else (exp_avg, exp_avg_sq)

    def runs(self, lo: int = 0, hi: int | None = None) -> list:
        """[(start, end, decays), ...]: the element ranges of the store's flats that hold the
        updated parameters, cut to [lo, hi), in layout order; parameters next to each other in the
        layout and in the same weight-decay group share one range (it may cover the zero gaps
        between them, which the update leaves zero); a range never spans a parameter left out
        (`only`)."""
        hi = self.store.numel if hi is None else hi
        decay, updated = set(self.decay), set(self.updated)
        out, joinable = [], False
        for o, n, i in sorted((o, p.numel(), i) for i, (o, p) in enumerate(zip(self.offsets, self.params))):
            if i not in updated:
                joinable = False
                continue
            a, b = max(o, lo), min(o + n, hi)
            if a >= b:
                continue
            group = i in decay
            if out and joinable and out[-1][2] == group:
                out[-1] = (out[-1][0], b, group)
            else:
                out.append((a, b, group))
            joinable = True
        return out

    def use_device_hyper(self) -> None:
        """From now on every step reads its constants (learning rate, bias corrections) from a
        device buffer written before it (CUDA graphs replay kernel arguments unchanged). The
        updates are bitwise the same as with the constants as launch arguments."""
        if self.hyper_dev is None:
            self.hyper_dev = xtrain.zeros((3,), dtype="float32", device=self.params[0].device)

    def prepare_step(self) -> None:
        """Advance the step count and write the step's constants to the device (use_device_hyper),
        without launching the update: step(prepared=True) or a replay of a captured one follows."""
        if self.hyper_dev is None:
            raise RuntimeError("AdamW.prepare_step needs use_device_hyper() first")
        self.step_count += 1
        self._write_hyper()

    def begin_step(self, prepared: bool = False) -> None:
        """The step count and device constants of the update about to launch: advanced here, or
        (prepared) already by prepare_step(). For the steps of AdamW.step and
        DataParallelAdamW.step."""
        if prepared:
            if self.hyper_dev is None:
                raise RuntimeError("AdamW.step(prepared=True) needs use_device_hyper() and prepare_step()")
            return
        self.step_count += 1
        if self.hyper_dev is not None:
            self._write_hyper()

    def _write_hyper(self) -> None:
        """One host-to-device copy of the constants of (lr, step_count), as the fused step computes
        them for the decaying group (the other group's decay constant, 1 - lr * 0, is the same
        every step: the kernel takes it as a launch constant)."""
        b1, b2 = self.betas
        consts = _C.optim.adamw_consts(self.lr, b1, b2, self.eps, self.weight_decay, self.step_count)
        with xtrain.no_grad():
            self.hyper_dev.copy_(xtrain.tensor(np.asarray(consts, dtype=np.float32), device="cpu"))

    def step(self, guard=None, clip_norm=None, max_norm: float | None = None, prepared: bool = False) -> None:
        """One update of every updated parameter (`only`) that has a gradient (asynchronous on the
        device).

        guard: a one-element float32 tensor on the device (the training loop passes the step's
        gradient norm + 0 * loss); when it is not finite the kernels write nothing, with no host
        sync. step_count still advances: the caller learns of the skip at its next sync point and
        takes the count back. clip_norm, max_norm: the gradients are read scaled by
        min(1, max_norm / (clip_norm + 1e-6)), the factor clip_by_norm_ applies, with no pass of
        their own (clip_and_step). prepared: prepare_step() already advanced the count and wrote
        the device constants (a CUDA graph capture)."""
        if self.sharded:
            raise RuntimeError("AdamW.step: the moments are sharded over the data-parallel ranks "
                               "(keep_moments); step with DataParallelAdamW.step")
        self._update(guard, clip_norm, max_norm, prepared)

    def _update(self, guard, clip_norm, max_norm, prepared) -> None:
        """step()'s update; sharded (Muon's AdamW part under DataParallelMuon), of this rank's share
        only, which its caller then sends to the other ranks."""
        self.begin_step(prepared)
        clip = (clip_norm, float(max_norm)) if clip_norm is not None and max_norm else (None, 0.0)
        if self.store is not None and self.store.flat_grads_ready():
            runs = self.runs() if self.moment_chunks is None else \
                [run for lo, hi, _ in self.moment_chunks for run in self.runs(lo, hi)]
            self._step_flat(self.store.params, self.store.grads, runs, guard, clip)
            return
        if self.sharded:
            raise RuntimeError("AdamW: sharded moments need the store's flat gradients (store.use_flat_grads())")
        params, m, v = self.params, self.exp_avg, self.exp_avg_sq
        idx = [i for i in self.updated if params[i].grad is not None]
        if idx:
            decay = set(self.decay)
            _C.optim.adamw_step([params[i] for i in idx], [params[i].grad for i in idx],
                                [m[i] for i in idx], [v[i] for i in idx],
                                self.lr, self.betas[0], self.betas[1], self.eps, self.weight_decay, self.step_count,
                                guard, *clip, hyper=self.hyper_dev, decays=[i in decay for i in idx])

    def clip_and_step(self, max_norm: float | None, loss=None, prepared: bool = False):
        """Global-norm clipping and the update in one pass over the gradients: the norm (returned,
        a device scalar, before clipping), then AdamW reading each gradient clipped. With `loss`,
        a step whose loss or norm is not finite updates nothing (step_guard). The gradients
        themselves are left unscaled."""
        norm = _C.optim.global_norm(self._grads_for_norm())
        self.step(guard=step_guard(norm, loss), clip_norm=norm if max_norm else None, max_norm=max_norm,
                  prepared=prepared)
        return norm

    def _grads_for_norm(self) -> list:
        """What the global norm sums: the store's gradient regions (every trained parameter has
        a gradient), else each gradient."""
        if self.store is not None and self.store.flat_grads_ready():
            return self.store.region_views(self.store.grads)
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            raise ValueError("AdamW.clip_and_step: no parameter has a gradient")
        return grads

    def _step_flat(self, params, grads, runs: list, guard=None, clip=(None, 0.0)) -> None:
        """AdamW over element ranges of the flats ([(start, end, decays)], runs()): one launch."""
        b1, b2 = self.betas
        self._gathered = None  # a gathered copy of the moments goes stale now
        if not runs:
            return
        views = lambda flat: [flat._storage_view(a, (b - a,)) for a, b, _ in runs]  # noqa: E731
        moments = lambda flat: [self._moment_view(flat, a, b) for a, b, _ in runs]  # noqa: E731
        _C.optim.adamw_step(views(params), views(grads), moments(self.flat_m), moments(self.flat_v),
                            self.lr, b1, b2, self.eps, self.weight_decay, self.step_count, guard, *clip,
                            hyper=self.hyper_dev, decays=[d for _, _, d in runs])

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.store is not None:
            self.store.zero_grad(set_to_none)
            return
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad = xtrain.zeros(p.shape, dtype=p.dtype, device=p.device)

    def hyper(self) -> dict:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay}

    def state_dict(self) -> dict:
        """step, hyper-parameters and the updated parameters' moments by name: views of the device
        buffers, or with sharded moments CPU tensors of the gathered copy
        (DataParallelAdamW.gather_state())."""
        if self.sharded:
            m, v = self.moment_arrays()
            return {"step": self.step_count, "hyper": self.hyper(),
                    "exp_avg": OrderedDict((n, xtrain.tensor(a)) for n, a in m.items()),
                    "exp_avg_sq": OrderedDict((n, xtrain.tensor(a)) for n, a in v.items())}
        return {"step": self.step_count, "hyper": self.hyper(),
                **{key: OrderedDict((self.names[i], views[i]) for i in self.updated)
                   for key, views in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq))}}

    def state_arrays(self) -> dict:
        """What a checkpoint's optim.safetensors holds, {kind: {parameter name: float32 array}}
        (kinds "exp_avg", "exp_avg_sq"): moment_arrays()."""
        return dict(zip(("exp_avg", "exp_avg_sq"), self.moment_arrays()))

    def moment_arrays(self) -> tuple[dict, dict]:
        """(exp_avg, exp_avg_sq) of the updated parameters as name -> float32 numpy arrays, from
        one device-to-host copy of each flat buffer (a sync point); with sharded moments, from
        the gathered copy."""
        if self.sharded:
            if self._gathered is None:
                raise RuntimeError("AdamW: the moments are sharded over the data-parallel ranks; the data-parallel "
                                   "step's gather_state() (DataParallelAdamW's, DataParallelMuon's) gathers a "
                                   "full copy (on every rank, or on its root) before they can be read")
            hosts, where = self._gathered, self.offsets
        else:
            hosts = [np.asarray(flat.numpy(), dtype=np.float32) for flat in (self.flat_m, self.flat_v)]
            where = self._positions()
        return tuple(OrderedDict((self.names[i], host[where[i]:where[i] + self.params[i].numel()]
                                  .reshape(tuple(self.params[i].shape))) for i in self.updated)
                     for host in hosts)

    def _positions(self) -> list:
        """Each updated parameter's first element in the flat moment buffers (unsharded)."""
        if self.moment_chunks is None:
            return list(self.offsets)
        out = [None] * len(self.params)
        for i in self.updated:
            o = self.offsets[i]
            out[i] = next(base + o - lo for lo, hi, base in self.moment_chunks if lo <= o < hi)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore step, hyper-parameters and the updated parameters' moments (xtrain Tensors or
        numpy arrays, by name), written into the flat moment buffers (one upload each).
        Everything is checked before anything changes."""
        hyper = state.get("hyper", self.hyper())
        if hyper.get("optimizer", "adamw") != "adamw":
            raise ValueError(f"AdamW.load_state_dict: the state is {hyper['optimizer']}'s, not AdamW's")
        names = [self.names[i] for i in self.updated]
        for key in ("exp_avg", "exp_avg_sq"):
            _check_named(f"AdamW.load_state_dict: {key}", state.get(key, {}), names,
                         [self.params[i] for i in self.updated])
        step = state.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"AdamW.load_state_dict: step must be a non-negative int, got {step!r}")
        _check_hyper(hyper["lr"], hyper["betas"], hyper["eps"], hyper["weight_decay"])
        size, where = (self.store.numel, self.offsets) if self.sharded else (self.flat_m.shape[0], self._positions())
        for key, flat in (("exp_avg", self.flat_m), ("exp_avg_sq", self.flat_v)):
            host = np.zeros(size, dtype=np.float32)
            for i in self.updated:
                host[where[i]:where[i] + self.params[i].numel()] = _host_array(state[key][self.names[i]])
            if self.sharded:  # this rank's chunks only (a resume scatters the full state)
                host = np.concatenate([host[lo:hi] for lo, hi, _ in self.moment_chunks])
            with xtrain.no_grad():
                flat.copy_(xtrain.tensor(host, dtype="float32", device="cpu"))
        self._gathered = None
        self.step_count = step
        self.lr, self.betas = float(hyper["lr"]), tuple(map(float, hyper["betas"]))
        self.eps, self.weight_decay = float(hyper["eps"]), float(hyper["weight_decay"])


def _chunk_view(flat, chunks, a: int, b: int, shape=None):
    """Elements [a, b) of the store's layout in moment buffer `flat`, which holds the whole layout
    (chunks None) or the chunks [(lo, hi, base)] end to end; flat or as `shape`."""
    shape = (b - a,) if shape is None else shape
    if chunks is None:
        return flat._storage_view(a, shape)
    for lo, hi, base in chunks:
        if lo <= a and b <= hi:
            return flat._storage_view(base + a - lo, shape)
    raise ValueError(f"AdamW: elements [{a}, {b}) are outside this rank's moment chunks")


def _check_shard(shard, who: str) -> tuple[int, int]:
    """(rank, world_size) of a shard= argument; ValueError unless 0 <= rank < world_size."""
    try:
        rank, world = shard
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world)) and 0 <= rank < world
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{who}: shard must be (rank, world_size) with 0 <= rank < world_size, got {shard!r}")
    return rank, world


def _check_named(what: str, got, names: list, params: list) -> None:
    """KeyError unless `got` (name -> array) holds exactly `names`; ValueError unless each has
    its parameter's shape."""
    if not isinstance(got, dict):
        raise ValueError(f"{what} must map parameter names to arrays, got {type(got).__name__}")
    missing = [n for n in names if n not in got]
    unexpected = [n for n in got if n not in names]
    if missing or unexpected:
        raise KeyError(f"{what} has missing {missing[:8]} / unexpected {unexpected[:8]} parameter names")
    for n, p in zip(names, params):
        if tuple(got[n].shape) != tuple(p.shape):
            raise ValueError(f"{what}[{n}] has shape {tuple(got[n].shape)}, parameter {tuple(p.shape)}")


def _host_array(value) -> np.ndarray:
    """A state entry (xtrain Tensor or array) as a flat float32 host array."""
    arr = value.numpy() if isinstance(value, xtrain.Tensor) else np.asarray(value)
    return np.asarray(arr, dtype=np.float32).reshape(-1)


def _indices_of(names: list, only, who: str) -> list:
    """The indices of the parameters named in `only` (None: all of them), in parameter order."""
    if only is None:
        return list(range(len(names)))
    only = [str(n) for n in only]
    index = {n: i for i, n in enumerate(names)}
    unknown = [n for n in only if n not in index]
    if unknown:
        raise ValueError(f"{who}: {unknown[:8]} are not among the parameters")
    if len(set(only)) != len(only):
        raise ValueError(f"{who}: a parameter is named twice")
    return sorted(index[n] for n in only)


def block_matrices(named_params) -> list:
    """The names of the 2-D weights inside a model's repeated blocks, whose names run
    "<blocks>.<index>.<...>" (TinyTransformer's "layers.3.mlp.up_proj.weight", GPT-2's
    "h.3.attn.q_proj.weight"): the matrices Muon trains. The embeddings, the positions and the
    head lie outside the blocks and stay AdamW's."""
    out = []
    for name, p in named_params:
        parts = str(name).split(".")
        if len(p.shape) == 2 and len(parts) > 2 and parts[1].isdigit():
            out.append(str(name))
    return out


# torch.optim.Muon's defaults (its Newton-Schulz coefficients, steps and eps).
MUON_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
MUON_NS_STEPS = 5
MUON_EPS = 1e-7
MUON_ADJUST_LR = ("original", "match_rms_adamw")


def muon_lr_ratio(adjust_lr_fn: str, shape) -> float:
    """The factor of the learning rate of a matrix of `shape` [A, B], as torch.optim.Muon's
    adjust_lr_fn: "original" sqrt(max(1, A / B)); "match_rms_adamw" 0.2 * sqrt(max(A, B)), which
    gives the update AdamW's typical RMS, so Muon can take AdamW's learning rate and weight decay."""
    a, b = int(shape[0]), int(shape[1])
    if adjust_lr_fn == "original":
        return math.sqrt(max(1.0, a / b))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(a, b))
    raise ValueError(f"Muon: adjust_lr_fn must be one of {', '.join(MUON_ADJUST_LR)}, got {adjust_lr_fn!r}")


class Muon:
    """Muon (torch.optim.Muon's update) for the 2-D matrices named in `matrices`, AdamW (this
    module's, unchanged) for every other parameter, one learning rate and weight decay for both.

    A step: the global gradient norm and the non-finite guard as AdamW's; AdamW over the other
    parameters (one fused launch over their runs of the store's flats); then _C.optim.muon_step
    over the matrices: momentum with Nesterov's mix, `ns_steps` Newton-Schulz iterations in bf16
    on the engine's GEMMs (matrices of one shape batched), decoupled weight decay and the
    learning rate scaled per shape by adjust_lr_fn (docs/training.md, "Muon").

    State: an AdamW with only=the other parameters keeps their two moments (compact buffers of
    the store's layout: no moment of a matrix); the momentum buffers of the matrices it keeps
    (`owned`: all of them, or a data-parallel rank's share after keep_momentum()) lie in one flat
    buffer of their own, each at an aligned offset (momentum_buffers, in the order of `owned`;
    flat_momentum is None where a rank owns no matrix). state_dict() and
    state_arrays() (the checkpoint's optim.safetensors) hold "exp_avg" and "exp_avg_sq" of the
    other parameters and "momentum_buffer" of the matrices (torch.optim.Muon's name). hyper() adds
    "optimizer": "muon" and Muon's settings, which load_state_dict() checks (an AdamW state does
    not load here, nor a Muon state into AdamW); a state in AdamW's layout over every parameter,
    a matrix's momentum as its exp_avg (what Muon wrote before it had a layout of its own), loads
    too.

    CUDA graphs: use_device_hyper() / prepare_step() write AdamW's constants and Muon's [decay,
    lr] to device memory, which the captured kernels read. Data parallel:
    xtrain.launch.distributed.DataParallelMuon: each rank keeps the momentum of its share of the
    matrices and AdamW's moments of its piece of the rest only, and steps those (shard=, or
    keep_momentum and AdamW.keep_moments); a full copy exists only when its gather_state() brings
    one (set_gathered: host arrays, read by state_dict() and state_arrays() until the next step)."""

    def __init__(self, params, matrices=None, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = MUON_NS_COEFFICIENTS, ns_steps: int = MUON_NS_STEPS,
                 ns_eps: float = MUON_EPS, adjust_lr_fn: str = "match_rms_adamw",
                 shard: tuple[int, int] | None = None):
        """params: as AdamW's. matrices: the names of the parameters Muon updates (each 2-D;
        None: every 2-D parameter). The rest of the arguments are AdamW's (betas, eps) and
        torch.optim.Muon's (momentum, nesterov, ns_coefficients, ns_steps, ns_eps: its eps,
        adjust_lr_fn); lr and weight_decay apply to both.

        shard=(rank, world_size): allocate only the momentum of that rank's share of the matrices
        (shares()) and AdamW's moments of its share of the other parameters (AdamW.share_chunks),
        for DataParallelMuon with those ranks (keep_momentum, AdamW.keep_moments, without ever
        holding the whole state)."""
        _check_muon(momentum, nesterov, ns_coefficients, ns_steps, ns_eps, adjust_lr_fn)
        named = [(str(i), p) if isinstance(p, xtrain.Tensor) else (str(p[0]), p[1]) for i, p in enumerate(params)]
        names = [n for n, _ in named]
        if matrices is None:
            matrices = [n for n, p in named if len(p.shape) == 2]
        matrices = _indices_of(names, matrices, "Muon: matrices")   # parameter indices, in parameter order
        for i in matrices:
            if len(named[i][1].shape) != 2:
                raise ValueError(f"Muon updates 2-D matrices; {names[i]} has shape {tuple(named[i][1].shape)}")
        if not matrices:
            raise ValueError("Muon: no matrix to update (every parameter would be AdamW's)")
        self.matrices = matrices
        mine = set(matrices)
        self.others = [i for i in range(len(named)) if i not in mine]
        if shard is not None:
            rank, world = _check_shard(shard, "Muon")
        self.adamw = AdamW(named, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                           only=[names[i] for i in self.others],
                           shard=shard if shard is not None and world > 1 and self.others else None)
        a = self.adamw
        # The matrices whose momentum this optimizer keeps and whose update its step runs
        # (parameter indices, in the order of `matrices`): all of them, or a data-parallel rank's
        # share (keep_momentum). sharded: a share, not all.
        self.owned, self.sharded = list(self.matrices), False
        self._gathered = None  # sharded: the full momentum (name -> host array) a gather brought, until a step
        if shard is not None:
            owners = self.shares(world)
            self.owned = [i for i in self.matrices if owners[i] == rank]
            self.sharded = self.owned != self.matrices
        self._allocate_momentum()
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.ns_coefficients = tuple(float(c) for c in ns_coefficients)
        self.ns_steps, self.ns_eps, self.adjust_lr_fn = int(ns_steps), float(ns_eps), adjust_lr_fn
        self.lr_ratios = [muon_lr_ratio(adjust_lr_fn, a.params[i].shape) for i in self.matrices]
        self.muon_hyper_dev = None  # use_device_hyper(): float32 (2,) [decay, lr] on the device

    def shares(self, world_size: int) -> dict:
        """{parameter index: data-parallel rank} of the matrices, whole matrices balanced by
        Newton-Schulz cost (5 (4 r^2 c + 2 r^3) for an r x c operand, r <= c): largest first (ties
        in parameter order), each to the rank with the least cost so far (the lowest rank on a
        tie). A function of the shapes: every rank computes the same."""
        def cost(i):
            a, b = self.params[i].shape
            r, c = min(a, b), max(a, b)
            return 4 * r * r * c + 2 * r ** 3
        load = [0] * world_size
        owners = {}
        for i in sorted(self.matrices, key=lambda i: (-cost(i), i)):
            rank = min(range(world_size), key=lambda r: (load[r], r))
            owners[i] = rank
            load[rank] += cost(i)
        return owners

    def momentum_layout(self, indices) -> tuple[list, int]:
        """The flat momentum buffer of the matrices `indices` (parameter indices, in that order):
        each one's first element (64-element aligned) and the buffer's size."""
        offsets, total = [], 0
        for i in indices:
            offsets.append(total)
            total += -(-self.params[i].numel() // _ALIGN) * _ALIGN
        return offsets, total

    def _allocate_momentum(self) -> None:
        """Zero momentum buffers for `owned`: flat_momentum (None for no matrix) and a view per matrix."""
        offsets, total = self.momentum_layout(self.owned)
        self.flat_momentum = xtrain.zeros((total,), dtype="float32", device=self.params[0].device) if total else None
        self.momentum_buffers = [self.flat_momentum._storage_view(o, tuple(self.params[i].shape))
                                 for o, i in zip(offsets, self.owned)]
        self._momentum_offsets = offsets

    def keep_momentum(self, owned) -> None:
        """Keep the momentum of the matrices `owned` (parameter indices among `matrices`: a
        data-parallel rank's share, DataParallelMuon) only, with their current values; the other
        matrices' buffers go, and step() updates `owned` only. Their momentum is then read
        through a gathered copy (set_gathered), and a loaded state gives this optimizer the
        momentum of `owned` only. Keeping every matrix changes nothing."""
        owned = list(owned)
        try:
            picked = {int(i) for i in owned}
        except (TypeError, ValueError):
            raise ValueError(f"Muon.keep_momentum: owned must be parameter indices, got {owned!r}") from None
        if len(picked) != len(owned) or not picked <= set(self.matrices):
            raise ValueError(f"Muon.keep_momentum: {owned} are not distinct indices of this optimizer's "
                             f"matrices {self.matrices}")
        picked = [i for i in self.matrices if i in picked]
        if picked == self.owned:
            return
        if self.sharded:
            raise ValueError(f"Muon.keep_momentum: the momentum is already kept for matrices {self.owned} only "
                             f"(another rank's share, or another world size); build a new Muon")
        kept = {i: b for i, b in zip(self.owned, self.momentum_buffers) if i in set(picked)}
        self.owned, self.sharded, self._gathered = picked, True, None
        self._allocate_momentum()
        with xtrain.no_grad():
            for i, b in zip(self.owned, self.momentum_buffers):
                b.copy_(kept[i])

    def set_gathered(self, momentum) -> None:
        """The full momentum that DataParallelMuon.gather_state() brought here (name -> float32
        host array, every matrix in the order of `matrices`), read by state_dict() and
        state_arrays() until the next step; None: none here."""
        self._gathered = None if momentum is None else OrderedDict(momentum)

    def _full_momentum(self) -> OrderedDict:
        """Every matrix's momentum on the host: the buffers here, or (sharded) the gathered copy."""
        if not self.sharded:
            host = np.asarray(self.flat_momentum.numpy(), dtype=np.float32)  # sync point
            return OrderedDict((self.names[i], host[o:o + self.params[i].numel()].reshape(tuple(self.params[i].shape)))
                               for o, i in zip(self._momentum_offsets, self.owned))
        if self._gathered is None:
            raise RuntimeError("Muon: this rank keeps the momentum of its share of the matrices only (data "
                               "parallel); DataParallelMuon.gather_state() gathers a full copy (on every rank, "
                               "or on its root) before it can be read")
        return self._gathered

    # The AdamW part's attributes, which the training loop and the checkpoint read and set.
    lr = property(lambda self: self.adamw.lr, lambda self, v: setattr(self.adamw, "lr", float(v)))
    step_count = property(lambda self: self.adamw.step_count,
                          lambda self, v: setattr(self.adamw, "step_count", int(v)))
    weight_decay = property(lambda self: self.adamw.weight_decay)
    names = property(lambda self: self.adamw.names)
    params = property(lambda self: self.adamw.params)
    store = property(lambda self: self.adamw.store)

    def use_device_hyper(self) -> None:
        """AdamW.use_device_hyper, and Muon's [decay, lr] in device memory too (CUDA graphs)."""
        self.adamw.use_device_hyper()
        if self.muon_hyper_dev is None:
            self.muon_hyper_dev = xtrain.zeros((2,), dtype="float32", device=self.params[0].device)

    def prepare_step(self) -> None:
        """AdamW.prepare_step, and this step's [decay, lr] written to the device."""
        if self.muon_hyper_dev is None:
            raise RuntimeError("Muon.prepare_step needs use_device_hyper() first")
        self.adamw.prepare_step()
        self._write_hyper()

    def _write_hyper(self) -> None:
        consts = _C.optim.muon_consts(self.lr, self.weight_decay)
        with xtrain.no_grad():
            self.muon_hyper_dev.copy_(xtrain.tensor(np.asarray(consts, dtype=np.float32), device="cpu"))

    def step(self, guard=None, clip_norm=None, max_norm: float | None = None, prepared: bool = False) -> None:
        """One update: AdamW over the other parameters, Muon over the matrices (asynchronous on
        the device). guard, clip_norm, max_norm, prepared: as AdamW.step's."""
        a = self.adamw
        a._update(guard, clip_norm, max_norm, prepared)  # sharded: this rank's share (DataParallelMuon)
        self._gathered = None  # a gathered copy of the momentum goes stale now
        if not prepared and self.muon_hyper_dev is not None:
            self._write_hyper()
        clip = (clip_norm, float(max_norm)) if clip_norm is not None and max_norm else (None, 0.0)
        if a.store is not None and a.store.flat_grads_ready():
            grads = a.store.views(a.store.grads)
            idx = self.owned
        else:
            grads = [p.grad for p in a.params]
            idx = [i for i in self.owned if grads[i] is not None]
        if not idx:
            return
        ratios = dict(zip(self.matrices, self.lr_ratios))
        buffers = dict(zip(self.owned, self.momentum_buffers))
        _C.optim.muon_step([a.params[i] for i in idx], [grads[i] for i in idx], [buffers[i] for i in idx],
                           self.lr, self.weight_decay, self.momentum, self.nesterov, list(self.ns_coefficients),
                           self.ns_steps, self.ns_eps, [ratios[i] for i in idx], guard, *clip,
                           hyper=self.muon_hyper_dev)

    def clip_and_step(self, max_norm: float | None, loss=None, prepared: bool = False):
        """As AdamW.clip_and_step: the global norm (returned, a device scalar), the guard, then
        this optimizer's step reading the gradients clipped."""
        norm = _C.optim.global_norm(self.adamw._grads_for_norm())
        self.step(guard=step_guard(norm, loss), clip_norm=norm if max_norm else None, max_norm=max_norm,
                  prepared=prepared)
        return norm

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)

    def hyper(self) -> dict:
        """AdamW's hyper-parameters, "optimizer": "muon" and Muon's settings (the checkpoint's)."""
        return {**self.adamw.hyper(), "optimizer": "muon",
                "muon": {"momentum": self.momentum, "nesterov": self.nesterov,
                         "ns_coefficients": list(self.ns_coefficients), "ns_steps": self.ns_steps,
                         "ns_eps": self.ns_eps, "adjust_lr_fn": self.adjust_lr_fn,
                         "matrices": [self.names[i] for i in self.matrices]}}

    def state_dict(self) -> dict:
        """step, hyper-parameters, AdamW's moments of the other parameters and the matrices'
        momentum buffers by name: views of the device buffers, or (sharded) CPU tensors of the
        gathered copy."""
        if self.sharded:
            momentum = OrderedDict((n, xtrain.tensor(a)) for n, a in self._full_momentum().items())
        else:
            momentum = OrderedDict((self.names[i], b) for i, b in zip(self.owned, self.momentum_buffers))
        return {**self.adamw.state_dict(), "hyper": self.hyper(), "momentum_buffer": momentum}

    def state_arrays(self) -> dict:
        """What a checkpoint's optim.safetensors holds, {kind: {parameter name: float32 array}}:
        AdamW's "exp_avg" and "exp_avg_sq" of the other parameters, "momentum_buffer" of the
        matrices (one device-to-host copy of each flat buffer: a sync point; sharded, the
        gathered copy)."""
        return {**self.adamw.state_arrays(), "momentum_buffer": self._full_momentum()}

    def load_state_dict(self, state: dict) -> None:
        """Restore a Muon state (state_dict(), or a checkpoint's): the same matrices, Muon's
        settings, AdamW's part and the momentum buffers; a state in AdamW's layout over every
        parameter (no "momentum_buffer": a matrix's momentum is its exp_avg, its exp_avg_sq is
        not read) loads too. An AdamW state is refused. Sharded (keep_momentum), the state is
        still every matrix's (each checked) and this optimizer takes the momentum of `owned` from
        it. Everything is checked before anything changes."""
        hyper = dict(state.get("hyper", self.hyper()))
        if hyper.get("optimizer", "adamw") != "muon":
            raise ValueError(f"Muon.load_state_dict: the state is {hyper.get('optimizer', 'adamw')}'s "
                             f"(resume it with that optimizer)")
        muon = hyper.pop("muon", None)
        hyper.pop("optimizer")
        if not isinstance(muon, dict):
            raise ValueError("Muon.load_state_dict: the state holds no Muon settings")
        mine = [self.names[i] for i in self.matrices]
        if list(muon.get("matrices", [])) != mine:
            raise ValueError(f"Muon.load_state_dict: the state's matrices {list(muon.get('matrices', []))[:4]}... "
                             f"differ from this optimizer's {mine[:4]}...")
        settings = (muon.get("momentum"), muon.get("nesterov"), muon.get("ns_coefficients"), muon.get("ns_steps"),
                    muon.get("ns_eps"), muon.get("adjust_lr_fn"))
        _check_muon(*settings)
        adamw_state = {"step": state.get("step"), "hyper": hyper}
        if "momentum_buffer" in state:
            momentum = state["momentum_buffer"]
            adamw_state.update(exp_avg=state.get("exp_avg", {}), exp_avg_sq=state.get("exp_avg_sq", {}))
        else:  # AdamW's layout over every parameter
            for key in ("exp_avg", "exp_avg_sq"):
                _check_named(f"Muon.load_state_dict: {key} (AdamW's layout)", state.get(key, {}), self.names,
                             self.params)
            momentum = {n: state["exp_avg"][n] for n in mine}
            others = [self.names[i] for i in self.others]
            adamw_state.update({key: {n: state[key][n] for n in others} for key in ("exp_avg", "exp_avg_sq")})
        _check_named("Muon.load_state_dict: momentum_buffer", momentum, mine, [self.params[i] for i in self.matrices])
        self.adamw.load_state_dict(adamw_state)
        if self.flat_momentum is not None:
            host = np.zeros(self.flat_momentum.shape[0], dtype=np.float32)
            for o, i in zip(self._momentum_offsets, self.owned):
                host[o:o + self.params[i].numel()] = _host_array(momentum[self.names[i]])
            with xtrain.no_grad():
                self.flat_momentum.copy_(xtrain.tensor(host, dtype="float32", device="cpu"))
        self._gathered = None
        self.momentum, self.nesterov = float(settings[0]), bool(settings[1])
        self.ns_coefficients = tuple(float(c) for c in settings[2])
        self.ns_steps, self.ns_eps, self.adjust_lr_fn = int(settings[3]), float(settings[4]), settings[5]
        self.lr_ratios = [muon_lr_ratio(self.adjust_lr_fn, self.params[i].shape) for i in self.matrices]


def state_layouts(hyper: dict, shapes: dict) -> list:
    """The tensors ({"<kind>.<parameter name>": shape}) that optim.safetensors may hold for an
    optimizer whose hyper() is `hyper`, over parameters of `shapes` (name -> shape), newest layout
    first: AdamW's exp_avg and exp_avg_sq of every parameter; Muon's momentum_buffer of its
    matrices (hyper["muon"]["matrices"]) and the two moments of the rest, or AdamW's layout
    (what Muon wrote before it had one of its own)."""
    adamw = {f"{kind}.{n}": s for kind in ("exp_avg", "exp_avg_sq") for n, s in shapes.items()}
    if hyper.get("optimizer", "adamw") != "muon":
        return [adamw]
    matrices = set(hyper["muon"]["matrices"])
    muon = {f"{kind}.{n}": s for kind in ("exp_avg", "exp_avg_sq") for n, s in shapes.items() if n not in matrices}
    muon.update({f"momentum_buffer.{n}": s for n, s in shapes.items() if n in matrices})
    return [muon, adamw]


def _check_muon(momentum, nesterov, ns_coefficients, ns_steps, ns_eps, adjust_lr_fn) -> None:
    if not isinstance(momentum, (int, float)) or isinstance(momentum, bool) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"Muon: momentum must be in [0, 1), got {momentum!r}")
    if not isinstance(nesterov, bool):
        raise ValueError(f"Muon: nesterov must be True or False, got {nesterov!r}")
    try:
        coefficients = [float(c) for c in ns_coefficients]
    except (TypeError, ValueError):
        coefficients = []
    if len(coefficients) != 3 or not all(math.isfinite(c) for c in coefficients):
        raise ValueError(f"Muon: ns_coefficients must be three finite values (a, b, c), got {ns_coefficients!r}")
    if not isinstance(ns_steps, int) or isinstance(ns_steps, bool) or not 1 <= ns_steps < 100:
        raise ValueError(f"Muon: ns_steps must be an int in [1, 100), got {ns_steps!r}")
    if not isinstance(ns_eps, (int, float)) or isinstance(ns_eps, bool) or not 0 < ns_eps < math.inf:
        raise ValueError(f"Muon: ns_eps must be a finite value > 0, got {ns_eps!r}")
    if adjust_lr_fn not in MUON_ADJUST_LR:
        raise ValueError(f"Muon: adjust_lr_fn must be one of {', '.join(MUON_ADJUST_LR)}, got {adjust_lr_fn!r}")


def clip_grad_norm_(params, max_norm: float):
    """Scale the gradients of `params` in place so their global L2 norm is at most max_norm.
    Returns the norm before clipping as a float32 scalar Tensor on the device (no host sync).

    When params are every parameter of one ParamStore with flat gradients (and each has a
    gradient), the norm and the scaling run over the store's flat gradient buffer, one launch
    each; otherwise over the gradients as a list (up to 256 tensors per launch).

    A non-finite norm (a gradient holding NaN or Inf, or one too large for float32) leaves every
    gradient as it is and comes back as NaN or Inf: no scale factor repairs such a step, so its
    caller must skip it (the training loop's non-finite guard does)."""
    if max_norm is not None and not max_norm >= 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0 (0 or None: no clipping), got {max_norm}")
    params = list(params)
    store = _store_of(params)
    if store is not None and store.flat_grads_ready():
        grads = [store.grads]
        norm = _C.optim.global_norm(store.region_views(store.grads))
    else:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            raise ValueError("clip_grad_norm_: no parameter has a gradient")
        norm = _C.optim.global_norm(grads)
    if max_norm is not None and max_norm > 0:
        _C.optim.clip_by_norm_(grads, finite_or_nan(norm), float(max_norm))
    return norm


def step_guard(norm, loss=None):
    """norm + 0 * loss on the device: finite exactly when both are (0 * Inf is NaN); the norm
    alone without a loss. AdamW.step(guard=...) skips its update when this is not finite."""
    return norm if loss is None else _C.ops.add(norm, _C.ops.mul_scalar(loss.detach(), 0.0))


def finite_or_nan(norm):
    """The norm when finite, else NaN (norm + (norm - norm)): the clip kernel scales by
    min(1, max_norm / (norm + 1e-6)), which is 1 for a NaN norm but 0 for an infinite one, and
    0 * Inf = NaN would spread to the finite gradients. Two scalar ops on the device, no sync."""
    return _C.ops.add(norm, _C.ops.sub(norm, norm))


def _check_hyper(lr, betas, eps, weight_decay) -> None:
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0, got {lr}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two values in [0, 1), got {betas}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


# Element alignment of the moments of parameters outside a store (as xtrain.store.ALIGN).
_ALIGN = 64


def _store_of(params):
    """The ParamStore whose parameters, all of them in its order, are `params`; else None."""
    return ParamStore.owning(params)
