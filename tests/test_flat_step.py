"""Flat buffers for data-parallel training: grad buffers (backward writes a leaf's gradient into
its slot of one flat buffer; a cast's backward writes it there directly), moving tensors into
flat memory, and xtrain.distributed.DataParallelAdamW (unsharded and ZeRO-1 sharded) against the
plain AdamW step on the averaged gradients, on the CPU with stand-in collectives. The NCCL
collectives themselves run in tests/test_distributed.py on two GPUs."""
import threading

import numpy as np
import pytest

import xtrain
from xtrain import distributed, ops
from xtrain.distributed import DataParallelAdamW, RankContext
from xtrain.models import TinyTransformer, TransformerConfig
from xtrain.optim import AdamW, clip_grad_norm_


def _leaf(a, device, dtype="float32"):
    return xtrain.tensor(np.asarray(a, np.float32), dtype=dtype, device=device, requires_grad=True)


def _buffer_for(t, extra=5):
    """A flat zero buffer with `t`'s slot at an offset (as DataParallelAdamW lays them out)."""
    flat = xtrain.zeros((t.numel() + 2 * extra,), dtype=t.dtype, device=t.device)
    return flat, flat._storage_view(extra, tuple(t.shape))


def _reference_grad(a, loss_fn, device):
    w = _leaf(a, device)
    loss_fn(w).backward()
    return w.grad.numpy()


def _cast_loss(w):
    return ops.sum(ops.cast(ops.scale(ops.cast(w, "bfloat16"), 3.0), "float32"))


def test_cast_backward_writes_into_the_grad_buffer(device):
    a = np.random.default_rng(0).standard_normal((6, 7))
    w = _leaf(a, device)
    flat, slot = _buffer_for(w)
    w._grad_buffer = slot
    _cast_loss(w).backward()
    assert w.grad.data_ptr() == slot.data_ptr()  # the buffer itself, no copy
    np.testing.assert_array_equal(w.grad.numpy(), _reference_grad(a, _cast_loss, device))
    f = flat.numpy()
    assert not f[:5].any() and not f[-5:].any()  # nothing outside the slot


@pytest.mark.parametrize("case", ["tied", "cast_twice", "no_cast", "accumulate"])
def test_grad_buffer_gets_the_same_gradient_as_without(case, device):
    a = np.random.default_rng(1).standard_normal((4, 5))
    loss_fn = {
        # a cast and a direct use: the engine sums two gradients, then they go into the buffer
        "tied": lambda w: ops.add(_cast_loss(w), ops.sum(ops.scale(w, 2.0))),
        # two casts of one leaf: only one may write the buffer, the other gets fresh memory
        "cast_twice": lambda w: ops.add(_cast_loss(w), _cast_loss(ops.scale(w, 0.5))),
        # a float32 gradient with no cast: copied into the buffer
        "no_cast": lambda w: ops.sum(ops.scale(w, 0.5)),
        "accumulate": _cast_loss,
    }[case]
    w = _leaf(a, device)
    _, slot = _buffer_for(w)
    w._grad_buffer = slot
    loss_fn(w).backward()
    want = _reference_grad(a, loss_fn, device)
    if case == "accumulate":  # a second backward without zeroing adds into the buffer
        loss_fn(w).backward()
        want = want + want
    assert w.grad.data_ptr() == slot.data_ptr()
    np.testing.assert_array_equal(w.grad.numpy(), want)
    w.grad = None  # the next backward writes the buffer afresh
    loss_fn(w).backward()
    np.testing.assert_array_equal(w.grad.numpy(), _reference_grad(a, loss_fn, device))


def test_grad_buffer_and_views_reject_bad_input(device):
    w = _leaf(np.ones((2, 3)), device)
    with pytest.raises(ValueError, match="must match"):
        w._grad_buffer = xtrain.zeros((3, 2), device=device)
    with pytest.raises(ValueError, match="must match"):
        w._grad_buffer = xtrain.zeros((2, 3), dtype="bfloat16", device=device)
    with pytest.raises(ValueError, match="only a leaf"):
        xtrain.zeros((2, 3), device=device)._grad_buffer = xtrain.zeros((2, 3), device=device)
    with pytest.raises(TypeError):
        w._grad_buffer = "buffer"
    flat = xtrain.zeros((10,), device=device)
    with pytest.raises(ValueError, match="do not fit"):
        flat._storage_view(8, (3,))
    with pytest.raises(ValueError, match="do not fit"):
        flat._storage_view(-1, (2,))
    with pytest.raises(ValueError, match="negative"):
        flat._storage_view(0, (-1,))
    with pytest.raises(ValueError, match="does not match"):
        w._move_into(flat._storage_view(0, (3, 2)))
    w._grad_buffer = flat._storage_view(2, (2, 3))
    assert w._grad_buffer.data_ptr() == flat._storage_view(2, (1,)).data_ptr()
    w._grad_buffer = None
    assert w._grad_buffer is None


def test_move_into_keeps_values_and_every_holder_follows(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = _leaf(a, device)
    holders = [w]  # a module or an optimizer holding the tensor
    flat = xtrain.zeros((20,), device=device)
    dst = flat._storage_view(4, (3, 4))
    w._move_into(dst)
    assert holders[0].data_ptr() == dst.data_ptr()
    np.testing.assert_array_equal(flat.numpy()[4:16], a.ravel())
    w.fill_(7.0)  # writes through to the flat buffer
    assert (flat.numpy()[4:16] == 7).all() and not flat.numpy()[:4].any()
    assert w.requires_grad and w.is_leaf


# ---------------------------------------------------------------- DataParallelAdamW on stand-ins

class _Collectives:
    """NCCL's in-place collectives for CPU tensors, between threads (average: sum / ranks)."""

    def __init__(self, world):
        self.world, self.barrier, self.slots = world, threading.Barrier(world, timeout=30), {}

    def _gather(self, rank, key, value):
        self.slots[(key, rank)] = value
        self.barrier.wait()
        out = [self.slots[(key, r)] for r in range(self.world)]
        self.barrier.wait()
        return out

    def rank(self, r):
        return _RankCollectives(self, r)


class _RankCollectives:
    def __init__(self, shared, rank):
        self.shared, self.rank, self.calls = shared, rank, []

    def _reduce(self, arrays, op):
        total = np.sum(np.stack(arrays), axis=0, dtype=np.float32)
        return total / np.float32(len(arrays)) if op == "avg" else total

    def all_reduce(self, tensors, op="avg"):
        self.calls.append("all_reduce")
        for i, t in enumerate(tensors):
            t.numpy()[...] = self._reduce(self.shared._gather(self.rank, ("ar", i), t.numpy().copy()), op)

    def reduce_scatter(self, flats, op="avg", extra=()):
        self.calls.append("reduce_scatter")
        for k, flat in enumerate(_listed(flats)):
            n = flat.numel() // self.shared.world
            mine = slice(self.rank * n, (self.rank + 1) * n)
            parts = self.shared._gather(self.rank, ("rs", k), flat.numpy().copy())
            flat.numpy()[mine] = self._reduce([p[mine] for p in parts], op)
        for i, t in enumerate(extra):
            t.numpy()[...] = self._reduce(self.shared._gather(self.rank, ("rsx", i), t.numpy().copy()), op)

    def all_gather(self, flats):
        self.calls.append("all_gather")
        for k, flat in enumerate(_listed(flats)):
            n = flat.numel() // self.shared.world
            host = flat.numpy()  # float32: the memory itself; bf16: a float32 copy (exact)
            parts = self.shared._gather(self.rank, ("ag", k), host.copy())
            for r, p in enumerate(parts):
                host[r * n:(r + 1) * n] = p[r * n:(r + 1) * n]
            if flat.dtype == "bfloat16":  # no shared numpy view of bf16: write back through a cast
                flat.copy_(xtrain.tensor(host, dtype="bfloat16"))


def _listed(flats):
    return [flats] if isinstance(flats, xtrain.Tensor) else list(flats)



SMALL = dict(vocab_size=96, dim=32, n_layers=2, n_heads=2, head_dim=16, ffn_dim=80, max_seq=16)
B, S, STEPS = 3, 8, 4


def _batches(world, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, SMALL["vocab_size"], size=(world * B, S + 1)) for _ in range(STEPS)]


def _run_ranks(world, fn):
    shared = _Collectives(world)
    results, errors = [None] * world, []

    def main(rank):
        try:
            ctx = RankContext(rank, world, "cpu", shared.rank(rank), None)
            results[rank] = fn(ctx)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            shared.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def _train_dp(world, shard, clip, bf16=False):
    config = TransformerConfig(**SMALL, bf16=bf16)
    batches = _batches(world)

    def fn(ctx):
        model = TinyTransformer(config, device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
        dp = DataParallelAdamW(opt, ctx, shard=shard, model=model)
        assert (dp.model is not None) == (shard and bf16)  # bf16 copies gathered: the cast cache
        losses, norms = [], []
        for w in batches:
            w = w[ctx.rank * B:(ctx.rank + 1) * B]
            _, loss = model(w[:, :-1], w[:, 1:])
            loss.backward()
            loss = loss.detach()
            norms.append(dp.step(clip, extra=[loss]).item())
            losses.append(loss.item())
        dp.gather_state()
        state = opt.state_dict()
        return (np.array(losses), np.array(norms), {n: p.numpy().copy() for n, p in model.named_parameters()},
                {k: {n: t.numpy().copy() for n, t in state[k].items()} for k in ("exp_avg", "exp_avg_sq")},
                ctx.comm.calls)

    return _run_ranks(world, fn)


def _train_reference(world, clip, bf16=False):
    """One model; each step the ranks' gradients are computed one after another and averaged in
    numpy the way the stand-in collectives do, then the usual clip and AdamW."""
    config = TransformerConfig(**SMALL, bf16=bf16)
    model = TinyTransformer(config, device="cpu", seed=0)
    params = model.parameters()
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    losses, norms = [], []
    for w in _batches(world):
        grads, step_losses = [], []
        for r in range(world):
            part = w[r * B:(r + 1) * B]
            _, loss = model(part[:, :-1], part[:, 1:])
            loss.backward()
            grads.append([p.grad.numpy().copy() for p in params])
            step_losses.append(loss.item())
            opt.zero_grad()
        for i, p in enumerate(params):
            total = np.sum(np.stack([g[i] for g in grads]), axis=0, dtype=np.float32)
            p.grad = xtrain.tensor(total / np.float32(world))
        norms.append(clip_grad_norm_(params, clip).item())
        opt.step()
        opt.zero_grad()
        losses.append(np.float32(np.sum(np.float32(step_losses), dtype=np.float32) / np.float32(world)))
    state = opt.state_dict()
    return (np.array(losses), np.array(norms), {n: p.numpy() for n, p in model.named_parameters()},
            {k: {n: t.numpy() for n, t in state[k].items()} for k in ("exp_avg", "exp_avg_sq")})


@pytest.mark.parametrize("shard", [True, False], ids=["sharded", "all-reduce"])
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_data_parallel_adamw_matches_adamw_on_the_averaged_gradients(shard, bf16):
    """No clipping (max_norm above the norm): every element takes the same arithmetic as the
    plain step on the averaged gradient, so parameters and moments match bit for bit."""
    ref_losses, ref_norms, ref_params, ref_state = _train_reference(2, clip=1e6, bf16=bf16)
    results = _train_dp(2, shard, clip=1e6, bf16=bf16)
    for losses, norms, params, state, calls in results:
        np.testing.assert_array_equal(losses, ref_losses)
        np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
        for name, want in ref_params.items():
            np.testing.assert_array_equal(params[name], want, err_msg=name)
        for key in state:
            for name, want in ref_state[key].items():
                np.testing.assert_array_equal(state[key][name], want, err_msg=f"{key} {name}")
        if shard:  # one reduce-scatter, one scalar all-reduce, one all-gather per step (+ 1 at the end)
            assert calls == ["reduce_scatter", "all_reduce", "all_gather"] * STEPS + ["all_gather"]
        else:
            assert calls == ["all_reduce"] * STEPS


def test_sharded_step_with_active_clipping_stays_within_rounding():
    ref_losses, ref_norms, ref_params, _ = _train_reference(2, clip=0.05)
    assert ref_norms.min() > 0.05  # clipping acts on every step
    (losses, norms, params, _, _), (_, _, params1, _, _) = _train_dp(2, shard=True, clip=0.05)
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name, want in ref_params.items():
        np.testing.assert_allclose(params[name], want, rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(params1[name], params[name], err_msg=name)  # ranks agree exactly


def test_three_ranks_with_uneven_chunks():
    """Chunk edges fall inside parameters; the padded flat length divides by the ranks."""
    ref_losses, _, ref_params, _ = _train_reference(3, clip=1e6)
    results = _train_dp(3, shard=True, clip=1e6)
    for losses, _, params, _, _ in results:
        np.testing.assert_array_equal(losses, ref_losses)
        for name, want in ref_params.items():
            np.testing.assert_array_equal(params[name], want, err_msg=name)


def test_layout_and_errors():
    def fn(ctx):
        model = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=0)
        before = {n: p.numpy().copy() for n, p in model.named_parameters()}
        opt = AdamW(model.named_parameters(), lr=1e-2)
        dp = DataParallelAdamW(opt, ctx)
        assert dp.numel % (ctx.world_size * distributed.FLAT_ALIGN) == 0
        for (name, p), off in zip(model.named_parameters(), dp.offsets):
            assert off % distributed.FLAT_ALIGN == 0
            assert p.data_ptr() == dp.flat_params._storage_view(off, (1,)).data_ptr()
            np.testing.assert_array_equal(p.numpy(), before[name])  # moved, values kept
        x = np.zeros((B, S), np.int64)
        _, loss = model(x, x)
        loss.backward()
        model.parameters()[0].grad = None  # a parameter without a gradient
        with pytest.raises(ValueError, match="has no gradient on rank"):
            dp.step(1.0)
        return True

    assert _run_ranks(2, fn) == [True, True]


def test_optimizer_state_loaded_after_construction_is_adopted():
    """load_state_dict replaces the moment tensors; the next step moves them into the flat
    buffers and the run continues as if they had been there."""
    def fn(ctx):
        model = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        dp = DataParallelAdamW(opt, ctx)
        state = opt.state_dict()
        loaded = {k: {n: np.full(t.shape, 0.5, np.float32) for n, t in state[k].items()}
                  for k in ("exp_avg", "exp_avg_sq")}
        opt.load_state_dict({**loaded, "step": 3, "hyper": opt.hyper()})
        x = np.ones((B, S), np.int64)
        _, loss = model(x, x)
        loss.backward()
        dp.step(1.0)
        dp.gather_state()
        m = opt.state_dict()["exp_avg"]
        return {n: t.numpy().copy() for n, t in m.items()}, [t.data_ptr() for t in opt.exp_avg]

    (m0, ptr0), (m1, _) = _run_ranks(2, fn)
    for name in m0:
        np.testing.assert_array_equal(m0[name], m1[name])
        assert not np.allclose(m0[name], 0.5), name  # updated from the loaded 0.5
    assert len(set(ptr0)) == len(ptr0)


def test_cast_cache_gives_the_forward_of_the_cast_weights():
    """With a bf16 model the ranks gather bf16 copies of the weights; the forward takes them
    instead of casting. Its loss and gradients must be those of casting the gathered float32
    weights (refresh() goes back to casting)."""
    config = TransformerConfig(**SMALL, bf16=True)
    w = _batches(2)[0]

    def fn(ctx):
        model = TinyTransformer(config, device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        dp = DataParallelAdamW(opt, ctx, model=model)
        assert model._cast_cache() is None  # nothing gathered yet: the forward casts
        part = w[ctx.rank * B:(ctx.rank + 1) * B]
        _, loss = model(part[:, :-1], part[:, 1:])
        loss.backward()
        dp.step(1.0)
        cached = model._cast_cache()
        assert len(cached) == len(model.cast_parameters()) and cached[0].dtype == "bfloat16"
        _, with_cache = model(part[:, :-1], part[:, 1:])
        with_cache.backward()
        g_cache = [p.grad.numpy().copy() for p in model.parameters()]
        opt.zero_grad()
        dp.gather_state()  # the float32 weights complete, then cast by the forward itself
        dp.refresh()
        assert model._cast_cache() is None
        _, cast = model(part[:, :-1], part[:, 1:])
        cast.backward()
        assert with_cache.item() == cast.item()
        for a, p in zip(g_cache, model.parameters()):
            np.testing.assert_array_equal(a, p.grad.numpy())
        with pytest.raises(ValueError, match="not a cast"):
            ops.cast_many(model.cast_parameters()[:1], "bfloat16", cached=[xtrain.zeros((1,), dtype="bfloat16")])
        with pytest.raises(ValueError, match="cached casts"):
            ops.cast_many(model.cast_parameters()[:2], "bfloat16", cached=cached[:1])
        with pytest.raises(ValueError, match="not of dtype"):
            ops.cast_many(model.cast_parameters()[:1], "float64", cached=cached[:1])
        dp.release()
        assert model._cast_cache is None and all(p._grad_buffer is None for p in model.parameters())
        return True

    assert _run_ranks(2, fn) == [True, True]
