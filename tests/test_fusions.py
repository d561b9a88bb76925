"""Fused ops of the training step, against PyTorch and against the unfused composition they replace:

- ops.linear_multi(x, [w0, w1, ...]): several linears of one input as batched GEMMs, the outputs
  views of one buffer (q/k/v, gate/up; Note [Merged projections] in csrc/ops/matmul.cpp).
- ops.add_rms_norm(x, r, w): (h = x + r, rms_norm(h)) in one kernel, bitwise add + rms_norm.
- ops.rms_norm_linear_multi(x, ws, w, eps, residual): add_rms_norm (rms_norm) then linear_multi,
  bitwise, without keeping the normed input (Note [Normed input recomputed for the projections]).
- ops.swiglu_linear(gate, up, w): linear(swiglu(gate, up), w), bitwise, without keeping the hidden
  (backward recomputes it; Note [SwiGLU recomputed for the down projection] in csrc/ops/matmul.cpp).
- rms_norm's one-pass weight gradient (CUDA), deterministic run to run.

Every test runs on each device of the `device` fixture (CUDA on the GPU machine).
"""
import gc

import numpy as np
import pytest
import torch

import xtrain
from xtrain import ops
from ophelp import assert_close, bits, finite_difference_check, make_inputs, to_numpy64

FLOATS = ["float32", "bfloat16"]


def _seed_like(t, rng, device):
    return xtrain.tensor(rng.standard_normal(tuple(t.shape)), dtype=t.dtype, device=device)


def _loss_backward(outs, seeds):
    """One backward walk from several outputs, each with its upstream gradient."""
    xtrain._C.backward_many(list(outs), list(seeds))


# ---------------------------------------------------------------- linear_multi

SHAPES = [
    # (leading dims of x, K, [N_i])
    ((6,), 5, [4, 4, 4]),          # MHA-like: one run of three
    ((2, 3), 8, [8, 4, 4]),        # GQA-like: q, then a run of two
    ((7,), 3, [5, 2]),             # gate/up-like with different widths: two runs
    ((1,), 16, [16]),              # a single weight
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("lead,K,Ns", SHAPES)
def test_linear_multi_matches_torch(device, dtype, lead, K, Ns):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(lead + (K,))] + [rng.standard_normal((n, K)) for n in Ns]
    xs, ts = make_inputs(arrays, dtype, device)
    outs = ops.linear_multi(xs[0], xs[1:])
    refs = [torch.nn.functional.linear(ts[0], w) for w in ts[1:]]
    assert len(outs) == len(Ns)
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert tuple(o.shape) == lead + (Ns[i],) and o.dtype == dtype
        assert_close(to_numpy64(o), r.detach().double().cpu().numpy(), dtype, f"output {i}", max(1, K / 8))
    seeds = [_seed_like(o, rng, device) for o in outs]
    _loss_backward(outs, seeds)
    tseeds = [torch.tensor(to_numpy64(s), dtype=r.dtype, device=r.device) for s, r in zip(seeds, refs)]
    grads = torch.autograd.grad(refs, ts, tseeds)
    for i, (x, g) in enumerate(zip(xs, grads)):
        assert x.grad is not None and x.grad.dtype == dtype and tuple(x.grad.shape) == tuple(x.shape)
        assert_close(to_numpy64(x.grad), g.double().cpu().numpy(), dtype, f"grad {i}", max(1, max(K, sum(Ns)) / 8))


def test_linear_multi_finite_differences():
    rng = np.random.default_rng(2)
    fn = lambda x, a, b, c: _qk_plus_v(ops.linear_multi(x, [a, b, c]))  # noqa: E731
    finite_difference_check(fn, [rng.standard_normal((3, 4))] + [rng.standard_normal((2, 4)) for _ in range(3)])
    # two runs of different shapes
    finite_difference_check(lambda x, a, b: _first_times_rowsum(ops.linear_multi(x, [a, b])),
                            [rng.standard_normal((3, 4)), rng.standard_normal((2, 4)), rng.standard_normal((5, 4))])


def _qk_plus_v(outs):
    q, k, v = outs
    return ops.add(ops.mul(q, k), v)


def _first_times_rowsum(outs):
    a, b = outs                                              # (3, 2), (3, 5)
    return ops.mul(a, ops.mul(ops.sum(ops.mul(b, b)), a))


@pytest.mark.parametrize("dtype", FLOATS)
def test_linear_multi_forward_and_weight_grads_bitwise_separate_linears_cpu(dtype):
    """On the CPU every batch entry is one BLAS call: outputs and weight gradients are bitwise those
    of separate linears; dx accumulates in the GEMMs (one rounding per step), within tolerance."""
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((10, 12))] + [rng.standard_normal((6, 12)) for _ in range(3)]
    xs, _ = make_inputs(arrays, dtype, "cpu")
    xs2, _ = make_inputs(arrays, dtype, "cpu")
    outs = ops.linear_multi(xs[0], xs[1:])
    outs2 = [ops.linear(xs2[0], w) for w in xs2[1:]]
    seeds = [_seed_like(o, rng, "cpu") for o in outs]
    for o, o2 in zip(outs, outs2):
        assert np.array_equal(bits(o), bits(o2))
    _loss_backward(outs, seeds)
    _loss_backward(outs2, seeds)
    for w, w2 in zip(xs[1:], xs2[1:]):
        assert np.array_equal(bits(w.grad), bits(w2.grad))
    assert_close(to_numpy64(xs[0].grad), to_numpy64(xs2[0].grad), dtype, "dx")


@pytest.mark.parametrize("dtype", FLOATS)
def test_linear_multi_same_bits_for_packed_and_store_like_weights(device, dtype):
    """Weights at a uniform distance in one buffer (as the parameter store lays them out, gaps
    included) and the same weights as separate tensors (packed by the op) give the same bits."""
    rng = np.random.default_rng(4)
    K, N, gap = 24, 16, 40
    flat = np.zeros(3 * (N * K + gap))
    ws = [rng.standard_normal((N, K)) for _ in range(3)]
    for i, w in enumerate(ws):
        flat[i * (N * K + gap):i * (N * K + gap) + N * K] = w.reshape(-1)
    x_np = rng.standard_normal((32, K))
    buf = xtrain.tensor(flat, dtype=dtype, device=device)
    views = [buf._storage_view(i * (N * K + gap), (N, K)) for i in range(3)]
    sep = [xtrain.tensor(w, dtype=dtype, device=device) for w in ws]
    results = []
    for weights in (views, sep):
        leaves = [w.detach() for w in weights]
        for w in leaves:
            w.requires_grad = True
        x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=True)
        outs = ops.linear_multi(x, leaves)
        seeds = [xtrain.tensor(np.full(tuple(o.shape), 0.5 + i), dtype=dtype, device=device)
                 for i, o in enumerate(outs)]
        _loss_backward(outs, seeds)
        results.append([bits(o) for o in outs] + [bits(x.grad)] + [bits(w.grad) for w in leaves])
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_linear_multi_partial_use_and_no_grad_inputs(device):
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal((5, 6))] + [rng.standard_normal((3, 6)) for _ in range(3)]
    xs, ts = make_inputs(arrays, "float32", device)
    q, k, v = ops.linear_multi(xs[0], xs[1:])
    ops.sum(ops.mul(q, v)).backward()                       # k unused
    tq, tk, tv = [torch.nn.functional.linear(ts[0], w) for w in ts[1:]]
    (tq * tv).sum().backward()
    for i in (0, 1, 3):
        assert_close(to_numpy64(xs[i].grad), ts[i].grad.double().cpu().numpy(), "float32", f"grad {i}")
    assert xs[2].grad is None                               # no gradient reached k
    # x without grad: weights only; weights without grad: x only
    x = xtrain.tensor(arrays[0], device=device)
    w = [xtrain.tensor(a, device=device, requires_grad=True) for a in arrays[1:]]
    ops.sum(ops.linear_multi(x, w)[1]).backward()
    assert w[1].grad is not None and w[0].grad is None and x.grad is None
    x = xtrain.tensor(arrays[0], device=device, requires_grad=True)
    w = [xtrain.tensor(a, device=device) for a in arrays[1:]]
    ops.sum(ops.linear_multi(x, w)[2]).backward()
    assert_close(to_numpy64(x.grad), np.ones((5, 3)) @ arrays[3], "float32", "dx")


def test_linear_multi_zero_rows(device):
    x = xtrain.zeros((0, 4), device=device)
    x.requires_grad = True
    ws = [xtrain.ones((3, 4), device=device) for _ in range(2)]
    for w in ws:
        w.requires_grad = True
    outs = ops.linear_multi(x, ws)
    assert [tuple(o.shape) for o in outs] == [(0, 3), (0, 3)]
    ops.add(ops.sum(outs[0]), ops.sum(outs[1])).backward()
    for w in ws:
        assert np.all(w.grad.numpy() == 0)


def test_linear_multi_bad_inputs(device):
    x = xtrain.zeros((2, 4), device=device)
    with pytest.raises(ValueError, match="at least one"):
        ops.linear_multi(x, [])
    with pytest.raises(ValueError, match="in_features"):
        ops.linear_multi(x, [xtrain.zeros((3, 4), device=device), xtrain.zeros((3, 5), device=device)])
    with pytest.raises(TypeError, match="dtype"):
        ops.linear_multi(x, [xtrain.zeros((3, 4), dtype="float64", device=device)])
    with pytest.raises(ValueError, match=r"\[out, in\]"):
        ops.linear_multi(x, [xtrain.zeros((4,), device=device)])


# ---------------------------------------------------------------- add_rms_norm

def _ref_add_rms_norm(x, r, w, eps):
    h = x + r
    return h, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 37), (5, 768), (3, 2048), (1, 1)])
def test_add_rms_norm_matches_torch(device, dtype, shape):
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape[-1])]
    xs, ts = make_inputs(arrays, dtype, device)
    xs[2] = xtrain.tensor(arrays[2], dtype="float32", device=device, requires_grad=True)  # the model's weight
    h, y = ops.add_rms_norm(xs[0], xs[1], xs[2], 1e-6)
    th, ty = _ref_add_rms_norm(*ts, 1e-6)
    assert_close(to_numpy64(h), th.detach().double().cpu().numpy(), dtype, "h")
    assert_close(to_numpy64(y), ty.detach().double().cpu().numpy(), dtype, "y", 2)
    seeds = [_seed_like(h, rng, device), _seed_like(y, rng, device)]
    _loss_backward([h, y], seeds)
    tseeds = [torch.tensor(to_numpy64(s), dtype=t.dtype, device=t.device) for s, t in zip(seeds, (th, ty))]
    grads = torch.autograd.grad([th, ty], ts, tseeds)
    scale = np.sqrt(shape[-1])
    for i, (x, g) in enumerate(zip(xs, grads)):
        assert x.grad is not None
        assert_close(to_numpy64(x.grad), g.double().cpu().numpy(), dtype, f"grad {i}", 2 if i < 2 else scale)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("use_h", [True, False])
@pytest.mark.parametrize("shape", [(6, 40), (9, 768), (3, 2048), (200, 768), (150, 1024)])
def test_add_rms_norm_bitwise_equals_add_then_rms_norm(device, dtype, use_h, shape):
    """The fused op gives the bits of add + rms_norm: h, y, and the gradients of x, r and w, with
    h's own gradient added (use_h) or not."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(shape), rng.standard_normal(shape)]
    w_np = rng.standard_normal(shape[-1])
    seeds_np = [rng.standard_normal(shape), rng.standard_normal(shape)]
    results = []
    for fused in (True, False):
        xs, _ = make_inputs(arrays, dtype, device)
        w = xtrain.tensor(w_np, dtype="float32", device=device, requires_grad=True)
        if fused:
            h, y = ops.add_rms_norm(xs[0], xs[1], w, 1e-6)
        else:
            h = ops.add(xs[0], xs[1])
            y = ops.rms_norm(h, w, 1e-6)
        seeds = [xtrain.tensor(s, dtype=dtype, device=device) for s in seeds_np]
        # the model's pattern: h flows on (h + f(y)), y feeds the next layer
        out = ops.add(h, ops.mul(y, seeds[1])) if use_h else ops.mul(y, seeds[1])
        out.backward_seeded(seeds[0])
        results.append([bits(h), bits(y), bits(xs[0].grad), bits(xs[1].grad), bits(w.grad)])
    for name, a, b in zip(["h", "y", "dx", "dr", "dw"], *results):
        assert np.array_equal(a, b), name


def test_add_rms_norm_finite_differences():
    rng = np.random.default_rng(8)
    finite_difference_check(_fd_add_rms_norm,
                            [rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), rng.standard_normal(5)])


def _fd_add_rms_norm(x, r, w):
    h, y = ops.add_rms_norm(x, r, w, 1e-5)
    return ops.add(ops.mul(h, h), y)   # both outputs reach the result


def test_add_rms_norm_bad_inputs(device):
    x = xtrain.zeros((3, 4), device=device)
    w = xtrain.ones((4,), device=device)
    with pytest.raises(ValueError, match="residual must match"):
        ops.add_rms_norm(x, xtrain.zeros((3, 5), device=device), w)
    with pytest.raises(ValueError, match="residual must match"):
        ops.add_rms_norm(x, xtrain.zeros((3, 4), dtype="bfloat16", device=device), w)
    with pytest.raises(ValueError, match="weight must have shape"):
        ops.add_rms_norm(x, x, xtrain.ones((5,), device=device))
    with pytest.raises(ValueError, match="eps"):
        ops.add_rms_norm(x, x, w, float("nan"))


# ---------------------------------------------------------------- rms_norm_linear_multi

def _norm_projections(fused, x, r, w, ws, eps=1e-6):
    """(h, ys) by the fused op or by the composition it replaces (r None: no residual add)."""
    if fused:
        return ops.rms_norm_linear_multi(x, ws, w, eps, residual=r)
    if r is None:
        return x, ops.linear_multi(ops.rms_norm(x, w, eps), ws)
    h, y = ops.add_rms_norm(x, r, w, eps)
    return h, ops.linear_multi(y, ws)


@pytest.mark.parametrize("dtype,w_dtype", [("float32", "float32"), ("bfloat16", "float32"), ("float64", "float64")])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("use", ["h and ys", "ys", "h", "one y"])
# the last: qwen3-1.7b's dim over enough rows for CUDA's wide bf16 norm kernels (Note [Wide RMSNorm forward])
@pytest.mark.parametrize("lead,K,Ns", [((6,), 8, [8, 4, 4]), ((2, 3), 16, [24, 24]), ((0,), 4, [4]),
                                       ((300,), 2048, [64, 64])])
def test_rms_norm_linear_multi_bitwise_equals_the_composition(device, dtype, w_dtype, residual, use, lead, K, Ns):
    """h, every projection and every gradient (x, residual, the norm weight, each weight) bitwise
    those of add_rms_norm (rms_norm) then linear_multi, whichever outputs the loss reads."""
    if dtype == "float64" and device != "cpu":
        pytest.skip("float64 is a CPU dtype (gradient checks)")
    if use == "h" and not residual:
        pytest.skip("without a residual h is x itself")
    rng = np.random.default_rng(14)
    x_np, r_np, w_np = rng.standard_normal(lead + (K,)), rng.standard_normal(lead + (K,)), rng.standard_normal(K)
    ws_np = [rng.standard_normal((n, K)) for n in Ns]
    seeds_np = [rng.standard_normal(lead + (n,)) for n in Ns] + [rng.standard_normal(lead + (K,))]
    results = []
    for fused in (True, False):
        x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=True)
        r = xtrain.tensor(r_np, dtype=dtype, device=device, requires_grad=True) if residual else None
        w = xtrain.tensor(w_np, dtype=w_dtype, device=device, requires_grad=True)
        ws = [xtrain.tensor(a, dtype=dtype, device=device, requires_grad=True) for a in ws_np]
        h, ys = _norm_projections(fused, x, r, w, ws)
        seeds = [xtrain.tensor(a, dtype=dtype, device=device) for a in seeds_np]
        outs = {"h and ys": list(ys) + [h], "ys": list(ys), "h": [h], "one y": [ys[-1]]}[use]
        outs_seeds = {"h and ys": seeds, "ys": seeds[:-1], "h": seeds[-1:], "one y": [seeds[len(Ns) - 1]]}[use]
        if use == "h":  # h alone: through a product, so the seed is not h's whole gradient
            outs = [ops.mul(h, h)]
        _loss_backward(outs, outs_seeds)
        leaves = [x, w] + ws + ([r] if residual else [])
        results.append([bits(h)] + [bits(y) for y in ys] + [None if t.grad is None else bits(t.grad) for t in leaves])
    for i, (a, b) in enumerate(zip(*results)):
        assert (a is None) == (b is None), i
        assert a is None or np.array_equal(a, b), i


def test_rms_norm_linear_multi_finite_differences():
    rng = np.random.default_rng(15)

    def fn(x, r, w, a, b):
        h, (p, q) = ops.rms_norm_linear_multi(x, [a, b], w, 1e-5, residual=r)
        return ops.add(ops.sum(ops.mul(p, q)), ops.sum(ops.mul(h, h)))

    finite_difference_check(fn, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4)), rng.standard_normal(4),
                                 rng.standard_normal((5, 4)), rng.standard_normal((5, 4))])


def test_rms_norm_linear_multi_keeps_no_normed_input():
    """Kept for backward (the CPU allocator's count): the composition keeps the normed input as
    well as h; the fused op keeps h and the rstd rows only."""
    rows, K = 64, 32
    rng = np.random.default_rng(16)
    x, r = (xtrain.tensor(rng.standard_normal((rows, K)), dtype="float32", requires_grad=True) for _ in range(2))
    w = xtrain.tensor(rng.standard_normal(K), dtype="float32", requires_grad=True)
    ws = [xtrain.tensor(rng.standard_normal((K, K)), dtype="float32", requires_grad=True) for _ in range(2)]
    held = {}
    gc.collect()
    for fused in (True, False):
        before = xtrain.memory_stats("cpu")["requested_bytes.current"]
        outs = _norm_projections(fused, x, r, w, ws)
        held[fused] = xtrain.memory_stats("cpu")["requested_bytes.current"] - before
        del outs
    assert held[False] - held[True] == rows * K * 4


def test_rms_norm_linear_multi_bad_inputs(device):
    x = xtrain.zeros((3, 4), device=device)
    w, ws = xtrain.ones((4,), device=device), [xtrain.zeros((2, 4), device=device)]
    with pytest.raises(ValueError, match="residual must match"):
        ops.rms_norm_linear_multi(x, ws, w, residual=xtrain.zeros((3, 5), device=device))
    with pytest.raises(ValueError, match="weight must have shape"):
        ops.rms_norm_linear_multi(x, ws, xtrain.ones((5,), device=device))
    with pytest.raises(ValueError, match="eps"):
        ops.rms_norm_linear_multi(x, ws, w, float("nan"))
    with pytest.raises(ValueError):
        ops.rms_norm_linear_multi(x, [xtrain.zeros((2, 5), device=device)], w)
    with pytest.raises(ValueError):
        ops.rms_norm_linear_multi(x, [], w)


# ---------------------------------------------------------------- swiglu_linear

@pytest.mark.parametrize("dtype", FLOATS + ["float64"])
@pytest.mark.parametrize("wants", ["all", "weight only", "inputs only"])
@pytest.mark.parametrize("shape", [(5, 12, 7), (2, 3, 16, 8), (0, 6, 4)])
def test_swiglu_linear_bitwise_equals_swiglu_then_linear(device, dtype, wants, shape):
    """Forward and every gradient bitwise those of ops.swiglu then ops.linear, on every device:
    backward recomputes the hidden with the same kernel and runs the composition's GEMMs."""
    if dtype == "float64" and device != "cpu":
        pytest.skip("float64 is a CPU dtype (gradient checks)")
    *lead, K, N = shape
    rng = np.random.default_rng(11)
    gate_np, up_np = rng.standard_normal((*lead, K)), rng.standard_normal((*lead, K))
    w_np, seed_np = rng.standard_normal((N, K)), rng.standard_normal((*lead, N))
    results = []
    for fused in (True, False):
        gate, up = (xtrain.tensor(a, dtype=dtype, device=device, requires_grad=wants != "weight only")
                    for a in (gate_np, up_np))
        w = xtrain.tensor(w_np, dtype=dtype, device=device, requires_grad=wants != "inputs only")
        y = ops.swiglu_linear(gate, up, w) if fused else ops.linear(ops.swiglu(gate, up), w)
        y.backward_seeded(xtrain.tensor(seed_np, dtype=dtype, device=device))
        results.append([bits(y)] + [bits(t.grad) if t.grad is not None else None for t in (gate, up, w)])
    for name, a, b in zip(["y", "dgate", "dup", "dw"], *results):
        assert (a is None) == (b is None), name
        assert a is None or np.array_equal(a, b), name
    assert (results[0][3] is None) == (wants == "inputs only")
    assert (results[0][1] is None) == (wants == "weight only")


def test_swiglu_linear_finite_differences():
    rng = np.random.default_rng(12)
    finite_difference_check(lambda g, u, w: ops.swiglu_linear(g, u, w),
                            [rng.standard_normal((4, 6)), rng.standard_normal((4, 6)), rng.standard_normal((3, 6))])


def test_swiglu_linear_keeps_no_hidden():
    """What the node keeps between forward and backward: gate and up (the caller's) and nothing of
    (rows, K) more, where swiglu then linear keeps the hidden too (the CPU allocator's count)."""
    rows, K, N = 256, 64, 32
    rng = np.random.default_rng(13)
    gate, up = (xtrain.tensor(rng.standard_normal((rows, K)), dtype="float32", requires_grad=True) for _ in range(2))
    w = xtrain.tensor(rng.standard_normal((N, K)), dtype="float32", requires_grad=True)
    held = {}
    gc.collect()
    for fused in (True, False):
        before = xtrain.memory_stats("cpu")["requested_bytes.current"]
        y = ops.swiglu_linear(gate, up, w) if fused else ops.linear(ops.swiglu(gate, up), w)
        held[fused] = xtrain.memory_stats("cpu")["requested_bytes.current"] - before - rows * N * 4  # less y
        del y
    assert held[True] == 0
    assert held[False] == rows * K * 4


def test_swiglu_linear_bad_inputs(device):
    g = xtrain.zeros((3, 4), device=device)
    with pytest.raises(ValueError, match="in_features"):
        ops.swiglu_linear(g, g, xtrain.zeros((2, 5), device=device))
    with pytest.raises(ValueError, match="in_features"):
        ops.swiglu_linear(g, g, xtrain.zeros((4,), device=device))
    with pytest.raises(ValueError, match="same shape"):
        ops.swiglu_linear(g, xtrain.zeros((3, 5), device=device), xtrain.zeros((2, 4), device=device))
    with pytest.raises(TypeError, match="up"):
        ops.swiglu_linear(g, xtrain.zeros((3, 4), dtype="bfloat16", device=device), xtrain.zeros((2, 4), device=device))
    with pytest.raises(TypeError, match="weight"):
        ops.swiglu_linear(g, g, xtrain.zeros((2, 4), dtype="bfloat16", device=device))


@pytest.mark.parametrize("dtype,w_dtype", [("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"),
                                           ("float64", "float64")])
@pytest.mark.parametrize("dim", [768, 37, 4096])
def test_few_rows_bitwise_equal_rows_of_a_large_batch(device, dtype, w_dtype, dim):
    """A few rows (a decode step; on CUDA a block per row, Note [Few rows: a block per row]) give
    the bits those rows get inside a batch too large for that path (G lanes per row), for rms_norm
    and add_rms_norm's h and y."""
    rng = np.random.default_rng(11)
    n = 300  # above the few-row limit (128 rows)
    x_np, r_np, w_np = rng.standard_normal((n, dim)), rng.standard_normal((n, dim)), rng.standard_normal(dim)
    w = xtrain.tensor(w_np, dtype=w_dtype, device=device)

    def run(rows):
        x = xtrain.tensor(x_np[rows], dtype=dtype, device=device)
        r = xtrain.tensor(r_np[rows], dtype=dtype, device=device)
        with xtrain.no_grad():
            h, y = ops.add_rms_norm(x, r, w, 1e-6)
            z = ops.rms_norm(x, w, 1e-6)
        return bits(h), bits(y), bits(z)

    full = run(slice(0, n))
    row_bytes = [len(a) // n for a in full]
    for lo, hi in [(0, 1), (5, 8), (100, 116), (3, 131)]:
        few = run(slice(lo, hi))
        for name, a, b, rb in zip(["h", "y", "rms_norm y"], few, full, row_bytes):
            assert np.array_equal(a, b[lo * rb:hi * rb]), f"{name}, rows {lo}:{hi}"


# ---------------------------------------------------------------- rms_norm one-pass weight gradient

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("rows,dim", [(1, 768), (33, 768), (8192, 64), (3000, 1536), (700, 2000), (257, 7),
                                      (300, 1024), (2100, 2048)])
def test_rms_norm_weight_grad_matches_torch_and_repeats(device, dtype, rows, dim):
    """Shapes around the one-pass plan's limits (one block, many blocks, rows that do not fill the
    last block, the widest row it takes, a row too wide for it; bf16 1024 and 2048, the wide
    backward's long rows): dw against torch, and bitwise the same in a second run."""
    rng = np.random.default_rng(9)
    x_np, dy_np, w_np = rng.standard_normal((rows, dim)), rng.standard_normal((rows, dim)), rng.standard_normal(dim)
    runs = []
    for _ in range(2):
        x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=True)
        w = xtrain.tensor(w_np, dtype="float32", device=device, requires_grad=True)
        ops.rms_norm(x, w, 1e-6).backward_seeded(xtrain.tensor(dy_np, dtype=dtype, device=device))
        runs.append((x.grad, w.grad))
    assert np.array_equal(bits(runs[0][0]), bits(runs[1][0]))
    assert np.array_equal(bits(runs[0][1]), bits(runs[1][1]))
    xt = torch.tensor(to_numpy64(xtrain.tensor(x_np, dtype=dtype)), dtype=torch.float64)
    dyt = torch.tensor(to_numpy64(xtrain.tensor(dy_np, dtype=dtype)), dtype=torch.float64)
    xhat = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-6)
    dw_ref = (dyt * xhat).sum(0).numpy()
    assert_close(to_numpy64(runs[0][1]), dw_ref, "float32" if dtype == "float32" else "bfloat16",
                 "dw", np.sqrt(rows) * (1 if dtype == "float32" else 0.1))
