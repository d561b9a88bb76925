"""The functional API: every differentiable op as xtrain.ops.<name>.

Everything bound in xtrain._C.ops is re-exported here unchanged. add/sub/mul/div also accept a
Python number on either side (routed to the *_scalar ops, which keep the scalar out of the
tape), and scale(x, s) is x * s.
"""
import numbers as _numbers

from . import _C

_ops = _C.ops
for _name in dir(_ops):
    if not _name.startswith("_"):
        globals()[_name] = getattr(_ops, _name)
del _name


def _is_scalar(v):
    return isinstance(v, _numbers.Real) and not isinstance(v, _C.Tensor)


def _both_scalars(op, a, b):
    raise TypeError(f"xtrain.ops.{op}: at least one argument must be an xtrain.Tensor, got "
                    f"{type(a).__name__} and {type(b).__name__}")


def add(a, b):
    """a + b; either side may be a Python number."""
    if _is_scalar(b):
        return _both_scalars("add", a, b) if _is_scalar(a) else _ops.add_scalar(a, float(b))
    if _is_scalar(a):
        return _ops.add_scalar(b, float(a))
    return _ops.add(a, b)


def sub(a, b):
    """a - b; either side may be a Python number."""
    if _is_scalar(b):
        return _both_scalars("sub", a, b) if _is_scalar(a) else _ops.add_scalar(a, -float(b))
    if _is_scalar(a):
        return _ops.rsub_scalar(b, float(a))
    return _ops.sub(a, b)


def mul(a, b):
    """a * b; either side may be a Python number."""
    if _is_scalar(b):
        return _both_scalars("mul", a, b) if _is_scalar(a) else _ops.mul_scalar(a, float(b))
    if _is_scalar(a):
        return _ops.mul_scalar(b, float(a))
    return _ops.mul(a, b)


def div(a, b):
    """a / b; either side may be a Python number."""
    if _is_scalar(b):
        return _both_scalars("div", a, b) if _is_scalar(a) else _ops.div_scalar(a, float(b))
    if _is_scalar(a):
        return _ops.rdiv_scalar(b, float(a))
    return _ops.div(a, b)


def scale(x, s):
    """x * s for a Python number s."""
    return _ops.mul_scalar(x, float(s))
