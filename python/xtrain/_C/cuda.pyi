"""
CUDA runtime queries
"""
from __future__ import annotations
import collections.abc
import numpy
import typing
import xtrain._C
__all__: list[str] = ['Event', 'Graph', 'PendingArray', 'PendingValues', 'allow_tf32', 'current_device', 'device_count', 'device_name', 'early_launch', 'is_available', 'is_built', 'is_capturing', 'read_array_async', 'read_async', 'runtime_info', 'set_allow_tf32', 'set_device', 'set_early_launch', 'synchronize']
class PendingValues:
    """
    Values of one-element tensors on their way to the host (read_async)
    """
    def ready(self) -> bool:
        """
        True once every value has landed (never waits)
        """
    def wait(self) -> list:
        """
        The values as Python numbers; waits for them (a sync point)
        """
class PendingArray:
    """
    A tensor's values on their way to the host (read_array_async)
    """
    def ready(self) -> bool:
        """
        True once the copy has landed (never waits)
        """
    def wait(self) -> numpy.ndarray[typing.Any, numpy.dtype[typing.Any]]:
        """
        The values as a numpy array (a copy); waits for them (a sync point)
        """
class Event:
    """
    A timing event on this thread's stream of one CUDA device: record() queues it, elapsed_ms_since(start) waits for it and returns the device time since start (ms)
    """
    def __init__(self, device: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        device: the CUDA device index
        """
    def elapsed_ms_since(self, start: Event) -> float:
        """
        Milliseconds of device time from `start` to this event; waits for this event (a sync point)
        """
    def ready(self) -> bool:
        """
        True once the device has passed the event, or when never recorded (never waits)
        """
    def record(self) -> None:
        """
        Queue the event on this thread's stream (not while capturing a graph: record between replays)
        """
    @property
    def device(self) -> int:
        ...
    @property
    def recorded(self) -> bool:
        ...
class Graph:
    """
    A CUDA graph of the work this thread queues on its stream of one device between capture_begin() and capture_end(); replay() launches it again (docs/cuda.md)
    """
    def __init__(self, device: typing.SupportsInt | typing.SupportsIndex = 0, share_pool_with: Graph = None) -> None:
        """
        device: the CUDA device index. share_pool_with: a graph captured before this one on this thread, always replayed before it: both use one private memory pool
        """
    def abort_capture(self) -> None:
        """
        Discard a capture in progress (never raises)
        """
    def capture_begin(self) -> None:
        """
        Start capturing this thread's stream; allocations come from the graph's private pool
        """
    def capture_end(self) -> None:
        """
        End the capture and instantiate the graph; RuntimeError when the captured region was not capturable
        """
    def replay(self) -> None:
        """
        Launch the graph on this thread's stream (no host sync)
        """
    @property
    def captured(self) -> bool:
        ...
    @property
    def capturing(self) -> bool:
        ...
    @property
    def device(self) -> int:
        ...
    @property
    def memsets_as_kernels(self) -> int:
        """
        Captured memsets written as kernel nodes (Note [Memset nodes as kernels])
        """
    @property
    def num_nodes(self) -> int:
        """
        Nodes of the graph: kernels, copies and memsets, i.e. the launches one replay saves
        """
    @property
    def pool_id(self) -> int:
        """
        The private pool's id (0 before the capture)
        """
    @property
    def replays(self) -> int:
        ...
def allow_tf32() -> bool:
    """
    Whether float32 GEMMs may use TF32
    """
def current_device() -> int:
    """
    This thread's current device
    """
def device_count() -> int:
    """
    Number of visible GPUs
    """
def device_name(device: typing.SupportsInt | typing.SupportsIndex = 0) -> str:
    ...
def early_launch(device: typing.SupportsInt | typing.SupportsIndex = 0) -> bool:
    """
    Whether a launch on that device starts early now (asked for by this thread, sm_90+)
    """
def is_available() -> bool:
    """
    True when the CUDA backend is built and a GPU is visible
    """
def is_built() -> bool:
    """
    True when the CUDA backend was compiled in
    """
def is_capturing() -> bool:
    """
    True while this thread captures a CUDA graph
    """
def read_array_async(tensor: xtrain._C.Tensor) -> PendingArray:
    """
    Queue a copy of a whole tensor (not bfloat16) to the host without waiting for the stream; .wait() returns it as a numpy array and waits only for the work queued before this call
    """
def read_async(tensors: collections.abc.Sequence[xtrain._C.Tensor]) -> PendingValues:
    """
    Queue copies of one-element tensors to the host without waiting for the stream; .wait() returns their values (and waits only for the work queued before this call)
    """
def runtime_info() -> str:
    """
    Driver, runtime and cuBLAS versions
    """
def set_allow_tf32(allow: bool) -> None:
    """
    Let float32 GEMMs use TF32 tensor cores (off by default: true float32)
    """
def set_device(device: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Set this thread's current device
    """
def set_early_launch(on: bool) -> bool:
    """
    Let this thread's launches of the decode step's kernels start before the kernel ahead of them finishes (programmatic dependent launch, sm_90+); returns the previous setting. The caller promises that what those kernels read before their wait is not written by the launch just before them (Note [Early launch of the decode step's kernels])
    """
def synchronize(device: typing.Any = None) -> None:
    """
    Wait for this thread's work on a device (all when None)
    """
