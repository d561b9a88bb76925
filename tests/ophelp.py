"""One helper to compare an xtrain op with PyTorch: forward value and the gradient of every
floating input, for one dtype and device, with one tolerance table per dtype.

The reference runs in float32 (float64 for float64) on the very same input values (bf16 inputs
are rounded to bf16 first), so a bf16 result is judged against what exact arithmetic on its
inputs would give, within bf16's precision.
"""
import numpy as np
import torch

import xtrain

# dtype -> (rtol, atol) for values and gradients.
TOLERANCE = {
    "float64": (1e-10, 1e-12),
    "float32": (2e-5, 2e-5),
    "bfloat16": (2e-2, 2e-2),
}

_TORCH_DTYPE = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                "int32": torch.int32, "int64": torch.int64}


def torch_device(device):
    return "cpu" if device == "cpu" else device


def to_numpy64(t):
    """xtrain tensor -> float64 numpy (bf16 converted exactly)."""
    return np.asarray(t.numpy(), dtype=np.float64)


def make_inputs(arrays, dtype, device, requires_grad=True):
    """numpy arrays -> (xtrain tensors, torch reference tensors). Floating arrays take `dtype`;
    integer arrays keep their integer type and never require grad."""
    xs, ts = [], []
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind in "iu":
            xs.append(xtrain.tensor(a, device=device))
            ts.append(torch.from_numpy(a.copy()).to(torch_device(device)))
            continue
        x = xtrain.tensor(a, dtype=dtype, device=device, requires_grad=requires_grad)
        ref_dtype = torch.float64 if dtype == "float64" else torch.float32
        # Same values as xtrain holds (bf16-rounded when dtype is bf16).
        t = torch.tensor(to_numpy64(x), dtype=ref_dtype, device=torch_device(device), requires_grad=requires_grad)
        xs.append(x)
        ts.append(t)
    return xs, ts


def assert_close(actual, expected, dtype, what, scale=1.0):
    rtol, atol = TOLERANCE[dtype]
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol * scale, atol=atol * scale, err_msg=what)


def check_op(xt_fn, torch_fn, arrays, dtype="float32", device="cpu", grad=True, seed=0, tol_scale=1.0):
    """Run xt_fn(*xtrain inputs) and torch_fn(*torch inputs); compare the output and, when
    `grad`, the gradient of every floating input under the same random upstream gradient."""
    xs, ts = make_inputs(arrays, dtype, device, requires_grad=grad)
    out = xt_fn(*xs)
    ref = torch_fn(*ts)
    assert_close(to_numpy64(out), ref.detach().double().cpu().numpy(), dtype, "forward", tol_scale)
    if not grad:
        return out
    rng = np.random.default_rng(seed)
    seed_np = rng.standard_normal(tuple(out.shape))
    seed_x = xtrain.tensor(seed_np, dtype=out.dtype, device=device)
    out.backward_seeded(seed_x)
    seed_t = torch.tensor(to_numpy64(seed_x), dtype=ref.dtype, device=ref.device)
    float_ts = [t for t in ts if t.is_floating_point()]
    float_xs = [x for x in xs if x.dtype in ("float32", "float64", "bfloat16")]
    grads = torch.autograd.grad(ref, float_ts, seed_t, allow_unused=True)
    for i, (x, g) in enumerate(zip(float_xs, grads)):
        if g is None:
            assert x.grad is None or np.all(to_numpy64(x.grad) == 0), f"grad of input {i} should be empty"
            continue
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.dtype == x.dtype, f"grad of input {i} has dtype {x.grad.dtype}, input {x.dtype}"
        assert_close(to_numpy64(x.grad), g.double().cpu().numpy(), dtype, f"grad of input {i}", tol_scale)
    return out


def finite_difference_check(xt_fn, arrays, eps=1e-6, rtol=1e-5, atol=1e-7, seed=0):
    """Central finite differences in float64 against the tape's gradients, using a random
    projection of the output so every output element contributes."""
    xs, _ = make_inputs(arrays, "float64", "cpu", requires_grad=True)
    out = xt_fn(*xs)
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(tuple(out.shape))
    out.backward_seeded(xtrain.tensor(w, dtype="float64"))
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        if a.dtype.kind in "iu":
            continue
        analytic = to_numpy64(xs[i].grad) if xs[i].grad is not None else np.zeros(a.shape)
        numeric = np.zeros(a.shape)
        flat = a.astype(np.float64).reshape(-1)
        for j in range(flat.size):
            vals = []
            for delta in (eps, -eps):
                pert = flat.copy()
                pert[j] += delta
                args = []
                for k, b in enumerate(arrays):
                    b = np.asarray(b)
                    if b.dtype.kind in "iu":
                        args.append(xtrain.tensor(b))  # indices stay integers
                    else:
                        args.append(xtrain.tensor(pert.reshape(a.shape) if k == i else b.astype(np.float64),
                                                  dtype="float64"))
                with xtrain.no_grad():
                    vals.append(float(np.sum(to_numpy64(xt_fn(*args)) * w)))
            numeric.reshape(-1)[j] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol, err_msg=f"finite differences, input {i}")


def bits(t):
    """Raw bits of a tensor's values, for bitwise comparisons."""
    a = t.numpy()
    return np.ascontiguousarray(a).view(np.uint8).copy()
