"""Model ops against PyTorch: rms_norm, rope, softmax, log_softmax, cross_entropy (flash_attention has
tests/test_flash_attention.py).

Values and gradients go through ophelp.check_op (float32 and bfloat16, several shapes including
odd sizes), gradients through finite differences in float64, every op runs twice to check bitwise
determinism, and bad inputs must raise clear Python exceptions.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xtrain
from ophelp import assert_close, bits, check_op, finite_difference_check, make_inputs, to_numpy64

ops = xtrain.ops
FLOAT_DTYPES = ["float32", "bfloat16"]


def rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- torch references

def ref_rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_rope(x, positions=None, theta=10000.0):
    """Hugging Face rotate-half RoPE on x [B, S, H, D]; inv_freq and angles in float32 as HF does."""
    S, D = x.shape[1], x.shape[3]
    pos = torch.arange(S, device=x.device) if positions is None else positions.to(x.device)
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64, device=x.device).float() / D))
    freqs = pos.float()[:, None] * inv_freq[None, :]  # (S, D/2), float32
    emb = torch.cat([freqs, freqs], dim=-1)
    cos = emb.cos().to(x.dtype)[None, :, None, :]
    sin = emb.sin().to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------- rms_norm

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(4, 8), (3, 7), (2, 5, 6), (1, 1)])
def test_rms_norm_matches_torch(device, dtype, shape):
    g = rng(1)
    x = g.standard_normal(shape)
    w = 1.0 + 0.5 * g.standard_normal(shape[-1])
    check_op(lambda a, b: ops.rms_norm(a, b, 1e-6), lambda a, b: ref_rms_norm(a, b, 1e-6), [x, w], dtype, device)


def test_rms_norm_eps_is_used(device):
    x = np.full((2, 4), 1e-3)
    w = np.ones(4)
    check_op(lambda a, b: ops.rms_norm(a, b, eps=0.5), lambda a, b: ref_rms_norm(a, b, 0.5), [x, w], "float32", device)


def test_rms_norm_bf16_x_with_float32_weight(device):
    g = rng(2)
    x_np, w_np, dy_np = g.standard_normal((5, 6)), g.standard_normal(6), g.standard_normal((5, 6))
    x = xtrain.tensor(x_np, dtype="bfloat16", device=device, requires_grad=True)
    w = xtrain.tensor(w_np, dtype="float32", device=device, requires_grad=True)
    y = ops.rms_norm(x, w)
    assert y.dtype == "bfloat16" and y.shape == (5, 6)
    dy = xtrain.tensor(dy_np, dtype="bfloat16", device=device)
    y.backward_seeded(dy)
    assert x.grad.dtype == "bfloat16" and w.grad.dtype == "float32"
    xt = torch.tensor(to_numpy64(x), dtype=torch.float32, requires_grad=True)
    wt = torch.tensor(w_np, dtype=torch.float32, requires_grad=True)
    yt = ref_rms_norm(xt, wt)
    yt.backward(torch.tensor(to_numpy64(dy), dtype=torch.float32))
    assert_close(to_numpy64(y), yt.detach().numpy(), "bfloat16", "y")
    assert_close(to_numpy64(x.grad), xt.grad.numpy(), "bfloat16", "dx")
    assert_close(to_numpy64(w.grad), wt.grad.numpy(), "float32", "dw", scale=10)  # dy, x were bf16-rounded alike


def test_rms_norm_finite_differences():
    g = rng(3)
    finite_difference_check(lambda a, b: ops.rms_norm(a, b, 1e-5), [g.standard_normal((3, 5)), g.standard_normal(5)])


# ---------------------------------------------------------------- rope

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(2, 5, 3, 8), (1, 7, 2, 6), (1, 3, 1, 2), (2, 16, 4, 32)])
def test_rope_matches_torch(device, dtype, shape):
    x = rng(4).standard_normal(shape)
    check_op(lambda a: ops.rope(a), lambda a: ref_rope(a), [x], dtype, device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_rope_positions_and_theta(device, dtype):
    x = rng(5).standard_normal((2, 4, 3, 10))
    pos = np.array([3, 7, 8, 40], dtype=np.int64)
    check_op(lambda a, p: ops.rope(a, p, theta=500.0), lambda a, p: ref_rope(a, p, theta=500.0), [x, pos], dtype,
             device)


def test_rope_default_positions_equal_arange(device):
    x = xtrain.tensor(rng(6).standard_normal((1, 6, 2, 4)), device=device)
    pos = xtrain.tensor(np.arange(6, dtype=np.int64), device=device)
    assert np.array_equal(bits(ops.rope(x)), bits(ops.rope(x, pos)))


def test_rope_position_zero_is_identity(device):
    x = xtrain.tensor(rng(7).standard_normal((2, 1, 3, 8)), device=device)
    assert np.array_equal(bits(ops.rope(x)), bits(x))


def test_rope_finite_differences():
    finite_difference_check(lambda a: ops.rope(a), [rng(8).standard_normal((1, 3, 2, 4))])


# ---------------------------------------------------------------- softmax / log_softmax

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(4, 10), (3, 7), (2, 3, 5), (9,), (2, 1)])
def test_softmax_matches_torch(device, dtype, log, shape):
    x = 3.0 * rng(13).standard_normal(shape)
    xt_fn = ops.log_softmax if log else ops.softmax
    t_fn = torch.log_softmax if log else torch.softmax
    check_op(lambda a: xt_fn(a), lambda a: t_fn(a, -1), [x], dtype, device)
    check_op(lambda a: xt_fn(a, dim=len(shape) - 1), lambda a: t_fn(a, -1), [x], dtype, device)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_large_inputs_stay_finite(device, log):
    x = np.array([[1000.0, 999.0, -1000.0], [-1e4, -1e4, -1e4]])
    xt_fn = ops.log_softmax if log else ops.softmax
    t_fn = torch.log_softmax if log else torch.softmax
    check_op(lambda a: xt_fn(a), lambda a: t_fn(a, -1), [x], "float32", device)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_finite_differences(log):
    fn = ops.log_softmax if log else ops.softmax
    finite_difference_check(lambda a: fn(a), [rng(14).standard_normal((3, 5))])


# ---------------------------------------------------------------- cross_entropy

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("tdtype", [np.int32, np.int64])
@pytest.mark.parametrize("n,vocab", [(6, 11), (7, 5), (1, 3), (32, 64)])
def test_cross_entropy_matches_torch(device, dtype, tdtype, n, vocab):
    g = rng(15)
    logits = 2.0 * g.standard_normal((n, vocab))
    targets = g.integers(0, vocab, n).astype(tdtype)
    out = check_op(lambda a, t: ops.cross_entropy(a, t), lambda a, t: F.cross_entropy(a, t.long()),
                   [logits, targets], dtype, device)
    assert out.shape == () and out.dtype == "float32"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_cross_entropy_ignore_index(device, dtype, ignore_index):
    g = rng(16)
    logits = g.standard_normal((8, 5))
    targets = g.integers(0, 5, 8).astype(np.int64)
    targets[[1, 4, 5]] = ignore_index
    if ignore_index == 2:
        targets[0] = 3
    check_op(lambda a, t: ops.cross_entropy(a, t, ignore_index=ignore_index),
             lambda a, t: F.cross_entropy(a, t, ignore_index=ignore_index), [logits, targets], dtype, device)


def test_cross_entropy_all_ignored_is_zero(device):
    """The mean over no targets is defined as 0 (kernels.h: sum / max(count, 1)), with zero gradient."""
    logits = xtrain.tensor(rng(17).standard_normal((3, 4)), device=device, requires_grad=True)
    targets = xtrain.tensor(np.full(3, -100, dtype=np.int64), device=device)
    loss = ops.cross_entropy(logits, targets)
    assert loss.item() == 0.0
    loss.backward()
    assert np.all(logits.grad.numpy() == 0)


def test_cross_entropy_large_logits_stay_finite(device):
    logits = np.array([[1000.0, 0.0, -1000.0], [50.0, 60.0, 70.0]])
    targets = np.array([2, 0], dtype=np.int64)
    check_op(lambda a, t: ops.cross_entropy(a, t), lambda a, t: F.cross_entropy(a, t), [logits, targets], "float32",
             device)


def test_cross_entropy_float64_matches_torch():
    """float64 logits compute in double, but the loss and lse are float32 (the kernel contract):
    the loss is accurate to float32 rounding and the gradient to ~1e-7 relative."""
    g = rng(18)
    logits, targets = g.standard_normal((6, 9)), g.integers(0, 9, 6)
    xs, ts = make_inputs([logits, targets], "float64", "cpu")
    loss = ops.cross_entropy(*xs)
    ref = F.cross_entropy(*ts)
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-6)
    loss.backward()
    ref.backward()
    assert xs[0].grad.dtype == "float64"
    np.testing.assert_allclose(to_numpy64(xs[0].grad), ts[0].grad.numpy(), rtol=1e-6, atol=1e-8)


def test_cross_entropy_finite_differences():
    # The loss is float32 even for float64 logits (cast to float64 here for the checker), so the
    # step must be large enough that float32 rounding of the loss (~2e-7) does not swamp the
    # difference quotient. The targets are closed over because finite_difference_check hands
    # every array back as float64 when it perturbs.
    targets = xtrain.tensor(np.array([0, 4, -100, 2], dtype=np.int64))
    finite_difference_check(lambda a: ops.cross_entropy(a, targets).to(dtype="float64"),
                            [rng(19).standard_normal((4, 5))], eps=1e-2, rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- determinism

def _run_twice(fn, arrays, dtype, device):
    results = []
    for _ in range(2):
        xs, _ = make_inputs(arrays, dtype, device)
        out = fn(*xs)
        g = rng(20).standard_normal(tuple(out.shape))
        out.backward_seeded(xtrain.tensor(g, dtype=out.dtype, device=device))
        results.append([bits(out)] + [bits(x.grad) for x in xs if x.dtype in ("float32", "bfloat16")])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bitwise_determinism(device, dtype):
    g = rng(21)
    _run_twice(lambda a, b: ops.rms_norm(a, b), [g.standard_normal((64, 48)), g.standard_normal(48)], dtype, device)
    _run_twice(lambda a: ops.rope(a), [g.standard_normal((2, 33, 4, 16))], dtype, device)
    qkv = [g.standard_normal((2, 33, 4, 16)) for _ in range(3)]
    _run_twice(lambda a, b, c: ops.flash_attention(a, b, c), qkv, dtype, device)
    _run_twice(lambda a: ops.softmax(a), [g.standard_normal((40, 77))], dtype, device)
    _run_twice(lambda a: ops.log_softmax(a), [g.standard_normal((40, 77))], dtype, device)
    ce = [g.standard_normal((130, 257)), g.integers(0, 257, 130)]
    _run_twice(lambda a, t: ops.cross_entropy(a, t), ce, dtype, device)


# ---------------------------------------------------------------- recompute

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_checkpoint_recompute_is_bitwise_exact(device, dtype):
    """rms_norm -> rope -> flash_attention inside a checkpoint, then cross_entropy: loss and every gradient
    are bit-identical with and without recompute."""
    g = rng(23)
    x_np, w_np = g.standard_normal((2, 6, 2, 8)), 1.0 + 0.1 * g.standard_normal(8)
    targets = xtrain.tensor(g.integers(0, 8, 24), device=device)

    def segment(x, params):
        h = ops.rope(ops.rms_norm(x, params[0]))
        return ops.flash_attention(h, h, x, causal=True)  # (B, S, H, D)

    results = []
    for use_checkpoint in (False, True):
        x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=True)
        w = xtrain.tensor(w_np, dtype="float32", device=device, requires_grad=True)
        out = xtrain.checkpoint(segment, x, [w]) if use_checkpoint else segment(x, [w])
        loss = ops.cross_entropy(out.reshape(24, 8), targets)
        loss.backward()
        results.append([bits(loss), bits(out), bits(x.grad), bits(w.grad)])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


# ---------------------------------------------------------------- grad mode

def test_no_grad_records_nothing(device):
    x = xtrain.tensor(rng(22).standard_normal((1, 3, 2, 4)), device=device, requires_grad=True)
    with xtrain.no_grad():
        for out in (ops.rope(x), ops.softmax(x), ops.log_softmax(x), ops.flash_attention(x, x, x)):
            assert not out.requires_grad


# ---------------------------------------------------------------- bad inputs

def _t(shape, dtype="float32", device="cpu", **kw):
    return xtrain.tensor(np.zeros(shape), dtype=dtype, device=device, **kw)


def test_rms_norm_bad_inputs(device):
    x = _t((3, 4), device=device)
    with pytest.raises(ValueError, match=r"weight must have shape \[4\]"):
        ops.rms_norm(x, _t((5,), device=device))
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, _t((1, 4), device=device))
    with pytest.raises(TypeError, match="weight"):
        ops.rms_norm(x, _t((4,), "int64", device))
    with pytest.raises(TypeError, match="weight must be float32 or x's dtype"):
        ops.rms_norm(_t((3, 4), "bfloat16", device), _t((4,), "float64", device))
    with pytest.raises(TypeError, match="x"):
        ops.rms_norm(_t((3, 4), "int32", device), _t((4,), device=device))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        ops.rms_norm(_t((), device=device), _t((1,), device=device))
    with pytest.raises(ValueError, match="eps"):
        ops.rms_norm(x, _t((4,), device=device), eps=-1.0)


def test_rope_bad_inputs(device):
    with pytest.raises(ValueError, match="must be even"):
        ops.rope(_t((1, 2, 3, 5), device=device))
    with pytest.raises(ValueError, match=r"\[B, S, H, D\]"):
        ops.rope(_t((2, 3, 4), device=device))
    x = _t((1, 3, 2, 4), device=device)
    with pytest.raises(ValueError, match=r"positions must have shape \[3\]"):
        ops.rope(x, xtrain.tensor(np.arange(4, dtype=np.int64), device=device))
    with pytest.raises(TypeError, match="positions must be int64"):
        ops.rope(x, xtrain.tensor(np.arange(3, dtype=np.int32), device=device))
    with pytest.raises(TypeError, match="positions must be int64"):
        ops.rope(x, _t((3,), device=device))
    with pytest.raises(ValueError, match="theta"):
        ops.rope(x, theta=0.0)
    with pytest.raises(TypeError, match="x"):
        ops.rope(_t((1, 3, 2, 4), "int64", device))


def test_softmax_bad_inputs(device):
    x = _t((3, 4), device=device)
    for fn in (ops.softmax, ops.log_softmax):
        with pytest.raises(ValueError, match="only the last dimension"):
            fn(x, dim=0)
        with pytest.raises(ValueError, match="only the last dimension"):
            fn(x, dim=2)
        with pytest.raises(ValueError, match="at least 1 dimension"):
            fn(_t((), device=device))
        with pytest.raises(TypeError):
            fn(_t((3,), "int32", device))


def test_cross_entropy_bad_inputs(device):
    logits = _t((3, 5), device=device)

    def targets(values, dtype=np.int64):
        return xtrain.tensor(np.array(values, dtype=dtype), device=device)

    # The CPU raises in the op (naming the position); CUDA checks on the device and raises at the
    # next sync point (item()).
    with pytest.raises(IndexError, match="target 5 (at position 1 )?is out of range for 5 classes"):
        ops.cross_entropy(logits, targets([0, 5, 1])).item()
    with pytest.raises(IndexError, match="target -1 "):
        ops.cross_entropy(logits, targets([0, 1, -1], np.int32)).item()
    with pytest.raises(IndexError, match="target -3 "):  # ignore_index present as well
        ops.cross_entropy(logits, targets([-100, -3, 1])).item()
    with pytest.raises(IndexError, match="target -100 "):  # -100 is not ignored when ignore_index differs
        ops.cross_entropy(logits, targets([-100, 0, 1]), ignore_index=4).item()
    with pytest.raises(TypeError, match="targets must be int32 or int64"):
        ops.cross_entropy(logits, _t((3,), device=device))
    with pytest.raises(ValueError, match=r"targets must be \[3\]"):
        ops.cross_entropy(logits, targets([0, 1]))
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        ops.cross_entropy(_t((1, 3, 5), device=device), targets([0, 1, 2]))
    with pytest.raises(TypeError, match="logits"):
        ops.cross_entropy(_t((3, 5), "int64", device), targets([0, 1, 2]))
