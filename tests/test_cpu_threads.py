"""The CPU kernels that split their work over the CPU backend's threads (kernels/cpu/parallel.h:
cross-entropy rows, SwiGLU elements) give the same bits at every thread count, forward and
backward."""
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


def run_at(n, fn):
    xtrain.set_num_threads(n)
    return fn()


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

    one, three = run_at(1, run), run_at(3, run)
    for a, b in zip(one, three):
        assert np.array_equal(a, b)


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

    one, two = run_at(1, run), run_at(2, run)
    for a, b in zip(one, two):
        assert np.array_equal(a, b)
