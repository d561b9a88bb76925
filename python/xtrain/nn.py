"""Modules: a container of parameters with names, in the PyTorch style, the layers the models are
built from (Linear, Embedding, RMSNorm, LayerNorm, Dropout), and the residual stream that fuses each
residual add into the norm after it (ResidualStream).

Rules:
- Every `xtrain.Tensor` assigned as an attribute of a Module is a parameter (the models here have no
  buffers); every Module attribute is a submodule. Both are remembered in assignment order, so
  `named_parameters()` (and hence the optimizer's tensor order and the checkpoint's key order) is
  fixed by the code, not by dict hashing.
- Parameters are float32 leaves with requires_grad=True (the master weights: bf16 runs cast them on
  use, see models/transformer.py).
- `load_state_dict` copies the given values into the parameters (in place: an optimizer built
  before keeps working with them; the model never shares memory with its source).
- A model may keep its parameters in a ParamStore (xtrain.store; TinyTransformer does): flat
  buffers with each parameter a view. `to()` and `load_state_dict` then work on the store.
- checkpoint(fn, x, *modules) is xtrain.checkpoint for module code: the modules' parameters (as
  bound at the call, e.g. a bf16 model's cast weights) are the segment's inputs.
- A ResidualStream leaves `x + delta` pending until the norm after it, which runs the add and the
  norm as one ops.add_rms_norm (RMSNorm) or ops.add_layer_norm (LayerNorm), bitwise the two ops,
  forward and backward: model code keeps the plain form `x = x + attn(norm(x))` and gets the fused
  kernel.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Iterator

import numpy as np

import xtrain
from xtrain import ops
from xtrain.store import ParamStore
from xtrain.tensor import to_args


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

    def to(self, *args, device=None, dtype=None) -> "Module":
        """Move the parameters to a device and/or convert them to a dtype, as Tensor.to takes
        them: m.to("cuda"), m.to("bfloat16"), m.to("cuda", "float32"), m.to(tensor), or by keyword.
        A module with a ParamStore moves its flat buffers as a whole (xtrain.store); otherwise each
        parameter becomes a new leaf. Gradients are dropped: build the optimizer afterwards."""
        device, dtype = to_args("Module.to", args, device, dtype)
        store = self.__dict__.get("store")
        if store is not None:
            store.to(device, dtype)
            return self
        for _, m in self.named_modules():
            for name, p in list(m._parameters.items()):
                if ParamStore.holding(p) is not None:
                    raise ValueError(f"{type(self).__name__}.to: parameter {name!r} lives in a parameter store "
                                     f"of an enclosing model; move that model instead")
                if (device is None or p.device == device) and (dtype is None or p.dtype == dtype):
                    continue
                m._parameters[name] = _leaf(p.detach().to(device=device, dtype=dtype), p.requires_grad)
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
        store = self.__dict__.get("store")
        if store is not None and not missing:
            store.load_arrays(state)  # one upload into the flat buffer
            return missing, unexpected
        with xtrain.no_grad():
            for name, p in own.items():
                if name in state:
                    p.copy_(_as_tensor(state[name]))
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
        """x (..., dim) -> the normed (..., dim); x a ResidualStream: its pending add and this norm
        in one kernel (ResidualStream.rms_norm)."""
        if isinstance(x, ResidualStream):
            return x.rms_norm(self.weight, self.eps)
        return ops.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim (torch.nn.LayerNorm with
    elementwise affine); weight starts at ones, bias at zeros. Both stay float32 in a bf16 model."""

    def __init__(self, dim: int, eps: float = 1e-5, device: str = "cpu"):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = _leaf(xtrain.ones((dim,), dtype="float32", device=device), True)
        self.bias = zeros_param((dim,), device)

    def forward(self, x):
        """x (..., dim) -> the normed (..., dim); x a ResidualStream: its pending add and this norm
        in one kernel (ResidualStream.layer_norm)."""
        if isinstance(x, ResidualStream):
            return x.layer_norm(self.weight, self.bias, self.eps)
        return ops.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """Zero each element with probability p and scale the rest by 1/(1-p) while training; the
    identity in eval mode or when p is 0. Masks come from the default generator, which
    xtrain.checkpoint saves and restores, so a recomputed segment draws the same mask."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x):
        if self.p == 0.0 or not self.training:
            return x
        return ops.dropout(x, self.p, True, None)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class ResidualStream:
    """A residual stream whose last add may still be pending: the value base + pending (base alone
    when pending is None), kept apart so that the RMSNorm after the add runs fused with it.

        x = ResidualStream(embedding)
        x = x + attn(norm_1(x))     # norm_1 resolves the pending add; the new add is left pending
        x = x + mlp(norm_2(x))      # norm_2: ops.add_rms_norm(base, attn's output), one kernel

    - `stream + delta` is a new stream with delta pending (an add already pending is done first,
      with ops.add).
    - RMSNorm(stream) returns the normed value; with an add pending it is ops.add_rms_norm, which
      also gives the sum, and the stream holds that sum from then on (its value does not change).
      add_rms_norm is bitwise the add then the norm, forward and backward (its backward rounds
      the norm's dx, then adds the sum's own gradient, as the engine would), so a model over a
      stream computes what it computes over plain tensors, one pass over the stream fewer per add
      forward and two backward.
    - resolve() is the value as a tensor (ops.add when an add is pending)."""

    __slots__ = ("base", "pending")

    def __init__(self, base, pending=None):
        if not isinstance(base, xtrain.Tensor):
            raise TypeError(f"ResidualStream: base must be an xtrain.Tensor, got {type(base).__name__}")
        if pending is not None and not isinstance(pending, xtrain.Tensor):
            raise TypeError(f"ResidualStream: pending must be an xtrain.Tensor or None, got {type(pending).__name__}")
        self.base, self.pending = base, pending

    def __add__(self, delta) -> "ResidualStream":
        if not isinstance(delta, xtrain.Tensor):
            raise TypeError(f"ResidualStream + x: x must be an xtrain.Tensor, got {type(delta).__name__}")
        return ResidualStream(self.resolve(), delta)

    def resolve(self):
        """The stream's value as a tensor; a pending add runs now (ops.add) and is pending no more."""
        if self.pending is not None:
            self.base, self.pending = self.base + self.pending, None
        return self.base

    def rms_norm(self, weight, eps: float):
        """ops.rms_norm of the stream's value; with an add pending, ops.add_rms_norm (the add is
        then done: base is the sum)."""
        if self.pending is None:
            return ops.rms_norm(self.base, weight, eps)
        self.base, h = ops.add_rms_norm(self.base, self.pending, weight, eps)
        self.pending = None
        return h

    def layer_norm(self, weight, bias, eps: float):
        """ops.layer_norm of the stream's value; with an add pending, ops.add_layer_norm (the add
        is then done: base is the sum)."""
        if self.pending is None:
            return ops.layer_norm(self.base, weight, bias, eps)
        self.base, h = ops.add_layer_norm(self.base, self.pending, weight, bias, eps)
        self.pending = None
        return h


def checkpoint(fn, x, *modules):
    """fn(x) under xtrain.checkpoint: its activations are not kept, and backward re-runs it.

    The parameters of `modules`, as their attributes hold them now (a bf16 model's forward binds
    the cast weights), are the segment's inputs: during the call and the re-run each module
    attribute holds the segment's own leaf of it, so gradients reach the tensors bound now.
    fn must depend only on x and those parameters (and the default generator)."""
    slots = [(m, name) for mod in modules for _, m in mod.named_modules() for name in m._parameters]
    params = [m._parameters[name] for m, name in slots]

    def segment(x, leaves):
        saved = [m._parameters[name] for m, name in slots]
        try:
            for (m, name), t in zip(slots, leaves):
                m._parameters[name] = t
            return fn(x)
        finally:
            for (m, name), t in zip(slots, saved):
                m._parameters[name] = t

    return xtrain.checkpoint(segment, x, params)


def matmul_weights(module: Module, attr: str) -> bool:
    """The weights of Linear layers: what a ParamStore keeps a compute-dtype copy of (bf16)."""
    return isinstance(module, Linear) and attr == "weight"


def linear_params(module: Module, attr: str) -> bool:
    """The weights and biases of Linear layers: the compute-dtype copies of a model whose linears
    have biases (GPT-2: a bf16 model adds each bias in bf16 to its bf16 GEMM output)."""
    return isinstance(module, Linear) and attr in ("weight", "bias")


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


def _as_tensor(value):
    if isinstance(value, xtrain.Tensor):
        return value
    return xtrain.tensor(np.ascontiguousarray(value), dtype="float32")


def _preview(keys: list[str], n: int = 8) -> str:
    shown = ", ".join(keys[:n])
    return f"[{shown}{', ...' if len(keys) > n else ''}] ({len(keys)} in all)"
