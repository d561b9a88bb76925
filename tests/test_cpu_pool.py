"""The CPU kernels' persistent thread pool (csrc/kernels/cpu/parallel.cpp): split kernels called
from several threads at once (one gets the pool, the others run their range themselves) give the
bits of a lone call, and a forked child (the data loader's worker processes) runs split kernels
with a pool of its own instead of waiting for the parent's workers, which it does not have."""
import os
import threading
import time

import numpy as np
import pytest

import xtrain
from ophelp import bits

ops = xtrain.ops


@pytest.fixture
def two_threads():
    before = xtrain.get_num_threads()
    xtrain.set_num_threads(2)
    yield
    xtrain.set_num_threads(before)


def _attention_inputs():
    r = np.random.default_rng(11)
    B, S, H, D = 8, 64, 4, 16  # 32 (b, head) pairs: a split call
    return [xtrain.tensor(r.standard_normal((B, S, H, D)), dtype="float32") for _ in range(3)]


def test_concurrent_callers_get_the_lone_call_bits(two_threads):
    q, k, v = _attention_inputs()
    want = bits(ops.flash_attention(q, k, v))
    failures = []

    def worker():
        for _ in range(30):
            if not np.array_equal(bits(ops.flash_attention(q, k, v)), want):  # releases the GIL
                failures.append(1)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a split kernel call did not return"
    assert not failures


def _swiglu_bits(g, u):
    return bits(ops.swiglu(xtrain.tensor(g, dtype="float32"), xtrain.tensor(u, dtype="float32")))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_runs_split_kernels(two_threads):
    r = np.random.default_rng(12)
    g, u = r.standard_normal(200_003), r.standard_normal(200_003)
    want = _swiglu_bits(g, u)  # the parent's pool is running now
    pid = os.fork()
    if pid == 0:  # the child: the same split kernel, the same bits
        ok = False
        try:
            ok = np.array_equal(_swiglu_bits(g, u), want)
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, "the child's split kernel gave other bits"
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's split kernel never returned (it waited for the parent's workers)")
