"""
The CPU profile: wall time and calls per CPU kernel and backward Node
"""
from __future__ import annotations
__all__: list[str] = ['cpu_enable', 'cpu_enabled', 'cpu_read', 'cpu_reset']
def cpu_enable(enabled: bool = True) -> None:
    """
    Start (True) or stop (False) recording; the entries recorded so far are kept
    """
def cpu_enabled() -> bool:
    """
    Whether the CPU profile is recording
    """
def cpu_read() -> list:
    """
    The entries recorded since the last reset, each a dict: name, kind ('kernel': a CPU kernel's own time; 'node': a backward Node's apply, kernels included), phase ('forward' or 'backward'), calls, seconds
    """
def cpu_reset() -> None:
    """
    Drop every entry recorded so far
    """
