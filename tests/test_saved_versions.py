"""Saved-tensor versions: every in-place write through the engine bumps the version counter of the
tensor's storage (shared by views, exposed read-only as Tensor._version), and backward raises a
RuntimeError naming the node and the tensor when a tensor it saved was written in place after it
was saved (checkpointed segments included). Out-of-place results leave versions alone."""
import numpy as np
import pytest

import xtrain
from xtrain import ops

MODIFIED = "modified by an in-place operation"


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def leaf(*shape, seed=0, device="cpu", requires_grad=True):
    return xtrain.tensor(randn(*shape, seed=seed), dtype="float32", device=device, requires_grad=requires_grad)


# ---------------------------------------------------------------- the counter


def test_in_place_writes_bump_the_version_and_views_share_it(device):
    x = leaf(2, 3, device=device, requires_grad=False)
    view = ops.reshape(x, (6,))
    alias = x.detach()
    assert x._version == 0
    x.zero_()
    assert (x._version, view._version, alias._version) == (1, 1, 1)
    view.fill_(2.0)
    x.copy_(xtrain.ones(2, 3, device=device))
    assert (x._version, view._version, alias._version) == (3, 3, 3)


def test_out_of_place_results_leave_versions_alone(device):
    x, w = leaf(4, device=device), leaf(4, seed=1, device=device)
    y = ops.exp(ops.mul(x, w)) + 1.0
    z = ops.cast(y, "bfloat16")
    y.sum().backward()
    assert (x._version, w._version, y._version, z._version) == (0, 0, 0, 0)
    assert x.grad._version == 0  # the first gradient is taken over, not copied in


def test_gradient_accumulation_bumps_the_grad(device):
    x = leaf(3, device=device)
    ops.mul_scalar(x, 2.0).sum().backward()
    before = x.grad._version
    ops.mul_scalar(x, 2.0).sum().backward()  # += into the existing .grad
    assert x.grad._version == before + 1


def test_optimizer_kernels_bump_what_they_update(device):
    p = [leaf(5, device=device, requires_grad=False), leaf(2, 2, seed=1, device=device, requires_grad=False)]
    g = [leaf(5, seed=2, device=device, requires_grad=False), leaf(2, 2, seed=3, device=device, requires_grad=False)]
    m = [xtrain.zeros(5, device=device), xtrain.zeros(2, 2, device=device)]
    v = [xtrain.zeros(5, device=device), xtrain.zeros(2, 2, device=device)]
    xtrain._C.optim.adamw_step(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1)
    assert [t._version for t in p + m + v] == [1] * 6
    assert [t._version for t in g] == [0, 0]  # read only
    norm = xtrain._C.optim.global_norm(g)
    xtrain._C.optim.clip_by_norm_(g, norm, 0.5)
    assert [t._version for t in g] == [1, 1] and norm._version == 0


def test_version_is_read_only():
    x = leaf(2)
    with pytest.raises(AttributeError):
        x._version = 5


# ---------------------------------------------------------------- backward refuses stale saved tensors


def test_mul_then_zero_the_other_input_raises(device):
    # The reproduction: without the check x.grad silently came out all zeros.
    x, w = leaf(3, device=device), leaf(3, seed=1, device=device)
    y = ops.mul(x, w)
    w.zero_()
    with pytest.raises(RuntimeError, match=MODIFIED) as err:
        y.sum().backward()
    msg = str(err.value)
    assert "MulBackward" in msg and "'b'" in msg and "version 1" in msg and "expected version 0" in msg
    assert x.grad is None


def test_a_write_to_a_saved_input_that_needs_no_grad_raises(device):
    x = leaf(3, device=device)
    w = leaf(3, seed=1, device=device, requires_grad=False)  # d(x*w)/dx needs w's values
    y = ops.mul(x, w)
    w.fill_(3.0)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()


def test_a_write_through_a_view_of_a_saved_tensor_raises(device):
    x, w = leaf(2, 3, device=device), leaf(3, 4, seed=1, device=device)
    y = ops.matmul(x, w)
    ops.reshape(w, (12,)).copy_(xtrain.zeros(12, device=device))
    with pytest.raises(RuntimeError, match=r"MatmulBackward's saved tensor 'b'"):
        y.sum().backward()


def test_a_write_to_a_saved_output_raises(device):
    x = leaf(4, device=device)
    y = ops.exp(x)  # exp's backward reads its own output
    z = ops.mul_scalar(y, 2.0)
    y.zero_()
    with pytest.raises(RuntimeError, match=r"ExpBackward's saved tensor 'result'"):
        z.sum().backward()


def test_writes_to_tensors_no_node_saved_are_fine(device):
    x, w = leaf(3, device=device), leaf(3, seed=1, device=device)
    y = ops.add(x, w)  # add saves nothing
    w.zero_()
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.ones(3, np.float32))


def test_writes_after_backward_are_fine_and_the_process_keeps_working(device):
    x, w = leaf(3, device=device), leaf(3, seed=1, device=device)
    y = ops.mul(x, w)
    w.zero_()
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.sum().backward()
    y = ops.mul(x, w)  # a new graph sees w as it is now
    y.sum().backward()
    w.fill_(5.0)  # after backward: nothing left to check
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros(3, np.float32))


def test_an_optimizer_step_between_forward_and_backward_raises(device):
    x = leaf(2, 4, device=device)
    w = leaf(3, 4, seed=1, device=device)
    y = ops.linear(x, w)
    g, m, v = xtrain.ones(3, 4, device=device), xtrain.zeros(3, 4, device=device), xtrain.zeros(3, 4, device=device)
    xtrain._C.optim.adamw_step([w.detach()], [g], [m], [v], 1e-3, 0.9, 0.95, 1e-8, 0.0, 1)
    with pytest.raises(RuntimeError, match=r"LinearBackward's saved tensor 'weight'"):
        y.sum().backward()


def test_checkpointed_segment_with_a_parameter_written_in_place_raises(device):
    x, w = leaf(4, 8, device=device), leaf(8, 8, seed=1, device=device)

    def segment(x, params):
        return ops.silu(ops.linear(x, params[0]))

    out = xtrain.checkpoint(segment, x, [w])
    w.zero_()  # the recompute would see zeros instead of the forward's weights
    with pytest.raises(RuntimeError, match=r"CheckpointBackward's saved tensor 'params\[0\]'"):
        out.sum().backward()


def test_checkpointed_segment_with_its_input_written_in_place_raises(device):
    x, w = leaf(4, 8, device=device), leaf(8, 8, seed=1, device=device)
    out = xtrain.checkpoint(lambda x, p: ops.linear(x, p[0]), x, [w])
    x.fill_(1.0)
    with pytest.raises(RuntimeError, match=r"CheckpointBackward's saved tensor 'x'"):
        out.sum().backward()


def test_checkpointed_segment_unchanged_inputs_backward_as_before(device):
    x, w = leaf(4, 8, device=device), leaf(8, 8, seed=1, device=device)
    out = xtrain.checkpoint(lambda x, p: ops.silu(ops.linear(x, p[0])), x, [w])
    out.sum().backward()
    x2, w2 = leaf(4, 8, device=device), leaf(8, 8, seed=1, device=device)
    ops.silu(ops.linear(x2, w2)).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), w2.grad.numpy())


def test_dlpack_writes_are_not_counted():
    """Writes through another library's view of the memory are out of the engine's reach: the
    version stays (documented in docs/tape.md), exactly as PyTorch's does for numpy writes."""
    torch = pytest.importorskip("torch")
    x = leaf(3, requires_grad=False)
    shared = torch.from_dlpack(x)
    shared[0] = 7.0
    assert x._version == 0 and x.numpy()[0] == 7.0


@pytest.mark.cuda
@pytest.mark.skipif(not (xtrain.cuda.is_available() and xtrain._C.dist.is_available()),
                    reason="needs an NCCL build of xtrain and a GPU: runs on the GPU machine")
def test_collectives_bump_what_they_write():
    comm = xtrain._C.dist.Communicator([0])
    try:
        rank = comm.rank(0)
        t, extra = xtrain.ones(8, device="cuda:0"), xtrain.ones(1, device="cuda:0")
        rank.all_reduce([t], "avg")
        assert t._version == 1
        rank.broadcast([t], 0)
        rank.all_gather(t)
        rank.reduce_scatter(t, "sum", [extra])
        assert (t._version, extra._version) == (4, 1)
        rank.barrier()
    finally:
        comm.close()
