"""Operators and methods of xtrain.Tensor, written over xtrain.ops so the two always agree.

install(Tensor) attaches them to the compiled class (xtrain/__init__.py calls it once):
+ - * / ** (with Python numbers on either side), unary -, @, and .sum .mean .reshape .view
.transpose .permute .to .float .bfloat16 .double .softmax .log_softmax .exp .log .sqrt .silu.

(.numpy() is the binding's own, read-only: on the CPU it shares the tensor's storage, and writing
into it would change the tensor behind the tape's back and give silently wrong gradients;
`.copy()` gives a writable array, in-place changes go through xtrain's ops.)
"""
import numbers

from . import _C, ops
from .tensor import to_args


def _binary(fn, reflected=False, scalars=True):
    def method(self, other):
        if not (isinstance(other, _C.Tensor) or (scalars and isinstance(other, numbers.Real))):
            return NotImplemented
        return fn(other, self) if reflected else fn(self, other)
    method.__name__ = fn.__name__
    return method


def _shape_args(shape, what):
    """t.reshape(2, 3) and t.reshape((2, 3)) both mean (2, 3)."""
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    for d in shape:
        if not isinstance(d, numbers.Integral) or isinstance(d, bool):
            raise TypeError(f"{what}: expected integers, got {type(d).__name__}")
    return [int(d) for d in shape]


def _pow(self, s):
    if not isinstance(s, numbers.Real):
        return NotImplemented
    return ops.pow_scalar(self, float(s))


def _sum(self, dim=None, keepdim=False):
    return ops.sum(self, dim, keepdim)


def _mean(self, dim=None, keepdim=False):
    return ops.mean(self, dim, keepdim)


def _reshape(self, *shape):
    return ops.reshape(self, _shape_args(shape, "reshape"))


def _view(self, *shape):
    return ops.view(self, _shape_args(shape, "view"))


def _transpose(self, dim0, dim1):
    return ops.transpose(self, dim0, dim1)


def _permute(self, *dims):
    return ops.permute(self, _shape_args(dims, "permute"))


def _softmax(self, dim=-1):
    return ops.softmax(self, dim)


def _log_softmax(self, dim=-1):
    return ops.log_softmax(self, dim)


def _to_method(native):
    def to(self, *args, device=None, dtype=None):
        """Copy to another device and/or dtype (differentiable), as torch.Tensor.to takes them:
        t.to("bfloat16"), t.to("cuda"), t.to("cuda", "float32"), t.to(other), or by keyword.
        Returns self when nothing changes."""
        device, dtype = to_args("Tensor.to", args, device, dtype)
        return native(self, device=device, dtype=dtype)
    return to


def install(Tensor):
    methods = {
        "to": _to_method(Tensor.to),
        "__add__": _binary(ops.add), "__radd__": _binary(ops.add, reflected=True),
        "__sub__": _binary(ops.sub), "__rsub__": _binary(ops.sub, reflected=True),
        "__mul__": _binary(ops.mul), "__rmul__": _binary(ops.mul, reflected=True),
        "__truediv__": _binary(ops.div), "__rtruediv__": _binary(ops.div, reflected=True),
        "__matmul__": _binary(ops.matmul, scalars=False),
        "__pow__": _pow,
        "__neg__": lambda self: ops.neg(self),
        "sum": _sum, "mean": _mean,
        "reshape": _reshape, "view": _view, "transpose": _transpose, "permute": _permute,
        "float": lambda self: ops.cast(self, "float32"),
        "bfloat16": lambda self: ops.cast(self, "bfloat16"),
        "double": lambda self: ops.cast(self, "float64"),
        "softmax": _softmax, "log_softmax": _log_softmax,
        "exp": lambda self: ops.exp(self),
        "log": lambda self: ops.log(self),
        "sqrt": lambda self: ops.sqrt(self),
        "silu": lambda self: ops.silu(self),
    }
    for name, fn in methods.items():
        setattr(Tensor, name, fn)
