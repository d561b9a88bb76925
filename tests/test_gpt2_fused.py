"""The biased linears with fused epilogues (ops.linear_bias, ops.gelu_mlp: csrc/ops/linear_bias.cpp;
ops.linear_multi_bias: csrc/ops/matmul.cpp) that GPT-2's q/k/v, attention projection and MLP run.

On the CPU (always): each op is the unfused composition (linear, add, gelu), bit for bit, values
and every gradient, in float32, bf16 and float64; against PyTorch; bad inputs. On a GPU (skipped
without one; the lead runs them on the H200): the cuBLASLt epilogues (bias, bias + GELU with the
pre-activation kept, GELU's derivative in the backward GEMM) against the unfused composition on
the same GPU within float32/bf16 rounding, two runs bitwise, the composition where cuBLASLt has no
algorithm (an aux ld that is not a multiple of 8, float64), capture in a CUDA graph, and the model
running the fused path (recompute on/off bitwise and graphs are test_gpt2.py's CUDA rows).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xtrain
from xtrain import ops
from ophelp import bits, check_op, to_numpy64

needs_gpu = pytest.mark.skipif(not xtrain.cuda.is_available(),
                               reason="needs a CUDA GPU (the lead runs these on the H200)")


def _arrays(rows, K, F_, N, seed=0):
    g = np.random.default_rng(seed)
    return [g.standard_normal((rows, K)), 0.2 * g.standard_normal((F_, K)), 0.5 * g.standard_normal(F_),
            0.2 * g.standard_normal((N, F_)), 0.5 * g.standard_normal(N)]


def _leaves(arrays, dtype, device):
    out = []
    for a in arrays:
        t = xtrain.tensor(np.asarray(a, dtype=np.float32 if dtype != "float64" else np.float64), device=device)
        t = t.to(dtype) if dtype == "bfloat16" else t
        t = t.detach()
        t.requires_grad = True
        out.append(t)
    return out


def _run(fn, arrays, dtype, device, seed=1):
    """fn over fresh leaves; backward from a fixed seed gradient -> bits of the output and of every
    leaf's gradient."""
    leaves = _leaves(arrays, dtype, device)
    y = fn(*leaves)
    g = np.random.default_rng(seed).standard_normal(tuple(y.shape))
    y.backward_seeded(xtrain.tensor(g, dtype=y.dtype, device=device))
    return y, [bits(y)] + [bits(t.grad) for t in leaves]


def _linear_bias_composed(x, w, b):
    return ops.add(ops.linear(x, w), b)


def _gelu_mlp_composed(x, w1, b1, w2, b2):
    return ops.add(ops.linear(ops.gelu(ops.add(ops.linear(x, w1), b1)), w2), b2)


def _equal(a, b, what):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert np.array_equal(u, v), f"{what}: array {i} differs"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_the_cpu_runs_the_composition_bitwise(dtype):
    a = _arrays(12, 8, 32, 6)
    y, fused = _run(lambda x, w1, b1, w2, b2: ops.gelu_mlp(x, w1, b1, w2, b2), a, dtype, "cpu")
    _, composed = _run(_gelu_mlp_composed, a, dtype, "cpu")
    _equal(fused, composed, "gelu_mlp")
    assert y.grad_fn == "AddBackward" and y.dtype == dtype
    a = _arrays(12, 8, 32, 6, seed=2)[:3]
    y, fused = _run(ops.linear_bias, a, dtype, "cpu")
    _, composed = _run(_linear_bias_composed, a, dtype, "cpu")
    _equal(fused, composed, "linear_bias")
    assert y.grad_fn == "AddBackward"


def _qkv_arrays(rows=24, K=16, N=8, seed=12):
    g = np.random.default_rng(seed)
    return [g.standard_normal((rows, K))] + [0.3 * g.standard_normal((N, K)) for _ in range(3)] + \
        [0.5 * g.standard_normal(N) for _ in range(3)]


def _qkv_run(fused, arrays, dtype, device, seed=13):
    """linear_multi_bias (fused) or linear_multi then add over fresh leaves; the three outputs'
    backward from fixed seeds -> bits of the outputs and of every leaf's gradient."""
    leaves = _leaves(arrays, dtype, device)
    x, ws, bs = leaves[0], leaves[1:4], leaves[4:]
    outs = ops.linear_multi_bias(x, ws, bs) if fused else [ops.add(y, b) for y, b in zip(ops.linear_multi(x, ws), bs)]
    g = np.random.default_rng(seed)
    total = None
    for y in outs:
        s = ops.sum(ops.mul(y, xtrain.tensor(g.standard_normal(tuple(y.shape)), dtype=dtype, device=device)))
        total = s if total is None else ops.add(total, s)
    total.backward()
    return outs, [bits(y) for y in outs] + [bits(t.grad) for t in leaves]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_linear_multi_bias_on_the_cpu_is_linear_multi_then_add(dtype):
    a = _qkv_arrays()
    outs, fused = _qkv_run(True, a, dtype, "cpu")
    _, composed = _qkv_run(False, a, dtype, "cpu")
    _equal(fused, composed, "linear_multi_bias")
    assert [tuple(y.shape) for y in outs] == [(24, 8)] * 3


def test_linear_multi_bias_bad_inputs():
    leaves = _leaves(_qkv_arrays(), "float32", "cpu")
    x, ws, bs = leaves[0], leaves[1:4], leaves[4:]
    with pytest.raises(ValueError, match="3 weights but 2 biases"):
        ops.linear_multi_bias(x, ws, bs[:2])
    with pytest.raises(ValueError, match=r"biases\[1\] must have shape \[8\]"):
        ops.linear_multi_bias(x, ws, [bs[0], ws[0], bs[2]])
    with pytest.raises(TypeError, match="same dtype"):
        ops.linear_multi_bias(x, ws, [bs[0], bs[1].to("bfloat16"), bs[2]])


def _torch_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


# bf16 chains two GEMMs with rounded intermediates (the composition rounds four times): 4x the
# table's 2e-2. float32 (the GELU epilogues are bf16 only) keeps the table's 2e-5 on both devices.
def _tol_scale(device, dtype):
    return 4.0 if dtype == "bfloat16" else 1.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_against_torch(device, dtype):
    a = _arrays(64, 32, 128, 24, seed=3)
    check_op(ops.gelu_mlp, _torch_mlp, a, dtype=dtype, device=device, tol_scale=_tol_scale(device, dtype))
    check_op(ops.linear_bias, F.linear, a[:3], dtype=dtype, device=device, tol_scale=_tol_scale(device, dtype))


def test_leading_dims_and_float64_gradients():
    a = _arrays(6, 4, 8, 3, seed=4)
    x3 = a[0].reshape(2, 3, 4)
    check_op(ops.gelu_mlp, _torch_mlp, [x3] + a[1:], dtype="float64")
    y = ops.linear_bias(*_leaves([x3] + a[1:3], "float32", "cpu"))
    assert tuple(y.shape) == (2, 3, 8)


def test_bad_inputs():
    x, w1, b1, w2, b2 = _leaves(_arrays(3, 4, 8, 5), "float32", "cpu")
    with pytest.raises(ValueError, match=r"bias must have shape \[8\]"):
        ops.linear_bias(x, w1, b2)
    with pytest.raises(ValueError, match="must end in the weight's in_features"):
        ops.linear_bias(x, w2, b2)
    with pytest.raises(TypeError, match="same dtype"):
        ops.linear_bias(x, w1, b1.to("bfloat16"))
    with pytest.raises(TypeError, match="same dtype"):
        ops.gelu_mlp(x, w1.to("bfloat16"), b1, w2, b2)
    with pytest.raises(ValueError, match="do not chain"):
        ops.gelu_mlp(x, w1, b1, w1, b1)
    with pytest.raises(ValueError, match="proj_bias must have shape"):
        ops.gelu_mlp(x, w1, b1, w2, b1)
    with pytest.raises(ValueError, match="fc_weight must have 2 dimensions|fc_weight"):
        ops.gelu_mlp(x, b1, b1, w2, b2)
    with pytest.raises(TypeError):
        ops.linear_bias(x, None, b1)
    with pytest.raises(ValueError, match="at least one dimension"):
        ops.linear_bias(xtrain.tensor(np.float32(1.0)), w1, b1)


# ---------------------------------------------------------------- on the GPU


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_fused_equals_the_composition_within_rounding(dtype):
    """The epilogues against the unfused ops on the same GPU: the fused forms round once where the
    composition rounds after the GEMM, the add and GELU (float32's gelu_mlp: BIAS GEMMs around the
    engine's GELU, whose outer node is LinearBiasBackward)."""
    a = _arrays(512, 128, 512, 128, seed=5)
    for fused_fn, composed_fn, arrays in ((ops.gelu_mlp, _gelu_mlp_composed, a),
                                          (ops.linear_bias, _linear_bias_composed, a[:3])):
        leaves = _leaves(arrays, dtype, "cuda")
        y = fused_fn(*leaves)
        assert y.grad_fn in ("GeluMlpBackward", "LinearBiasBackward"), y.grad_fn  # the fused path ran
        g = xtrain.tensor(np.random.default_rng(6).standard_normal(tuple(y.shape)), dtype=dtype, device="cuda")
        y.backward_seeded(g)
        ref_leaves = _leaves(arrays, dtype, "cuda")
        ref = composed_fn(*ref_leaves)
        ref.backward_seeded(g)
        rtol = 1e-4 if dtype == "float32" else 2e-2
        scale = np.abs(to_numpy64(ref)).max()
        np.testing.assert_allclose(to_numpy64(y), to_numpy64(ref), rtol=rtol, atol=rtol * scale)
        for i, (u, v) in enumerate(zip(leaves, ref_leaves)):
            gs = np.abs(to_numpy64(v.grad)).max()
            np.testing.assert_allclose(to_numpy64(u.grad), to_numpy64(v.grad), rtol=rtol, atol=rtol * gs,
                                       err_msg=f"grad of input {i}")


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_fused_repeats_bitwise(dtype):
    """GPT-2 d12's MLP and projection shapes at 4096 rows: two runs, the same bits (the cached
    heuristic choice, split-K only with the ordered float32 reduction, ordered bias sums)."""
    a = _arrays(4096, 768, 3072, 768, seed=7)
    _, first = _run(ops.gelu_mlp, a, dtype, "cuda")
    _, second = _run(ops.gelu_mlp, a, dtype, "cuda")
    _equal(first, second, "gelu_mlp run to run")
    _, first = _run(ops.linear_bias, a[:3], dtype, "cuda")
    _, second = _run(ops.linear_bias, a[:3], dtype, "cuda")
    _equal(first, second, "linear_bias run to run")


def _gelu_mlp_biased(x, w1, b1, w2, b2):
    return ops.linear_bias(ops.gelu(ops.linear_bias(x, w1, b1)), w2, b2)


@needs_gpu
def test_cuda_composes_where_cublaslt_has_no_epilogue():
    """A hidden width that is not a multiple of 8 (the aux matrix's ld), float32 (GELU epilogues
    are bf16 only) and float64 take linear_bias, gelu, linear_bias: bitwise that composition."""
    for arrays, dtype in ((_arrays(40, 16, 20, 8, seed=8), "bfloat16"), (_arrays(40, 16, 32, 8, seed=8), "float32"),
                          (_arrays(40, 16, 32, 8, seed=8), "float64")):
        y, fused = _run(ops.gelu_mlp, arrays, dtype, "cuda")
        _, composed = _run(_gelu_mlp_biased, arrays, dtype, "cuda")
        assert y.grad_fn != "GeluMlpBackward"
        _equal(fused, composed, f"gelu_mlp {dtype}")


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_linear_multi_bias(dtype):
    """The q/k/v form on CUDA: one batched GEMM with the Bias epilogue (the node is
    LinearMultiBiasBackward), against linear_multi then add within rounding; two runs bitwise."""
    a = _qkv_arrays(rows=512, K=128, N=128, seed=14)
    outs, fused = _qkv_run(True, a, dtype, "cuda")
    assert outs[0].grad_fn == "LinearMultiBiasBackward"
    _, again = _qkv_run(True, a, dtype, "cuda")
    _equal(fused, again, "linear_multi_bias run to run")
    _, composed = _qkv_run(False, a, dtype, "cuda")
    tol = 1e-4 if dtype == "float32" else 2e-2
    for i, (u, v) in enumerate(zip(fused, composed)):
        if dtype == "float32":
            u, v = u.view(np.float32), v.view(np.float32)
        else:  # bf16 bits -> float32 values
            u = (u.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            v = (v.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_allclose(u, v, rtol=tol, atol=tol * np.abs(v).max(), err_msg=f"array {i}")


def _chain_arrays(seed):
    """An MLP, then a biased projection of its output: x, the MLP's four, w3 [64, 64], b3 [64]."""
    g = np.random.default_rng(seed + 100)
    return _arrays(256, 64, 256, 64, seed=seed) + [0.2 * g.standard_normal((64, 64)), 0.5 * g.standard_normal(64)]


def _chain(leaves, seed):
    for t in leaves:
        t.grad = None
    x, w1, b1, w2, b2, w3, b3 = leaves
    y = ops.linear_bias(ops.gelu_mlp(x, w1, b1, w2, b2), w3, b3)
    y.backward_seeded(seed)
    return y


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_capture_replays_the_eager_bits(dtype):
    """Forward and backward of both ops captured in a CUDA graph (the heuristic query is host-side
    and cached by the warm-up): replays with new inputs give the eager bits."""
    leaves = _leaves(_chain_arrays(9), dtype, "cuda")
    seed = xtrain.tensor(np.random.default_rng(10).standard_normal((256, 64)), dtype=dtype, device="cuda")
    _chain(leaves, seed)  # warm-up outside the capture
    g = xtrain.cuda.Graph(0)
    with xtrain.cuda.graph(g):
        y = _chain(leaves, seed)
    grads = [t.grad for t in leaves]
    for k in range(2):
        fresh = _chain_arrays(20 + k)
        for t, a in zip(leaves, fresh):
            t.detach().copy_(xtrain.tensor(np.asarray(a, np.float32)).to(dtype))
        g.replay()
        replayed = [bits(y)] + [bits(t) for t in grads]
        eager_leaves = _leaves(fresh, dtype, "cuda")
        eager = [bits(_chain(eager_leaves, seed))] + [bits(t.grad) for t in eager_leaves]
        _equal(replayed, eager, f"graph replay {k}")


@needs_gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_cuda_gpt2_runs_the_fused_ops(bf16):
    """The model's MLP, attention projection and q/k/v are the fused nodes on CUDA (float32's MLP:
    BIAS GEMMs around the engine's GELU)."""
    from xtrain.models import GPT2, GPT2Config

    model = GPT2(GPT2Config(vocab_size=300, dim=64, n_layers=1, n_heads=4, max_seq=32, bf16=bf16), device="cuda")
    x = xtrain.tensor(np.random.default_rng(11).standard_normal((16, 64)), dtype=model.config.dtype, device="cuda")
    x.requires_grad = True
    with model.store.bound(model.store.compute_weights()):
        block = model.h[0]
        assert block.mlp(x).grad_fn == ("GeluMlpBackward" if bf16 else "LinearBiasBackward")
        assert block.attn.c_proj(x).grad_fn == "LinearBiasBackward"
        assert block.attn.qkv(x)[0].grad_fn == "LinearMultiBiasBackward"


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_one_pass_layer_norm_backward_at_gpt2_scale(dtype):
    """add_layer_norm's one-pass backward (Note [One-pass LayerNorm backward]) at d12's width over
    8192 rows (512 blocks, the final trees): dx, dw, db against float64 torch on the same values,
    and two runs bitwise."""
    g = np.random.default_rng(15)
    rows, dim = 8192, 768
    arrays = [g.standard_normal((rows, dim)), g.standard_normal((rows, dim)), 1 + 0.1 * g.standard_normal(dim),
              0.1 * g.standard_normal(dim)]
    seed_np = g.standard_normal((rows, dim))
    runs = []
    for _ in range(2):
        x, r = _leaves(arrays[:2], dtype, "cuda")
        w, b = _leaves(arrays[2:], "float32", "cuda")
        h, y = ops.add_layer_norm(x, r, w, b)
        y.backward_seeded(xtrain.tensor(seed_np, dtype=dtype, device="cuda"))
        runs.append([bits(y)] + [bits(t.grad) for t in (x, r, w, b)])
    _equal(runs[0], runs[1], "add_layer_norm run to run")
    ht = torch.tensor(to_numpy64(h), dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(arrays[2], dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(arrays[3], dtype=torch.float64, requires_grad=True)
    yt = F.layer_norm(ht, (dim,), wt, bt, 1e-5)
    yt.backward(torch.tensor(to_numpy64(xtrain.tensor(seed_np, dtype=dtype)), dtype=torch.float64))
    tol = 1e-4 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(to_numpy64(x.grad), ht.grad.numpy(), rtol=tol, atol=tol)
    for got, want in ((w.grad, wt.grad), (b.grad, bt.grad)):  # sums over 8192 rows
        np.testing.assert_allclose(to_numpy64(got), want.numpy(), rtol=tol, atol=tol * np.sqrt(rows))
