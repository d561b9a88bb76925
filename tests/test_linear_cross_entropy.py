"""linear_cross_entropy: the fused lm_head + loss against the unfused pair cross_entropy(linear(x, w)).

On the CPU the fused op makes the same GEMM calls and runs the same kernels (only the logits' row
stride differs, and OpenBLAS results do not depend on it), so loss, dx and dw are bitwise equal in
float32 and bfloat16. On CUDA cuBLAS may pick another algorithm for the padded stride: the same
comparisons hold to a tight tolerance. Also: against PyTorch, ignore_index, all ignored, N == 0,
odd vocabularies (37, 50257), the returned logits, float64 finite differences, the in-place
backward (no second backward, returned logits untouched), and bad inputs.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xtrain
from ophelp import assert_close, bits, check_op, finite_difference_check, to_numpy64

ops = xtrain.ops
FLOAT_DTYPES = ["float32", "bfloat16"]

# CUDA vs the unfused pair on CUDA: same math, possibly another cuBLAS algorithm.
CUDA_TOL = {"float32": (1e-5, 1e-6), "bfloat16": (2e-2, 1e-3), "float64": (1e-12, 1e-14)}


def rng(seed=0):
    return np.random.default_rng(seed)


def make(device, dtype, N, K, V, seed=0, ignore=(), ignore_index=-100, tdtype=np.int64, scale=1.0):
    g = rng(seed)
    x = scale * g.standard_normal((N, K))
    w = scale * g.standard_normal((V, K)) / np.sqrt(max(K, 1))
    t = g.integers(0, V, N).astype(tdtype)
    for i in ignore:
        t[i] = ignore_index
    return x, w, t


def run(fused, device, dtype, x_np, w_np, t_np, ignore_index=-100, x_grad=True, w_grad=True):
    """(loss, x.grad, w.grad) of the fused op or of cross_entropy(linear(x, w)) on fresh leaves."""
    x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=x_grad)
    w = xtrain.tensor(w_np, dtype=dtype, device=device, requires_grad=w_grad)
    t = xtrain.tensor(t_np, device=device)
    if fused:
        loss, logits = ops.linear_cross_entropy(x, w, t, ignore_index=ignore_index)
        assert logits is None
    else:
        loss = ops.cross_entropy(ops.linear(x, w), t, ignore_index=ignore_index)
    loss.backward()
    return loss, x.grad, w.grad


def assert_same(device, dtype, a, b, what, scale=1.0):
    """Bitwise on the CPU; within CUDA_TOL (relative to the values' scale) on CUDA."""
    if a is None or b is None:
        assert a is None and b is None, what
        return
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (what, a.dtype, b.dtype, a.shape, b.shape)
    if device == "cpu":
        assert np.array_equal(bits(a), bits(b)), f"{what}: not bitwise equal"
        return
    rtol, atol = CUDA_TOL[dtype]
    an, bn = to_numpy64(a), to_numpy64(b)
    ref = max(float(np.abs(bn).max(initial=0.0)), 1e-30)
    np.testing.assert_allclose(an, bn, rtol=rtol, atol=atol * ref * scale, err_msg=what)


def compare_with_unfused(device, dtype, x_np, w_np, t_np, ignore_index=-100, **kw):
    fused = run(True, device, dtype, x_np, w_np, t_np, ignore_index, **kw)
    plain = run(False, device, dtype, x_np, w_np, t_np, ignore_index, **kw)
    for what, a, b in zip(("loss", "dx", "dw"), fused, plain):
        assert_same(device, dtype, a, b, what)
    return fused


# ---------------------------------------------------------------- equality with the unfused pair

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("N,K,V", [(6, 8, 37), (5, 16, 64), (17, 33, 129), (1, 1, 1), (4, 24, 65), (3, 8, 50257)])
def test_equals_unfused_pair(device, dtype, N, K, V):
    x, w, t = make(device, dtype, N, K, V, seed=N + K + V, scale=2.0)
    loss, dx, dw = compare_with_unfused(device, dtype, x, w, t)
    assert loss.dtype == "float32" and tuple(loss.shape) == ()
    assert dx.dtype == dtype and tuple(dx.shape) == (N, K)
    assert dw.dtype == dtype and tuple(dw.shape) == (V, K)


@pytest.mark.parametrize("tdtype", [np.int32, np.int64])
def test_equals_unfused_pair_target_dtypes(device, tdtype):
    x, w, t = make(device, "float32", 9, 12, 45, seed=1, tdtype=tdtype)
    compare_with_unfused(device, "float32", x, w, t)


def test_equals_unfused_pair_float64(device):
    if device != "cpu":
        pytest.skip("float64 GEMMs are a CPU gradient-check feature here")
    x, w, t = make(device, "float64", 7, 10, 37, seed=2)
    compare_with_unfused(device, "float64", x, w, t)


@pytest.mark.parametrize("x_grad,w_grad", [(True, False), (False, True)])
def test_one_input_requires_grad(device, x_grad, w_grad):
    x, w, t = make(device, "float32", 6, 8, 37, seed=3)
    fused = run(True, device, "float32", x, w, t, x_grad=x_grad, w_grad=w_grad)
    plain = run(False, device, "float32", x, w, t, x_grad=x_grad, w_grad=w_grad)
    for what, a, b in zip(("loss", "dx", "dw"), fused, plain):
        assert_same(device, "float32", a, b, what)
    assert (fused[1] is None) != x_grad and (fused[2] is None) != w_grad


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_matches_torch(device, dtype):
    g = rng(4)
    x, w = g.standard_normal((11, 16)), 0.5 * g.standard_normal((37, 16))
    t = g.integers(0, 37, 11)
    out = check_op(lambda a, b, tt: ops.linear_cross_entropy(a, b, tt)[0],
                   lambda a, b, tt: F.cross_entropy(a @ b.T, tt), [x, w, t], dtype, device)
    assert out.dtype == "float32"


def test_loss_used_twice_accumulates_like_unfused(device):
    """The Node runs once with the summed upstream gradient (2 * 1 + 3 * 1): same as the pair."""
    x_np, w_np, t_np = make(device, "float32", 8, 12, 37, seed=5)
    results = []
    for fused in (True, False):
        x = xtrain.tensor(x_np, device=device, requires_grad=True)
        w = xtrain.tensor(w_np, device=device, requires_grad=True)
        t = xtrain.tensor(t_np, device=device)
        loss = ops.linear_cross_entropy(x, w, t)[0] if fused else ops.cross_entropy(ops.linear(x, w), t)
        (loss * 2.0 + loss * 3.0).backward()
        results.append((loss, x.grad, w.grad))
    for what, a, b in zip(("loss", "dx", "dw"), *results):
        assert_same(device, "float32", a, b, what)


# ---------------------------------------------------------------- ignore_index, empty batches

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_ignore_index(device, dtype, ignore_index):
    x, w, t = make(device, dtype, 8, 12, 37, seed=6, ignore=(1, 4, 5), ignore_index=ignore_index)
    _, dx, _ = compare_with_unfused(device, dtype, x, w, t, ignore_index=ignore_index)
    assert np.all(to_numpy64(dx)[[1, 4, 5]] == 0)  # ignored rows get exactly no gradient


def test_all_ignored_is_zero(device):
    x, w, t = make(device, "float32", 5, 8, 37, seed=7, ignore=range(5))
    loss, dx, dw = compare_with_unfused(device, "float32", x, w, t)
    assert loss.item() == 0.0
    assert np.all(dx.numpy() == 0) and np.all(dw.numpy() == 0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_empty_batch(device, dtype):
    x = np.zeros((0, 8))
    w = rng(8).standard_normal((37, 8))
    t = np.zeros(0, dtype=np.int64)
    loss, dx, dw = compare_with_unfused(device, dtype, x, w, t)
    assert loss.item() == 0.0
    assert tuple(dx.shape) == (0, 8) and tuple(dw.shape) == (37, 8) and np.all(to_numpy64(dw) == 0)
    xx = xtrain.tensor(x, dtype=dtype, device=device)
    _, logits = ops.linear_cross_entropy(xx, xtrain.tensor(w, dtype=dtype, device=device),
                                         xtrain.tensor(t, device=device), return_logits=True)
    assert tuple(logits.shape) == (0, 37) and logits.dtype == dtype


# ---------------------------------------------------------------- returned logits

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("V", [37, 64, 50257])
def test_return_logits_equal_linear(device, dtype, V):
    x_np, w_np, t_np = make(device, dtype, 3, 8, V, seed=V)
    x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=True)
    w = xtrain.tensor(w_np, dtype=dtype, device=device, requires_grad=True)
    t = xtrain.tensor(t_np, device=device)
    loss, logits = ops.linear_cross_entropy(x, w, t, return_logits=True)
    assert tuple(logits.shape) == (3, V) and logits.dtype == dtype
    assert not logits.requires_grad
    with xtrain.no_grad():
        ref = ops.linear(x, w)
    before = bits(logits)
    assert_same(device, dtype, logits, ref, "logits")
    loss.backward()  # overwrites the op's own buffer with dlogits, never the returned copy
    assert np.array_equal(bits(logits), before)
    # The loss of the returned logits is the fused loss.
    assert_same(device, dtype, loss, ops.cross_entropy(logits, t), "loss")


def test_return_logits_false_gives_none(device):
    x, w, t = (xtrain.tensor(a, device=device) for a in make(device, "float32", 2, 4, 5))
    loss, logits = ops.linear_cross_entropy(x, w, t)
    assert logits is None and tuple(loss.shape) == ()


# ---------------------------------------------------------------- autograd mechanics

def test_second_backward_raises(device):
    """Backward overwrites the saved logits with dlogits: a second walk must be refused, not wrong."""
    x_np, w_np, t_np = make(device, "float32", 4, 8, 37, seed=9)
    x = xtrain.tensor(x_np, device=device, requires_grad=True)
    loss, _ = ops.linear_cross_entropy(x, xtrain.tensor(w_np, device=device), xtrain.tensor(t_np, device=device))
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


def test_no_grad_records_nothing(device):
    x_np, w_np, t_np = make(device, "float32", 4, 8, 37, seed=10)
    x = xtrain.tensor(x_np, device=device, requires_grad=True)
    w = xtrain.tensor(w_np, device=device, requires_grad=True)
    with xtrain.no_grad():
        loss, _ = ops.linear_cross_entropy(x, w, xtrain.tensor(t_np, device=device))
    assert not loss.requires_grad


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bitwise_determinism(device, dtype):
    x, w, t = make(device, dtype, 130, 48, 257, seed=11)
    a = run(True, device, dtype, x, w, t)
    b = run(True, device, dtype, x, w, t)
    for u, v in zip(a, b):
        assert np.array_equal(bits(u), bits(v))


def test_finite_differences():
    """float64 x and w; the loss is float32 by the kernel contract (cast to float64 for the
    checker), so the step is large enough that its rounding does not swamp the quotient."""
    targets = xtrain.tensor(np.array([0, 4, -100, 2, 6], dtype=np.int64))
    g = rng(12)
    finite_difference_check(lambda a, b: ops.linear_cross_entropy(a, b, targets)[0].to(dtype="float64"),
                            [g.standard_normal((5, 3)), g.standard_normal((7, 3))], eps=1e-2, rtol=1e-3,
                            atol=1e-4)


def test_cuda_matches_cpu(device):
    if device != "cuda":
        pytest.skip("needs CUDA (run with --device cuda or all on a GPU machine)")
    x, w, t = make("cpu", "float32", 16, 32, 50257, seed=13, ignore=(3,))
    cpu = run(True, "cpu", "float32", x, w, t)
    gpu = run(True, "cuda", "float32", x, w, t)
    for what, a, b in zip(("loss", "dx", "dw"), gpu, cpu):
        rtol, atol = CUDA_TOL["float32"]
        ref = max(float(np.abs(b.numpy()).max()), 1e-30)
        np.testing.assert_allclose(to_numpy64(a), to_numpy64(b), rtol=rtol, atol=atol * ref, err_msg=what)


# ---------------------------------------------------------------- bad inputs

def _t(shape, dtype="float32", device="cpu"):
    return xtrain.tensor(np.zeros(shape), dtype=dtype, device=device)


def test_bad_inputs(device):
    x, w = _t((3, 4), device=device), _t((5, 4), device=device)

    def targets(values, dtype=np.int64):
        return xtrain.tensor(np.array(values, dtype=dtype), device=device)

    t = targets([0, 1, 2])
    lce = ops.linear_cross_entropy
    # CPU: raised in the op; CUDA: checked on the device, raised at the next sync point (item()).
    with pytest.raises(IndexError, match="target 5 (at position 1 )?is out of range for 5 classes"):
        lce(x, w, targets([0, 5, 1]))[0].item()
    with pytest.raises(IndexError, match="target -1 "):
        lce(x, w, targets([0, 1, -1], np.int32))[0].item()
    with pytest.raises(IndexError, match="target -100 "):  # -100 is not ignored when ignore_index differs
        lce(x, w, targets([-100, 0, 1]), ignore_index=4)[0].item()
    with pytest.raises(TypeError, match="targets must be int32 or int64"):
        lce(x, w, _t((3,), device=device))
    with pytest.raises(ValueError, match=r"targets must be \[3\]"):
        lce(x, w, targets([0, 1]))
    with pytest.raises(ValueError, match=r"targets must be \[3\]"):
        lce(x, w, xtrain.tensor(np.zeros((3, 1), np.int64), device=device))
    with pytest.raises(ValueError, match=r"x must be \[N, K\]"):
        lce(_t((1, 3, 4), device=device), w, t)
    with pytest.raises(ValueError, match=r"w must be \[V, K\]"):
        lce(x, _t((4,), device=device), t)
    with pytest.raises(ValueError, match="in_features 6"):
        lce(x, _t((5, 6), device=device), t)
    with pytest.raises(ValueError, match="at least one class"):
        lce(x, _t((0, 4), device=device), t)
    with pytest.raises(TypeError, match="same dtype"):
        lce(x, _t((5, 4), "bfloat16", device), t)
    with pytest.raises(TypeError, match="x"):
        lce(_t((3, 4), "int64", device), w, t)
    with pytest.raises(TypeError, match="w"):
        lce(x, _t((5, 4), "int32", device), t)
    with pytest.raises(TypeError):
        lce(x, None, t)


def test_mixed_devices_raise(device):
    if not xtrain.cuda.is_available():
        pytest.skip("needs a GPU to put the arguments on two devices")
    x, w = _t((3, 4)), _t((5, 4))
    t = xtrain.tensor(np.array([0, 1, 2], np.int64))
    with pytest.raises(ValueError, match="device"):
        ops.linear_cross_entropy(x, w.to("cuda"), t)
    with pytest.raises(ValueError, match="device"):
        ops.linear_cross_entropy(x, w, t.to("cuda"))
