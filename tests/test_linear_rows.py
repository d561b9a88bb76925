"""ops.linear_rows(x, [w0, w1, ...]): the decode step's matrix-vector products (x [M, K], 1 <= M
<= 8), against numpy in float64 with the project's tolerance table, deterministic call to call,
the CPU kernel bitwise against a numpy replay of its summation order, the outputs laid out as
linear_multi's, bad inputs, and the decode step's switch (decode.DECODE_GEMV_MAX_ROWS).
ops.rms_norm_linear_rows (the residual add and norm fused into the products, with swiglu for
the MLP) bitwise its composition add_rms_norm / rms_norm, linear_rows, swiglu, and its checks.
The CUDA kernels also run under the warp emulator: tests/emu/run.sh linear_rows.
Every op test runs on each device of the `device` fixture (CUDA on the GPU machine)."""
import numpy as np
import pytest

import xtrain
from modelhelp import make_model, small_config
from ophelp import assert_close, bits, to_numpy64
from xtrain import ops
from xtrain.models import decode

DTYPES = ["float32", "bfloat16", "float64"]
# (M, K, Ns): batch 1 q/k/v-like, all rows, K not a multiple of the 16-byte chunk (bf16: 8
# elements, float32: 4, float64: 2), an empty weight, more weights than one CUDA launch takes (8).
CASES = [
    (1, 64, [32, 16, 16]),
    (8, 48, [40]),
    (3, 100, [7, 9]),
    (5, 13, [3, 0, 4]),
    (2, 1, [5]),
    (4, 24, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]),
    (1, 520, [33, 33]),
]


def _inputs(M, K, Ns, dtype, device, seed=0):
    rng = np.random.default_rng(seed)
    x = xtrain.tensor(rng.standard_normal((M, K)), dtype=dtype, device=device)
    ws = [xtrain.tensor(rng.standard_normal((n, K)) / np.sqrt(max(K, 1)), dtype=dtype, device=device) for n in Ns]
    return x, ws


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, K, Ns", CASES)
def test_matches_numpy(device, dtype, M, K, Ns):
    x, ws = _inputs(M, K, Ns, dtype, device)
    with xtrain.no_grad():
        outs = ops.linear_rows(x, ws)
    assert len(outs) == len(Ns)
    for i, (w, y) in enumerate(zip(ws, outs)):
        assert tuple(y.shape) == (M, Ns[i]) and y.dtype == dtype
        assert_close(to_numpy64(y), to_numpy64(x) @ to_numpy64(w).T, dtype, f"weight {i}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic_and_laid_out_as_linear_multi(device, dtype):
    x, ws = _inputs(3, 200, [24, 8, 8], dtype, device, seed=1)
    a = ops.linear_rows(x, ws)
    b = ops.linear_rows(x, ws)
    ref = ops.linear_multi(x, ws)
    for ya, yb, yr in zip(a, b, ref):
        assert np.array_equal(bits(ya), bits(yb))
        assert tuple(ya.shape) == tuple(yr.shape)
        assert_close(to_numpy64(ya), to_numpy64(yr), dtype, "linear_multi")
    # one buffer, block after block, as linear_multi's outputs
    size = {"float32": 4, "bfloat16": 2, "float64": 8}[dtype]
    for prev, nxt in zip(a, a[1:]):
        assert nxt.data_ptr() - prev.data_ptr() == prev.shape[0] * prev.shape[1] * size


def _bf16_round(a32):
    """float32 -> the nearest bfloat16 (ties to even), as float32."""
    u = np.ascontiguousarray(a32, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_kernel_is_its_summation_order_bitwise(dtype):
    """The CPU kernel adds x[m, k] * w[n, k] in increasing k into one float32 (float64) sum and
    rounds once: replayed in numpy, the bits agree."""
    M, K, Ns = 3, 37, [5, 4]
    x, ws = _inputs(M, K, Ns, dtype, "cpu", seed=2)
    outs = ops.linear_rows(x, ws)
    ct = np.float64 if dtype == "float64" else np.float32
    xa = np.asarray(x.numpy(), ct)
    for w, y in zip(ws, outs):
        wa = np.asarray(w.numpy(), ct)
        acc = np.zeros((M, wa.shape[0]), ct)
        for k in range(K):
            acc = (acc + (xa[:, k, None] * wa[None, :, k]).astype(ct)).astype(ct)
        want = _bf16_round(acc) if dtype == "bfloat16" else acc
        assert np.array_equal(np.asarray(y.numpy(), ct).view(np.uint8), want.view(np.uint8))


def test_zero_k_gives_zeros(device):
    x, ws = _inputs(2, 0, [3, 2], "float32", device)
    for y in ops.linear_rows(x, ws):
        assert np.array_equal(y.numpy(), np.zeros(tuple(y.shape), np.float32))


def test_bad_inputs(device):
    x, ws = _inputs(2, 8, [3], "float32", device)
    with pytest.raises(ValueError, match="at least one weight"):
        ops.linear_rows(x, [])
    with pytest.raises(ValueError, match="1 to 8 rows"):
        ops.linear_rows(xtrain.zeros((9, 8), device=device), ws)
    with pytest.raises(ValueError, match="1 to 8 rows"):
        ops.linear_rows(xtrain.zeros((0, 8), device=device), ws)
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        ops.linear_rows(xtrain.zeros((1, 2, 8), device=device), ws)
    with pytest.raises(ValueError, match="in_features"):
        ops.linear_rows(x, [xtrain.zeros((3, 7), device=device)])
    with pytest.raises(ValueError, match=r"\[out, in\]"):
        ops.linear_rows(x, [xtrain.zeros((3, 2, 4), device=device)])
    with pytest.raises(TypeError, match="x's dtype"):
        ops.linear_rows(x, [xtrain.zeros((3, 8), dtype="float64", device=device)])
    with pytest.raises(TypeError):
        ops.linear_rows(xtrain.tensor(np.zeros((2, 8), np.int64), device=device), ws)


def test_refuses_inputs_that_require_grad(device):
    x, ws = _inputs(2, 8, [3], "float32", device)
    w = xtrain.tensor(np.ones((3, 8)), dtype="float32", device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        ops.linear_rows(x, [w])
    with xtrain.no_grad():
        (y,) = ops.linear_rows(x, [w])
    assert not y.requires_grad
    np.testing.assert_allclose(y.numpy(), x.numpy().sum(axis=1, keepdims=True).repeat(3, 1), rtol=1e-6)


# ---------------------------------------------------------------- rms_norm_linear_rows

def _composed(x, ws, nw, eps, residual, swiglu):
    if residual is None:
        h, y = x, ops.rms_norm(x, nw, eps)
    else:
        h, y = ops.add_rms_norm(x, residual, nw, eps)
    outs = ops.linear_rows(y, ws)
    return h, [ops.swiglu(*outs)] if swiglu else outs


# (M, K, Ns, residual, swiglu): the decode step's three uses (q/k/v, gate/up, the head), K not a
# multiple of the chunk, short rows (fewer lanes per row in the norm's sum), every M.
NORM_CASES = [
    (1, 96, [64, 16, 16], True, False),
    (1, 96, [40, 40], True, True),
    (1, 96, [50], False, False),
    (8, 100, [24, 24], True, True),
    (3, 13, [7, 2], True, False),
    (5, 40, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3], False, False),
]


@pytest.mark.parametrize("dtype, w_dtype", [("float32", "float32"), ("bfloat16", "float32"),
                                            ("bfloat16", "bfloat16"), ("float64", "float64")])
@pytest.mark.parametrize("M, K, Ns, residual, swiglu", NORM_CASES)
def test_norm_linear_rows_bitwise_its_composition(device, dtype, w_dtype, M, K, Ns, residual, swiglu):
    rng = np.random.default_rng(M * 100 + K)
    x, ws = _inputs(M, K, Ns, dtype, device, seed=K)
    res = xtrain.tensor(rng.standard_normal((M, K)), dtype=dtype, device=device) if residual else None
    nw = xtrain.tensor(1 + 0.1 * rng.standard_normal(K), dtype=w_dtype, device=device)
    with xtrain.no_grad():
        h, outs = ops.rms_norm_linear_rows(x, ws, nw, 1e-5, residual=res, swiglu=swiglu)
        h_ref, ref = _composed(x, ws, nw, 1e-5, res, swiglu)
    assert len(outs) == len(ref)
    assert np.array_equal(bits(h), bits(h_ref))
    for y, r in zip(outs, ref):
        assert tuple(y.shape) == tuple(r.shape) and y.dtype == dtype
        assert np.array_equal(bits(y), bits(r))
    if not residual:
        assert h.data_ptr() == x.data_ptr()
    if not swiglu:  # one buffer, block after block, as linear_rows' outputs
        size = {"float32": 4, "bfloat16": 2, "float64": 8}[dtype]
        for prev, nxt in zip(outs, outs[1:]):
            assert nxt.data_ptr() - prev.data_ptr() == prev.shape[0] * prev.shape[1] * size


def test_norm_linear_rows_bad_inputs(device):
    x, ws = _inputs(2, 8, [3, 3], "float32", device)
    nw = xtrain.ones((8,), device=device)
    with pytest.raises(ValueError, match="at least one weight"):
        ops.rms_norm_linear_rows(x, [], nw)
    with pytest.raises(ValueError, match="1 to 8 rows"):
        ops.rms_norm_linear_rows(xtrain.zeros((9, 8), device=device), ws, nw)
    with pytest.raises(ValueError, match="in_features"):
        ops.rms_norm_linear_rows(x, [xtrain.zeros((3, 7), device=device)], nw)
    with pytest.raises(ValueError, match=r"norm_weight must have shape \[8\]"):
        ops.rms_norm_linear_rows(x, ws, xtrain.ones((7,), device=device))
    with pytest.raises(TypeError, match="float32 or x's dtype"):
        ops.rms_norm_linear_rows(x, ws, xtrain.ones((8,), dtype="float64", device=device))
    with pytest.raises(ValueError, match="eps"):
        ops.rms_norm_linear_rows(x, ws, nw, eps=-1.0)
    with pytest.raises(ValueError, match="residual must match x"):
        ops.rms_norm_linear_rows(x, ws, nw, residual=xtrain.zeros((1, 8), device=device))
    with pytest.raises(ValueError, match="two weights of one shape"):
        ops.rms_norm_linear_rows(x, ws[:1], nw, swiglu=True)
    with pytest.raises(ValueError, match="two weights of one shape"):
        ops.rms_norm_linear_rows(x, [ws[0], xtrain.zeros((4, 8), device=device)], nw, swiglu=True)
    needs = xtrain.tensor(np.ones(8), dtype="float32", device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        ops.rms_norm_linear_rows(x, ws, needs)


# ---------------------------------------------------------------- the decode step's switch

def _count_linear_rows(monkeypatch):
    """Spies on the decode step's matrix-vector ops: the rows (x's shape) of each call."""
    calls = []
    real, real_norm = ops.linear_rows, ops.rms_norm_linear_rows

    def spy(x, weights):
        calls.append(tuple(x.shape))
        return real(x, weights)

    def spy_norm(x, weights, *args, **kwargs):
        calls.append(tuple(x.shape))
        return real_norm(x, weights, *args, **kwargs)

    monkeypatch.setattr(decode.ops, "linear_rows", spy)
    monkeypatch.setattr(decode.ops, "rms_norm_linear_rows", spy_norm)
    return calls


@pytest.mark.parametrize("options", [{}, {"n_kv_heads": 1, "tie_embeddings": True}])
def test_decode_switch_same_tokens_as_the_gemms(device, monkeypatch, options):
    """Greedy decode through the matrix-vector ops (batch <= DECODE_GEMV_MAX_ROWS) gives the tokens
    of the GEMM decode (the switch at 0), and each step's linears all go through them: per layer
    norm + q/k/v, o_proj, norm + gate/up + swiglu and down_proj, then norm + the head."""
    model = make_model(small_config(max_seq=48, n_heads=4, head_dim=8, **options), device, weights_seed=2)
    prompts = [[1, 2, 3], [5], [7, 8, 9, 10, 11]]
    calls = _count_linear_rows(monkeypatch)
    rows = model.generate(prompts, 10, greedy=True, cuda_graphs=False)
    steps = 9  # the prefill gives the first token; 9 decode steps the other 9
    assert len(calls) == steps * (4 * model.config.n_layers + 1)
    assert all(c[0] == len(prompts) for c in calls)
    monkeypatch.setattr(decode, "DECODE_GEMV_MAX_ROWS", 0)
    calls.clear()
    gemms = model.generate(prompts, 10, greedy=True, cuda_graphs=False)
    assert calls == []
    assert np.array_equal(rows, gemms)


def test_decode_switch_keeps_gemms_above_the_limit(device, monkeypatch):
    model = make_model(small_config(max_seq=48), device, weights_seed=2)
    prompts = [[i + 1, i + 2] for i in range(decode.DECODE_GEMV_MAX_ROWS + 1)]
    calls = _count_linear_rows(monkeypatch)
    model.generate(prompts, 3, greedy=True, cuda_graphs=False)
    assert calls == []
    calls.clear()
    model.generate(prompts[:-1], 3, greedy=True, cuda_graphs=False)
    assert len(calls) > 0
