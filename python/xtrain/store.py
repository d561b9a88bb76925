"""ParamStore: a module's parameters, their gradients and their compute-dtype copies in flat,
aligned buffers; every parameter is a view (llm.c allocates all parameters at once).

    model = TinyTransformer(config, device="cuda")   # builds its store: model.store
    model.store.params                              # float32 [numel]: every parameter, as views
    opt = AdamW(model.named_parameters())           # finds the store: moments in the same layout

What lives on the flats, each as one buffer of the same layout:
- `params`: the master weights (float32); each parameter of the module is a leaf view into it.
- `grads` (only with flat gradients, use_flat_grads(): data-parallel training reduces it as one
  buffer): each leaf's gradient slot. Backward puts a leaf's gradient there (the leaf's
  AccumulateGrad has the slot as its destination, tape/grad_slots.h) and the slot becomes its
  .grad; a bf16 weight's cast backward writes its float32 gradient straight into the slot.
  Without it (the default, one process) each gradient is a tensor of its own that backward
  allocates when it produces it, as the activations it no longer needs are freed, and
  zero_grad(set_to_none=True) frees: the peak at the start of backward holds no gradient buffer
  (4 bytes per parameter; Note [Gradients without a flat buffer]). Clipping and AdamW then take
  the gradients as a list (their kernels run over up to 256 tensors per launch).
- `compute`: with a compute dtype (bf16 mixed precision), the compute copies of the region-0
  weights (the weights of every nn.Linear): one cast launch over the region, reused until the
  float32 weights change (their storage version moves). A store that casts on use (`cast_on_use`,
  the lean 0.6B-2B presets) has none while it trains: the forward casts each layer's weights as it
  reaches the layer (cast_weights), and what backward needs of them is cast again from the float32
  weights (Note [Casts saved as their source], csrc/ops/cast.cpp), so no bf16 copy of the weights
  is held at the step's peak. It is made on first use by compute_weights() (generation).
The optimizer adds its moments in the same layout (xtrain.optim.AdamW), so with flat gradients
clipping, AdamW, the gradient average and ZeRO-1 sharding each work on whole regions
(xtrain.launch.distributed).

Note [Gradients without a flat buffer]: a flat gradient buffer lives across steps, so at the
start of backward, where the step's peak is (every saved activation still held), it holds 4
bytes per parameter beside the master weights, the moments and the compute copies; PyTorch's
gradients appear as backward frees the activations. One process needs no flat buffer (only the
collectives want one buffer), so by default each gradient is allocated by the backward that
produces it. The same kernels update the same values: AdamW's elements are bitwise the flat
runs' (elementwise math); the global norm sums the same squares over another partition into
float64 partials, so its float32 value can differ from the flat buffer's by an ulp. Under CUDA
graphs the gradients are allocated in the step graph's pool, in blocks the freed activations
leave, at fixed addresses that the update graph reads.

Layout, fixed at construction from the module's named_parameters() order:
- Region 0: the parameters `compute` picks (a model passes nn.matmul_weights: the weights of its
  nn.Linear layers, which a bf16 model runs in bf16); region 1: everything else (embeddings, norm
  weights). Within a region, tensors
  keep named_parameters() order.
- Every tensor starts at a multiple of ALIGN elements (256 bytes of float32, the caching
  allocator's block alignment), so a view is aligned like a tensor of its own.
- Every region's length is a multiple of ALIGN * SHARD_MULTIPLE, so it splits into equal,
  ALIGN-aligned chunks for any number of ranks that divides SHARD_MULTIPLE; the padding and the
  gaps between tensors hold zeros in every buffer (params, grads, moments), so whole-region
  kernels leave them zero.

Invariants: parameters are written through the store's views only (optimizer steps, load,
collectives), never replaced, so the optimizer's moments, the gradient slots and the compute
copies stay in step with them. Module.to() and load_state_dict() go through the store.
"""

from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

import xtrain
from xtrain import _C, ops

# Element alignment of every tensor (256 bytes of float32).
ALIGN = 64
# Regions split into equal aligned chunks for 1-8, 10, 12, 14, 15, 16, 20, 21, 24, 28, 30, 32,
# ... ranks (2^6 * 3 * 5 * 7); costs at most 1.6 MiB of float32 padding per region.
SHARD_MULTIPLE = 6720


@dataclass(frozen=True)
class Slot:
    """One parameter in the store: its name, shape, offset (elements from the start of the flat
    buffers), region, and the module attribute that holds it."""
    name: str
    shape: tuple
    offset: int
    region: int
    owner: weakref.ref
    attr: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Region:
    start: int     # element offset of the region in the flat buffers
    length: int    # elements, padding included: a multiple of ALIGN * SHARD_MULTIPLE
    used: int      # elements up to the end of its last tensor (the rest is padding)


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


class ParamStore:
    """The parameters of `module` moved into flat buffers on `device` (see the module doc).

    compute(submodule, attr) -> bool picks the region-0 parameters, which the forward uses in
    `compute_dtype` (None: the parameters' own dtype); nn.matmul_weights is the usual choice (the
    weights of every nn.Linear). dtype: the master weights' dtype (float32 for training).
    flat_grads: keep the gradients in one flat buffer (`grads`, use_flat_grads()); by default
    each gradient is a tensor of its own (Note [Gradients without a flat buffer]).
    cast_on_use: the forward casts the region-0 weights layer by layer (cast_weights) instead of
    using the flat compute copies (compute_weights), which are then made only when asked for."""

    def __init__(self, module, device: str = "cpu", compute_dtype: str | None = None,
                 dtype: str = "float32", compute=None, flat_grads: bool = False, cast_on_use: bool = False):
        named = []
        for mod_name, m in module.named_modules():
            for attr, p in m._parameters.items():
                if p is None:
                    continue
                name = f"{mod_name}.{attr}" if mod_name else attr
                region = 0 if (compute is not None and compute(m, attr)) else 1
                named.append((name, m, attr, p, region))
        if not named:
            raise ValueError(f"ParamStore: {type(module).__name__} has no parameters")
        self.device, self.dtype = str(device), str(dtype)
        self.compute_dtype = None if compute_dtype in (None, dtype) else str(compute_dtype)
        self._flat_grads = bool(flat_grads)
        self._cast_on_use = bool(cast_on_use)

        # ---- layout: region 0, then region 1; each tensor at a multiple of ALIGN
        slots, regions, total = [], [], 0
        for region in (0, 1):
            start = total
            for name, m, attr, p, r in named:
                if r != region:
                    continue
                slots.append(Slot(name, tuple(p.shape), total, region, weakref.ref(m), attr))
                total += _round_up(math.prod(p.shape), ALIGN)
            used = total - start
            total = start + _round_up(used, ALIGN * SHARD_MULTIPLE) if used else start
            regions.append(Region(start, total - start, used))
        order = {name: i for i, (name, *_rest) in enumerate(named)}
        self.slots = sorted(slots, key=lambda s: order[s.name])  # named_parameters() order
        self.regions = regions
        self.numel = total
        self.index = {s.name: i for i, s in enumerate(self.slots)}

        # ---- the values: one host array, one upload
        host = np.zeros(total, dtype=np.float32)
        requires = {}
        for (name, _m, _a, p, _r) in named:
            s = self.slots[self.index[name]]
            host[s.offset:s.offset + s.numel] = np.asarray(p.detach().to(dtype="float32").numpy(),
                                                           dtype=np.float32).reshape(-1)
            requires[name] = p.requires_grad
        self._build(host, {s.name: requires[s.name] for s in self.slots})
        _STORES.add(self)

    @staticmethod
    def holding(tensor) -> "ParamStore | None":
        """The store one of whose parameters is `tensor`, or None."""
        for store in list(_STORES):
            if any(t is tensor for t in store.leaves):
                return store
        return None

    @staticmethod
    def owning(params) -> "ParamStore | None":
        """The store whose parameters are exactly `params` (the same tensors, in its order)."""
        params = list(params)
        for store in list(_STORES):
            if len(store.leaves) == len(params) and all(a is b for a, b in zip(store.leaves, params)):
                return store
        return None

    # ---- construction and placement

    def _build(self, host: np.ndarray, requires_grad: dict) -> None:
        """Allocate the flats on self.device, fill params from `host`, and put a leaf view of each
        parameter in its module."""
        with xtrain.no_grad():
            self.params = xtrain.tensor(host, dtype=self.dtype, device=self.device)
        self.device = self.params.device  # canonical: "cuda" -> "cuda:0"
        self.leaves = []
        for s in self.slots:
            leaf = self.params._storage_view(s.offset, s.shape)
            if requires_grad[s.name]:
                leaf.requires_grad = True
            self.leaves.append(leaf)
            owner = s.owner()
            if owner is not None:
                owner._parameters[s.attr] = leaf
        self._trained = [i for i, t in enumerate(self.leaves) if t.requires_grad]
        self.grads, self._slots = None, None
        if self._flat_grads:
            self._make_slots()
        # compute copies of region 0 (bf16 mixed precision): one flat buffer, a view per weight
        self.compute = None
        self._compute_views, self._compute_leaves, self._compute_names = [], [], []
        self._compute_version = None   # the params version the copies were made from
        self._partial = False          # ZeRO: only this rank's chunk of params is current
        for i, s in enumerate(self.slots):
            if s.region == 0:
                self._compute_leaves.append(self.leaves[i])
                self._compute_names.append(s.name)
        if not self._cast_on_use:
            self._make_compute()

    def _make_compute(self) -> None:
        """The flat compute copies of region 0 (with a compute dtype), if not made yet."""
        r0 = self.regions[0]
        if self.compute is not None or self.compute_dtype is None or not r0.used:
            return
        self.compute = xtrain.zeros((r0.length,), dtype=self.compute_dtype, device=self.device)
        self._compute_views = [self.compute._storage_view(self.slots[self.index[n]].offset - r0.start,
                                                          self.slots[self.index[n]].shape)
                               for n in self._compute_names]
        self._compute_version = None

    def to(self, device: str | None = None, dtype: str | None = None) -> "ParamStore":
        """Move the flats to `device` and/or convert the master weights to `dtype`, re-pointing
        every parameter of the module at the new views (gradients are dropped; build the optimizer
        afterwards, as in PyTorch)."""
        device = self.device if device is None else str(device)
        dtype = self.dtype if dtype is None else str(dtype)
        if device == self.device and dtype == self.dtype:
            return self
        host = np.asarray(self.params.to(dtype="float32").numpy(), dtype=np.float32)  # sync point
        requires = {s.name: t.requires_grad for s, t in zip(self.slots, self.leaves)}
        self.device, self.dtype = device, dtype
        if self.compute_dtype == dtype:
            self.compute_dtype = None
        self._build(host, requires)
        return self

    # ---- views of the flats

    def views(self, flat) -> list:
        """Per-parameter views (in named_parameters() order) of a flat buffer of this layout."""
        return [flat._storage_view(s.offset, s.shape) for s in self.slots]

    def region_views(self, flat, used: bool = False) -> list:
        """One 1-D view per non-empty region of `flat` (used=True: up to its last tensor)."""
        return [flat._storage_view(r.start, (r.used if used else r.length,)) for r in self.regions if r.used]

    def chunks(self, rank: int, world_size: int) -> list:
        """Rank `rank`'s (start, end) element range of each non-empty region, of `world_size` equal
        chunks (the sharded data-parallel step); ValueError when world_size does not divide
        SHARD_MULTIPLE."""
        regions = [r for r in self.regions if r.used]
        if any((r.length // ALIGN) % world_size for r in regions):
            raise ValueError(f"the sharded data-parallel step needs a number of ranks that divides "
                             f"{SHARD_MULTIPLE} (got {world_size}); use shard=False (--no-shard-optimizer)")
        return [(r.start + rank * (r.length // world_size), r.start + (rank + 1) * (r.length // world_size))
                for r in regions]

    def named_views(self, flat) -> dict:
        return {s.name: v for s, v in zip(self.slots, self.views(flat))}

    # ---- gradients

    @property
    def flat_grads(self) -> bool:
        """Whether the gradients live in the flat buffer `grads` (use_flat_grads())."""
        return self._slots is not None

    def use_flat_grads(self, flat: bool = True) -> None:
        """flat: from the next backward on, every gradient lands in its slot of one flat buffer,
        `grads` (what the data-parallel collectives reduce); a gradient already set is copied in
        at the next sync_grads(). flat=False: each gradient a tensor of its own again, `grads`
        None (the gradients set keep their memory until zero_grad)."""
        if bool(flat) == self.flat_grads:
            return
        self._flat_grads = bool(flat)
        if flat:
            self._make_slots()
        else:
            self._slots = self.grads = None  # the GradSlots' destructor removes the destinations

    def _make_slots(self) -> None:
        with xtrain.no_grad():
            self.grads = xtrain.zeros((self.numel,), dtype=self.dtype, device=self.device)
        self._slots = _C.GradSlots([self.leaves[i] for i in self._trained],
                                   [self.grads._storage_view(self.slots[i].offset, self.slots[i].shape)
                                    for i in self._trained])

    def sync_grads(self) -> list:
        """Returns the names of the trained parameters without a gradient. With flat gradients,
        every gradient is first brought into its slot (one assigned by hand is copied in; the
        slots of those without one hold stale values)."""
        if self._slots is None:
            return [self.slots[i].name for i in self._trained if self.leaves[i].grad is None]
        missing = self._slots.sync()
        return [self.slots[self._trained[i]].name for i in missing]

    def flat_grads_ready(self) -> bool:
        """True when `grads` holds every trained parameter's gradient (flat gradients, after
        sync_grads()): clipping and AdamW may then run over the flat buffer's regions."""
        return self._slots is not None and not self.sync_grads()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """set_to_none: every .grad becomes None (flat: the next backward writes the slots; else
        the gradients' memory is freed); else the gradients are zeroed and stay .grad (a trained
        parameter without one gets zeros), so the next backward accumulates into them."""
        if set_to_none:
            if self._slots is not None:
                self._slots.clear()
            else:
                for i in self._trained:
                    self.leaves[i].grad = None
            return
        if self._slots is not None:
            self.grads.zero_()
        for i in self._trained:
            leaf = self.leaves[i]
            if leaf.grad is not None:
                if self._slots is None:
                    leaf.grad.zero_()
            elif self._slots is not None:
                leaf.grad = self.grads._storage_view(self.slots[i].offset, self.slots[i].shape)
            else:
                leaf.grad = xtrain.zeros(leaf.shape, dtype=leaf.dtype, device=leaf.device)

    # ---- compute copies (bf16 mixed precision)

    @property
    def cast_on_use(self) -> bool:
        """Whether the forward casts the region-0 weights layer by layer (cast_weights) rather
        than using the flat compute copies (compute_weights)."""
        return self._cast_on_use and self.compute_dtype is not None

    def use_compute_copies(self) -> None:
        """From now on the forward uses the flat compute copies (made here): the sharded
        data-parallel step gathers them instead of casting."""
        self._cast_on_use = False
        self._make_compute()

    def compute_names(self, prefix: str = "") -> list:
        """The names of the region-0 weights (those used in the compute dtype) under `prefix`
        ("layers.3." for a block's), in named_parameters() order."""
        return [n for n in self._compute_names if n.startswith(prefix)]

    def cast_weights(self, names) -> dict:
        """name -> a new compute-dtype cast of each named region-0 weight (one cast launch), with
        the history of a cast from its float32 leaf, made to be saved as that leaf: an op that
        keeps one for backward keeps the float32 weight and casts it again then (Note [Casts
        saved as their source], csrc/ops/cast.cpp), so the casts' memory is freed once the
        forward is done with them. {} without a compute dtype."""
        names = list(names)
        unknown = [n for n in names if n not in self.index or self.slots[self.index[n]].region != 0]
        if unknown:
            raise ValueError(f"ParamStore.cast_weights: {unknown[0]!r} is not a weight used in the compute dtype "
                             f"(region 0: {', '.join(self._compute_names[:4])}"
                             f"{', ...' if len(self._compute_names) > 4 else ''})")
        if self.compute_dtype is None or not names:
            return {}
        self._check_current()
        leaves = [self.leaves[self.index[n]] for n in names]
        return dict(zip(names, ops.cast_many(leaves, self.compute_dtype, recast_saved=True)))

    def _check_current(self) -> None:
        if self._partial:
            raise RuntimeError(
                "ParamStore: the float32 weights changed while only this rank's shard of them is "
                "current (sharded data-parallel step); call gather_state() on every rank first")

    def compute_weights(self) -> dict:
        """name -> the region-0 weight in the compute dtype, with the history of a cast from its
        float32 leaf (gradients come back in float32, into the leaf's slot). The copies are made
        by one cast launch over the region when the float32 weights changed since the last one
        (the flat buffer itself on first use when the store casts on use); {} without a compute
        dtype."""
        self._make_compute()
        if self.compute is None:
            return {}
        if self._compute_version != self._params_version():
            self._check_current()
            r0 = self.regions[0]
            with xtrain.no_grad():
                self.compute.copy_(self.params._storage_view(r0.start, (r0.length,)))
            self._compute_version = self._params_version()
        casts = ops.cast_many(self._compute_leaves, self.compute_dtype, cached=self._compute_views)
        return dict(zip(self._compute_names, casts))

    def compute_region_chunk(self, lo: int, hi: int):
        """Elements [lo, hi) of the compute copy of region 0 (offsets into the flats): the part a
        rank casts itself in the sharded step."""
        r0 = self.regions[0]
        return self.compute._storage_view(lo - r0.start, (hi - lo,))

    def mark_compute_current(self, partial: bool) -> None:
        """The compute copies hold the casts of the current float32 weights (a sharded step just
        gathered them); partial: the float32 weights themselves are current only in this rank's
        chunk until gather_state()."""
        self._compute_version = self._params_version()
        self._partial = bool(partial)

    def _params_version(self) -> int:
        return self.params._version

    # ---- state

    def state_arrays(self) -> dict:
        """name -> float32 numpy array of each parameter, from one device-to-host copy (a sync
        point)."""
        host = np.asarray(self.params.to(dtype="float32").numpy(), dtype=np.float32)
        return {s.name: host[s.offset:s.offset + s.numel].reshape(s.shape) for s in self.slots}

    def load_arrays(self, arrays: dict) -> None:
        """Overwrite every parameter from name -> array (all names, shapes checked by the caller),
        with one host-to-device copy."""
        host = np.zeros(self.numel, dtype=np.float32)
        for s in self.slots:
            host[s.offset:s.offset + s.numel] = np.asarray(_host(arrays[s.name]), dtype=np.float32).reshape(-1)
        with xtrain.no_grad():
            self.params.copy_(xtrain.tensor(host, dtype=self.dtype, device="cpu"))
        self._partial = False

    @contextmanager
    def bound(self, weights: dict):
        """Within the block, the module attributes of the named parameters hold `weights` instead
        (e.g. the compute copies during a forward); restored afterwards."""
        slots = [self.slots[self.index[n]] for n in weights]
        saved = []
        try:
            for s, t in zip(slots, weights.values()):
                owner = s.owner()
                saved.append((owner, s.attr, owner._parameters[s.attr]))
                owner._parameters[s.attr] = t
            yield
        finally:
            for owner, attr, t in saved:
                owner._parameters[attr] = t


_STORES: "weakref.WeakSet[ParamStore]" = weakref.WeakSet()


def _host(value):
    return value.numpy() if isinstance(value, xtrain.Tensor) else value
