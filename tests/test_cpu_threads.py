"""The CPU kernels that split their work over the CPU backend's threads (kernels/cpu/parallel.h:
flash attention's (batch, head) pairs, RoPE positions, cross-entropy rows, SwiGLU elements, RMSNorm and add+RMSNorm forward rows,
RMSNorm backward rows and columns, AdamW and clipping elements, random draws and arange) give the same bits at every thread count."""
import numpy as np
import pytest

import xtrain
from ophelp import bits

ops = xtrain.ops


@pytest.fixture
def threads():
    before = xtrain.get_num_threads()
    yield
    xtrain.set_num_threads(before)


def assert_same_bits(run, counts=(1, 2)):
    """run() -> list of bit arrays; the same at every thread count."""
    results = []
    for n in counts:
        xtrain.set_num_threads(n)
        results.append(run())
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_cross_entropy_same_bits_at_any_thread_count(threads, dtype):
    r = np.random.default_rng(3)
    logits = r.standard_normal((301, 517)) * 3
    targets = r.integers(0, 517, 301)
    targets[::7] = -100

    def run():
        x = xtrain.tensor(logits, dtype=dtype, requires_grad=True)
        loss = ops.cross_entropy(x, xtrain.tensor(targets))
        loss.backward()
        return bits(loss), bits(x.grad)

    assert_same_bits(run, (1, 3))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_random_draws_same_bits_at_any_thread_count(threads, dtype):
    """Element i of a draw is philox(seed, offset + i) whichever thread computes it, for a first
    draw and for a second one that continues at the generator's offset; the values look normal."""
    n = 300_007

    def run():
        g = xtrain.Generator(11)
        a = xtrain.randn((n,), dtype=dtype, generator=g)
        b = xtrain.rand((n,), dtype=dtype, generator=g)
        return bits(a), bits(b), bits(xtrain.arange(0, n, 1, dtype=dtype))

    assert_same_bits(run, (1, 3))
    xtrain.set_num_threads(3)
    whole = xtrain.randn((n,), dtype="float32", generator=xtrain.Generator(11)).numpy()
    assert np.isfinite(whole).all() and abs(float(whole.mean())) < 0.01 and abs(float(whole.std()) - 1) < 0.01


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_swiglu_same_bits_at_any_thread_count(threads, dtype):
    r = np.random.default_rng(4)
    g, u, d = (r.standard_normal(200_003) for _ in range(3))

    def run():
        gt = xtrain.tensor(g, dtype=dtype, requires_grad=True)
        ut = xtrain.tensor(u, dtype=dtype, requires_grad=True)
        y = ops.swiglu(gt, ut)
        y.backward_seeded(xtrain.tensor(d, dtype=dtype))
        return bits(y), bits(gt.grad), bits(ut.grad)

    assert_same_bits(run)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rms_norm_forwards_same_bits_at_any_thread_count(threads, dtype):
    r = np.random.default_rng(5)
    x, res, w = r.standard_normal((1031, 96)), r.standard_normal((1031, 96)), r.standard_normal(96)

    def run():
        xt, rt, wt = (xtrain.tensor(a, dtype=dtype) for a in (x, res, w))
        h, y = ops.add_rms_norm(xt, rt, wt, 1e-6)
        return bits(ops.rms_norm(xt, wt, 1e-6)), bits(h), bits(y)

    assert_same_bits(run)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rms_norm_backwards_same_bits_at_any_thread_count(threads, dtype):
    """dx split by rows, dw by columns (each column's rows still in order)."""
    r = np.random.default_rng(8)
    x, res, w, dy = r.standard_normal((1031, 96)), r.standard_normal((1031, 96)), r.standard_normal(96), \
        r.standard_normal((1031, 96))

    def run():
        xt, rt, wt = (xtrain.tensor(a, dtype=dtype, requires_grad=True) for a in (x, res, w))
        ops.rms_norm(xt, wt, 1e-6).backward_seeded(xtrain.tensor(dy, dtype=dtype))
        plain = [bits(xt.grad), bits(wt.grad)]
        xt, rt, wt = (xtrain.tensor(a, dtype=dtype, requires_grad=True) for a in (x, res, w))
        h, y = ops.add_rms_norm(xt, rt, wt, 1e-6)
        ops.add(ops.sum(ops.mul(h, h)), ops.sum(ops.mul(y, xtrain.tensor(dy, dtype=dtype)))).backward()
        return plain + [bits(xt.grad), bits(rt.grad), bits(wt.grad)]

    assert_same_bits(run, (1, 3))


def test_adamw_and_clip_same_bits_at_any_thread_count(threads):
    r = np.random.default_rng(6)
    sizes = [(300, 257), (129,), (70_001,)]
    init = [r.standard_normal(s) for s in sizes]
    grads = [r.standard_normal(s) for s in sizes]

    def run():
        ps = [xtrain.tensor(a, dtype="float32") for a in init]
        gs = [xtrain.tensor(a, dtype="float32") for a in grads]
        ms = [xtrain.zeros(s) for s in sizes]
        vs = [xtrain.zeros(s) for s in sizes]
        for step in (1, 2):
            xtrain._C.optim.adamw_step(ps, gs, ms, vs, 1e-3, 0.9, 0.95, 1e-8, 0.1, step)
        xtrain._C.optim.clip_by_norm_(gs, xtrain._C.optim.global_norm(gs), 0.5)
        return [bits(t) for t in ps + ms + vs + gs]

    assert_same_bits(run)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2)])
def test_flash_attention_same_bits_at_any_thread_count(threads, dtype, H, Hkv):
    r = np.random.default_rng(7)
    B, S, D = 24, 40, 16  # 96 (b, head) pairs: two threads take a share each
    q, k, v, d = (r.standard_normal(s) for s in [(B, S, H, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, S, H, D)])

    def run():
        qt, kt, vt = (xtrain.tensor(a, dtype=dtype, requires_grad=True) for a in (q, k, v))
        out = ops.flash_attention(qt, kt, vt, causal=True)
        out.backward_seeded(xtrain.tensor(d, dtype=dtype))
        return bits(out), bits(qt.grad), bits(kt.grad), bits(vt.grad)

    assert_same_bits(run)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rope_and_qk_norm_rope_same_bits_at_any_thread_count(threads, dtype):
    r = np.random.default_rng(8)
    B, S, H, D = 2, 300, 4, 32  # 128 positions a thread at the least: three chunks
    q, k, dq, dk = (r.standard_normal((B, S, H, D)) for _ in range(4))
    wq, wk = r.standard_normal(D), r.standard_normal(D)

    def run():
        qt, kt = (xtrain.tensor(a, dtype=dtype, requires_grad=True) for a in (q, k))
        yq, yk = ops.qk_norm_rope(qt, kt, xtrain.tensor(wq, dtype=dtype), xtrain.tensor(wk, dtype=dtype))
        (yq * xtrain.tensor(dq, dtype=dtype) + yk * xtrain.tensor(dk, dtype=dtype)).sum().backward()
        return bits(ops.rope(qt.detach(), None, 10000.0)), bits(yq), bits(yk), bits(qt.grad), bits(kt.grad)

    assert_same_bits(run, (1, 3))
