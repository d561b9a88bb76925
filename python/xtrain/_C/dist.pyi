"""
NCCL communicator (data-parallel training)
"""
from __future__ import annotations
import collections.abc
import typing
import xtrain._C
__all__: list[str] = ['Communicator', 'GradReducer', 'RankComm', 'UNAVAILABLE_REASON', 'is_available', 'nccl_version', 'unique_id']
class RankComm:
    """
    One rank's view of a Communicator; use it from that rank's thread
    """
    def abort(self, reason: str = 'aborted by the caller') -> None:
        """
        Abort the whole communicator
        """
    def all_gather(self, flats: typing.Any) -> None:
        """
        In place, for a tensor or each of a list: chunk r becomes rank r's chunk r on every rank (one launch, asynchronous)
        """
    def all_reduce(self, tensors: collections.abc.Sequence[xtrain._C.Tensor], op: str = 'avg') -> None:
        """
        In-place all-reduce ("avg" or "sum") of float32/bfloat16 tensors on this rank's device, as one NCCL launch on this thread's stream (asynchronous)
        """
    def barrier(self) -> None:
        """
        Sync point: wait until every rank reached its barrier
        """
    def broadcast(self, tensors: collections.abc.Sequence[xtrain._C.Tensor], root: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        In place: every rank gets root's values (asynchronous)
        """
    def note_replay(self) -> None:
        """
        After replaying a CUDA graph that holds this rank's collectives: the watchdog times the replay (collectives queued during a capture are not tracked)
        """
    def reduce_scatter(self, flats: typing.Any, op: str = 'avg', extra: collections.abc.Sequence[xtrain._C.Tensor] = []) -> None:
        """
        In place, for a tensor or each of a list: this rank's chunk (numel / world_size elements, in rank order) becomes the reduction over the ranks; the other chunks are left unspecified. `extra` tensors are all-reduced in the same launch (asynchronous)
        """
    @property
    def communicator(self) -> Communicator:
        ...
    @property
    def device(self) -> int:
        """
        The CUDA device index this rank drives
        """
    @property
    def rank(self) -> int:
        ...
    @property
    def world_size(self) -> int:
        ...
class Communicator:
    """
    NCCL ranks this process drives: one per GPU with a host thread each (the constructor), or its one rank of a process group (join)
    """
    @staticmethod
    def join(device: typing.SupportsInt | typing.SupportsIndex, world_size: typing.SupportsInt | typing.SupportsIndex, rank: typing.SupportsInt | typing.SupportsIndex, unique_id: bytes, timeout: typing.SupportsFloat | typing.SupportsIndex = 600.0) -> Communicator:
        """
        Rank `rank` of a process group on cuda:device, from rank 0's unique_id(); starts connecting and returns: call wait_ready() next (abort() from another thread ends that wait)
        """
    def __init__(self, devices: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], timeout: typing.SupportsFloat | typing.SupportsIndex = 600.0) -> None:
        """
        Create rank i on cuda:devices[i]; a collective unfinished after `timeout` s aborts all ranks
        """
    def abort(self, reason: str = 'aborted by the caller') -> None:
        """
        ncclCommAbort every rank (any thread): peers blocked in NCCL return, later calls raise
        """
    def close(self) -> None:
        """
        Orderly teardown once every rank is done (sync point; bounded by the timeout)
        """
    def rank(self, rank: typing.SupportsInt | typing.SupportsIndex) -> RankComm:
        """
        The handle rank `rank`'s thread uses
        """
    def wait_ready(self) -> None:
        """
        Sync point: wait until the ranks are connected (raises on failure, timeout or abort)
        """
    @property
    def aborted(self) -> bool:
        ...
    @property
    def devices(self) -> list[int]:
        ...
    @property
    def error(self) -> typing.Any:
        """
        Why the communicator was aborted (None while healthy)
        """
    @property
    def first_rank(self) -> int:
        """
        Global rank of devices[0]
        """
    @property
    def ready(self) -> bool:
        ...
    @property
    def timeout(self) -> float:
        ...
    @property
    def world_size(self) -> int:
        ...
class GradReducer:
    """
    Averages one rank's parameter gradients over the ranks while backward runs: buckets of about bucket_bytes, in reverse parameter order, each all-reduced on a side stream as soon as its gradients are final. Use from the rank's thread: arm(); loss.backward(); finish(extra)
    """
    def __init__(self, comm: RankComm, params: collections.abc.Sequence[xtrain._C.Tensor], bucket_bytes: typing.SupportsInt | typing.SupportsIndex = 26214400) -> None:
        ...
    def arm(self) -> None:
        """
        Hook this thread's backward walks (call before backward)
        """
    def disarm(self) -> None:
        """
        Unhook without launching anything (after a failed backward)
        """
    def finish(self, extra: collections.abc.Sequence[xtrain._C.Tensor] = []) -> None:
        """
        Unhook, launch what is left, join the side stream and average the small gradients and `extra` (asynchronous: no host wait)
        """
    @property
    def launched_during_backward(self) -> int:
        """
        Buckets the last backward launched before it ended (the overlapped ones)
        """
    @property
    def num_buckets(self) -> int:
        ...
def is_available() -> bool:
    """
    True when xtrain was built with NCCL
    """
def nccl_version() -> str:
    """
    Version of the NCCL library in use
    """
def unique_id() -> bytes:
    """
    A new NCCL unique id (bytes) for a process group: rank 0 makes it, every process passes it to Communicator.join
    """
UNAVAILABLE_REASON = None
