"""linear_cross_entropy in row chunks (Note [Row-chunked head], csrc/ops/cross_entropy.cpp): the
forward computes the gradients chunk by chunk into float32 accumulators, the backward scales them.

Against the unchunked op and the unfused pair: the loss bitwise on the CPU (whole rows, the same
kernels; to rounding on CUDA), dx and dw to float rounding (dw sums over the chunks); bitwise run
to run; one input requiring grad; an upstream gradient other than 1; ignored targets; the returned
logits; float64 finite differences; peak memory below the logits' size; bad chunk sizes.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import xtrain
from ophelp import bits, finite_difference_check, to_numpy64

ops = xtrain.ops

# Chunked against unchunked, relative to each quantity's largest magnitude: float32 sums the
# tokens in another grouping (a few ulps), bf16 rounds the unchunked dx/dw GEMM outputs once from
# scaled dlogits and the chunked ones once from float32 accumulators (one bf16 ulp either way).
TOL = {"float32": 2e-6, "bfloat16": 1.6e-2, "float64": 1e-12}


def make(N, K, V, seed=0, ignore=(), tdtype=np.int64):
    g = np.random.default_rng(seed)
    x = g.standard_normal((N, K))
    w = g.standard_normal((V, K)) / np.sqrt(K)
    t = g.integers(0, V, N).astype(tdtype)
    t[list(ignore)] = -100
    return x, w, t


def run(device, dtype, x_np, w_np, t_np, chunk_rows=None, x_grad=True, w_grad=True, upstream=None, chunked=None):
    """(loss, dx, dw): chunk_rows None runs the unfused pair, else the fused op with that chunk;
    chunked: whether the op must take the chunked path (default: 0 < chunk_rows < N)."""
    x = xtrain.tensor(x_np, dtype=dtype, device=device, requires_grad=x_grad)
    w = xtrain.tensor(w_np, dtype=dtype, device=device, requires_grad=w_grad)
    t = xtrain.tensor(t_np, device=device)
    if chunk_rows is None:
        loss = ops.cross_entropy(ops.linear(x, w), t)
    else:
        loss, logits = ops.linear_cross_entropy(x, w, t, chunk_rows=chunk_rows)
        assert logits is None
        chunked = 0 < chunk_rows < len(t_np) if chunked is None else chunked
        assert loss.grad_fn == ("ChunkedLinearCrossEntropyBackward" if chunked else "LinearCrossEntropyBackward")
    out = loss if upstream is None else loss * upstream
    out.backward()
    return loss, x.grad, w.grad


def close(a, b, dtype, what):
    if a is None or b is None:
        assert a is None and b is None, what
        return
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape), (what, a.dtype, b.dtype, a.shape, b.shape)
    an, bn = to_numpy64(a), to_numpy64(b)
    scale = max(float(np.abs(bn).max(initial=0.0)), 1e-30)
    np.testing.assert_allclose(an, bn, rtol=0, atol=TOL[dtype] * scale, err_msg=what)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("N,K,V,R", [(23, 16, 37, 5), (64, 24, 256, 8), (130, 48, 257, 128), (7, 8, 50257, 3),
                                     (9, 1, 5, 1)])
def test_chunked_equals_unchunked_and_unfused(device, dtype, N, K, V, R):
    if dtype == "float64" and device != "cpu":
        pytest.skip("float64 runs on the CPU (gradient checks)")
    x, w, t = make(N, K, V, seed=N + V, ignore=(1, N - 1))
    chunked = run(device, dtype, x, w, t, chunk_rows=R)
    whole = run(device, dtype, x, w, t, chunk_rows=N)   # one chunk: the unchunked path
    plain = run(device, dtype, x, w, t)
    if device == "cpu":  # whole rows through the same GEMM and kernels: the same row losses
        assert np.array_equal(bits(chunked[0]), bits(whole[0]))
    for what, a, b in zip(("loss", "dx", "dw"), chunked, whole):
        close(a, b, dtype, what)
    for what, a, b in zip(("loss", "dx", "dw"), chunked, plain):
        close(a, b, dtype, what + " (unfused)")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_bitwise_run_to_run(device, dtype):
    x, w, t = make(130, 48, 257, seed=11, ignore=(3,))
    a = run(device, dtype, x, w, t, chunk_rows=32)
    b = run(device, dtype, x, w, t, chunk_rows=32)
    for u, v in zip(a, b):
        assert np.array_equal(bits(u), bits(v))


@pytest.mark.parametrize("x_grad,w_grad", [(True, False), (False, True)])
def test_chunked_one_input_requires_grad(device, x_grad, w_grad):
    x, w, t = make(40, 16, 70, seed=3)
    got = run(device, "float32", x, w, t, chunk_rows=16, x_grad=x_grad, w_grad=w_grad)
    want = run(device, "float32", x, w, t, x_grad=x_grad, w_grad=w_grad)
    for what, a, b in zip(("loss", "dx", "dw"), got, want):
        close(a, b, "float32", what)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_scales_by_upstream_gradient(device, dtype):
    """The backward's dloss (here 0.37) scales the forward's gradients, as it scales dlogits."""
    x, w, t = make(50, 16, 70, seed=4, ignore=(0, 7))
    got = run(device, dtype, x, w, t, chunk_rows=16, upstream=0.37)
    want = run(device, dtype, x, w, t, upstream=0.37)
    for what, a, b in zip(("loss", "dx", "dw"), got, want):
        close(a, b, dtype, what)


def test_chunked_matches_torch(device):
    x, w, t = make(45, 12, 90, seed=5, ignore=(2, 30))
    loss, dx, dw = run(device, "float32", x, w, t, chunk_rows=10)
    tx, tw = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w))
    ref = F.cross_entropy(tx @ tw.t(), torch.tensor(t), ignore_index=-100)
    ref.backward()
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-6)
    np.testing.assert_allclose(to_numpy64(dx), tx.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(to_numpy64(dw), tw.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_chunked_all_ignored_and_return_logits(device):
    x, w, t = make(20, 8, 33, seed=6)
    xt = xtrain.tensor(x, dtype="float32", device=device, requires_grad=True)
    wt = xtrain.tensor(w, dtype="float32", device=device, requires_grad=True)
    ignored = xtrain.tensor(np.full(20, -100, np.int64), device=device)
    loss, _ = ops.linear_cross_entropy(xt, wt, ignored, chunk_rows=6)
    loss.backward()
    assert loss.item() == 0.0 and not to_numpy64(xt.grad).any() and not to_numpy64(wt.grad).any()
    loss, logits = ops.linear_cross_entropy(xt, wt, xtrain.tensor(t, device=device), return_logits=True,
                                            chunk_rows=6)
    assert logits is not None and tuple(logits.shape) == (20, 33) and not logits.requires_grad
    want = ops.linear(xt, wt)
    if device == "cpu":
        # The head's GEMM per chunk of 6 rows: OpenBLAS may pick another kernel for 6 rows than for
        # 20 (it does on AMD EPYC), so the bitwise reference is the same GEMM chunk by chunk.
        chunks = [to_numpy64(ops.linear(xtrain.tensor(x[i:i + 6], dtype="float32", device=device), wt))
                  for i in range(0, 20, 6)]
        assert np.array_equal(to_numpy64(logits), np.concatenate(chunks))
        np.testing.assert_allclose(to_numpy64(logits), to_numpy64(want), rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_allclose(to_numpy64(logits), to_numpy64(want), rtol=1e-5, atol=1e-5)


def test_chunked_no_grad_records_nothing(device):
    x, w, t = make(20, 8, 33, seed=7)
    xt = xtrain.tensor(x, dtype="float32", device=device, requires_grad=True)
    wt = xtrain.tensor(w, dtype="float32", device=device, requires_grad=True)
    tt = xtrain.tensor(t, device=device)
    with xtrain.no_grad():
        loss, _ = ops.linear_cross_entropy(xt, wt, tt, chunk_rows=4)
    assert not loss.requires_grad
    assert np.array_equal(bits(loss), bits(ops.linear_cross_entropy(xt, wt, tt, chunk_rows=4)[0]))


def test_chunked_second_backward_raises(device):
    x, w, t = make(20, 8, 33, seed=8)
    xt = xtrain.tensor(x, dtype="float32", device=device, requires_grad=True)
    wt = xtrain.tensor(w, dtype="float32", device=device, requires_grad=True)
    loss, _ = ops.linear_cross_entropy(xt, wt, xtrain.tensor(t, device=device), chunk_rows=4)
    loss.backward()
    with pytest.raises(RuntimeError):
        loss.backward()


def test_chunked_finite_differences():
    targets = xtrain.tensor(np.array([0, 4, -100, 2, 6, 1, 3], dtype=np.int64))
    g = np.random.default_rng(12)
    finite_difference_check(
        lambda a, b: ops.linear_cross_entropy(a, b, targets, chunk_rows=2)[0].to(dtype="float64"),
        [g.standard_normal((7, 3)), g.standard_normal((7, 3))], eps=1e-2, rtol=1e-3, atol=1e-4)


def test_chunked_peak_memory_is_below_the_logits():
    """The claim of the chunking: the forward + backward's peak allocation does not hold [N, V]."""
    N, K, V = 2048, 16, 4096
    x, w, t = make(N, K, V, seed=9)
    logits_bytes = N * V * 4

    def peak(chunk_rows):
        xt = xtrain.tensor(x, dtype="float32", requires_grad=True)
        wt = xtrain.tensor(w, dtype="float32", requires_grad=True)
        tt = xtrain.tensor(t)
        xtrain.reset_peak_memory_stats("cpu")
        base = xtrain.memory_stats("cpu")["allocated_bytes.current"]
        loss, _ = ops.linear_cross_entropy(xt, wt, tt, chunk_rows=chunk_rows)
        loss.backward()
        return xtrain.memory_stats("cpu")["allocated_bytes.peak"] - base

    assert peak(N) >= logits_bytes                       # unchunked: the whole logits buffer
    chunked = peak(128)                                  # 128 rows: a 2 MiB chunk, dw and dx accumulators
    # + 2 MiB: the CPU kernels' per-thread scratch, which grows with the thread count (16 cores: 1.2 MiB)
    assert chunked < 128 * V * 4 + V * K * 4 * 2 + N * K * 4 * 2 + (2 << 20), chunked
    assert chunked < logits_bytes / 4


def test_chunk_rows_must_be_non_negative(device):
    x, w, t = make(4, 8, 5)
    with pytest.raises(ValueError, match="chunk_rows must be >= 0"):
        ops.linear_cross_entropy(xtrain.tensor(x, device=device), xtrain.tensor(w, device=device),
                                 xtrain.tensor(t, device=device), chunk_rows=-1)


def test_auto_chunks_at_a_published_vocabulary(device):
    """chunk_rows=0 at Qwen3's vocabulary (151936, bf16: 3456 rows a chunk) chunks 4096 rows, and
    agrees with the unchunked op. CUDA only: the CPU would spend ~10 GB widening the bf16 chunk."""
    if device == "cpu":
        pytest.skip("1 GiB bf16 chunks: run on CUDA")
    N, K, V = 4096, 64, 151936
    x, w, t = make(N, K, V, seed=13, ignore=(5,))
    xt = xtrain.tensor(x, dtype="bfloat16", device=device, requires_grad=True)
    wt = xtrain.tensor(w, dtype="bfloat16", device=device, requires_grad=True)
    loss, _ = ops.linear_cross_entropy(xt, wt, xtrain.tensor(t, device=device))
    assert loss.grad_fn == "ChunkedLinearCrossEntropyBackward"
    loss.backward()
    whole = run(device, "bfloat16", x, w, t, chunk_rows=N)
    for what, a, b in zip(("loss", "dx", "dw"), (loss, xt.grad, wt.grad), whole):
        close(a, b, "bfloat16", what)


def test_auto_rule_balances_chunks_of_at_most_a_gibibyte(device):
    """chunk_rows=0 at 4 MiB logits rows (V = 2^20 float32): 256 rows fit a GiB, so 300 rows run
    in 2 chunks of 256 rows rounded from 150 (balanced, a multiple of 128): the same bits as
    chunk_rows=256, and torch's loss and gradients."""
    N, K, V = 300, 1, 1 << 20
    x, w, t = make(N, K, V, seed=14, ignore=(9,))
    auto = run(device, "float32", x, w, t, chunk_rows=0, chunked=True)
    explicit = run(device, "float32", x, w, t, chunk_rows=256)
    for u, v in zip(auto, explicit):
        assert np.array_equal(bits(u), bits(v))
    tx, tw = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w))
    ref = F.cross_entropy(tx @ tw.t(), torch.tensor(t), ignore_index=-100)
    ref.backward()
    np.testing.assert_allclose(auto[0].item(), ref.item(), rtol=1e-5)
    # dx sums 2^20 float32 products per row, with cancellation: 6.1e-4 of the norm off float64,
    # the same for the unfused pair's GEMM (measured)
    got, want = to_numpy64(auto[1]), tx.grad.numpy()
    assert np.linalg.norm(got - want) < 2e-3 * np.linalg.norm(want)


@pytest.mark.parametrize("rows,vocab,dtype,want", [
    (16384, 151936, "bfloat16", (2048, 151936)),   # qwen3 at batch 4 x 4096: 8 chunks of at most 2,048 rows
    (16384, 128256, "bfloat16", (2048, 128256)),   # llama3.2 likewise
    (8192, 50257, "bfloat16", (8192, 50304)),      # dim768 at batch 32: 0.77 GiB of logits, unchunked
    (300, 1 << 20, "float32", (256, 1 << 20)),     # the test above: 2 chunks of 256
])
def test_head_layout_is_the_ops_rule(rows, vocab, dtype, want):
    """ops.head_layout gives the chunking linear_cross_entropy uses (bench/activation_memory.py
    reads it rather than restating it): rows per chunk and the logits' 64-element row stride."""
    assert ops.head_layout(rows, vocab, dtype) == want
    for vocab_bad in (0, 1 << 41):
        with pytest.raises(ValueError, match="vocab must be in"):
            ops.head_layout(rows, vocab_bad, dtype)
    with pytest.raises(ValueError, match="rows must be >= 0"):
        ops.head_layout(-1, vocab, dtype)
