"""AdamW on the fused C++ step, global-norm gradient clipping, and the LR schedule.

- AdamW follows torch.optim.AdamW (decoupled weight decay, bias correction) and nanoGPT's grouping:
  tensors with 2 or more dims (linear and embedding weights) decay, the rest (norm weights) do not.
  Each group is one call of `_C.optim.adamw_step`, which updates every tensor of the group in one
  fused launch. Parameters, gradients and both moments are float32 on one device.
- clip_grad_norm_ computes the global L2 norm on the device and scales the gradients by
  min(1, max_norm / (norm + 1e-6)) there too: it returns the norm as a device Tensor and never
  waits for the device (read it with .item() only when logging). A non-finite norm leaves the
  gradients untouched; the step must then be skipped by the caller.
- The schedule is a plain function of the step, so a resumed run needs no schedule state.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

import xtrain
from xtrain import _C


class AdamW:
    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1):
        """params: tensors, or (name, tensor) pairs such as model.named_parameters() (names key
        the moments in state_dict; plain tensors are named "0", "1", ...)."""
        named = [(str(i), p) if isinstance(p, xtrain.Tensor) else (str(p[0]), p[1])
                 for i, p in enumerate(params)]
        if not named:
            raise ValueError("AdamW got an empty parameter list")
        if len({n for n, _ in named}) != len(named):
            raise ValueError("AdamW parameter names must be unique")
        for n, p in named:
            if p.dtype != "float32":
                raise TypeError(f"AdamW keeps float32 master weights; parameter {n} is {p.dtype}")
            if p.device != named[0][1].device:
                raise ValueError(f"AdamW parameters must share one device: {n} is on {p.device}, "
                                 f"{named[0][0]} on {named[0][1].device}")
        _check_hyper(lr, betas, eps, weight_decay)
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), tuple(map(float, betas)), \
            float(eps), float(weight_decay)
        self.decay = [i for i, p in enumerate(self.params) if len(p.shape) >= 2]
        self.no_decay = [i for i, p in enumerate(self.params) if len(p.shape) < 2]
        self.exp_avg = [_zeros_like(p) for p in self.params]
        self.exp_avg_sq = [_zeros_like(p) for p in self.params]
        self.step_count = 0

    def step(self) -> None:
        """One update of every parameter that has a gradient (asynchronous on the device)."""
        self.step_count += 1
        b1, b2 = self.betas
        params, m, v = self.params, self.exp_avg, self.exp_avg_sq
        for group, wd in ((self.decay, self.weight_decay), (self.no_decay, 0.0)):
            grads = [params[i].grad for i in group]
            idx = group
            if any(g is None for g in grads):  # only the parameters that have a gradient
                idx = [i for i, g in zip(group, grads) if g is not None]
                grads = [g for g in grads if g is not None]
            if not idx:
                continue
            _C.optim.adamw_step([params[i] for i in idx], grads, [m[i] for i in idx], [v[i] for i in idx],
                                self.lr, b1, b2, self.eps, wd, self.step_count)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad = xtrain.zeros(p.shape, dtype=p.dtype, device=p.device)

    def hyper(self) -> dict:
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "weight_decay": self.weight_decay}

    def state_dict(self) -> dict:
        return {"step": self.step_count, "hyper": self.hyper(),
                "exp_avg": OrderedDict(zip(self.names, self.exp_avg)),
                "exp_avg_sq": OrderedDict(zip(self.names, self.exp_avg_sq))}

    def load_state_dict(self, state: dict) -> None:
        """Restore step, hyper-parameters and moments (xtrain Tensors or numpy arrays, by name).
        Everything is checked before anything changes."""
        for key in ("exp_avg", "exp_avg_sq"):
            got = state.get(key, {})
            missing = [n for n in self.names if n not in got]
            unexpected = [n for n in got if n not in self.names]
            if missing or unexpected:
                raise KeyError(f"AdamW.load_state_dict: {key} has missing {missing[:8]} / "
                               f"unexpected {unexpected[:8]} parameter names")
            for n, p in zip(self.names, self.params):
                if tuple(got[n].shape) != tuple(p.shape):
                    raise ValueError(f"AdamW.load_state_dict: {key}[{n}] has shape "
                                     f"{tuple(got[n].shape)}, parameter {tuple(p.shape)}")
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"AdamW.load_state_dict: step must be a non-negative int, got {step!r}")
        hyper = state.get("hyper", self.hyper())
        _check_hyper(hyper["lr"], hyper["betas"], hyper["eps"], hyper["weight_decay"])
        device = self.params[0].device
        self.exp_avg = [_copy(state["exp_avg"][n], device) for n in self.names]
        self.exp_avg_sq = [_copy(state["exp_avg_sq"][n], device) for n in self.names]
        self.step_count = step
        self.lr, self.betas = float(hyper["lr"]), tuple(map(float, hyper["betas"]))
        self.eps, self.weight_decay = float(hyper["eps"]), float(hyper["weight_decay"])


def clip_grad_norm_(params, max_norm: float):
    """Scale the gradients of `params` in place so their global L2 norm is at most max_norm.
    Returns the norm before clipping as a float32 scalar Tensor on the device (no host sync).

    A non-finite norm (a gradient holding NaN or Inf, or one too large for float32) leaves every
    gradient as it is and comes back as NaN or Inf: no scale factor repairs such a step, so its
    caller must skip it (the training loop's non-finite guard does)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        raise ValueError("clip_grad_norm_: no parameter has a gradient")
    if max_norm is not None and not max_norm >= 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0 (0 or None: no clipping), got {max_norm}")
    norm = _C.optim.global_norm(grads)
    if max_norm is not None and max_norm > 0:
        # The kernel scales by min(1, max_norm / (norm + 1e-6)): 1 for a NaN norm, but 0 for an
        # infinite one, and 0 * Inf = NaN would spread to the finite gradients. norm + (norm -
        # norm) is the norm when finite and NaN otherwise: two scalar ops on the device, no sync.
        _C.optim.clip_by_norm_(grads, _C.ops.add(norm, _C.ops.sub(norm, norm)), float(max_norm))
    return norm


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """LR for `step` (0-based): linear warm-up over `warmup` steps, then cosine decay to min_lr at
    step `total`, min_lr afterwards (nanoGPT's get_lr)."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    ratio = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


def _check_hyper(lr, betas, eps, weight_decay) -> None:
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0, got {lr}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two values in [0, 1), got {betas}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")


def _zeros_like(p):
    return xtrain.zeros(tuple(p.shape), dtype="float32", device=p.device)


def _copy(value, device: str):
    arr = value.numpy() if isinstance(value, xtrain.Tensor) else np.asarray(value)
    return xtrain.tensor(np.array(arr, dtype=np.float32), dtype="float32", device=device)
