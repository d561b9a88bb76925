"""to_heads / from_heads against the Python composition they replace (reshape -> rms_norm -> rope
-> permute, and permute -> reshape): forward values and the gradients of x and norm_weight must
be bit-identical, in float32 and bfloat16, with and without the norm and RoPE; no_grad records
nothing; bad arguments raise clear Python exceptions.
"""
import itertools

import numpy as np
import pytest

import xtrain
from ophelp import bits

ops = xtrain.ops
FLOAT_DTYPES = ["float32", "bfloat16"]
# (B, S, H, D): every B in 1,2,3, S in 1,5,8, H in 1,3,4, D in 2,8,32 appears, in mixed combinations.
SHAPES = [(1, 1, 1, 2), (2, 5, 3, 8), (3, 8, 4, 32), (1, 8, 3, 2), (3, 1, 4, 8), (2, 8, 1, 32), (3, 5, 1, 2),
          (1, 5, 4, 32), (2, 1, 3, 32)]


def rng(seed=0):
    return np.random.default_rng(seed)


def composed_to_heads(x, seq, n_heads, norm_weight=None, eps=1e-6, rope_theta=None):
    """What python/xtrain/models/transformer.py did before to_heads, op by op."""
    rows, cols = x.shape
    h = ops.reshape(x, (rows // seq, seq, n_heads, cols // n_heads))  # (B, S, H, D)
    if norm_weight is not None:
        h = ops.rms_norm(h, norm_weight, eps)
    if rope_theta is not None:
        h = ops.rope(h, theta=rope_theta)
    return ops.permute(h, [0, 2, 1, 3])  # (B, H, S, D)


def composed_from_heads(x):
    B, H, S, D = x.shape
    return ops.reshape(ops.permute(x, [0, 2, 1, 3]), (B * S, H * D))


def run(fn, arrays, dtypes, device, seed):
    """fn(*leaves) with a random upstream gradient; returns the bits of the output and of every
    leaf's gradient, plus the output itself."""
    leaves = [xtrain.tensor(a, dtype=dt, device=device, requires_grad=True) for a, dt in zip(arrays, dtypes)]
    out = fn(*leaves)
    dout = xtrain.tensor(rng(seed).standard_normal(tuple(out.shape)), dtype=out.dtype, device=device)
    out.backward_seeded(dout)
    for leaf in leaves:
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype
    return [bits(out)] + [bits(leaf.grad) for leaf in leaves], out


def assert_same_bits(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert np.array_equal(g, w), f"{['output', 'grad x', 'grad norm_weight'][i]} differs from the composition"


# ---------------------------------------------------------------- to_heads

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("norm", [None, "x", "float32"])  # norm_weight dtype: none, x's dtype, float32
@pytest.mark.parametrize("theta", [None, 10000.0, 500.0])
@pytest.mark.parametrize("shape", SHAPES)
def test_to_heads_matches_composition_bitwise(device, dtype, norm, theta, shape):
    B, S, H, D = shape
    g = rng(1)
    arrays = [g.standard_normal((B * S, H * D))]
    dtypes = [dtype]
    if norm is not None:
        arrays.append(1.0 + 0.3 * g.standard_normal(D))
        dtypes.append(dtype if norm == "x" else "float32")
    eps = 1e-5

    def fused(x, w=None):
        return ops.to_heads(x, S, H, norm_weight=w, eps=eps, rope_theta=theta)

    def composed(x, w=None):
        return composed_to_heads(x, S, H, w, eps, theta)

    got, out = run(fused, arrays, dtypes, device, seed=2)
    want, ref = run(composed, arrays, dtypes, device, seed=2)
    assert out.shape == ref.shape == (B, H, S, D) and out.dtype == ref.dtype == dtype
    assert_same_bits(got, want)


def test_to_heads_positional_arguments_and_defaults(device):
    """Defaults: no norm, no rope (a pure layout change); eps defaults to 1e-6 like rms_norm's."""
    g = rng(3)
    x = xtrain.tensor(g.standard_normal((10, 12)), device=device)
    w = xtrain.tensor(1.0 + g.standard_normal(4), device=device)
    assert np.array_equal(bits(ops.to_heads(x, 5, 3)), bits(composed_to_heads(x, 5, 3)))
    assert np.array_equal(bits(ops.to_heads(x, 5, 3, w)), bits(composed_to_heads(x, 5, 3, w, 1e-6)))
    assert np.array_equal(bits(ops.to_heads(x, 5, 3, w, 1e-6, 10000)),
                          bits(composed_to_heads(x, 5, 3, w, 1e-6, 10000.0)))


def test_to_heads_eps_is_used(device):
    x = xtrain.tensor(np.full((4, 8), 1e-3), device=device)
    w = xtrain.tensor(np.ones(4), device=device)
    a, b = ops.to_heads(x, 2, 2, w, eps=0.5), ops.to_heads(x, 2, 2, w, eps=1e-6)
    assert np.array_equal(bits(a), bits(composed_to_heads(x, 2, 2, w, 0.5)))
    assert not np.array_equal(bits(a), bits(b))


def test_to_heads_layout(device):
    """Element (b*S + s, h*D + d) of x lands at [b, h, s, d]."""
    B, S, H, D = 2, 3, 4, 5
    x_np = np.arange(B * S * H * D, dtype=np.float32).reshape(B * S, H * D)
    out = ops.to_heads(xtrain.tensor(x_np, device=device), S, H).numpy()
    for b, s, h, d in itertools.product(range(B), range(S), range(H), range(D)):
        assert out[b, h, s, d] == x_np[b * S + s, h * D + d]


def test_to_heads_grad_of_norm_weight_only(device):
    """x not requiring grad: only norm_weight gets a gradient, identical to the composition's."""
    g = rng(4)
    x = xtrain.tensor(g.standard_normal((6, 16)), device=device)
    w_np = 1.0 + 0.3 * g.standard_normal(8)
    results = []
    for fn in (ops.to_heads, composed_to_heads):
        w = xtrain.tensor(w_np, device=device, requires_grad=True)
        out = fn(x, 3, 2, w, 1e-6, 10000.0)
        out.backward_seeded(xtrain.tensor(rng(5).standard_normal(tuple(out.shape)), device=device))
        assert x.grad is None
        results.append((bits(out), bits(w.grad)))
    assert_same_bits(results[0], results[1])


def test_to_heads_empty_batch(device):
    x = xtrain.tensor(np.zeros((0, 8)), device=device, requires_grad=True)
    w = xtrain.tensor(np.ones(4), device=device, requires_grad=True)
    out = ops.to_heads(x, 3, 2, w, rope_theta=10000.0)
    assert out.shape == (0, 2, 3, 4)


# ---------------------------------------------------------------- from_heads

@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_from_heads_matches_composition_bitwise(device, dtype, shape):
    B, H, S, D = shape[0], shape[2], shape[1], shape[3]
    arrays = [rng(6).standard_normal((B, H, S, D))]
    got, out = run(ops.from_heads, arrays, [dtype], device, seed=7)
    want, ref = run(composed_from_heads, arrays, [dtype], device, seed=7)
    assert out.shape == ref.shape == (B * S, H * D) and out.dtype == dtype
    assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trips_are_identity(device, dtype, shape):
    B, S, H, D = shape
    g = rng(8)
    x = xtrain.tensor(g.standard_normal((B * S, H * D)), dtype=dtype, device=device, requires_grad=True)
    back = ops.from_heads(ops.to_heads(x, S, H))
    assert back.shape == x.shape
    assert np.array_equal(bits(back), bits(x))
    dy_np = g.standard_normal((B * S, H * D))
    back.backward_seeded(xtrain.tensor(dy_np, dtype=dtype, device=device))
    assert np.array_equal(bits(x.grad), bits(xtrain.tensor(dy_np, dtype=dtype)))
    y = xtrain.tensor(g.standard_normal((B, H, S, D)), dtype=dtype, device=device)
    assert np.array_equal(bits(ops.to_heads(ops.from_heads(y), S, H)), bits(y))


# ---------------------------------------------------------------- grad mode and recompute

def test_no_grad_records_nothing(device):
    x = xtrain.tensor(rng(9).standard_normal((6, 8)), device=device, requires_grad=True)
    w = xtrain.tensor(np.ones(4), device=device, requires_grad=True)
    y = xtrain.tensor(rng(10).standard_normal((2, 2, 3, 4)), device=device, requires_grad=True)
    with xtrain.no_grad():
        outs = [ops.to_heads(x, 3, 2), ops.to_heads(x, 3, 2, w, rope_theta=10000.0), ops.from_heads(y)]
    for out in outs:
        assert not out.requires_grad and out.grad_fn is None
    # Grad mode on but nothing requires grad: nothing recorded either.
    x0 = xtrain.tensor(rng(9).standard_normal((6, 8)), device=device)
    w0 = xtrain.tensor(np.ones(4), device=device)
    assert ops.to_heads(x0, 3, 2, w0, rope_theta=10000.0).grad_fn is None


def test_records_the_composition_nodes(device):
    x = xtrain.tensor(rng(11).standard_normal((6, 8)), device=device, requires_grad=True)
    w = xtrain.tensor(np.ones(4), device=device, requires_grad=True)
    assert ops.to_heads(x, 3, 2, w, rope_theta=10000.0).grad_fn == "PermuteBackward"
    assert ops.from_heads(ops.to_heads(x, 3, 2)).grad_fn == "ReshapeBackward"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_checkpoint_recompute_is_bitwise_exact(device, dtype):
    g = rng(12)
    x_np, w_np = g.standard_normal((10, 16)), 1.0 + 0.1 * g.standard_normal(4)

    def segment(x, params):
        q = ops.to_heads(x, 5, 4, params[0], rope_theta=10000.0)
        v = ops.to_heads(x, 5, 4)
        return ops.from_heads(ops.sdpa(q, q, v, causal=True))

    results = []
    for use_checkpoint in (False, True):
        x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=True)
        w = xtrain.tensor(w_np, dtype="float32", device=device, requires_grad=True)
        out = xtrain.checkpoint(segment, x, [w]) if use_checkpoint else segment(x, [w])
        out.backward_seeded(xtrain.tensor(rng(13).standard_normal((10, 16)), dtype=dtype, device=device))
        results.append([bits(out), bits(x.grad), bits(w.grad)])
    assert_same_bits(results[0], results[1])


# ---------------------------------------------------------------- bad inputs

def _t(shape, dtype="float32", device="cpu", **kw):
    return xtrain.tensor(np.zeros(shape), dtype=dtype, device=device, **kw)


def test_to_heads_bad_inputs(device):
    x = _t((6, 8), device=device)
    w = _t((4,), device=device)
    with pytest.raises(ValueError, match=r"x must be \[B\*S, H\*D\] \(2 dimensions\)"):
        ops.to_heads(_t((2, 3, 8), device=device), 3, 2)
    with pytest.raises(ValueError, match="2 dimensions"):
        ops.to_heads(_t((8,), device=device), 1, 2)
    with pytest.raises(ValueError, match="divisible by seq = 4"):
        ops.to_heads(x, 4, 2)
    with pytest.raises(ValueError, match="divisible by n_heads = 3"):
        ops.to_heads(x, 3, 3)
    with pytest.raises(ValueError, match="seq must be > 0"):
        ops.to_heads(x, 0, 2)
    with pytest.raises(ValueError, match="seq must be > 0"):
        ops.to_heads(x, -3, 2)
    with pytest.raises(ValueError, match="n_heads must be > 0"):
        ops.to_heads(x, 3, 0)
    with pytest.raises(ValueError, match="n_heads must be > 0"):
        ops.to_heads(x, 3, -2)
    # The norm weight, eps and theta reach rms_norm and rope, which check them (their messages).
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \[4\]"):
        ops.to_heads(x, 3, 2, _t((8,), device=device))
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \[4\]"):
        ops.to_heads(x, 3, 2, _t((1, 4), device=device))
    with pytest.raises(TypeError, match="rms_norm"):
        ops.to_heads(x, 3, 2, _t((4,), "int64", device))
    with pytest.raises(TypeError, match="rms_norm"):
        ops.to_heads(_t((6, 8), "bfloat16", device), 3, 2, _t((4,), "float64", device))
    with pytest.raises(ValueError, match="eps"):
        ops.to_heads(x, 3, 2, w, eps=-1.0)
    with pytest.raises(ValueError, match="eps"):
        ops.to_heads(x, 3, 2, w, eps=float("nan"))
    for theta in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rope: theta must be finite and > 0"):
            ops.to_heads(x, 3, 2, rope_theta=theta)
    with pytest.raises(ValueError, match="rope: the head dimension D must be even"):
        ops.to_heads(_t((6, 10), device=device), 3, 2, rope_theta=10000.0)
    with pytest.raises(ValueError, match="must be even"):
        ops.to_heads(_t((6, 10), device=device), 3, 2, _t((5,), device=device), rope_theta=10000.0)
    with pytest.raises(TypeError, match="x"):
        ops.to_heads(_t((6, 8), "int64", device), 3, 2)
    with pytest.raises(TypeError):
        ops.to_heads(None, 3, 2)
    with pytest.raises(TypeError):
        ops.to_heads(x, 1.5, 2)
    with pytest.raises(TypeError):
        ops.to_heads(x, 3, 2, norm_weight=np.ones(4))
    # Odd D without RoPE is fine (norm and layout only).
    assert ops.to_heads(_t((6, 10), device=device), 3, 2, _t((5,), device=device)).shape == (2, 2, 3, 5)


def test_from_heads_bad_inputs(device):
    for shape in ((2, 3, 4), (6, 8), (1, 2, 3, 4, 5), ()):
        with pytest.raises(ValueError, match=r"x must be \[B, H, S, D\] \(4 dimensions\)"):
            ops.from_heads(_t(shape, device=device))
    with pytest.raises(TypeError, match="x"):
        ops.from_heads(_t((1, 2, 3, 4), "int32", device))
    with pytest.raises(TypeError):
        ops.from_heads(None)
