"""
NCCL communicator (data-parallel training)
"""
from __future__ import annotations
import typing
__all__: list[str] = ['Communicator', 'UNAVAILABLE_REASON', 'is_available', 'nccl_version']
class Communicator:
    """
    Unavailable: xtrain was built without NCCL
    """
    def __init__(self, devices: typing.Any, timeout: typing.SupportsFloat | typing.SupportsIndex = 600.0) -> None:
        ...
def is_available() -> bool:
    """
    True when xtrain was built with NCCL
    """
def nccl_version() -> typing.Any:
    """
    None: built without NCCL
    """
UNAVAILABLE_REASON: str = 'xtrain was built without NCCL (xtrain._C.dist.is_available() is False): data-parallel training needs a CUDA build that found NCCL (the nvidia-nccl-cu13 wheel or a system NCCL)'
