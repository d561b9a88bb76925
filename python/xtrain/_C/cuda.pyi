"""
CUDA runtime queries
"""
from __future__ import annotations
import typing
__all__: list[str] = ['allow_tf32', 'current_device', 'device_count', 'device_name', 'is_available', 'is_built', 'runtime_info', 'set_allow_tf32', 'set_device', 'synchronize']
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
def is_available() -> bool:
    """
    True when the CUDA backend is built and a GPU is visible
    """
def is_built() -> bool:
    """
    True when the CUDA backend was compiled in
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
def synchronize(device: typing.Any = None) -> None:
    """
    Wait for this thread's work on a device (all when None)
    """
