"""ops.layer_norm and the fused residual add + norm ops.add_layer_norm (GPT-2's norms) against
torch.nn.functional.layer_norm: values and every gradient in float32 and bf16 (float32 weights
with bf16 x, as the model runs them), finite differences in float64, the fused op bitwise equal
to add + layer_norm both ways, run-to-run bitwise determinism, and bad inputs.

Every test runs on each device of the `device` fixture (CUDA on the GPU machine).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xtrain
from xtrain import ops
from ophelp import assert_close, bits, check_op, finite_difference_check, make_inputs, to_numpy64

FLOATS = ["float32", "bfloat16"]
SHAPES = [(4, 8), (2, 3, 37), (5, 768), (3, 1600), (1, 1), (300, 64), (10, 256), (33, 1024)]  # 256-1024: GPT-2 widths


def ref_layer_norm(x, w, b, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_matches_torch(device, dtype, shape):
    g = np.random.default_rng(1)
    arrays = [g.standard_normal(shape) * 3 + 1.5, g.standard_normal(shape[-1]), g.standard_normal(shape[-1])]
    # dw, db sum over rows: their tolerance grows with the row count
    rows = int(np.prod(shape[:-1]))
    check_op(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), ref_layer_norm, arrays, dtype, device,
             tol_scale=max(1.0, np.sqrt(rows) / 4))


def test_layer_norm_eps_is_used(device):
    g = np.random.default_rng(2)
    arrays = [g.standard_normal((6, 10)) * 0.1, g.standard_normal(10), g.standard_normal(10)]
    check_op(lambda x, w, b: ops.layer_norm(x, w, b, eps=0.5), lambda x, w, b: ref_layer_norm(x, w, b, 0.5),
             arrays, "float32", device)


def test_layer_norm_bf16_x_with_float32_weight_and_bias(device):
    g = np.random.default_rng(3)
    xnp, wnp, bnp = g.standard_normal((33, 96)), g.standard_normal(96), g.standard_normal(96)
    x = xtrain.tensor(xnp, dtype="bfloat16", device=device, requires_grad=True)
    w = xtrain.tensor(wnp, dtype="float32", device=device, requires_grad=True)
    b = xtrain.tensor(bnp, dtype="float32", device=device, requires_grad=True)
    y = ops.layer_norm(x, w, b)
    assert y.dtype == "bfloat16"
    seed = g.standard_normal((33, 96))
    y.backward_seeded(xtrain.tensor(seed, dtype="bfloat16", device=device))
    assert w.grad.dtype == "float32" and b.grad.dtype == "float32" and x.grad.dtype == "bfloat16"
    xt = torch.tensor(to_numpy64(x), dtype=torch.float32, requires_grad=True)
    wt = torch.tensor(wnp, dtype=torch.float32, requires_grad=True)
    bt = torch.tensor(bnp, dtype=torch.float32, requires_grad=True)
    yt = ref_layer_norm(xt, wt, bt)
    st = torch.tensor(to_numpy64(xtrain.tensor(seed, dtype="bfloat16")), dtype=torch.float32)
    yt.backward(st)
    assert_close(to_numpy64(y), yt.detach().double().numpy(), "bfloat16", "y")
    assert_close(to_numpy64(x.grad), xt.grad.double().numpy(), "bfloat16", "dx")
    assert_close(to_numpy64(w.grad), wt.grad.double().numpy(), "bfloat16", "dw", 3)
    assert_close(to_numpy64(b.grad), bt.grad.double().numpy(), "bfloat16", "db", 3)


def test_layer_norm_finite_differences():
    g = np.random.default_rng(4)
    finite_difference_check(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5),
                            [g.standard_normal((3, 5)), g.standard_normal(5), g.standard_normal(5)])


def test_add_layer_norm_finite_differences():
    g = np.random.default_rng(5)

    def fused(x, r, w, b):
        h, y = ops.add_layer_norm(x, r, w, b, 1e-5)
        return y

    finite_difference_check(fused, [g.standard_normal((3, 6)), g.standard_normal((3, 6)), g.standard_normal(6),
                                    g.standard_normal(6)])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("use_h", [True, False])
@pytest.mark.parametrize("shape", [(6, 40), (9, 768), (200, 768), (3, 1600)])
def test_add_layer_norm_bitwise_equals_add_then_layer_norm(device, dtype, use_h, shape):
    """The fused op gives the bits of add + layer_norm: h, y, and the gradients of x, r, w and b,
    with h's own gradient added (use_h) or not."""
    g = np.random.default_rng(7)
    arrays = [g.standard_normal(shape), g.standard_normal(shape)]
    w_np, b_np = g.standard_normal(shape[-1]), g.standard_normal(shape[-1])
    seeds_np = [g.standard_normal(shape), g.standard_normal(shape)]
    results = []
    for fused in (True, False):
        xs, _ = make_inputs(arrays, dtype, device)
        w = xtrain.tensor(w_np, dtype="float32", device=device, requires_grad=True)
        b = xtrain.tensor(b_np, dtype="float32", device=device, requires_grad=True)
        if fused:
            h, y = ops.add_layer_norm(xs[0], xs[1], w, b, 1e-5)
        else:
            h = ops.add(xs[0], xs[1])
            y = ops.layer_norm(h, w, b, 1e-5)
        outs = [h, y] if use_h else [y]
        seeds = [xtrain.tensor(s, dtype=dtype, device=device) for s in seeds_np][: len(outs)]
        xtrain._C.backward_many(outs, seeds)
        results.append([bits(h), bits(y)] + [bits(t.grad) for t in (*xs, w, b)])
    for i, (a, c) in enumerate(zip(*results)):
        assert np.array_equal(a, c), f"array {i} differs between the fused and the composed form"


@pytest.mark.parametrize("dtype", FLOATS)
def test_add_layer_norm_matches_torch(device, dtype):
    g = np.random.default_rng(8)
    shape = (7, 96)
    arrays = [g.standard_normal(shape), g.standard_normal(shape), g.standard_normal(96), g.standard_normal(96)]
    xs, ts = make_inputs(arrays, dtype, device)
    h, y = ops.add_layer_norm(*xs, 1e-5)
    th = ts[0] + ts[1]
    ty = ref_layer_norm(th, ts[2], ts[3])
    assert_close(to_numpy64(h), th.detach().double().cpu().numpy(), dtype, "h")
    assert_close(to_numpy64(y), ty.detach().double().cpu().numpy(), dtype, "y", 2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_bitwise_determinism(device, dtype):
    g = np.random.default_rng(9)
    arrays = [g.standard_normal((300, 768)), g.standard_normal(768), g.standard_normal(768)]
    seed = g.standard_normal((300, 768))
    runs = []
    for _ in range(2):
        xs, _ = make_inputs(arrays, dtype, device)
        y = ops.layer_norm(*xs)
        y.backward_seeded(xtrain.tensor(seed, dtype=dtype, device=device))
        runs.append([bits(y)] + [bits(t.grad) for t in xs])
    for a, c in zip(*runs):
        assert np.array_equal(a, c)


def test_layer_norm_bad_inputs(device):
    x = xtrain.zeros((3, 4), device=device)
    w, b = xtrain.ones((4,), device=device), xtrain.zeros((4,), device=device)
    with pytest.raises(ValueError, match="weight must have shape"):
        ops.layer_norm(x, xtrain.ones((5,), device=device), b)
    with pytest.raises(ValueError, match="bias must have shape"):
        ops.layer_norm(x, w, xtrain.zeros((1, 4), device=device))
    with pytest.raises(TypeError):
        ops.layer_norm(x, w, xtrain.zeros((4,), dtype="int64", device=device))
    with pytest.raises(TypeError, match="bias must have weight's dtype"):
        ops.layer_norm(xtrain.zeros((3, 4), dtype="bfloat16", device=device), w,
                       xtrain.zeros((4,), dtype="bfloat16", device=device))
    with pytest.raises(ValueError, match="eps"):
        ops.layer_norm(x, w, b, float("nan"))
    with pytest.raises(ValueError, match="residual must match x"):
        ops.add_layer_norm(x, xtrain.zeros((3, 5), device=device), w, b)
    with pytest.raises(ValueError, match="non-empty"):
        ops.layer_norm(xtrain.zeros((3, 0), device=device), xtrain.ones((0,), device=device),
                       xtrain.zeros((0,), device=device))
