"""The functional API: every differentiable op as xtrain.ops.<name>.

Everything bound in xtrain._C.ops is re-exported here unchanged. add/sub/mul/div also accept a
Python number on either side (routed to the *_scalar ops, which keep the scalar out of the
tape), and scale(x, s) is x * s. linear_cross_entropy (the fused lm_head + loss) is the bound op
with its full documentation.
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


def linear_cross_entropy(x, w, targets, ignore_index=-100, return_logits=False, chunk_rows=0):
    """The language-model head and its loss in one op: cross_entropy(linear(x, w), targets).

    x [N, K] and w [V, K] (float32, bfloat16 or float64, one dtype), targets int32/int64 [N].
    Returns ``(loss, logits)``: loss is the float32 mean cross-entropy over the targets that are
    not ignore_index (the semantics of ``cross_entropy``: 0 when every target is ignored or N == 0,
    IndexError for a target outside [0, V), raised on CUDA at the next sync point such as
    ``loss.item()``); logits is a detached contiguous [N, V] copy of
    x @ w^T when ``return_logits`` is True, else None. Gradients reach x and w in their dtype, as
    ``linear`` followed by ``cross_entropy`` gives them (bit for bit in float32 on the CPU).

    Internally the logits live in a buffer whose row stride is V rounded up to a multiple of 64
    elements, so every row is 16-byte aligned and cuBLAS runs its fast GEMMs even for an odd V
    (GPT-2's 50257); on CUDA the GEMMs also run over that padded width with w extended by zero
    rows (a copy of w per call). The model's vocabulary stays V: the padding never enters the
    loss. Backward writes dlogits over the buffer in place instead of allocating another [N, V]
    tensor.

    When the N rows' logits would take more than about 1 GiB, the op runs in row chunks of
    ``chunk_rows`` rows (0: chosen from the shapes) and never holds [N, V]: the forward computes
    the gradients of x and w too (float32 accumulators; dw sums over the chunks in order) and the
    backward scales them by the upstream gradient. The results equal the unchunked op's to float
    rounding and repeat bit for bit (docs/performance.md, "The row-chunked head"). A chunk_rows of
    N or more runs unchunked.
    """
    return _ops.linear_cross_entropy(x, w, targets, ignore_index, return_logits, chunk_rows)
