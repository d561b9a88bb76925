"""
Fused optimizer kernels on float32 tensors of one device
"""
from __future__ import annotations
import collections.abc
import typing
import xtrain._C
__all__: list[str] = ['adamw_consts', 'adamw_step', 'clip_by_norm_', 'global_norm', 'muon_consts', 'muon_step']
def adamw_consts(lr: typing.SupportsFloat | typing.SupportsIndex, beta1: typing.SupportsFloat | typing.SupportsIndex, beta2: typing.SupportsFloat | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex, step: typing.SupportsInt | typing.SupportsIndex) -> list[float]:
    """
    [decay, step_size, bc2_sqrt]: the per-step constants adamw_step computes from lr and step (float32 values as Python floats), for its `hyper` tensor
    """
def adamw_step(params: collections.abc.Sequence[xtrain._C.Tensor], grads: collections.abc.Sequence[xtrain._C.Tensor], exp_avg: collections.abc.Sequence[xtrain._C.Tensor], exp_avg_sq: collections.abc.Sequence[xtrain._C.Tensor], lr: typing.SupportsFloat | typing.SupportsIndex, beta1: typing.SupportsFloat | typing.SupportsIndex, beta2: typing.SupportsFloat | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex, step: typing.SupportsInt | typing.SupportsIndex, guard: xtrain._C.Tensor | None = None, clip_norm: xtrain._C.Tensor | None = None, max_norm: typing.SupportsFloat | typing.SupportsIndex = 0.0, hyper: xtrain._C.Tensor | None = None, decays: collections.abc.Sequence[bool] | None = None) -> None:
    """
    One AdamW step (torch.optim.AdamW math) over every tensor, in place; step counts from 1. guard: a one-element float32 tensor on the device; when it is not finite nothing is written (no host sync). clip_norm (with max_norm > 0): each gradient is read scaled by min(1, max_norm / (clip_norm + 1e-6)), the factor clip_by_norm_ would apply, without writing the gradients. hyper: a 3-element float32 tensor on the device holding adamw_consts(lr, ..., step), read by the kernel instead of lr and step (a CUDA graph replays with the values written there before each replay). decays: one bool per tensor, whether weight_decay applies to it (None: to every tensor); the others update as with weight_decay 0, in the same launch
    """
def clip_by_norm_(tensors: collections.abc.Sequence[xtrain._C.Tensor], norm: xtrain._C.Tensor, max_norm: typing.SupportsFloat | typing.SupportsIndex) -> None:
    """
    Scale every tensor in place by min(1, max_norm / (norm + 1e-6)); no host sync
    """
def global_norm(tensors: collections.abc.Sequence[xtrain._C.Tensor]) -> xtrain._C.Tensor:
    """
    sqrt of the sum of squares over all tensors, as a float32 [] tensor on their device
    """
def muon_consts(lr: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex) -> list[float]:
    """
    [decay, lr]: the per-step values muon_step computes from lr and weight_decay (float32 values as Python floats), for its `hyper` tensor
    """
def muon_step(params: collections.abc.Sequence[xtrain._C.Tensor], grads: collections.abc.Sequence[xtrain._C.Tensor], momentum_buffers: collections.abc.Sequence[xtrain._C.Tensor], lr: typing.SupportsFloat | typing.SupportsIndex, weight_decay: typing.SupportsFloat | typing.SupportsIndex, momentum: typing.SupportsFloat | typing.SupportsIndex, nesterov: bool, ns_coefficients: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], ns_steps: typing.SupportsInt | typing.SupportsIndex, eps: typing.SupportsFloat | typing.SupportsIndex, lr_ratios: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], guard: xtrain._C.Tensor | None = None, clip_norm: xtrain._C.Tensor | None = None, max_norm: typing.SupportsFloat | typing.SupportsIndex = 0.0, hyper: xtrain._C.Tensor | None = None) -> None:
    """
    One Muon step (torch.optim.Muon math) over float32 2-D matrices, in place: momentum (Nesterov), ns_steps Newton-Schulz iterations with ns_coefficients (a, b, c) in bf16 on the engine's GEMMs (matrices of one shape batched), decoupled weight decay, and each matrix's lr * lr_ratios[i]. guard, clip_norm, max_norm: as adamw_step's. hyper: a 2-element float32 tensor on the device holding muon_consts(lr, weight_decay), read instead of lr and weight_decay (a CUDA graph replays with the values written there)
    """
