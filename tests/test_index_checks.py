"""Index range checks of embedding ids and cross-entropy targets.

The CPU checks before it computes and raises in the op. CUDA adds no host sync for them: the
kernels check each index as they read it, an out-of-range one reads nothing (a zero embedding
row, a skipped gradient row, a NaN loss), and IndexError is raised at the next sync point
(item(), numpy(), xtrain.cuda.synchronize()), naming the op, the bad value and the valid range;
the error is then cleared and the process keeps working. The CUDA tests run on the GPU machine.
"""
import numpy as np
import pytest

import xtrain
from xtrain import ops

CUDA = "cuda:0"


def cuda_only(test):
    skip = pytest.mark.skipif(not xtrain.cuda.is_available(),
                              reason="no CUDA device (xtrain.cuda.is_available() is False): runs on the GPU machine")
    return pytest.mark.cuda(skip(test))


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def ids(values, device, dtype=np.int64):
    return xtrain.tensor(np.array(values, dtype=dtype), device=device)


def pending_index_error():
    """The IndexError the next sync point raises (as a string), or None."""
    try:
        xtrain.cuda.synchronize()
    except IndexError as e:
        return str(e)
    return None


# ---------------------------------------------------------------- both devices


@pytest.mark.parametrize("id_dtype", [np.int64, np.int32])
def test_bad_embedding_id_raises_by_the_next_sync_and_the_process_keeps_working(id_dtype, device):
    table = xtrain.tensor(randn(5, 4), device=device)
    with pytest.raises(IndexError, match=r"embedding: ids must be in \[0, 5\)"):
        ops.embedding(table, ids([1, 9, 2], device, id_dtype)).numpy()
    good = ops.embedding(table, ids([4, 0], device, id_dtype)).numpy()
    np.testing.assert_array_equal(good, table.numpy()[[4, 0]])


def test_bad_target_raises_by_the_next_sync_and_the_process_keeps_working(device):
    logits = xtrain.tensor(randn(3, 5), device=device)
    with pytest.raises(IndexError, match=r"cross_entropy: target 7 .*out of range for 5 classes"):
        ops.cross_entropy(logits, ids([0, 7, -100], device)).item()
    with pytest.raises(IndexError, match=r"cross_entropy: target -2 .*ignore_index -100"):
        ops.linear_cross_entropy(xtrain.tensor(randn(3, 4), device=device), xtrain.tensor(randn(5, 4), device=device),
                                 ids([-2, 0, 1], device))[0].item()
    want = ops.cross_entropy(xtrain.tensor(randn(3, 5)), ids([0, 4, -100], "cpu")).item()
    assert abs(ops.cross_entropy(logits, ids([0, 4, -100], device)).item() - want) < 1e-5


def test_cpu_raises_in_the_op_itself():
    table = xtrain.tensor(randn(5, 4))
    with pytest.raises(IndexError, match=r"got values in \[-1, 6\]"):
        ops.embedding(table, ids([6, -1], "cpu"))
    with pytest.raises(IndexError, match="target 5 at position 1"):
        ops.cross_entropy(xtrain.tensor(randn(2, 5)), ids([0, 5], "cpu"))


# ---------------------------------------------------------------- CUDA: checked on the device


@cuda_only
@pytest.mark.parametrize("id_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("row_dim", [4, 3])  # 16-byte rows and 12-byte rows: both gather widths
def test_cuda_embedding_bad_id_reads_nothing_and_is_reported_once(id_dtype, row_dim):
    table = xtrain.tensor(randn(5, row_dim), device=CUDA)
    out = ops.embedding(table, ids([1, 70000, -3, 4], CUDA, id_dtype))  # returns: no host sync here
    msg = pending_index_error()
    assert msg is not None and "embedding: ids must be in [0, 5)" in msg and "cuda:0" in msg
    assert ("got 70000" in msg) or ("got -3" in msg)
    assert pending_index_error() is None  # reported once, then cleared
    got = out.numpy()
    np.testing.assert_array_equal(got[[0, 3]], table.numpy()[[1, 4]])
    np.testing.assert_array_equal(got[[1, 2]], np.zeros((2, row_dim), np.float32))


@cuda_only
def test_cuda_embedding_backward_skips_bad_ids_and_keeps_the_good_rows_exact():
    vocab, dim = 6, 8
    bad = np.array([2, 5, 9, 2, 0, -1, 5, 2])
    good = np.where((bad >= 0) & (bad < vocab), bad, -1)
    w = xtrain.tensor(randn(vocab, dim), dtype="float32", device=CUDA, requires_grad=True)
    dout = randn(len(bad), dim, seed=1)
    ops.embedding(w, ids(bad, CUDA)).backward_seeded(xtrain.tensor(dout, dtype="float32", device=CUDA))
    msg = pending_index_error()
    assert msg is not None and "ids must be in [0, 6)" in msg
    want = np.zeros((vocab, dim))
    for i, v in enumerate(good):
        if v >= 0:
            want[v] += dout[i].astype(np.float32)
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6, atol=1e-6)


@cuda_only
def test_cuda_cross_entropy_bad_target_gives_nan_and_a_zero_gradient_row():
    logits = xtrain.tensor(randn(3, 5), device=CUDA, requires_grad=True)
    loss = ops.cross_entropy(logits, ids([1, 5, 2], CUDA))
    loss.backward()
    msg = pending_index_error()
    assert msg is not None and "cross_entropy: target 5 is out of range for 5 classes" in msg
    assert np.isnan(loss.item())
    np.testing.assert_array_equal(logits.grad.numpy()[1], np.zeros(5, np.float32))


@cuda_only
def test_cuda_ignore_index_is_not_an_error():
    logits = xtrain.tensor(randn(4, 5), device=CUDA)
    ops.cross_entropy(logits, ids([-100, 3, -100, 0], CUDA)).item()
    ops.cross_entropy(logits, ids([7, 3, 7, 0], CUDA), ignore_index=7).item()
    assert pending_index_error() is None


@cuda_only
def test_cuda_ids_computed_written_or_shared_on_the_device_are_checked():
    table = xtrain.tensor(randn(5, 4), device=CUDA)
    ops.embedding(table, xtrain.arange(0, 6, dtype="int64", device=CUDA))  # computed on the device
    assert "got 5" in pending_index_error()
    t = ids([0, 1, 2], CUDA)
    t.fill_(8)  # written in place
    ops.embedding(table, t)
    assert "got 8" in pending_index_error()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = ids([0, 1, 2], CUDA)
    torch.from_dlpack(t)[1] = 11  # written behind xtrain's back
    torch.cuda.synchronize()
    ops.embedding(table, t)
    assert "got 11" in pending_index_error()


@cuda_only
def test_cuda_every_sync_point_reports():
    table = xtrain.tensor(randn(5, 4), device=CUDA)
    other = xtrain.ones(3, device=CUDA)
    for sync in (lambda: other.numpy(), lambda: other.sum().item(), lambda: other.to("cpu"),
                 lambda: xtrain.cuda.synchronize(CUDA)):
        ops.embedding(table, ids([6], CUDA))
        with pytest.raises(IndexError, match="embedding: ids must be in"):
            sync()
        sync()  # cleared
