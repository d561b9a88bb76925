"""
xtrain engine: tensors, caching allocator, autodiff tape, CPU/CUDA kernels
"""
from __future__ import annotations
import collections.abc
import numpy
import typing
import typing_extensions
from . import cuda
from . import ops
from . import optim
from . import dist
from . import profile
__all__: list[str] = ['Generator', 'GradSlots', 'OutOfMemoryError', 'Tensor', 'arange', 'backward_many', 'checkpoint', 'cuda', 'default_generator', 'dist', 'empty', 'empty_cache', 'full', 'get_num_threads', 'is_grad_enabled', 'last_backward_batched_casts', 'manual_seed', 'memory_history', 'memory_segments', 'memory_stats', 'ops', 'optim', 'profile', 'rand', 'randn', 'record_memory_history', 'reset_peak_memory_stats', 'set_grad_enabled', 'set_memory_limit', 'set_num_threads']
class OutOfMemoryError(RuntimeError, MemoryError):
    """
    A device or a memory limit ran out of memory; the message gives the request, what is allocated and reserved, and the limit.
    """
class Tensor:
    """
    A contiguous n-dimensional array on a device, with autograd.
    """
    grad: typing.Any
    requires_grad: bool
    @staticmethod
    def __new__(*args, **kwargs):
        """
        (*args, **kwargs) -> object
        """
    @staticmethod
    def __repr__(t):
        """
        tensor([[1. , 2.5], ...], dtype=float32, device=cuda:0, grad_fn=...) with numpy's
            formatting of the values (a sync point for CUDA tensors).
        """
    def __add__(self, other):
        ...
    def __dlpack__(self, *, stream: typing.Any = None, max_version: typing.Any = None, dl_device: typing.Any = None, copy: typing.Any = None) -> typing_extensions.CapsuleType:
        """
        Export as a DLPack capsule sharing memory
        """
    def __dlpack_device__(self) -> tuple[int, int]:
        """
        (device_type, device_id) for DLPack
        """
    def __matmul__(self, other):
        ...
    def __mul__(self, other):
        ...
    def __neg__(self):
        ...
    def __pow__(self, s):
        ...
    def __radd__(self, other):
        ...
    def __rmul__(self, other):
        ...
    def __rsub__(self, other):
        ...
    def __rtruediv__(self, other):
        ...
    def __sub__(self, other):
        ...
    def __truediv__(self, other):
        ...
    def _storage_view(self, offset: typing.SupportsInt | typing.SupportsIndex, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> Tensor:
        """
        A view of `shape` starting `offset` elements into this tensor's storage (no history)
        """
    def backward(self) -> None:
        """
        Backpropagate from a one-element tensor (seed of ones)
        """
    def backward_seeded(self, seed: Tensor) -> None:
        """
        Backpropagate from this tensor with an explicit upstream gradient of its shape
        """
    def bfloat16(self):
        ...
    def clone(self) -> Tensor:
        """
        A copy with no history
        """
    def copy_(self, src: Tensor) -> Tensor:
        """
        Copy values from src (any dtype/device) in place (no autograd)
        """
    def data_ptr(self) -> int:
        ...
    def detach(self) -> Tensor:
        """
        A tensor sharing storage, with no history
        """
    def dim(self) -> int:
        ...
    def double(self):
        ...
    def exp(self):
        ...
    def fill_(self, value: typing.SupportsFloat | typing.SupportsIndex) -> Tensor:
        """
        Fill with a value in place (no autograd)
        """
    def float(self):
        ...
    def item(self) -> typing.Any:
        """
        The value of a one-element tensor (a sync point on CUDA)
        """
    def log(self):
        ...
    def log_softmax(self, dim = -1):
        ...
    def mean(self, dim = None, keepdim = False):
        ...
    def numel(self) -> int:
        ...
    def numpy(self) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        As a read-only numpy array (shares memory for CPU float32/float64/int; bf16 -> float32 copy); .copy() it to write
        """
    def permute(self, *dims):
        ...
    def reshape(self, *shape):
        ...
    def same_storage(self, other: Tensor) -> bool:
        """
        True when both tensors view the same storage
        """
    def silu(self):
        ...
    def size(self, dim: typing.Any = None) -> typing.Any:
        ...
    def softmax(self, dim = -1):
        ...
    def sqrt(self):
        ...
    def sum(self, dim = None, keepdim = False):
        ...
    def to(self, *args, device = None, dtype = None):
        """
        Copy to another device and/or dtype (differentiable), as torch.Tensor.to takes them:
                t.to("bfloat16"), t.to("cuda"), t.to("cuda", "float32"), t.to(other), or by keyword.
                Returns self when nothing changes.
        """
    def transpose(self, dim0, dim1):
        ...
    def view(self, *shape):
        ...
    def zero_(self) -> Tensor:
        """
        Fill with zeros in place (no autograd)
        """
    @property
    def _version(self) -> int:
        """
        How many in-place writes the engine made to this tensor's storage (shared by views)
        """
    @property
    def device(self) -> str:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def grad_fn(self) -> typing.Any:
        ...
    @property
    def is_leaf(self) -> bool:
        ...
    @property
    def itemsize(self) -> int:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def ndim(self) -> int:
        ...
    @property
    def shape(self) -> tuple:
        ...
class Generator:
    """
    Counter-based (Philox) random generator: a (seed, offset) pair.
    """
    def __init__(self, seed: typing.SupportsInt | typing.SupportsIndex = 24301) -> None:
        ...
    def begin_capture(self, base: Tensor) -> None:
        """
        Capture mode for a CUDA graph (Note [Random draws in captured graphs]): dropout draws offsets relative to the capture's start and reads (seed, offset) from `base` (int64 [2], on the device, kept alive by the caller), which the owner fills before each replay
        """
    def end_capture(self) -> int:
        """
        Leave capture mode; returns the counters the captured work draws per replay
        """
    def get_state(self) -> tuple[int, int]:
        """
        The state as a (seed, offset) tuple
        """
    def manual_seed(self, seed: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Reset to (seed, offset 0)
        """
    def set_state(self, state: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex]) -> None:
        """
        Restore a state from get_state()
        """
    @property
    def capturing(self) -> bool:
        """
        True between begin_capture and end_capture
        """
class GradSlots:
    """
    The gradient slots of a parameter store: while this object lives, each leaf's gradient lands in its slot (a view of one flat buffer), which becomes its .grad
    """
    def __init__(self, leaves: collections.abc.Sequence[Tensor], slots: collections.abc.Sequence[Tensor]) -> None:
        ...
    def __len__(self) -> int:
        ...
    def clear(self) -> None:
        """
        Set every leaf's .grad to None (the slots keep their memory)
        """
    def sync(self) -> list[int]:
        """
        Put every .grad into its slot (one assigned by hand is copied in); the indices of leaves without one
        """
def _from_dlpack_capsule(capsule: typing_extensions.CapsuleType) -> Tensor:
    """
    Wrap a DLPack capsule as a tensor sharing its memory
    """
def _from_numpy(array: numpy.ndarray[typing.Any, numpy.dtype[typing.Any]], dtype: typing.Any, device: typing.Any = None) -> Tensor:
    """
    Copy a numpy array into a new tensor (used by xtrain.tensor)
    """
def arange(start: typing.SupportsFloat | typing.SupportsIndex, end: typing.SupportsFloat | typing.SupportsIndex, step: typing.SupportsFloat | typing.SupportsIndex = 1.0, dtype: typing.Any = None, device: typing.Any = None) -> Tensor:
    """
    Values start, start+step, ... below end
    """
def backward_many(roots: collections.abc.Sequence[Tensor], seeds: collections.abc.Sequence[Tensor]) -> None:
    """
    One backward walk from several roots, each with its upstream gradient (ops with several outputs)
    """
def checkpoint(segment_fn: collections.abc.Callable, x: Tensor, params: collections.abc.Sequence[Tensor]) -> Tensor:
    """
    Run segment_fn(x, params) without keeping its activations; recompute them in backward
    """
def default_generator(device: typing.Any = None) -> Generator:
    """
    The default generator of a device
    """
def empty(shape: typing.Any, dtype: typing.Any = None, device: typing.Any = None) -> Tensor:
    """
    An uninitialised tensor from the caching allocator
    """
def empty_cache(device: typing.Any = None) -> None:
    """
    Return cached free blocks to the system / driver
    """
def full(shape: typing.Any, fill_value: typing.SupportsFloat | typing.SupportsIndex, dtype: typing.Any = None, device: typing.Any = None) -> Tensor:
    """
    A tensor filled with a value
    """
def get_num_threads() -> int:
    """
    Threads of the CPU backend: OpenBLAS's pool for the matrix multiplies, and as many for the CPU kernels that split rows or elements (their bits do not depend on the count)
    """
def is_grad_enabled() -> bool:
    """
    Whether ops record the tape on this thread
    """
def last_backward_batched_casts() -> int:
    """
    How many gradient conversions into parameter-store slots the last backward walk on this thread ran in one batch at its end (Note [Batched gradient casts])
    """
def manual_seed(seed: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Seed the default generator of every device
    """
def memory_history(device: typing.Any = None) -> list:
    """
    The allocations the caching allocator took from the device since record_memory_history(True), in order: requested and size (bytes asked for and taken), pool (the CUDA graph's private pool served, 0 for the shared cache), the allocator's allocated/requested/reserved bytes just before, and the free bytes, largest free block and free block count of the cache or pool that could not serve the request
    """
def memory_segments(device: typing.Any = None) -> list:
    """
    The caching allocator's large allocations on a device (1 MiB and up) and the pieces each is split into now: offset, size, free, and for a free piece the private pool that owns it (0: the shared cache)
    """
def memory_stats(device: typing.Any = None) -> dict:
    """
    Caching-allocator statistics of a device (PyTorch's names where it has one)
    """
def rand(shape: typing.Any, dtype: typing.Any = None, device: typing.Any = None, generator: typing.Any = None, requires_grad: bool = False) -> Tensor:
    """
    Uniform samples in [0, 1)
    """
def randn(shape: typing.Any, dtype: typing.Any = None, device: typing.Any = None, generator: typing.Any = None, requires_grad: bool = False) -> Tensor:
    """
    Standard normal samples
    """
def record_memory_history(enabled: bool = True, device: typing.Any = None) -> None:
    """
    Record every allocation the caching allocator takes from the device from now on (forgetting what it recorded before), or stop recording; memory_history() reads them
    """
def reset_peak_memory_stats(device: typing.Any = None) -> None:
    """
    Set the peaks to the current values
    """
def set_grad_enabled(enabled: bool) -> None:
    """
    Turn tape recording on/off for this thread
    """
def set_memory_limit(nbytes: typing.Any, device: typing.Any = None) -> None:
    """
    Cap the bytes the allocator may reserve on a device (None lifts the cap)
    """
def set_num_threads(n: typing.Any) -> None:
    """
    Set the CPU backend's matrix-multiply threads (as OPENBLAS_NUM_THREADS at start-up); on a machine whose cores are shared with other work, fewer threads than cores avoid oversubscription. A GEMM's bits may depend on the count: results repeat at a fixed count
    """
