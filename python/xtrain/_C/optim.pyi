"""
Fused optimizer kernels on float32 tensors of one device
"""
from __future__ import annotations
import collections.abc
import typing
import xtrain._C
__all__: list[str] = ['adamw_step', 'clip_by_norm_', 'global_norm']
def adamw_step(params: collections.abc.Sequence[xtrain._C.Tensor], grads: collections.abc.Sequence[xtrain._C.Tensor], exp_avg: collections.abc.Sequence[xtrain._C.Tensor], exp_avg_sq: collections.abc.Sequence[xtrain._C.Tensor], lr: typing.SupportsFloat | typing.SupportsIndex, beta1: typing.SupportsFloat | typing.SupportsIndex, beta2: typing.SupportsFloat | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex, step: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    One AdamW step (torch.optim.AdamW math) over every tensor, in place; step counts from 1
    """
def clip_by_norm_(tensors: collections.abc.Sequence[xtrain._C.Tensor], norm: xtrain._C.Tensor, max_norm: typing.SupportsFloat | typing.SupportsIndex) -> None:
    """
    Scale every tensor in place by min(1, max_norm / (norm + 1e-6)); no host sync
    """
def global_norm(tensors: collections.abc.Sequence[xtrain._C.Tensor]) -> xtrain._C.Tensor:
    """
    sqrt of the sum of squares over all tensors, as a float32 [] tensor on their device
    """
