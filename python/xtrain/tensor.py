"""Tensor creation, grad mode, checkpoint and DLPack: thin Python over xtrain._C."""
import contextlib
import numbers

import numpy as np

from . import _C

float32 = "float32"
bfloat16 = "bfloat16"
float64 = "float64"
int32 = "int32"
int64 = "int64"
_DTYPES = (float32, bfloat16, float64, int32, int64)
_INT_RANGE = {int32: (-2**31, 2**31), int64: (-2**63, 2**63)}  # [lo, hi)


def _check_dtype(dtype):
    if dtype is not None and dtype not in _DTYPES and not isinstance(dtype, str):
        raise TypeError(f"dtype must be a string such as 'float32', got {type(dtype).__name__}")


def _shape(args):
    """zeros(2, 3), zeros((2, 3)) and zeros([2, 3]) all mean shape (2, 3)."""
    if len(args) == 1 and not isinstance(args[0], numbers.Integral):
        args = tuple(args[0])
    for d in args:
        if not isinstance(d, numbers.Integral) or isinstance(d, bool):
            raise TypeError(f"shape entries must be integers, got {type(d).__name__}")
    return tuple(int(d) for d in args)


def _infer_dtype(arr, from_numpy):
    """numpy arrays keep float32/float64/int32/int64; Python numbers give float32 or int64."""
    if from_numpy and arr.dtype == np.float64:
        return float64
    if from_numpy and arr.dtype == np.int32:
        return int32
    return float32 if arr.dtype.kind == "f" else int64


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data` (a numpy array, nested lists, a scalar or a Tensor).
    Floats default to float32 and integers to int64, as in PyTorch."""
    _check_dtype(dtype)
    if isinstance(data, _C.Tensor):
        out = data.detach().to(device=device, dtype=dtype).clone()
    else:
        try:
            arr = np.asarray(data)
        except ValueError as e:
            raise ValueError(f"xtrain.tensor: data is ragged or not rectangular: {e}") from None
        if arr.dtype == object:
            raise ValueError("xtrain.tensor: data is ragged or holds non-numeric values or integers "
                             "beyond 64 bits (nested lists must be rectangular and contain numbers)")
        if arr.dtype.kind == "b":
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iuf":
            raise TypeError(f"xtrain.tensor: unsupported element type {arr.dtype} (numbers only)")
        if dtype is None:
            dtype = _infer_dtype(arr, from_numpy=isinstance(data, np.ndarray))
        _check_integer_fit(arr, dtype)
        out = _C._from_numpy(arr, dtype, device)
    if requires_grad:
        out.requires_grad = True
    return out


def _check_integer_fit(arr, dtype):
    """numpy wraps out-of-range integers and turns NaN into INT_MIN when it converts: an integer
    tensor takes only values it can hold exactly (floats are truncated toward zero, as in torch)."""
    if dtype not in _INT_RANGE or arr.size == 0:
        return
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValueError(f"xtrain.tensor: NaN or Inf cannot be stored in {dtype}")
    lo, hi = _INT_RANGE[dtype]
    low, high = arr.min().item(), arr.max().item()
    if low < lo or high >= hi:
        raise ValueError(f"xtrain.tensor: values in [{low}, {high}] do not fit in {dtype}")


def zeros(*shape, dtype=None, device=None, requires_grad=False):
    return full(_shape(shape), 0.0, dtype=dtype, device=device, requires_grad=requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False):
    return full(_shape(shape), 1.0, dtype=dtype, device=device, requires_grad=requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad=False):
    _check_dtype(dtype)
    t = _C.full(_shape((shape,)) if not isinstance(shape, numbers.Integral) else (int(shape),), float(fill_value),
                dtype, device)
    if requires_grad:
        t.requires_grad = True
    return t


def empty(*shape, dtype=None, device=None):
    return _C.empty(_shape(shape), dtype, device)


def arange(start, end=None, step=1, dtype=None, device=None):
    if end is None:
        start, end = 0, start
    if dtype is None:
        dtype = int64 if all(isinstance(v, numbers.Integral) for v in (start, end, step)) else float32
    return _C.arange(float(start), float(end), float(step), dtype, device)


def rand(*shape, dtype=None, device=None, generator=None, requires_grad=False):
    return _C.rand(_shape(shape), dtype, device, generator, requires_grad)


def randn(*shape, dtype=None, device=None, generator=None, requires_grad=False):
    return _C.randn(_shape(shape), dtype, device, generator, requires_grad)


def get_rng_state(device="cpu"):
    """(seed, offset) of a device's default generator."""
    return _C.default_generator(device).get_state()


def set_rng_state(state, device="cpu"):
    _C.default_generator(device).set_state(tuple(state))


@contextlib.contextmanager
def _grad_mode(enabled):
    prev = _C.is_grad_enabled()
    _C.set_grad_enabled(enabled)
    try:
        yield
    finally:
        _C.set_grad_enabled(prev)


def no_grad():
    """Ops inside record nothing on the tape (on this thread)."""
    return _grad_mode(False)


def enable_grad():
    """Ops inside record the tape again, even within no_grad (on this thread)."""
    return _grad_mode(True)


def checkpoint(segment_fn, x, params):
    """Activation recompute: y = segment_fn(x, params) without keeping the segment's
    activations; backward re-runs segment_fn (same RNG state) and backpropagates through it.
    segment_fn must be deterministic and depend only on x and params. Under no_grad it is a
    plain call."""
    if not callable(segment_fn):
        raise TypeError(f"checkpoint: segment_fn must be callable, got {type(segment_fn).__name__}")
    if not isinstance(x, _C.Tensor):
        raise TypeError(f"checkpoint: x must be an xtrain.Tensor, got {type(x).__name__}")
    params = list(params)
    for i, p in enumerate(params):
        if not isinstance(p, _C.Tensor):
            raise TypeError(f"checkpoint: params[{i}] must be an xtrain.Tensor, got {type(p).__name__}")
    return _C.checkpoint(segment_fn, x, params)


def from_dlpack(obj):
    """A tensor sharing memory with any DLPack producer (torch, numpy, CuPy, JAX), or with a
    raw DLPack capsule. Only contiguous row-major data can be shared."""
    if hasattr(obj, "__dlpack__"):
        kwargs = {}
        if hasattr(obj, "__dlpack_device__"):
            dev_type, dev_id = obj.__dlpack_device__()
            if int(dev_type) == 2:  # CUDA: ask the producer to order its work before ours
                _C.cuda.set_device(int(dev_id))
                _C.cuda.synchronize(f"cuda:{int(dev_id)}")
        try:
            capsule = obj.__dlpack__(max_version=(1, 0), **kwargs)
        except TypeError:
            capsule = obj.__dlpack__(**kwargs)
        return _C._from_dlpack_capsule(capsule)
    if type(obj).__name__ != "PyCapsule":
        raise TypeError(f"from_dlpack: expected an object with __dlpack__ (a torch/numpy/CuPy/JAX array) "
                        f"or a DLPack capsule, got {type(obj).__name__}")
    return _C._from_dlpack_capsule(obj)


def to_args(what, args, device=None, dtype=None):
    """(device, dtype) from the ways PyTorch's .to() takes them: (dtype), (device),
    (device, dtype), (other_tensor), with device=/dtype= keywords; None where not given."""
    if len(args) > 2:
        raise TypeError(f"{what}() takes at most 2 positional arguments (device, dtype), got {len(args)}")
    if len(args) == 1 and isinstance(args[0], _C.Tensor):
        if device is not None or dtype is not None:
            raise TypeError(f"{what}(other): device= and dtype= cannot be combined with a tensor")
        return args[0].device, args[0].dtype
    if len(args) == 2:
        pos_device, pos_dtype = args
    elif len(args) == 1:
        pos_device, pos_dtype = (None, args[0]) if args[0] in _DTYPES else (args[0], None)
    else:
        pos_device, pos_dtype = None, None
    for name, pos, kw in (("device", pos_device, device), ("dtype", pos_dtype, dtype)):
        if pos is not None and kw is not None:
            raise TypeError(f"{what}(): {name} given twice (positionally and as {name}=)")
    device = pos_device if pos_device is not None else device
    dtype = pos_dtype if pos_dtype is not None else dtype
    if device is not None and not isinstance(device, str):
        raise TypeError(f"{what}(): device must be a string such as 'cpu' or 'cuda:0', got "
                        f"{type(device).__name__}")
    if dtype is not None and dtype not in _DTYPES:
        raise (TypeError if not isinstance(dtype, str) else ValueError)(
            f"{what}(): unknown dtype {dtype!r}; choose one of {', '.join(_DTYPES)}")
    return device, dtype


def tensor_repr(t):
    """tensor([[1. , 2.5], ...], dtype=float32, device=cuda:0, grad_fn=...) with numpy's
    formatting of the values (a sync point for CUDA tensors)."""
    body = np.array2string(t.numpy(), separator=", ", prefix="tensor(", threshold=200, edgeitems=3)
    extras = [f"dtype={t.dtype}"]
    if t.device != "cpu":
        extras.append(f"device={t.device}")
    if t.grad_fn is not None:
        extras.append(f"grad_fn=<{t.grad_fn}>")
    elif t.requires_grad:
        extras.append("requires_grad=True")
    return f"tensor({body}, {', '.join(extras)})"
