"""ops.cast_many: one fused forward for a list of casts, bit-for-bit the same as ops.cast on each
tensor (values and gradients), one CastBackward node per output, nothing recorded under no_grad,
and bad inputs raising Python exceptions."""
import numpy as np
import pytest
import torch

import xtrain
from xtrain import ops

def bits(t):
    """The raw bits of a tensor as bytes (bf16 kept at 16 bits, NaN payloads included)."""
    w = torch.from_dlpack(t).cpu()
    ints = {torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
    return (w.view(ints[w.dtype]) if w.dtype in ints else w).numpy().tobytes()

# Odd element counts (a tail after the 16-byte packs, a chunk edge at 4096) and 2-D weights.
SHAPES = [(1,), (7,), (1023,), (4097,), (0,), (3, 5), (64, 48), (33, 129)]


def float32_bits(shape, seed):
    """float32 values from random bit patterns (NaNs, infinities, subnormals, bf16 rounding ties)
    mixed with ordinary normal samples."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    raw = rng.integers(0, 2 ** 32, size=n, dtype=np.uint32)
    raw[1::4] = (raw[1::4] & 0xFFFF0000) | 0x8000  # exact ties: round half to even
    raw[2::4] = rng.standard_normal(len(raw[2::4])).astype(np.float32).view(np.uint32)
    return raw.view(np.float32).reshape(shape)


def leaves(dtype, device, seed=0, shapes=SHAPES, requires_grad=True):
    out = []
    for i, shape in enumerate(shapes):
        a = float32_bits(shape, seed + i)
        if dtype == "bfloat16":  # bf16-representable values, NaNs included
            a = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)
        elif dtype == "float64":  # also beyond float32's range: overflow and underflow
            with np.errstate(all="ignore"):
                a = a.astype(np.float64)
                a[3::8] *= 1e300
                a[5::8] *= 1e-300
        out.append(xtrain.tensor(a, dtype=dtype, device=device, requires_grad=requires_grad))
    return out


def seed_like(t, seed):
    a = np.random.default_rng(seed).standard_normal(t.shape)
    return xtrain.tensor(a, dtype=t.dtype, device=t.device)


@pytest.mark.parametrize("src,dst", [("float32", "bfloat16"), ("bfloat16", "float32"), ("float32", "float64"),
                                     ("float64", "float32"), ("float64", "bfloat16"), ("bfloat16", "float64")])
def test_values_and_grads_match_per_tensor_cast(src, dst, device):
    xs = leaves(src, device, seed=10)
    ys = leaves(src, device, seed=10)  # the same values, separate leaves for the per-tensor path
    outs = ops.cast_many(xs, dst)
    refs = [ops.cast(y, dst) for y in ys]
    assert len(outs) == len(xs)
    for i, (o, r, x) in enumerate(zip(outs, refs, xs)):
        assert o.dtype == dst and o.shape == x.shape and o.device == x.device, i
        assert not o.same_storage(x), i
        assert bits(o) == bits(r), f"value of output {i}"
        assert o.grad_fn == "CastBackward" and o.requires_grad, i
    for i, (o, r) in enumerate(zip(outs, refs)):
        o.backward_seeded(seed_like(o, 100 + i))
        r.backward_seeded(seed_like(r, 100 + i))
    for i, (x, y) in enumerate(zip(xs, ys)):
        assert x.grad is not None and x.grad.dtype == src, i
        assert bits(x.grad) == bits(y.grad), f"grad of input {i}"


def test_values_match_torch_rounding(device):
    """float32 -> bfloat16 rounds to nearest even, like torch (NaNs left out: payloads may differ)."""
    a = float32_bits((4097,), seed=3)
    a = a[np.isfinite(a)]
    (o,) = ops.cast_many([xtrain.tensor(a, device=device)], "bfloat16")
    assert bits(o) == torch.from_numpy(a.copy()).bfloat16().view(torch.int16).numpy().tobytes()


def test_mixed_list_keeps_already_converted_tensors(device):
    f32 = leaves("float32", device, seed=20, shapes=[(7,), (64, 48), (1023,)])
    b16 = leaves("bfloat16", device, seed=30, shapes=[(5,), (4097,)])
    f64 = leaves("float64", device, seed=40, shapes=[(9,)])
    xs = [f32[0], b16[0], f32[1], f64[0], b16[1], f32[2]]
    outs = ops.cast_many(xs, "bfloat16")
    for i, (x, o) in enumerate(zip(xs, outs)):
        assert o.dtype == "bfloat16", i
        if x.dtype == "bfloat16":  # returned as itself, like ops.cast
            assert o.same_storage(x) and o.is_leaf and o.grad_fn is None, i
        else:
            assert bits(o) == bits(ops.cast(x, "bfloat16")), i
            assert o.grad_fn == "CastBackward", i
    # gradients flow to the right leaf, in the leaf's own dtype
    for i, o in enumerate(outs):
        o.backward_seeded(seed_like(o, 200 + i))
    for i, x in enumerate(xs):
        expected = seed_like(outs[i], 200 + i)
        assert x.grad.dtype == x.dtype
        assert bits(x.grad) == bits(ops.cast(expected, x.dtype)), i


def test_each_output_has_its_own_node(device):
    """A weight's gradient is final when its own output's gradient arrives: the others do not
    hold it back (the data-parallel gradient-ready hook relies on this)."""
    xs = leaves("float32", device, seed=50, shapes=[(3, 5), (7,), (4,)])
    outs = ops.cast_many(xs, "bfloat16")
    outs[1].backward_seeded(seed_like(outs[1], 1))
    assert xs[0].grad is None and xs[2].grad is None
    assert bits(xs[1].grad) == bits(ops.cast(seed_like(outs[1], 1), "float32"))
    outs[0].backward_seeded(seed_like(outs[0], 2))
    assert xs[0].grad is not None and xs[2].grad is None


def test_repeated_tensor_accumulates(device):
    (x,) = leaves("float32", device, seed=60, shapes=[(6,)])
    a, b = ops.cast_many([x, x], "bfloat16")
    assert not a.same_storage(b)
    ops.sum(ops.add(ops.cast(a, "float32"), ops.cast(b, "float32"))).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full(6, 2.0, np.float32))


def test_through_a_loss_matches_per_tensor_cast(device):
    """A bf16 forward with the fp32 weights cast in one call: every weight gradient bit-equal."""
    rng = np.random.default_rng(7)
    shapes = [(16, 8), (16, 16), (4, 16)]
    ws_a = [xtrain.tensor(rng.standard_normal(s) * 0.3, device=device, requires_grad=True) for s in shapes]
    ws_b = [xtrain.tensor(w.numpy(), device=device, requires_grad=True) for w in ws_a]
    x = xtrain.tensor(rng.standard_normal((5, 8)), dtype="bfloat16", device=device)

    def loss(ws):
        h = x
        for w in ws:
            h = ops.linear(h, w)
        return ops.sum(ops.cast(h, "float32"))

    loss(ops.cast_many(ws_a, "bfloat16")).backward()
    loss([ops.cast(w, "bfloat16") for w in ws_b]).backward()
    for i, (a, b) in enumerate(zip(ws_a, ws_b)):
        assert bits(a.grad) == bits(b.grad), i


def test_many_tensors(device):
    """More tensors than one CUDA launch takes (512), with sizes around the chunk size."""
    rng = np.random.default_rng(8)
    sizes = [int(s) for s in rng.integers(0, 5000, size=600)]
    xs = [xtrain.tensor(rng.standard_normal(n).astype(np.float32), device=device) for n in sizes]
    outs = ops.cast_many(xs, "bfloat16")
    for i, (x, o) in enumerate(zip(xs, outs)):
        assert bits(o) == bits(ops.cast(x, "bfloat16")), i


def test_unaligned_views(device):
    """Tensors that start off the 16-byte grid (DLPack views of a sliced torch tensor) take the
    one-element path and give the same bits."""
    base = torch.from_numpy(float32_bits((4200,), seed=9)).to(device)
    xs = [xtrain.from_dlpack(base[k:k + 4097]) for k in (0, 1, 2, 3)]
    outs = ops.cast_many(xs, "bfloat16")
    for i, (x, o) in enumerate(zip(xs, outs)):
        assert bits(o) == bits(ops.cast(x, "bfloat16")), i
    outs = ops.cast_many([ops.cast(x, "bfloat16") for x in xs], "float32")
    for i, (x, o) in enumerate(zip(xs, outs)):
        assert bits(o) == bits(ops.cast(ops.cast(x, "bfloat16"), "float32")), i


def test_integer_casts_without_grad(device):
    xs = [xtrain.tensor(np.array([1.5, -2.25, 3e4, 7.0]), device=device), xtrain.tensor([4, 5, -6], device=device)]
    outs = ops.cast_many(xs, "int32")
    assert [o.dtype for o in outs] == ["int32", "int32"]
    for x, o in zip(xs, outs):
        np.testing.assert_array_equal(o.numpy(), ops.cast(x, "int32").numpy())
    back = ops.cast_many(outs, "float32")
    np.testing.assert_array_equal(back[1].numpy(), np.array([4, 5, -6], np.float32))


def test_no_grad_records_nothing(device):
    xs = leaves("float32", device, seed=70, shapes=[(3, 5), (7,)])
    with xtrain.no_grad():
        outs = ops.cast_many(xs, "bfloat16")
    for o in outs:
        assert o.grad_fn is None and not o.requires_grad and o.is_leaf
    outs = ops.cast_many(leaves("float32", device, seed=70, shapes=[(3,)], requires_grad=False), "bfloat16")
    assert outs[0].grad_fn is None and not outs[0].requires_grad


def test_empty_list_and_no_dtype(device):
    assert ops.cast_many([], "bfloat16") == []
    (x,) = leaves("float32", device, seed=80, shapes=[(4,)])
    (same,) = ops.cast_many([x], None)  # like ops.cast(x, None): the tensor itself
    assert same.same_storage(x) and same.is_leaf
    (same,) = ops.cast_many((x,), "float32")  # any sequence
    assert same.same_storage(x) and same.grad_fn is None


def test_bad_inputs(device):
    x = xtrain.tensor(np.ones(3, np.float32), device=device, requires_grad=True)
    with pytest.raises(TypeError, match="requires grad can only be cast to a floating dtype.*int32.*tensors\\[1\\]"):
        ops.cast_many([xtrain.tensor(np.ones(2, np.float32), device=device), x], "int32")
    assert x.grad_fn is None
    with pytest.raises(TypeError):
        ops.cast_many([x, 3.0], "bfloat16")
    with pytest.raises(TypeError):
        ops.cast_many([x, None], "bfloat16")
    with pytest.raises(TypeError):
        ops.cast_many(x, "bfloat16")
    with pytest.raises(TypeError, match="dtype must be a string"):
        ops.cast_many([x], 16)
    with pytest.raises(ValueError):
        ops.cast_many([x], "float16")
    with xtrain.no_grad():  # like ops.cast: the floating-only rule is about recording a gradient
        (i,) = ops.cast_many([x], "int64")
    assert i.dtype == "int64"


@pytest.mark.skipif(not xtrain.cuda.is_available(), reason="mixing devices needs a GPU")
def test_mixed_devices_raise():
    a = xtrain.tensor(np.ones(3, np.float32), device="cuda")
    b = xtrain.tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"tensors\[2\].*on cuda:0.*one device"):
        ops.cast_many([a, a, b], "bfloat16")
    with pytest.raises(ValueError, match=r"tensors\[1\].*one device"):
        ops.cast_many([b, a], "bfloat16")
