"""Modules: a container of parameters with names, in the PyTorch style, and the three layers the
model is built from (Linear, Embedding, RMSNorm).

Rules:
- Every `xtrain.Tensor` assigned as an attribute of a Module is a parameter (the models here have no
  buffers); every Module attribute is a submodule. Both are remembered in assignment order, so
  `named_parameters()` (and hence the optimizer's tensor order and the checkpoint's key order) is
  fixed by the code, not by dict hashing.
- Parameters are float32 leaves with requires_grad=True (the master weights: bf16 runs cast them on
  use, see models/transformer.py).
- `load_state_dict` replaces parameters with fresh leaves holding copies of the given values, so a
  loaded model never shares memory with its source. Build the optimizer after loading.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Iterator

import numpy as np

import xtrain
from xtrain import ops


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- registration by attribute
    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                               f"before assigning {name!r}")
        params, modules = self.__dict__["_parameters"], self.__dict__["_modules"]
        params.pop(name, None)
        modules.pop(name, None)
        if isinstance(value, xtrain.Tensor):
            params[name] = value
        elif isinstance(value, Module):
            modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: parameters and submodules live in the dicts.
        d = self.__dict__
        if name in d.get("_parameters", {}):
            return d["_parameters"][name]
        if name in d.get("_modules", {}):
            return d["_modules"][name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    # ---- traversal
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self) -> Iterator[tuple[str, "xtrain.Tensor"]]:
        for mod_name, m in self.named_modules():
            for name, p in m._parameters.items():
                yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> list:
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        return sum(math.prod(p.shape) for p in self.parameters())

    def children(self) -> Iterator["Module"]:
        return iter(self._modules.values())

    # ---- modes and placement
    def train(self, mode: bool = True) -> "Module":
        for _, m in self.named_modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def to(self, device: str) -> "Module":
        """Move every parameter to `device` (new leaves; gradients are dropped)."""
        for _, m in self.named_modules():
            for name, p in list(m._parameters.items()):
                if p.device != device:
                    m._parameters[name] = _leaf(p.detach().to(device=device), p.requires_grad)
        return self

    @property
    def device(self) -> str:
        """The first parameter's device ("cpu" for a module without parameters)."""
        for _, p in self.named_parameters():
            return p.device
        return "cpu"

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    # ---- state
    def state_dict(self) -> "OrderedDict[str, xtrain.Tensor]":
        """name -> parameter value (detached; shares storage with the parameter)."""
        return OrderedDict((name, p.detach()) for name, p in self.named_parameters())

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy values (xtrain Tensors or numpy arrays) into the parameters of the same names.

        Every shape is checked before anything changes, so a failed load leaves the module as it
        was. strict=True: missing or unexpected keys raise KeyError naming them. Returns
        (missing, unexpected) keys."""
        own = OrderedDict(self.named_parameters())
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append(f"missing keys {_preview(missing)}")
            if unexpected:
                parts.append(f"unexpected keys {_preview(unexpected)}")
            raise KeyError(f"load_state_dict for {type(self).__name__}: " + "; ".join(parts))
        bad = []
        for name, p in own.items():
            if name in state and tuple(state[name].shape) != tuple(p.shape):
                bad.append(f"{name}: checkpoint {tuple(state[name].shape)}, model {tuple(p.shape)}")
        if bad:
            raise ValueError(f"load_state_dict for {type(self).__name__}: shape mismatch for "
                             + "; ".join(bad))
        owners = {}
        for mod_name, m in self.named_modules():
            for pname in m._parameters:
                owners[f"{mod_name}.{pname}" if mod_name else pname] = (m, pname)
        for name, p in own.items():
            if name not in state:
                continue
            m, pname = owners[name]
            m._parameters[pname] = _copy_leaf(state[name], p.dtype, p.device, p.requires_grad)
        return missing, unexpected

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            lines.append("  " + f"({name}): {m!r}".replace("\n", "\n  "))
        return "\n".join(lines) + ("\n)" if len(lines) > 1 else ")")


class ModuleList(Module):
    """An indexable list of submodules, registered as "0", "1", ..."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m: Module) -> None:
        setattr(self, str(len(self._modules)), m)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)


class Linear(Module):
    """y = x @ weight^T (+ bias). weight [out, in], as in PyTorch and the Hugging Face layout."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 device: str = "cpu", generator=None, std: float = 0.02):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = normal_param((out_features, in_features), std, device, generator)
        self.bias = zeros_param((out_features,), device) if bias else None

    def forward(self, x):
        y = ops.linear(x, self.weight)
        return y if self.bias is None else ops.add(y, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """weight [num_embeddings, dim]; forward(ids int [...]) -> [..., dim]."""

    def __init__(self, num_embeddings: int, dim: int, device: str = "cpu", generator=None,
                 std: float = 0.02):
        super().__init__()
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight = normal_param((num_embeddings, dim), std, device, generator)

    def forward(self, ids):
        return ops.embedding(self.weight, ids)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.dim}"


class RMSNorm(Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dim; weight starts at ones."""

    def __init__(self, dim: int, eps: float = 1e-6, device: str = "cpu"):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = _leaf(xtrain.ones((dim,), dtype="float32", device=device), True)

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


# ---- parameter construction

def normal_param(shape, std: float, device: str = "cpu", generator=None):
    """A float32 leaf ~ N(0, std^2). Drawn on the CPU from `generator` and then moved, so the
    same seed gives the same weights whatever the device."""
    w = ops.scale(xtrain.randn(tuple(shape), dtype="float32", device="cpu", generator=generator),
                  float(std))
    return _leaf(w.to(device=device) if device != "cpu" else w, True)


def zeros_param(shape, device: str = "cpu"):
    return _leaf(xtrain.zeros(tuple(shape), dtype="float32", device=device), True)


def _leaf(t, requires_grad: bool):
    t = t.detach()
    t.requires_grad = requires_grad
    return t


def _copy_leaf(value, dtype: str, device: str, requires_grad: bool):
    # Through host memory: a fresh storage that the source can never alias.
    arr = value.numpy() if isinstance(value, xtrain.Tensor) else np.asarray(value)
    return _leaf(xtrain.tensor(np.array(arr, dtype=np.float32), dtype=dtype, device=device),
                 requires_grad)


def _preview(keys: list[str], n: int = 8) -> str:
    shown = ", ".join(keys[:n])
    return f"[{shown}{', ...' if len(keys) > n else ''}] ({len(keys)} in all)"
