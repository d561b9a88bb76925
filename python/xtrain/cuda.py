"""CUDA queries and memory helpers (work in CPU-only builds too: nothing is available there)."""
import gc
import threading

from . import _C

is_built = _C.cuda.is_built
is_available = _C.cuda.is_available
device_count = _C.cuda.device_count
current_device = _C.cuda.current_device
set_device = _C.cuda.set_device
synchronize = _C.cuda.synchronize
device_name = _C.cuda.device_name
runtime_info = _C.cuda.runtime_info
set_allow_tf32 = _C.cuda.set_allow_tf32
allow_tf32 = _C.cuda.allow_tf32
# read_async([loss, norm]).wait() -> [float, float]: the values of one-element tensors, copied to
# the host without waiting for the stream (waits, at .wait(), only for the work queued before).
read_async = _C.cuda.read_async
PendingValues = _C.cuda.PendingValues
# read_array_async(t).wait() -> numpy array: a whole tensor (not bfloat16), the same way (generate's
# token ring).
read_array_async = _C.cuda.read_array_async
PendingArray = _C.cuda.PendingArray
# Event(device): a timing event on this thread's stream; record(), ready(), elapsed_ms_since(start)
# (waits for this event; device milliseconds since start). The training loop times its steps with
# them (Note [Step time] in xtrain/trainer/train.py). CPU-only builds have the class, and
# constructing one raises RuntimeError.
Event = _C.cuda.Event


def _dev(device):
    if device is None:
        return f"cuda:{current_device()}"
    if isinstance(device, int):
        return f"cuda:{device}"
    return device


def memory_stats(device=None):
    return _C.memory_stats(_dev(device))


def max_memory_allocated(device=None):
    return _C.memory_stats(_dev(device))["allocated_bytes.peak"]


def memory_allocated(device=None):
    return _C.memory_stats(_dev(device))["allocated_bytes.current"]


def max_memory_reserved(device=None):
    return _C.memory_stats(_dev(device))["reserved_bytes.peak"]


def reset_peak_memory_stats(device=None):
    _C.reset_peak_memory_stats(_dev(device))


def empty_cache(device=None):
    _C.empty_cache(_dev(device))


# ---- CUDA graphs (docs/cuda.md, "Graph capture")
# Graph(device, share_pool_with=None): capture_begin(), capture_end(), replay(), abort_capture(),
# num_nodes, memsets_as_kernels, replays. CPU-only builds have the class, and constructing one raises RuntimeError.
Graph = _C.cuda.Graph
is_capturing = _C.cuda.is_capturing


class early_launch:
    """`with xtrain.cuda.early_launch():` this thread's launches of the decode step's kernels
    (the matrix-vector products, the fused decode attention, the greedy pick) may start before the
    kernel ahead of them has finished: they load their weights while it drains, then wait for it
    (programmatic dependent launch, sm_90 and later). The values do not change. The block promises
    that nothing such a kernel reads before its wait (its weights, norm weights and residual input,
    the KV cache's earlier slots, positions, lengths) is written by the launch just before it; the
    generator's decode step keeps that promise, other code should not enter it (Note [Early launch
    of the decode step's kernels])."""

    def __init__(self, on: bool = True):
        self.on = bool(on)

    def __enter__(self):
        self._prev = _C.cuda.set_early_launch(self.on)
        return self

    def __exit__(self, *exc):
        _C.cuda.set_early_launch(self._prev)
        return False


# Captures in progress in this process (rank threads capture at once) and whether the garbage
# collector was on before the first of them: it stays off until the last one ends.
_gc_hold = threading.Lock()
_gc_holders = 0
_gc_was_enabled = False


def _hold_gc() -> None:
    global _gc_holders, _gc_was_enabled
    with _gc_hold:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1


def _release_gc() -> None:
    global _gc_holders
    with _gc_hold:
        _gc_holders -= 1
        if _gc_holders == 0 and _gc_was_enabled:
            gc.enable()


class graph:
    """`with xtrain.cuda.graph(g): ...` captures the work queued in the block into Graph `g`; an
    exception inside the block aborts the capture (the stream stays usable) and propagates."""

    def __init__(self, g):
        self.g = g

    def __enter__(self):
        # A garbage collection inside the capture could free objects that own pinned host memory
        # or events (a pending read_async of an earlier step): releasing those is an unsafe CUDA
        # call on the capturing thread and invalidates the capture. So the collector is held off
        # until the capture ends (until the last one ends, when rank threads of a data-parallel
        # step capture at the same time: the collector is process-wide). No collection first:
        # with torch imported one takes 30-70 ms, as long as 50 decode steps of a generate() call
        # that captures its decode step, and holding the collector off is all the capture needs.
        _hold_gc()
        try:
            self.g.capture_begin()
        except BaseException:
            _release_gc()
            raise
        return self.g

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None:
                self.g.abort_capture()
                return False
            self.g.capture_end()
            return False
        finally:
            _release_gc()
