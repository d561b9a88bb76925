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


def _scalar_aware(name, tensors, tensor_scalar, scalar_tensor):
    """The binary op `name` where either side may be a Python number: tensors(a, b) for two
    tensors, tensor_scalar(t, s) for t op s, scalar_tensor(t, s) for s op t."""
    def op(a, b):
        if _is_scalar(b):
            return _both_scalars(name, a, b) if _is_scalar(a) else tensor_scalar(a, float(b))
        if _is_scalar(a):
            return scalar_tensor(b, float(a))
        return tensors(a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"a {_SYMBOL[name]} b (numpy broadcasting); either side may be a Python number."
    return op


_SYMBOL = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
add = _scalar_aware("add", _ops.add, _ops.add_scalar, _ops.add_scalar)
sub = _scalar_aware("sub", _ops.sub, lambda t, s: _ops.add_scalar(t, -s), _ops.rsub_scalar)
mul = _scalar_aware("mul", _ops.mul, _ops.mul_scalar, _ops.mul_scalar)
div = _scalar_aware("div", _ops.div, _ops.div_scalar, _ops.rdiv_scalar)


def scale(x, s):
    """x * s for a Python number s."""
    return _ops.mul_scalar(x, float(s))
