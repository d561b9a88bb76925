"""FP8 on CUDA (the GPU machine): the cast kernels and the cuBLASLt GEMM against the CPU reference,
CUDA graphs, and a Qwen3-shaped model trained with fp8 against bf16. tests/test_fp8.py runs its
device-parametrised tests (conversion tables, torch bitwise, the recipe's reference, recompute,
run-to-run and resume bit-exactness) on CUDA too.
"""

import math

import numpy as np
import pytest

import xtrain
from modelhelp import bits_equal, fp8_gemm_tolerance
from xtrain import graphs, ops
from xtrain.models import TinyTransformer, TransformerConfig
from xtrain.optim import AdamW

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not xtrain.cuda.is_available(),
                       reason="no CUDA device (xtrain.cuda.is_available() is False): runs on the GPU machine"),
]

CUDA = "cuda:0"


def values(t) -> np.ndarray:
    return np.asarray(ops.cast(t, "float32").numpy() if t.dtype == "bfloat16" else t.numpy(), np.float32)


def run(x, w, dy, dtype, device):
    X = xtrain.tensor(x, dtype=dtype, device=device, requires_grad=True)
    W = xtrain.tensor(w, dtype=dtype, device=device, requires_grad=True)
    y = ops.linear_fp8(X, W)
    y.backward_seeded(xtrain.tensor(dy, dtype=dtype, device=device))
    return values(y), values(X.grad), values(W.grad)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(16, 16, 16), (4096, 2048, 2048), (2048, 2048, 6144), (8192, 6144, 2048)])
def test_cuda_gemms_match_the_cpu_reference(dtype, shape):
    """Forward (fast accumulation), dgrad and wgrad against the CPU's quantise -> dequantise ->
    float32 GEMM: the same codes and scales (the casts are bitwise the CPU's), so what differs
    is the summation (order, and the forward's fast accumulation) and the output's rounding."""
    M, K, N = shape
    rng = np.random.default_rng(M + K + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / math.sqrt(K)).astype(np.float32)
    dy = rng.standard_normal((M, N)).astype(np.float32)
    got = run(x, w, dy, dtype, CUDA)
    want = run(x, w, dy, dtype, "cpu")
    base = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -9  # the gradients: promoted float32 sums
    for g, r, name in zip(got, want, ("y", "dx", "dW")):
        tol = max(base, fp8_gemm_tolerance(K)) if name == "y" else base
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * np.abs(r).max(), err_msg=name)
        if name == "y":  # the bound is for the worst element; the typical one is far inside it
            rms = max(base, tol / 8) * np.sqrt(np.mean(r ** 2))
            assert np.sqrt(np.mean((g - r) ** 2)) <= rms, name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_casts_are_the_cpus_bitwise(dtype):
    """With an identity weight the GEMMs return the dequantised operands themselves (one nonzero
    product per output): x's E4M3 values in y, dy's E5M2 values in dx, bitwise the CPU's, at a
    size where the amax runs over many blocks and the casts over many tiles."""
    rng = np.random.default_rng(9)
    n = 2048
    x = (rng.standard_normal((4096, n)) * np.exp2(rng.uniform(-20, 20, (4096, n)))).astype(np.float32)
    dy = (rng.standard_normal((4096, n)) * np.exp2(rng.uniform(-20, 20, (4096, n)))).astype(np.float32)
    eye = np.eye(n, dtype=np.float32)
    got, want = run(x, eye, dy, dtype, CUDA), run(x, eye, dy, dtype, "cpu")
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])


def test_cuda_repeats_bitwise_at_size():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4096, 2048)).astype(np.float32)
    w = (rng.standard_normal((6144, 2048)) / 45).astype(np.float32)
    dy = rng.standard_normal((4096, 6144)).astype(np.float32)
    a, b = run(x, w, dy, "bfloat16", CUDA), run(x, w, dy, "bfloat16", CUDA)
    for u, v in zip(a, b):
        assert bits_equal(u, v)


SMALL = dict(vocab_size=64, dim=32, n_layers=2, n_heads=2, head_dim=16, ffn_dim=64, max_seq=16)


def test_fp8_step_graphs_equal_eager_steps_bitwise():
    """The fp8 casts and GEMMs inside captured training steps: the amax and scales are computed
    on the device, so replays give the eager steps' bits."""
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 64, (2, 16)) for _ in range(6)]
    results = []
    for use_graphs in (False, True):
        model = TinyTransformer(TransformerConfig(**SMALL, bf16=True, fp8=True), device="cuda", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        sg = graphs.StepGraphs(model, opt, 1, 1.0, note=lambda m: None)
        losses = []
        for ids in batches:
            out = sg.step(ids, ids) if use_graphs else None
            if out is None:
                loss = graphs.forward_backward(model, ids, ids, 1)
                opt.clip_and_step(1.0, loss)
                opt.zero_grad(set_to_none=True)
                if use_graphs:
                    sg.eager()
        if use_graphs:
            assert sg.active and sg.replays >= 3
        xtrain.cuda.synchronize()
        results.append({n: p.numpy().copy() for n, p in model.named_parameters()})
    for name in results[0]:
        assert bits_equal(results[0][name], results[1][name]), name


def _qwen3_small(fp8: bool) -> TransformerConfig:
    # Qwen3's shape, shrunk: head dim 128, grouped-query attention, qk-norm, tied embeddings
    return TransformerConfig(vocab_size=4096, dim=512, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=128,
                             ffn_dim=1536, max_seq=256, rope_theta=1e6, tie_embeddings=True, bf16=True, fp8=fp8)


def _train_losses(fp8: bool, steps: int = 300):
    """Next-token training on a learnable synthetic stream (each sequence a random walk over a
    fixed random successor table), the same batches for both runs."""
    config = _qwen3_small(fp8)
    model = TinyTransformer(config, device="cuda", seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.0)
    rng = np.random.default_rng(0)
    succ = rng.integers(0, config.vocab_size, (config.vocab_size, 4))
    losses = []
    for _ in range(steps):
        seq = np.empty((8, 257), np.int64)
        seq[:, 0] = rng.integers(0, config.vocab_size, 8)
        for t in range(1, 257):
            seq[:, t] = succ[seq[:, t - 1], rng.integers(0, 4, 8)]
        _, loss = model(seq[:, :-1], seq[:, 1:])
        loss.backward()
        opt.clip_and_step(1.0, loss)
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_qwen3_shaped_training_with_fp8_tracks_bf16():
    bf16, fp8 = _train_losses(False), _train_losses(True)
    assert all(math.isfinite(v) for v in fp8)
    end_bf16, end_fp8 = np.mean(bf16[-20:]), np.mean(fp8[-20:])
    assert end_bf16 < 0.8 * np.mean(bf16[:5])  # it learned
    assert abs(end_fp8 - end_bf16) < 0.03 * end_bf16, (end_fp8, end_bf16)
