"""Basic ops against PyTorch: elementwise (with broadcasting), scalar and unary ops, SiLU/GELU/SwiGLU,
cast/to, dropout, sum/mean, reshape/transpose/permute, matmul/linear, embedding, and the fused
optimizer kernels (AdamW, global norm, clipping). Forward and gradients through tests/ophelp.py,
finite differences in float64, determinism, gradient accumulation and bad inputs."""
import numpy as np
import pytest
import torch

import xtrain
from xtrain import ops
from ophelp import bits, check_op, finite_difference_check, to_numpy64

DTYPES = ["float32", "bfloat16"]


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def positive(*shape, seed=0):
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape)


def nonzero(*shape, seed=0):
    """Magnitudes in [0.5, 2] with random signs: safe divisors."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


# ---------------------------------------------------------------- elementwise

BINARY = {
    "add": (ops.add, torch.add),
    "sub": (ops.sub, torch.sub),
    "mul": (ops.mul, torch.mul),
    "div": (ops.div, torch.div),
}
BROADCAST_SHAPES = [
    ((3, 5), (3, 5)),
    ((17, 33), (17, 33)),
    ((2, 3, 5), (5,)),
    ((5,), (2, 3, 5)),
    ((4, 1, 3), (1, 5, 3)),
    ((17, 1), (1, 9)),
    ((2, 1, 4, 1), (3, 1, 5)),
    ((), (3, 4)),
    ((3, 4), (1, 1)),
    ((2, 0, 3), (3,)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_broadcast(name, shapes, dtype, device):
    xt_fn, torch_fn = BINARY[name]
    a = randn(*shapes[0], seed=1)
    b = nonzero(*shapes[1], seed=2) if name == "div" else randn(*shapes[1], seed=2)
    check_op(xt_fn, torch_fn, [a, b], dtype=dtype, device=device)


def test_binary_many_dims_are_merged(device):
    # 9 output dims: too many for one kernel Broadcast, fine once contiguous dims are merged.
    a, b = randn(*(2,) * 9, seed=3), randn(2, seed=4)
    check_op(ops.add, torch.add, [a, b], device=device)


SCALAR = {
    "add_scalar": (lambda x: ops.add_scalar(x, 1.75), lambda x: x + 1.75, randn),
    "mul_scalar": (lambda x: ops.mul_scalar(x, -2.5), lambda x: x * -2.5, randn),
    "rsub_scalar": (lambda x: ops.rsub_scalar(x, 3.0), lambda x: 3.0 - x, randn),
    "div_scalar": (lambda x: ops.div_scalar(x, 3.0), lambda x: x / 3.0, randn),
    "rdiv_scalar": (lambda x: ops.rdiv_scalar(x, -1.5), lambda x: -1.5 / x, nonzero),
    "pow_2": (lambda x: ops.pow_scalar(x, 2.0), lambda x: x ** 2.0, randn),
    "pow_half": (lambda x: ops.pow_scalar(x, 0.5), lambda x: x ** 0.5, positive),
    "pow_neg": (lambda x: ops.pow_scalar(x, -1.5), lambda x: x ** -1.5, positive),
    "pow_0": (lambda x: ops.pow_scalar(x, 0.0), lambda x: x ** 0.0, positive),
    "neg": (ops.neg, torch.neg, randn),
    "exp": (ops.exp, torch.exp, randn),
    "log": (ops.log, torch.log, positive),
    "sqrt": (ops.sqrt, torch.sqrt, positive),
    "silu": (ops.silu, torch.nn.functional.silu, lambda *s, seed=0: 4 * randn(*s, seed=seed)),
    "gelu": (ops.gelu, lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
             lambda *s, seed=0: 4 * randn(*s, seed=seed)),
    "tanh": (ops.tanh, torch.tanh, lambda *s, seed=0: 3 * randn(*s, seed=seed)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 17), ()], ids=str)
@pytest.mark.parametrize("name", list(SCALAR))
def test_scalar_and_unary(name, shape, dtype, device):
    xt_fn, torch_fn, make = SCALAR[name]
    check_op(xt_fn, torch_fn, [make(*shape, seed=5)], dtype=dtype, device=device)


def test_gelu_float64_and_saturation_match_torch(device):
    # float64 to 1e-10, and |x| large enough that tanh saturates (gelu(x) -> x or 0, gelu' -> 1 or 0).
    x = np.concatenate([3 * randn(40, seed=41), [-60.0, -12.0, 0.0, 12.0, 60.0]])
    ref = lambda t: torch.nn.functional.gelu(t, approximate="tanh")  # noqa: E731
    check_op(ops.gelu, ref, [x], dtype="float64", device=device)
    out = check_op(ops.gelu, ref, [x], dtype="float32", device=device)
    assert out.grad_fn == "GeluBackward"


def test_tanh_float64_and_saturation_match_torch(device):
    # float64 to 1e-10, and |x| where tanh saturates to +-1 with a zero gradient (a soft cap's far range).
    x = np.concatenate([3 * randn(40, seed=42), [-60.0, -20.0, 0.0, 20.0, 60.0]])
    check_op(ops.tanh, torch.tanh, [x], dtype="float64", device=device)
    out = check_op(ops.tanh, torch.tanh, [x], dtype="float32", device=device)
    assert out.grad_fn == "TanhBackward"
    assert np.array_equal(out.numpy()[-5:], np.array([-1, -1, 0, 1, 1], np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(6,), (3, 11), (2, 4, 9)], ids=str)
def test_swiglu(shape, dtype, device):
    ref = lambda g, u: torch.nn.functional.silu(g) * u  # noqa: E731
    check_op(ops.swiglu, ref, [3 * randn(*shape, seed=6), randn(*shape, seed=7)], dtype=dtype, device=device)


@pytest.mark.parametrize("src,dst", [("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float64"),
                                     ("float64", "float32")])
def test_cast(src, dst, device):
    tdst = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[dst]
    out = check_op(lambda x: ops.cast(x, dst), lambda x: x.to(tdst), [randn(4, 5, seed=8)], dtype=src,
                   device=device)
    assert out.dtype == dst


def test_cast_same_dtype_is_identity():
    x = xtrain.tensor(randn(3), dtype="float32", requires_grad=True)
    y = ops.cast(x, "float32")
    assert y.same_storage(x) and y.is_leaf and y.requires_grad
    assert x.float().same_storage(x)


def test_to_dtype_and_device(device):
    x = xtrain.tensor(randn(3, 4, seed=9), dtype="float32", requires_grad=True)
    y = ops.to(x, device=device, dtype="bfloat16")
    assert y.device.startswith(device) and y.dtype == "bfloat16"
    np.testing.assert_array_equal(y.numpy(), torch.tensor(x.numpy()).bfloat16().float().numpy())
    ops.sum(ops.mul_scalar(ops.cast(y, "float32"), 3.0)).backward()
    assert x.grad.dtype == "float32" and x.grad.device == "cpu"
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 3.0, np.float32))


# ---------------------------------------------------------------- dropout

def test_dropout_identity_cases(device):
    x = xtrain.tensor(randn(5, 7), device=device, requires_grad=True)
    for y in (ops.dropout(x, 0.0), ops.dropout(x, 0.5, training=False)):
        assert y.same_storage(x) and y.is_leaf and y.grad_fn is None


@pytest.mark.parametrize("dtype", DTYPES + ["float64"])
def test_dropout_mask_scale_and_backward(dtype, device):
    p, n = 0.3, 20000
    x = xtrain.ones(n, dtype=dtype, device=device, requires_grad=True)
    y = ops.dropout(x, p, generator=xtrain.Generator(11))
    out = to_numpy64(y)
    kept = out != 0
    assert abs(1 - kept.mean() - p) < 0.02, f"dropped fraction {1 - kept.mean()} for p={p}"
    expected_scale = to_numpy64(xtrain.tensor([1 / (1 - p)], dtype=dtype))[0] if dtype == "bfloat16" else 1 / (1 - p)
    np.testing.assert_allclose(out[kept], expected_scale, rtol=1e-6 if dtype != "bfloat16" else 0)
    # backward re-derives the same mask from (seed, offset): grad == mask / (1 - p) == y for x = 1
    y.backward_seeded(xtrain.ones(n, dtype=dtype, device=device))
    np.testing.assert_array_equal(to_numpy64(x.grad), out)


def test_dropout_mask_is_philox_uniform_below_p(device):
    # rand() draws philox_uniform(seed, offset + i): the same numbers dropout compares with p.
    n, p = 4096, 0.4
    u = xtrain.rand(n, generator=xtrain.Generator(5), device=device).numpy()
    y = ops.dropout(xtrain.ones(n, device=device), p, generator=xtrain.Generator(5)).numpy()
    np.testing.assert_array_equal(y == 0, u < p)


def test_dropout_generator_advances_and_replays(device):
    x = xtrain.ones(1000, device=device)
    g = xtrain.Generator(3)
    a, b = ops.dropout(x, 0.5, generator=g).numpy(), ops.dropout(x, 0.5, generator=g).numpy()
    assert not np.array_equal(a, b), "successive calls must draw fresh masks"
    g.set_state((3, 0))
    np.testing.assert_array_equal(ops.dropout(x, 0.5, generator=g).numpy(), a)
    assert np.all(ops.dropout(x, 1.0).numpy() == 0)


def _words(seed, offset, device):
    """A generator state as the two device words a captured graph's dropout kernels read."""
    return xtrain.tensor(np.array([seed, offset], dtype=np.uint64).view(np.int64), device=device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_in_capture_mode_draws_from_the_device_words(dtype, device):
    # Note [Random draws in captured graphs]: relative offsets plus the words the replay fills
    x = xtrain.tensor(randn(3, 700), dtype=dtype, device=device, requires_grad=True)
    eager_g = xtrain.Generator(7)
    eager_g.set_state((7, 5000))
    want = [ops.dropout(x, 0.3, generator=eager_g), ops.dropout(x, 0.3, generator=eager_g)]
    (want[0] + want[1]).backward_seeded(xtrain.ones((3, 700), dtype=dtype, device=device))
    want_grad = bits(x.grad)
    x.grad = None

    g = xtrain.Generator(123)              # another seed: the words decide
    g.set_state((123, 99))
    base = _words(7, 5000, device)
    g.begin_capture(base)
    assert g.capturing and g.get_state() == (123, 0)  # the relative counter
    got = [ops.dropout(x, 0.3, generator=g), ops.dropout(x, 0.3, generator=g)]
    assert g.end_capture() == 2 * 3 * 700 and not g.capturing
    assert g.get_state() == (123, 99), "a capture leaves the generator's own counter alone"
    for a, b in zip(got, want):
        np.testing.assert_array_equal(bits(a), bits(b))
    (got[0] + got[1]).backward_seeded(xtrain.ones((3, 700), dtype=dtype, device=device))
    np.testing.assert_array_equal(bits(x.grad), want_grad)  # the backward reads the same words
    # the words are read when the kernel runs: new words, new masks (a replay's next step)
    g.begin_capture(base)
    base.copy_(_words(7, 5000 + 2 * 3 * 700, device))
    nxt = ops.dropout(x, 0.3, generator=g)
    g.end_capture()
    np.testing.assert_array_equal(bits(nxt), bits(ops.dropout(x, 0.3, generator=eager_g)))


def test_generator_capture_mode_refusals(device):
    g = xtrain.Generator(1)
    base = _words(1, 0, device)
    with pytest.raises(ValueError, match="int64 tensor of 2 elements"):
        g.begin_capture(xtrain.zeros(3, dtype="int64", device=device))
    with pytest.raises(RuntimeError, match="not capturing"):
        g.end_capture()
    g.begin_capture(base)
    try:
        with pytest.raises(RuntimeError, match="already capturing"):
            g.begin_capture(base)
        with pytest.raises(RuntimeError, match="random tensors cannot be drawn inside a captured CUDA graph"):
            xtrain.rand(4, generator=g, device=device)
        with pytest.raises(RuntimeError, match="seed cannot change"):
            g.manual_seed(2)
        g.set_state((1, 40))                # a recompute's restore: the relative counter
        assert g.get_state() == (1, 40)
    finally:
        assert g.end_capture() == 40
    assert g.get_state() == (1, 0)


# ---------------------------------------------------------------- reductions

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 33), ()], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_reduce_all(name, keepdim, shape, dtype, device):
    xt_fn = lambda x: getattr(ops, name)(x, None, keepdim)  # noqa: E731
    if keepdim:
        torch_fn = lambda x: getattr(torch, name)(x, dim=tuple(range(x.dim())), keepdim=True)  # noqa: E731
    else:
        torch_fn = lambda x: getattr(torch, name)(x)  # noqa: E731
    check_op(xt_fn, torch_fn, [randn(*shape, seed=12)], dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 3, 33), (4, 1)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", ["sum", "mean"])
def test_reduce_lastdim(name, keepdim, shape, dtype, device):
    check_op(lambda x: getattr(ops, name)(x, -1, keepdim), lambda x: getattr(torch, name)(x, -1, keepdim=keepdim),
             [randn(*shape, seed=13)], dtype=dtype, device=device)


def test_sum_accepts_last_dim_index():
    x = xtrain.tensor(randn(2, 3))
    np.testing.assert_array_equal(ops.sum(x, 1).numpy(), ops.sum(x, -1).numpy())


# ---------------------------------------------------------------- layout

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,new", [((3, 4), (12,)), ((2, 3, 5), (6, -1)), ((7,), (1, 7, 1)), ((), (1,)),
                                       ((4, 6), (-1, 2, 3))], ids=str)
def test_reshape(shape, new, dtype, device):
    check_op(lambda x: ops.reshape(x, list(new)), lambda x: x.reshape(new), [randn(*shape, seed=14)], dtype=dtype,
             device=device)


def test_reshape_and_view_share_storage():
    x = xtrain.tensor(randn(2, 6))
    assert ops.reshape(x, [3, 4]).same_storage(x)
    assert x.view(4, 3).same_storage(x)
    assert x.reshape((12,)).shape == (12,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,d0,d1", [((3, 5), 0, 1), ((2, 3, 4), 0, 2), ((2, 3, 4, 5), -1, 1),
                                         ((3, 4), 1, 1)], ids=str)
def test_transpose(shape, d0, d1, dtype, device):
    check_op(lambda x: ops.transpose(x, d0, d1), lambda x: x.transpose(d0, d1), [randn(*shape, seed=15)],
             dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dims", [((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)),
                                        ((3, 1, 5), (1, 2, 0)), ((7, 3), (-1, 0))], ids=str)
def test_permute(shape, dims, dtype, device):
    check_op(lambda x: ops.permute(x, list(dims)), lambda x: x.permute(*dims), [randn(*shape, seed=16)],
             dtype=dtype, device=device)


def test_permute_integer_tensor(device):
    ids = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    out = ops.permute(xtrain.tensor(ids, device=device), [2, 0, 1])
    np.testing.assert_array_equal(out.numpy(), ids.transpose(2, 0, 1))


# ---------------------------------------------------------------- matmul

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 3)), ((1, 33), (33, 17)), ((4, 5, 6), (4, 6, 2)),
                                   ((2, 3, 5, 7), (7, 4)), ((6, 1), (1, 6))], ids=str)
def test_matmul(sa, sb, dtype, device):
    check_op(ops.matmul, torch.matmul, [randn(*sa, seed=17), randn(*sb, seed=18)], dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sx,n", [((5, 7), 3), ((2, 3, 33), 17), ((7,), 4), ((1, 1, 8), 1)], ids=str)
def test_linear(sx, n, dtype, device):
    k = sx[-1]
    check_op(ops.linear, torch.nn.functional.linear, [randn(*sx, seed=19), randn(n, k, seed=20)], dtype=dtype,
             device=device)


# ---------------------------------------------------------------- embedding

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("id_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("ids_shape", [(5,), (2, 7), (3, 1, 4)], ids=str)
def test_embedding(ids_shape, id_dtype, dtype, device):
    ids = np.random.default_rng(21).integers(0, 9, ids_shape).astype(id_dtype)  # repeats guaranteed
    check_op(lambda w, i: ops.embedding(w, i), lambda w, i: torch.nn.functional.embedding(i.long(), w),
             [randn(9, 6, seed=22), ids], dtype=dtype, device=device)


# ---------------------------------------------------------------- finite differences (float64, CPU)

FD_CASES = {
    "add_broadcast": (ops.add, [randn(3, 4, seed=1), randn(4, seed=2)]),
    "sub_broadcast": (ops.sub, [randn(2, 1, 3, seed=3), randn(4, 1, seed=4)]),
    "mul_broadcast": (ops.mul, [randn(3, 1, seed=5), randn(1, 4, seed=6)]),
    "div_broadcast": (ops.div, [randn(2, 3, seed=7), nonzero(3, seed=8)]),
    "add_scalar": (lambda x: ops.add_scalar(x, 0.5), [randn(5, seed=9)]),
    "mul_scalar": (lambda x: ops.mul_scalar(x, -1.5), [randn(5, seed=10)]),
    "rsub_scalar": (lambda x: ops.rsub_scalar(x, 2.0), [randn(5, seed=11)]),
    "div_scalar": (lambda x: ops.div_scalar(x, 3.0), [randn(5, seed=12)]),
    "rdiv_scalar": (lambda x: ops.rdiv_scalar(x, 2.0), [nonzero(5, seed=13)]),
    "pow_scalar": (lambda x: ops.pow_scalar(x, 2.5), [positive(5, seed=14)]),
    "neg": (ops.neg, [randn(5, seed=15)]),
    "exp": (ops.exp, [randn(5, seed=16)]),
    "log": (ops.log, [positive(5, seed=17)]),
    "sqrt": (ops.sqrt, [positive(5, seed=18)]),
    "silu": (ops.silu, [randn(6, seed=19)]),
    "gelu": (ops.gelu, [3 * randn(7, seed=22)]),
    "tanh": (ops.tanh, [2 * randn(7, seed=43)]),
    "swiglu": (ops.swiglu, [randn(2, 3, seed=20), randn(2, 3, seed=21)]),
    "sum_all": (lambda x: ops.sum(x), [randn(3, 4, seed=23)]),
    "sum_last_keepdim": (lambda x: ops.sum(x, -1, True), [randn(3, 4, seed=24)]),
    "mean_all": (lambda x: ops.mean(x), [randn(3, 4, seed=25)]),
    "mean_last": (lambda x: ops.mean(x, -1), [randn(2, 3, 4, seed=26)]),
    "reshape": (lambda x: ops.exp(ops.reshape(x, [4, -1])), [randn(2, 6, seed=27)]),
    "transpose": (lambda x: ops.mul(ops.transpose(x, 0, 2), ops.transpose(x, 0, 2)), [randn(2, 3, 4, seed=28)]),
    "permute": (lambda x: ops.exp(ops.permute(x, [1, 2, 0])), [randn(2, 3, 2, seed=29)]),
    "matmul_2d": (ops.matmul, [randn(3, 4, seed=30), randn(4, 2, seed=31)]),
    "matmul_batched": (ops.matmul, [randn(2, 3, 4, seed=32), randn(2, 4, 2, seed=33)]),
    "matmul_nd_2d": (ops.matmul, [randn(2, 2, 3, seed=34), randn(3, 2, seed=35)]),
    "linear": (ops.linear, [randn(2, 3, 4, seed=36), randn(5, 4, seed=37)]),
    "embedding": (lambda w, i: ops.exp(ops.embedding(w, i)), [randn(5, 3, seed=38), np.array([4, 0, 4, 2, 4])]),
}


@pytest.mark.parametrize("name", list(FD_CASES))
def test_finite_differences(name):
    fn, arrays = FD_CASES[name]
    finite_difference_check(fn, arrays)


def test_finite_differences_cast():
    # The round trip through float32 rounds at ~1e-7 relative: a wide step keeps that noise small.
    fn = lambda x: ops.cast(ops.mul_scalar(ops.cast(x, "float32"), 3.0), "float64")  # noqa: E731
    finite_difference_check(fn, [randn(4, seed=22)], eps=1e-2, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- tape behaviour

def _mlp_grads(dtype, device):
    rng = np.random.default_rng(40)
    x = xtrain.tensor(rng.standard_normal((64, 48)), dtype=dtype, device=device, requires_grad=True)
    w1 = xtrain.tensor(rng.standard_normal((96, 48)) * 0.1, dtype=dtype, device=device, requires_grad=True)
    w2 = xtrain.tensor(rng.standard_normal((96, 48)) * 0.1, dtype=dtype, device=device, requires_grad=True)
    w3 = xtrain.tensor(rng.standard_normal((48, 96)) * 0.1, dtype=dtype, device=device, requires_grad=True)
    h = ops.swiglu(ops.linear(x, w1), ops.linear(x, w2))
    y = ops.linear(h, w3) + x
    loss = ops.mean(ops.mul(y, y))
    loss.backward()
    return [bits(loss)] + [bits(t.grad) for t in (x, w1, w2, w3)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_backward_is_bitwise_deterministic(dtype, device):
    first, second = _mlp_grads(dtype, device), _mlp_grads(dtype, device)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_repeated_ids_deterministic(dtype, device):
    rng = np.random.default_rng(41)
    ids = rng.integers(0, 7, 5000)
    table_np, seed_np = rng.standard_normal((7, 16)), rng.standard_normal((5000, 16))

    def run():
        table = xtrain.tensor(table_np, dtype=dtype, device=device, requires_grad=True)
        out = ops.embedding(table, xtrain.tensor(ids, device=device))
        out.backward_seeded(xtrain.tensor(seed_np, dtype=dtype, device=device))
        return table.grad

    g1, g2 = run(), run()
    np.testing.assert_array_equal(bits(g1), bits(g2))
    ref = np.zeros((7, 16))
    np.add.at(ref, ids, to_numpy64(xtrain.tensor(seed_np, dtype=dtype)))
    tol = 1e-4 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(to_numpy64(g1), ref, rtol=tol, atol=tol * 10)


def test_gradients_accumulate_over_two_backward_calls(device):
    x = xtrain.tensor(randn(4, 5, seed=42), device=device, requires_grad=True)
    w = xtrain.tensor(randn(3, 5, seed=43), device=device, requires_grad=True)
    ops.sum(ops.silu(ops.linear(x, w))).backward()
    gx, gw = x.grad.numpy().copy(), w.grad.numpy().copy()
    ops.sum(ops.silu(ops.linear(x, w))).backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * gx)
    np.testing.assert_array_equal(w.grad.numpy(), 2 * gw)


def test_shared_input_gets_summed_gradient(device):
    x = xtrain.tensor(randn(6, seed=44), device=device, requires_grad=True)
    ops.sum(ops.mul(x, x) + ops.exp(x)).backward()
    xn = x.numpy().astype(np.float64)
    np.testing.assert_allclose(x.grad.numpy(), 2 * xn + np.exp(xn), rtol=1e-5)


def test_no_grad_records_nothing(device):
    x = xtrain.tensor(randn(3, seed=45), device=device, requires_grad=True)
    with xtrain.no_grad():
        y = ops.exp(x) * 2 + x
    assert not y.requires_grad and y.grad_fn is None
    assert (x * 2).grad_fn == "MulScalarBackward"


def test_gradient_only_flows_to_inputs_that_need_it(device):
    a = xtrain.tensor(randn(3, 4, seed=46), device=device, requires_grad=True)
    b = xtrain.tensor(randn(4, 2, seed=47), device=device)
    ops.sum(ops.matmul(a, b)).backward()
    assert a.grad is not None and b.grad is None


# ---------------------------------------------------------------- Tensor operators and methods

def test_tensor_operators_and_methods(device):
    xn, yn = positive(3, 4, seed=48), randn(3, 4, seed=49)
    x, y = xtrain.tensor(xn, device=device), xtrain.tensor(yn, device=device)
    tx, ty = torch.tensor(x.numpy()), torch.tensor(y.numpy())
    cases = [
        (x + y, tx + ty), (x - y, tx - ty), (x * y, tx * ty), (x / y, tx / ty),
        (x + 2, tx + 2), (2 + x, 2 + tx), (x - 2, tx - 2), (2 - x, 2 - tx), (x * 3, tx * 3), (3 * x, 3 * tx),
        (x / 4, tx / 4), (4 / x, 4 / tx), (x ** 2, tx ** 2), (-x, -tx),
        (x @ y.transpose(0, 1), tx @ ty.T), (x.permute(1, 0), tx.permute(1, 0)),
        (x.sum(), tx.sum()), (x.sum(-1), tx.sum(-1)), (x.mean(dim=-1, keepdim=True), tx.mean(-1, keepdim=True)),
        (x.reshape(2, 6), tx.reshape(2, 6)), (x.view(-1), tx.view(-1)), (x.exp(), tx.exp()), (x.log(), tx.log()),
        (x.sqrt(), tx.sqrt()), (x.silu(), torch.nn.functional.silu(tx)), (x.double(), tx.double()),
        (x.bfloat16().float(), tx.bfloat16().float()), (x.softmax(), tx.softmax(-1)),
        (x.log_softmax(dim=1), tx.log_softmax(-1)),
    ]
    for i, (got, want) in enumerate(cases):
        np.testing.assert_allclose(to_numpy64(got), want.double().numpy(), rtol=2e-6, atol=1e-6, err_msg=f"case {i}")
    assert x.bfloat16().dtype == "bfloat16" and x.double().dtype == "float64"


def test_ops_accept_scalars_on_either_side():
    x = xtrain.tensor([1.0, 2.0, 4.0])
    np.testing.assert_array_equal(ops.add(1, x).numpy(), [2, 3, 5])
    np.testing.assert_array_equal(ops.sub(1, x).numpy(), [0, -1, -3])
    np.testing.assert_array_equal(ops.sub(x, 1).numpy(), [0, 1, 3])
    np.testing.assert_array_equal(ops.mul(x, 2).numpy(), [2, 4, 8])
    np.testing.assert_array_equal(ops.div(4, x).numpy(), [4, 2, 1])
    np.testing.assert_array_equal(ops.scale(x, 0.5).numpy(), [0.5, 1, 2])
    with pytest.raises(TypeError):
        ops.add(1, 2)


# ---------------------------------------------------------------- bad inputs

def _t(*shape, dtype="float32", device="cpu"):
    return xtrain.tensor(randn(*shape), dtype=dtype, device=device)


def test_bad_inputs_raise_clear_errors(device):
    with pytest.raises(ValueError, match=r"\[2, 3\] and \[4\] cannot be broadcast"):
        ops.add(_t(2, 3, device=device), _t(4, device=device))
    with pytest.raises(TypeError, match="same dtype.*float32.*bfloat16"):
        ops.mul(_t(3, device=device), _t(3, dtype="bfloat16", device=device))
    with pytest.raises(TypeError, match="exp: x must be floating point.*int64"):
        ops.exp(xtrain.tensor([1, 2, 3], device=device))
    with pytest.raises(TypeError, match="linear: x and weight must have the same dtype"):
        ops.linear(_t(2, 3, dtype="bfloat16", device=device), _t(4, 3, device=device))
    with pytest.raises(ValueError, match=r"inner dimensions.*K=4.*K=5"):
        ops.matmul(_t(3, 4, device=device), _t(5, 2, device=device))
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.matmul(_t(2, 3, 4, device=device), _t(5, 2, device=device))
    with pytest.raises(ValueError, match="batch sizes differ"):
        ops.matmul(_t(2, 3, 4, device=device), _t(3, 4, 2, device=device))
    with pytest.raises(ValueError, match="2-D"):
        ops.matmul(_t(4, device=device), _t(4, 2, device=device))
    with pytest.raises(ValueError, match="in_features"):
        ops.linear(_t(2, 3, device=device), _t(4, 5, device=device))
    with pytest.raises(ValueError, match=r"cannot reshape.*\[2, 3\].*\[4, 2\]"):
        ops.reshape(_t(2, 3, device=device), [4, 2])
    with pytest.raises(ValueError, match="only one dimension can be -1"):
        ops.reshape(_t(2, 3, device=device), [-1, -1])
    with pytest.raises(ValueError, match="cannot reshape"):
        ops.reshape(_t(2, 3, device=device), [4, -1])
    with pytest.raises(ValueError, match="invalid size"):
        ops.reshape(_t(2, 3, device=device), [-2, -3])
    with pytest.raises(IndexError, match="out of range"):
        ops.transpose(_t(2, 3, device=device), 0, 2)
    with pytest.raises(ValueError, match="repeated"):
        ops.permute(_t(2, 3, device=device), [0, 0])
    with pytest.raises(ValueError, match="dims has 1 entries"):
        ops.permute(_t(2, 3, device=device), [0])
    with pytest.raises(ValueError, match="dim=-1"):
        ops.sum(_t(2, 3, device=device), 0)
    with pytest.raises(ValueError, match="dim=-1"):
        _t(2, 3, device=device).mean(dim=0)
    with pytest.raises(ValueError, match="p must be in"):
        ops.dropout(_t(3, device=device), 1.5)
    with pytest.raises(ValueError, match="p must be in"):
        ops.dropout(_t(3, device=device), -0.1, training=False)
    with pytest.raises(ValueError, match="swiglu.*same shape"):
        ops.swiglu(_t(2, 3, device=device), _t(3, 2, device=device))


@pytest.mark.parametrize("bad", [[0, 5, 2], [-1, 0], [7]])
def test_embedding_ids_out_of_range(bad, device):
    # The CPU raises in the op; CUDA checks on the device and raises at the next sync point.
    table = _t(5, 4, device=device)
    for id_dtype in (np.int64, np.int32):
        with pytest.raises(IndexError, match=r"ids must be in \[0, 5\)"):
            ops.embedding(table, xtrain.tensor(np.array(bad, dtype=id_dtype), device=device)).numpy()
    with pytest.raises(TypeError, match="int32 or int64"):
        ops.embedding(table, _t(3, device=device))
    with pytest.raises(ValueError, match="2 dimensions"):
        ops.embedding(_t(5, device=device), xtrain.tensor([0], device=device))


def test_device_mismatch_raises():
    if not xtrain.cuda.is_available():
        pytest.skip("needs a GPU: mixes a CPU and a CUDA tensor")
    with pytest.raises(ValueError, match="same device"):
        ops.add(_t(3), _t(3, device="cuda"))
    with pytest.raises(ValueError, match="same device"):
        ops.embedding(_t(5, 4, device="cuda"), xtrain.tensor([1, 2]))


# ---------------------------------------------------------------- optimizer kernels

def test_adamw_matches_torch(device):
    rng = np.random.default_rng(50)
    shapes = [(5, 3), (7,), (2, 3, 4)]
    lr, betas, eps, wd = 1e-2, (0.9, 0.95), 1e-8, 0.1
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tparams = [torch.tensor(p, requires_grad=True) for p in init]
    topt = torch.optim.AdamW(tparams, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    params = [xtrain.tensor(p, device=device) for p in init]
    m = [xtrain.zeros(*s, device=device) for s in shapes]
    v = [xtrain.zeros(*s, device=device) for s in shapes]
    for step in range(1, 6):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for tp, g in zip(tparams, grads):
            tp.grad = torch.tensor(g)
        topt.step()
        xtrain._C.optim.adamw_step(params, [xtrain.tensor(g, device=device) for g in grads], m, v, lr, betas[0],
                                   betas[1], eps, wd, step)
    for i, tp in enumerate(tparams):
        state = topt.state[tp]
        np.testing.assert_allclose(params[i].numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m[i].numpy(), state["exp_avg"].numpy(), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(v[i].numpy(), state["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-7)


def test_adamw_decay_flags_equal_one_call_per_group(device):
    """decays=[...]: one launch over both weight-decay groups gives the bits of a call per group
    (the other group with weight_decay 0), with device constants (hyper) and clipping too."""
    rng = np.random.default_rng(51)
    sizes, flags = [3000, 7, 2048, 5000, 1], [True, False, True, False, True]
    init = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(4)]
    lr, wd, step = 1e-2, 0.1, 3
    consts = xtrain._C.optim.adamw_consts(lr, 0.9, 0.95, 1e-8, wd, step)
    hyper = xtrain.tensor(np.asarray(consts, dtype=np.float32), device=device)
    hyper0 = xtrain.tensor(np.asarray(xtrain._C.optim.adamw_consts(lr, 0.9, 0.95, 1e-8, 0.0, step),
                                      dtype=np.float32), device=device)
    norm = xtrain.tensor(np.float32(7.5), device=device)
    for kw in ({}, {"hyper": True, "clip_norm": norm, "max_norm": 1.0}):
        one = [[xtrain.tensor(a, device=device) for a in arrays] for arrays in init]
        two = [[xtrain.tensor(a, device=device) for a in arrays] for arrays in init]
        extra = {k: v for k, v in kw.items() if k != "hyper"}
        xtrain._C.optim.adamw_step(*one, lr, 0.9, 0.95, 1e-8, wd, step, decays=flags,
                                   hyper=hyper if kw else None, **extra)
        for group, decay in ((True, wd), (False, 0.0)):
            idx = [i for i, f in enumerate(flags) if f == group]
            xtrain._C.optim.adamw_step(*[[t[i] for i in idx] for t in two], lr, 0.9, 0.95, 1e-8, decay, step,
                                       hyper=(hyper if group else hyper0) if kw else None, **extra)
        for a, b in zip(one, two):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x.numpy(), y.numpy())
        assert not np.array_equal(one[0][1].numpy(), init[0][1])  # updated


def test_adamw_bad_inputs():
    p, g = [xtrain.zeros(3)], [xtrain.zeros(3)]
    with pytest.raises(ValueError, match="same length"):
        xtrain._C.optim.adamw_step(p, g, [], [], 1e-3, 0.9, 0.99, 1e-8, 0.0, 1)
    with pytest.raises(ValueError, match="step must be >= 1"):
        xtrain._C.optim.adamw_step(p, g, [xtrain.zeros(3)], [xtrain.zeros(3)], 1e-3, 0.9, 0.99, 1e-8, 0.0, 0)
    with pytest.raises(ValueError, match="differ in shape"):
        xtrain._C.optim.adamw_step(p, [xtrain.zeros(4)], [xtrain.zeros(3)], [xtrain.zeros(3)], 1e-3, 0.9, 0.99,
                                   1e-8, 0.0, 1)
    with pytest.raises(TypeError, match="float32"):
        xtrain._C.optim.adamw_step([xtrain.zeros(3, dtype="bfloat16")], g, [xtrain.zeros(3)], [xtrain.zeros(3)],
                                   1e-3, 0.9, 0.99, 1e-8, 0.0, 1)
    with pytest.raises(ValueError, match="beta1"):
        xtrain._C.optim.adamw_step(p, g, [xtrain.zeros(3)], [xtrain.zeros(3)], 1e-3, 1.0, 0.99, 1e-8, 0.0, 1)
    with pytest.raises(ValueError, match="decays must be empty"):
        xtrain._C.optim.adamw_step(p, g, [xtrain.zeros(3)], [xtrain.zeros(3)], 1e-3, 0.9, 0.99, 1e-8, 0.0, 1,
                                   decays=[True, False])


@pytest.mark.parametrize("ratio", [0.3, 10.0])
def test_global_norm_and_clip_match_torch(ratio, device):
    rng = np.random.default_rng(51)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(4, 5), (17,), (2, 3, 3)]]
    total = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))
    max_norm = ratio * total
    tparams = [torch.zeros(g.shape, requires_grad=True) for g in grads]
    for tp, g in zip(tparams, grads):
        tp.grad = torch.tensor(g)
    tnorm = torch.nn.utils.clip_grad_norm_(tparams, max_norm)
    xgrads = [xtrain.tensor(g, device=device) for g in grads]
    norm = xtrain._C.optim.global_norm(xgrads)
    assert norm.shape == () and norm.dtype == "float32" and norm.device.startswith(device)
    np.testing.assert_allclose(norm.item(), tnorm.item(), rtol=1e-6)
    xtrain._C.optim.clip_by_norm_(xgrads, norm, max_norm)
    for xg, tp in zip(xgrads, tparams):
        np.testing.assert_allclose(xg.numpy(), tp.grad.numpy(), rtol=1e-6, atol=1e-7)
    if ratio > 1:
        for xg, g in zip(xgrads, grads):
            np.testing.assert_array_equal(xg.numpy(), g)  # below max_norm: untouched
