"""The recompute gate: checkpoint on vs off gives bitwise-identical loss, outputs and every
parameter gradient (float32 and bf16, with dropout inside the segment), keeps fewer bytes
alive between forward and backward, and fails cleanly."""
import gc

import numpy as np
import pytest

import xtrain
from xtrain import ops

from ophelp import bits

DIM, FFN, HEADS, SEQ, BATCH, BLOCKS = 64, 128, 4, 16, 2, 4


def make_params(seed, device):
    g = xtrain.Generator(seed)

    def p(*shape, scale=0.05):
        t = (xtrain.randn(*shape, generator=g, device=device) * scale)
        t = t.detach()
        t.requires_grad = True
        return t

    blocks = []
    for _ in range(BLOCKS):
        blocks.append([
            xtrain.ones(DIM, device=device, requires_grad=True),  # norm 1
            p(DIM, DIM),  # q
            p(DIM, DIM),  # k
            p(DIM, DIM),  # v
            p(DIM, DIM),  # attention out
            xtrain.ones(DIM, device=device, requires_grad=True),  # norm 2
            p(FFN, DIM),  # gate
            p(FFN, DIM),  # up
            p(DIM, FFN),  # down
        ])
    head = p(32, DIM)
    return blocks, head


def block(x, params, bf16, dropout):
    """norm -> causal attention -> residual, norm -> swiglu MLP -> residual; x is [B*S, DIM]."""
    n1, wq, wk, wv, wo, n2, wg, wu, wd = params
    act = "bfloat16" if bf16 else "float32"
    hd = DIM // HEADS

    def w(t):
        return ops.cast(t, "bfloat16") if bf16 else t

    def heads(t):  # [B*S, DIM] -> [B, S, H, hd]
        return t.reshape(BATCH, SEQ, HEADS, hd)

    h = ops.rms_norm(x, n1, 1e-6)
    a = ops.flash_attention(heads(ops.linear(h, w(wq))), heads(ops.linear(h, w(wk))), heads(ops.linear(h, w(wv))),
                            causal=True)
    a = a.reshape(BATCH * SEQ, DIM)
    x = x + ops.linear(a, w(wo))
    h = ops.rms_norm(x, n2, 1e-6)
    m = ops.swiglu(ops.linear(h, w(wg)), ops.linear(h, w(wu)))
    if dropout:
        m = ops.dropout(m, 0.1, True)
    x = x + ops.linear(m, w(wd))
    assert x.dtype == act
    return x


def run(recompute, bf16, dropout, device, seed=0, measure=False):
    blocks, head = make_params(seed, device)
    g = xtrain.Generator(100)
    x0 = xtrain.randn(BATCH * SEQ, DIM, generator=g, device=device)
    if bf16:
        x0 = ops.cast(x0, "bfloat16")
    targets = xtrain.tensor(np.random.default_rng(1).integers(0, 32, BATCH * SEQ), device=device)
    xtrain.manual_seed(1234)
    if measure:
        gc.collect()
        xtrain.reset_peak_memory_stats(device)
        base = xtrain.memory_stats(device)["allocated_bytes.current"]
    x = x0
    for params in blocks:
        if recompute:
            x = xtrain.checkpoint(lambda xx, pp: block(xx, pp, bf16, dropout), x, params)
        else:
            x = block(x, params, bf16, dropout)
    logits = ops.linear(x, ops.cast(head, "bfloat16") if bf16 else head)
    loss = ops.cross_entropy(logits, targets)
    held = None
    if measure:
        held = xtrain.memory_stats(device)["allocated_bytes.current"] - base
    loss.backward()
    all_params = [p for blk in blocks for p in blk] + [head]
    return loss, logits, [p.grad for p in all_params], held


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("dropout", [False, True], ids=["nodrop", "dropout"])
def test_recompute_is_bitwise_exact(bf16, dropout, device):
    loss_a, logits_a, grads_a, _ = run(False, bf16, dropout, device)
    loss_b, logits_b, grads_b, _ = run(True, bf16, dropout, device)
    assert np.array_equal(bits(loss_a), bits(loss_b))
    assert np.array_equal(bits(logits_a), bits(logits_b))
    assert len(grads_a) == len(grads_b) == BLOCKS * 9 + 1
    for i, (ga, gb) in enumerate(zip(grads_a, grads_b)):
        assert ga is not None and gb is not None, f"param {i} has no gradient"
        assert np.array_equal(bits(ga), bits(gb)), f"gradient of param {i} differs"
    assert np.isfinite(loss_a.item())


def test_recompute_keeps_fewer_bytes_alive(device):
    _, _, _, held_plain = run(False, False, False, device, measure=True)
    _, _, _, held_ckpt = run(True, False, False, device, measure=True)
    assert held_ckpt < 0.6 * held_plain, (held_ckpt, held_plain)


def test_checkpoint_under_no_grad_is_a_plain_call():
    x = xtrain.randn(4, 8)
    w = xtrain.randn(8, 8, requires_grad=True)
    with xtrain.no_grad():
        y = xtrain.checkpoint(lambda a, p: ops.linear(a, p[0]), x, [w])
    assert y.grad_fn is None and not y.requires_grad


def test_checkpoint_when_x_needs_no_grad_and_nested():
    x = xtrain.randn(4, 8)  # no grad
    w1 = xtrain.randn(8, 8, requires_grad=True)
    w2 = xtrain.randn(8, 8, requires_grad=True)
    frozen = xtrain.randn(8, 8)

    def inner(a, p):
        return ops.silu(ops.linear(a, p[0]))

    def outer(a, p):
        return ops.linear(xtrain.checkpoint(inner, a, [p[0]]), p[1]) + ops.linear(a, p[2])

    y = xtrain.checkpoint(outer, x, [w1, w2, frozen])
    y.sum().backward()
    g1, g2 = w1.grad.numpy().copy(), w2.grad.numpy().copy()
    assert frozen.grad is None and x.grad is None
    w1.grad = None
    w2.grad = None
    outer(x, [w1, w2, frozen]).sum().backward()
    np.testing.assert_array_equal(g1, w1.grad.numpy())
    np.testing.assert_array_equal(g2, w2.grad.numpy())


class Boom(Exception):
    pass


def test_exception_in_segment_during_backward_propagates_and_frees():
    calls = {"n": 0}

    def seg(a, p):
        calls["n"] += 1
        if calls["n"] == 2:  # the recompute
            raise Boom("segment failed during recompute")
        return ops.linear(a, p[0])

    gc.collect()
    before = xtrain.memory_stats("cpu")["allocated_bytes.current"]
    x = xtrain.randn(64, 64, requires_grad=True)
    w = xtrain.randn(64, 64, requires_grad=True)
    y = xtrain.checkpoint(seg, x, [w])
    with pytest.raises(Boom, match="recompute"):
        y.sum().backward()
    del x, w, y
    gc.collect()
    assert xtrain.memory_stats("cpu")["allocated_bytes.current"] == before
    # The interpreter and the engine still work.
    z = xtrain.randn(3, requires_grad=True)
    (z * 2.0).sum().backward()
    np.testing.assert_array_equal(z.grad.numpy(), [2, 2, 2])


def test_recomputed_shape_mismatch_raises():
    calls = {"n": 0}

    def seg(a, p):
        calls["n"] += 1
        out = ops.linear(a, p[0])
        return out if calls["n"] == 1 else out.reshape(-1)

    x = xtrain.randn(4, 8, requires_grad=True)
    w = xtrain.randn(8, 8, requires_grad=True)
    y = xtrain.checkpoint(seg, x, [w])
    with pytest.raises(RuntimeError, match="recomputed output"):
        y.sum().backward()


def test_segment_must_return_a_tensor():
    x = xtrain.randn(4, requires_grad=True)
    with pytest.raises(TypeError, match="must return"):
        xtrain.checkpoint(lambda a, p: 3, x, [])
    with pytest.raises(TypeError):
        xtrain.checkpoint("not callable", x, [])


def test_wrong_seed_shape_raises():
    x = xtrain.randn(2, 3, requires_grad=True)
    y = x * 2.0
    with pytest.raises(ValueError, match="seed"):
        y.backward_seeded(xtrain.ones(3, 2))
    with pytest.raises(RuntimeError, match="one-element"):
        y.backward()


def test_first_gradient_is_taken_over_only_when_nothing_else_shares_it():
    a = xtrain.randn(4, 4, requires_grad=True)
    b = xtrain.randn(4, 4, requires_grad=True)
    (a + b).sum().backward()  # the add hands one gradient tensor to both inputs
    assert not a.grad.same_storage(b.grad)
    a.grad.fill_(5.0)
    np.testing.assert_array_equal(b.grad.numpy(), np.ones((4, 4)))
    seed = xtrain.ones(4, 4)
    c = xtrain.randn(4, 4, requires_grad=True)
    c.backward_seeded(seed)  # a leaf root: the caller's seed must not become c.grad
    assert not c.grad.same_storage(seed)
    seed.fill_(3.0)
    np.testing.assert_array_equal(c.grad.numpy(), np.ones((4, 4)))
