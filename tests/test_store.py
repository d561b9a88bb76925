"""The parameter store (xtrain.store): parameters, gradient slots, moments and bf16 compute copies
in flat buffers; gradient slots in the tape (_C.GradSlots: backward writes a leaf's gradient into
its slot of one flat buffer, a cast's backward directly); AdamW and clipping over the flats; and
xtrain.launch.distributed.DataParallelAdamW (unsharded and ZeRO-1 sharded) against the plain AdamW step
on the averaged gradients, on the CPU with stand-in collectives. The NCCL collectives themselves
run in tests/test_distributed.py on two GPUs."""

import numpy as np
import pytest

import xtrain
from cpu_collectives import ThreadCollectives, run_rank_threads
from xtrain import _C, ops, store as store_mod
from xtrain.io import state as state_mod
from xtrain.launch.distributed import DataParallelAdamW, RankContext
from xtrain.models import TinyTransformer, TransformerConfig
from xtrain.optim import AdamW, clip_grad_norm_

SMALL = dict(vocab_size=96, dim=32, n_layers=2, n_heads=2, head_dim=16, ffn_dim=80, max_seq=16)
B, S, STEPS = 3, 8, 4


def _leaf(a, device, dtype="float32"):
    return xtrain.tensor(np.asarray(a, np.float32), dtype=dtype, device=device, requires_grad=True)


def _buffer_for(t, extra=5):
    """A flat zero buffer with `t`'s slot at an offset (as the store lays them out)."""
    flat = xtrain.zeros((t.numel() + 2 * extra,), dtype=t.dtype, device=t.device)
    return flat, flat._storage_view(extra, tuple(t.shape))


def _reference_grad(a, loss_fn, device):
    w = _leaf(a, device)
    loss_fn(w).backward()
    return w.grad.numpy()


def _cast_loss(w):
    return ops.sum(ops.cast(ops.scale(ops.cast(w, "bfloat16"), 3.0), "float32"))


def _batch(seed=0):
    w = np.random.default_rng(seed).integers(0, SMALL["vocab_size"], size=(B, S + 1))
    return w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------- gradient slots (the tape)

def test_cast_backward_writes_into_the_slot(device):
    a = np.random.default_rng(0).standard_normal((6, 7))
    w = _leaf(a, device)
    flat, slot = _buffer_for(w)
    slots = _C.GradSlots([w], [slot])
    _cast_loss(w).backward()
    assert w.grad.data_ptr() == slot.data_ptr()  # the slot itself
    assert _C.last_backward_batched_casts() == 1  # converted at the end of the walk
    np.testing.assert_array_equal(w.grad.numpy(), _reference_grad(a, _cast_loss, device))
    f = flat.numpy()
    assert not f[:5].any() and not f[-5:].any()  # nothing outside the slot
    assert slots.sync() == [] and len(slots) == 1


@pytest.mark.parametrize("case", ["tied", "cast_twice", "no_cast", "accumulate"])
def test_slot_gets_the_same_gradient_as_without(case, device):
    a = np.random.default_rng(1).standard_normal((4, 5))
    loss_fn = {
        # a cast and a direct use: the engine sums two gradients, then they go into the slot
        "tied": lambda w: ops.add(_cast_loss(w), ops.sum(ops.scale(w, 2.0))),
        # two casts of one leaf: only one may write the slot, the other gets fresh memory
        "cast_twice": lambda w: ops.add(_cast_loss(w), _cast_loss(ops.scale(w, 0.5))),
        # a float32 gradient with no cast: copied into the slot
        "no_cast": lambda w: ops.sum(ops.scale(w, 0.5)),
        "accumulate": _cast_loss,
    }[case]
    w = _leaf(a, device)
    _, slot = _buffer_for(w)
    slots = _C.GradSlots([w], [slot])
    loss_fn(w).backward()
    # Note [Batched gradient casts]: only a sole producer's conversion waits for the end of the walk
    assert _C.last_backward_batched_casts() == (1 if case == "accumulate" else 0)
    want = _reference_grad(a, loss_fn, device)
    if case == "accumulate":  # a second backward without zeroing adds into the slot
        loss_fn(w).backward()
        assert _C.last_backward_batched_casts() == 0  # the slot holds a gradient: converted and added
        want = want + want
    assert w.grad.data_ptr() == slot.data_ptr()
    np.testing.assert_array_equal(w.grad.numpy(), want)
    slots.clear()  # the next backward writes the slot afresh
    assert w.grad is None
    loss_fn(w).backward()
    np.testing.assert_array_equal(w.grad.numpy(), _reference_grad(a, loss_fn, device))


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "recompute"])
def test_weight_gradients_are_converted_in_one_batch_unless_a_hook_reads_them(recompute):
    """Note [Batched gradient casts]: a bf16 model's backward converts every Linear weight's bf16
    gradient into float32 in one call at the end of the walk: into its slot (flat gradients) or
    into a fresh buffer that becomes its .grad (gradients of their own, the default); with
    gradients already set each is converted and added (tests/cpp/test_tape.cpp: with the
    gradient-ready hook of data parallelism each is converted on its own). The same bits every way."""
    config = TransformerConfig(**SMALL, bf16=True, recompute=recompute)
    x, y = _batch()
    linears = sum(s.region == 0 for s in TinyTransformer(config, device="cpu", seed=0).store.slots)
    grads = {}
    for flat in (True, False):
        model = TinyTransformer(config, device="cpu", seed=0)
        model.store.use_flat_grads(flat)
        _, loss = model(x, y)
        loss.backward()
        assert _C.last_backward_batched_casts() == linears
        grads[flat] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        _, loss = model(x, y)
        loss.backward()  # no zeroing: each converted and added
        assert _C.last_backward_batched_casts() == 0
        for n, p in model.named_parameters():
            np.testing.assert_array_equal(p.grad.numpy(), grads[flat][n] + grads[flat][n], err_msg=n)
    for n in grads[True]:
        np.testing.assert_array_equal(_bits(grads[False][n]), _bits(grads[True][n]), err_msg=n)


def test_slots_sync_copies_hand_made_grads_and_reports_missing(device):
    ws = [_leaf(np.ones((2, 3)), device), _leaf(np.ones((4,)), device)]
    flat = xtrain.zeros((16,), device=device)
    slots = _C.GradSlots(ws, [flat._storage_view(0, (2, 3)), flat._storage_view(8, (4,))])
    assert slots.sync() == [0, 1]
    ws[1].grad = xtrain.full((4,), 2.5, device=device)
    assert slots.sync() == [0]
    assert ws[1].grad.data_ptr() == flat._storage_view(8, (1,)).data_ptr()
    np.testing.assert_array_equal(flat.numpy()[8:12], 2.5)
    del slots  # the destinations go with the slots: gradients are plain tensors again
    ws[0].grad = None
    ops.sum(ws[0]).backward()
    assert ws[0].grad.data_ptr() != flat.data_ptr()


def test_slots_and_views_reject_bad_input(device):
    w = _leaf(np.ones((2, 3)), device)
    with pytest.raises(ValueError, match="does not match"):
        _C.GradSlots([w], [xtrain.zeros((3, 2), device=device)])
    with pytest.raises(ValueError, match="does not match"):
        _C.GradSlots([w], [xtrain.zeros((2, 3), dtype="bfloat16", device=device)])
    with pytest.raises(ValueError, match="leaf tensor that requires grad"):
        _C.GradSlots([xtrain.zeros((2, 3), device=device)], [xtrain.zeros((2, 3), device=device)])
    with pytest.raises(ValueError, match="1 leaves but 2 slots"):
        _C.GradSlots([w], [xtrain.zeros((2, 3), device=device)] * 2)
    flat = xtrain.zeros((10,), device=device)
    with pytest.raises(ValueError, match="do not fit"):
        flat._storage_view(8, (3,))
    with pytest.raises(ValueError, match="do not fit"):
        flat._storage_view(-1, (2,))
    with pytest.raises(ValueError, match="negative"):
        flat._storage_view(0, (-1,))


# ---------------------------------------------------------------- the store

def test_parameters_are_aligned_views_of_one_buffer(device):
    model = TinyTransformer(TransformerConfig(**SMALL), device=device, seed=0)
    store = model.store
    cpu = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=0)
    assert model.device == model.parameters()[0].device == store.params.device  # canonical ("cuda:0")
    assert [s.name for s in store.slots] == [n for n, _ in model.named_parameters()]
    for s, (name, p) in zip(store.slots, model.named_parameters()):
        assert s.offset % store_mod.ALIGN == 0
        assert p.data_ptr() == store.params._storage_view(s.offset, (1,)).data_ptr()
        assert p.is_leaf and p.requires_grad
        np.testing.assert_array_equal(p.numpy(), dict(cpu.named_parameters())[name].numpy())  # any device
    assert all(r.length % (store_mod.ALIGN * store_mod.SHARD_MULTIPLE) == 0 for r in store.regions)
    linear = {n for n, _ in model.named_parameters() if n.endswith("_proj.weight") or n == "lm_head.weight"}
    assert {s.name for s in store.slots if s.region == 0} == linear
    host = store.params.numpy()
    used = np.zeros(store.numel, bool)
    for s in store.slots:
        used[s.offset:s.offset + s.numel] = True
    assert not host[~used].any()  # gaps and padding hold zeros
    shapes = model.config.param_shapes()
    assert list(shapes) == [n for n, _ in model.named_parameters()]
    assert all(tuple(p.shape) == shapes[n] for n, p in model.named_parameters())


def test_gradients_land_in_the_flat_buffer(device):
    for bf16 in (False, True):
        model = TinyTransformer(TransformerConfig(**SMALL, bf16=bf16), device=device, seed=0)
        model.store.use_flat_grads()
        _, loss = model(*_batch())
        loss.backward()
        store = model.store
        assert store.sync_grads() == []
        flat = store.grads.numpy()
        for s, (name, p) in zip(store.slots, model.named_parameters()):
            assert p.grad.data_ptr() == store.grads._storage_view(s.offset, (1,)).data_ptr(), name
            np.testing.assert_array_equal(flat[s.offset:s.offset + s.numel].reshape(s.shape), p.grad.numpy())
        store.zero_grad()
        assert all(p.grad is None for p in model.parameters())


def test_gradients_of_their_own_by_default(device):
    """Note [Gradients without a flat buffer]: without flat gradients (the default) each gradient
    is a tensor of its own, allocated by backward and freed by zero_grad; the same bits as the
    flat buffer's. Switching either way keeps the gradients already set."""
    for bf16 in (False, True):
        flat = TinyTransformer(TransformerConfig(**SMALL, bf16=bf16), device=device, seed=0)
        flat.store.use_flat_grads()
        own = TinyTransformer(TransformerConfig(**SMALL, bf16=bf16), device=device, seed=0)
        store = own.store
        assert not store.flat_grads and store.grads is None
        for m in (flat, own):
            _, loss = m(*_batch())
            loss.backward()
        assert store.sync_grads() == [] and not store.flat_grads_ready()
        ptrs = {p.grad.data_ptr() for p in own.parameters()}
        assert len(ptrs) == len(own.parameters())
        lo, hi = store.params.data_ptr(), store.params.data_ptr() + 4 * store.numel
        assert not any(lo <= q < hi for q in ptrs)  # nothing in the store's buffers
        for (name, p), q in zip(own.named_parameters(), flat.parameters()):
            np.testing.assert_array_equal(_bits(p.grad.numpy()), _bits(q.grad.numpy()), err_msg=name)
        own.layers[0].mlp.up_proj.weight.grad = None
        assert store.sync_grads() == ["layers.0.mlp.up_proj.weight"]
        # to flat: the gradients set are copied into their slots at the next sync
        store.use_flat_grads()
        assert store.flat_grads and not store.flat_grads_ready()
        own.layers[0].mlp.up_proj.weight.grad = flat.layers[0].mlp.up_proj.weight.grad
        assert store.flat_grads_ready()
        for s, p in zip(store.slots, own.parameters()):
            assert p.grad.data_ptr() == store.grads._storage_view(s.offset, (1,)).data_ptr(), s.name
        store.use_flat_grads(False)
        assert store.grads is None and all(p.grad is not None for p in own.parameters())
        store.zero_grad()
        assert all(p.grad is None for p in own.parameters())


def test_gradients_of_their_own_leave_the_peak(device):
    """The allocator's peak over a step (forward, backward, clip + AdamW), counted from before the
    model exists, is lower without the flat buffer by the buffer less the gradients alive at the
    peak (here the activations dominate it and backward frees them as it makes the gradients).
    Tied to the CPU allocator's exact accounting."""
    if device != "cpu":
        pytest.skip("exact peak accounting on the CPU allocator")
    import gc
    config = TransformerConfig(**{**SMALL, "max_seq": 64}, bf16=True)
    ids = np.random.default_rng(0).integers(0, SMALL["vocab_size"], size=(16, 65))
    x, y = ids[:, :-1], ids[:, 1:]
    peaks, flat_bytes = {}, None
    for flat in (True, False):
        gc.collect()
        base = xtrain.memory_stats("cpu")["allocated_bytes.current"]
        model = TinyTransformer(config, device="cpu", seed=0)
        model.store.use_flat_grads(flat)
        opt = AdamW(model.named_parameters(), lr=1e-3)
        for _ in range(2):
            xtrain.reset_peak_memory_stats("cpu")
            before = xtrain.memory_stats("cpu")["allocated_bytes.current"]
            _, loss = model(x, y)
            loss.backward()
            opt.clip_and_step(1.0)
            opt.zero_grad()
            del loss
            assert xtrain.memory_stats("cpu")["allocated_bytes.current"] == before  # the gradients freed
            peaks[flat] = xtrain.memory_stats("cpu")["allocated_bytes.peak"] - base
        if flat:
            flat_bytes = model.store.grads.nbytes
        del model, opt
    grads = 4 * sum(int(np.prod(s)) for s in config.param_shapes().values())
    assert peaks[True] - peaks[False] >= flat_bytes - grads, (peaks, flat_bytes, grads)


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "own"])
def test_adamw_on_the_store_equals_adamw_on_separate_tensors(flat, device):
    """The flat step (one launch over whole ranges of the flats, a weight-decay flag per range)
    and the per-tensor step give the same bits, clipping included; so does the store's step on
    gradients of their own (flat=False, the default)."""
    model = TinyTransformer(TransformerConfig(**SMALL, bf16=True), device=device, seed=0)
    model.store.use_flat_grads(flat)
    plain = [xtrain.tensor(p.numpy(), device=device, requires_grad=True) for p in model.parameters()]
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    ref = AdamW(list(zip([n for n, _ in model.named_parameters()], plain)), lr=1e-2, weight_decay=0.1)
    assert opt.store is model.store and ref.store is None
    for step in range(3):
        _, loss = model(*_batch(step))
        loss.backward()
        for p, q in zip(model.parameters(), plain):
            q.grad = xtrain.tensor(p.grad.numpy(), device=device)
        n1, n2 = clip_grad_norm_(opt.params, 0.5), clip_grad_norm_(plain, 0.5)
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
        assert n1.item() == n2.item()
    for (name, p), q in zip(model.named_parameters(), plain):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    m1, v1 = opt.moment_arrays()
    m2, v2 = ref.moment_arrays()
    for name in m1:
        np.testing.assert_array_equal(m1[name], m2[name], err_msg=name)
        np.testing.assert_array_equal(v1[name], v2[name], err_msg=name)


def test_a_parameter_without_gradient_is_left_alone(device):
    """As in torch.optim.AdamW: a parameter whose .grad is None is not updated (nor its moments)."""
    model = TinyTransformer(TransformerConfig(**SMALL), device=device, seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    _, loss = model(*_batch())
    loss.backward()
    frozen = model.layers[0].self_attn.q_proj.weight
    before = frozen.numpy().copy()
    frozen.grad = None
    other = model.lm_head.weight.numpy().copy()
    opt.step()
    np.testing.assert_array_equal(frozen.numpy(), before)
    assert not np.array_equal(model.lm_head.weight.numpy(), other)
    assert not opt.moment_arrays()[0]["layers.0.self_attn.q_proj.weight"].any()


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "own"])
def test_zero_grad_without_none_accumulates_into_the_slots(flat, device):
    model = TinyTransformer(TransformerConfig(**SMALL), device=device, seed=0)
    model.store.use_flat_grads(flat)
    opt = AdamW(model.named_parameters(), lr=1e-2)
    _, loss = model(*_batch())
    loss.backward()
    once = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.numpy().any() for p in model.parameters())
    for _ in range(2):
        _, loss = model(*_batch())
        loss.backward()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), 2 * once[n], rtol=1e-6, atol=1e-7, err_msg=n)


def test_load_state_dict_and_to_go_through_the_store(device):
    model = TinyTransformer(TransformerConfig(**SMALL), device=device, seed=0)
    other = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=1)
    opt = AdamW(model.named_parameters(), lr=1e-2)
    params_before = model.parameters()
    model.load_state_dict(other.state_dict())
    assert all(a is b for a, b in zip(params_before, model.parameters()))  # values copied in place
    for (n, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)
    assert opt.store is model.store  # the optimizer built before still holds the parameters
    with pytest.raises(ValueError, match="shape mismatch"):
        model.load_state_dict({**other.state_dict(), "norm.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="parameter store of an enclosing model"):
        model.layers[0].to("float64")
    values = {n: p.numpy().copy() for n, p in model.named_parameters()}
    model.to("bfloat16")
    assert {p.dtype for p in model.parameters()} == {"bfloat16"} and model.store.params.dtype == "bfloat16"
    model.to(dtype="float32")
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), values[n], rtol=1e-2, atol=1e-6, err_msg=n)
        assert p.data_ptr() == model.store.params._storage_view(model.store.slots[model.store.index[n]].offset,
                                                                (1,)).data_ptr()
    _, loss = model(*_batch())
    loss.backward()
    assert model.store.sync_grads() == []


def test_bf16_copies_are_made_once_per_change_of_the_weights(device):
    model = TinyTransformer(TransformerConfig(**SMALL, bf16=True), device=device, seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-2)
    store = model.store
    _, loss = model(*_batch())
    casts = store.compute._version
    with xtrain.no_grad():
        model(*_batch(1))  # the weights did not change: no new cast
    assert store.compute._version == casts
    loss.backward()
    opt.step()
    opt.zero_grad()
    model(*_batch())  # AdamW wrote the weights: cast again
    assert store.compute._version == casts + 1
    w = model.layers[0].mlp.up_proj.weight
    w.fill_(0.5)  # any in-place write counts
    _, loss = model(*_batch())
    assert store.compute._version == casts + 2
    loss.backward()
    assert w.grad is not None and w.grad.dtype == "float32"


# ---------------------------------------------------------------- casts saved as their source

def _requested(device):
    return xtrain.memory_stats(device)["requested_bytes.current"] if device == "cpu" else None


@pytest.mark.parametrize("written", [False, True], ids=["as-cast", "written-in-place"])
def test_a_cast_saved_as_its_source_frees_its_memory_and_gives_the_same_gradients(written, device):
    """Note [Casts saved as their source]: linear keeps its bf16 weight for dx; a marked cast is
    kept as its float32 source instead, so dropping the cast frees it, and backward casts again
    (same bits). A cast written in place since is no longer the cast of its source: saved as
    usual (nothing freed), with the gradients of the written values."""
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((16, 64)), rng.standard_normal((48, 64))
    grads, freed = {}, {}
    for recast in (False, True):
        x, w = _leaf(x_np, device), _leaf(w_np, device)
        wb = ops.cast_many([w], "bfloat16", recast_saved=recast)[0]
        if written:
            with xtrain.no_grad():
                wb.fill_(0.25)
        y = ops.linear(ops.cast(x, "bfloat16"), wb)
        before = _requested(device)
        del wb
        freed[recast] = before - _requested(device) if device == "cpu" else None
        ops.sum(ops.cast(y, "float32")).backward()
        grads[recast] = (x.grad.numpy(), w.grad.numpy())
    for a, b in zip(grads[False], grads[True]):
        np.testing.assert_array_equal(a, b)
    if device == "cpu":
        assert freed == {False: 0, True: 0 if written else 48 * 64 * 2}


def test_a_cast_saved_as_its_source_checks_the_source_version(device):
    x, w = _leaf(np.ones((4, 8)), device), _leaf(np.ones((6, 8)), device)
    y = ops.linear(ops.cast(x, "bfloat16"), ops.cast_many([w], "bfloat16", recast_saved=True)[0])
    w.fill_(0.5)  # the float32 weight the cast would be made again from
    with pytest.raises(RuntimeError, match="saved as its cast's source"):
        ops.sum(ops.cast(y, "float32")).backward()
    with pytest.raises(ValueError, match="recast_saved needs the casts made here"):
        ops.cast_many([w], "bfloat16", cached=[ops.cast(w, "bfloat16")], recast_saved=True)
    store = TinyTransformer(TransformerConfig(**SMALL, bf16=True, lean_activations=True), device=device).store
    for bad in ("layers.0.mlp.nope.weight", "norm.weight"):  # unknown; not used in the compute dtype
        with pytest.raises(ValueError, match="not a weight used in the compute dtype"):
            store.cast_weights([bad])


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "recompute"])
def test_cast_on_use_is_bitwise_the_compute_copies_and_holds_none(recompute, device):
    """A lean model's store casts on use (each block's weights as the block runs, saved as their
    float32 sources): losses and weights bit for bit those of the flat compute copies over a few
    AdamW steps, with and without recompute; no flat copy while training, and on the CPU the
    step's peak is lower by the copies but for those of the head and of two blocks alive at once
    (recompute: a segment's re-run holds its block's casts made again).
    Generation makes the flat copies on first use and matches."""
    import gc
    config = TransformerConfig(**{**SMALL, "max_seq": 32}, bf16=True, lean_activations=True, recompute=recompute)
    ids = np.random.default_rng(0).integers(0, SMALL["vocab_size"], size=(4, 33))
    losses, weights, peaks, tokens = {}, {}, {}, {}
    for on_use in (True, False):
        gc.collect()
        base = xtrain.memory_stats(device)["requested_bytes.current"] if device == "cpu" else 0
        model = TinyTransformer(config, device=device, seed=0)
        if not on_use:
            model.store.use_compute_copies()
        assert model.store.cast_on_use == on_use and (model.store.compute is None) == on_use
        opt = AdamW(model.named_parameters(), lr=1e-2)
        if device == "cpu":
            xtrain.reset_peak_memory_stats("cpu")
        out = []
        for _ in range(3):
            _, loss = model(ids[:, :-1], ids[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        assert (model.store.compute is None) == on_use
        losses[on_use], weights[on_use] = out, model.store.params.numpy().copy()
        if device == "cpu":
            peaks[on_use] = xtrain.memory_stats("cpu")["requested_bytes.peak"] - base
        tokens[on_use] = model.generate(ids[:2, :5], 4, greedy=True)
        assert model.store.compute is not None
        del model, opt, loss
    assert losses[True] == losses[False]
    np.testing.assert_array_equal(weights[True], weights[False])
    np.testing.assert_array_equal(tokens[True], tokens[False])
    if device == "cpu":
        shapes = config.param_shapes()
        store = TinyTransformer(config, seed=0).store
        r0 = 2 * store.regions[0].length
        alive = 2 * (int(np.prod(shapes["lm_head.weight"]))
                     + 2 * sum(int(np.prod(shapes[n])) for n in store.compute_names("layers.0.")))
        assert peaks[False] - peaks[True] >= r0 - alive, (peaks, r0, alive)


def test_store_errors():
    from xtrain import nn

    with pytest.raises(ValueError, match="has no parameters"):
        store_mod.ParamStore(nn.ModuleList())
    model = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=0)
    opt = AdamW(model.parameters()[:3], lr=1e-2)  # not the whole store: per-tensor moments
    assert opt.store is None
    with pytest.raises(ValueError, match="every parameter of one ParamStore"):
        DataParallelAdamW(opt, RankContext(0, 1, "cpu", None, None))


# ---------------------------------------------------------------- DataParallelAdamW on stand-ins

def _batches(world, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, SMALL["vocab_size"], size=(world * B, S + 1)) for _ in range(STEPS)]


def _run_ranks(world, fn):
    shared = ThreadCollectives(world)
    return run_rank_threads(shared, lambda rank: fn(RankContext(rank, world, "cpu", shared.rank(rank), None)))


def _model_and_adamw(config, resume, shard=None):
    model = resume.build_model("cpu", bf16=config.bf16) if resume else TinyTransformer(config, device="cpu", seed=0)
    return model, AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1, shard=shard)


def _train_dp(world, shard, clip, bf16=False, steps=slice(None), resume=None, save=None, born_sharded=False,
              lean=False):
    """`world` rank threads with the stand-in collectives over _batches(world)[steps]; `resume`: a
    checkpoint to start from (loaded after DataParallelAdamW: a sharded optimizer takes its
    chunks); `save`: rank 0 writes a checkpoint there at the end (the moments gathered on rank 0
    only, whose results alone then hold them); born_sharded: AdamW(shard=(rank, world)) instead of
    DataParallelAdamW dropping the full moments. lean: the lean blocks, whose store casts on use
    (switched to the flat copies by the sharded step, which gathers them)."""
    config = TransformerConfig(**SMALL, bf16=bf16, lean_activations=lean)
    batches = _batches(world)[steps]

    def fn(ctx):
        model, opt = _model_and_adamw(config, resume, (ctx.rank, world) if born_sharded else None)
        dp = DataParallelAdamW(opt, ctx, shard=shard)
        assert dp._cast == (shard and bf16)  # bf16 copies gathered instead of the float32 weights
        assert model.store.cast_on_use == (lean and bf16 and not shard)
        if resume:
            resume.load_optimizer(opt)
        losses, norms = [], []
        for w in batches:
            w = w[ctx.rank * B:(ctx.rank + 1) * B]
            _, loss = model(w[:, :-1], w[:, 1:])
            loss.backward()
            loss = loss.detach()
            norms.append(dp.step(clip, extra=[loss]).item())
            losses.append(loss.item())
        dp.gather_state(root=0 if save else None)
        moments = None
        if ctx.rank == 0 or not save:
            state = opt.state_dict()
            moments = {k: {n: t.numpy().copy() for n, t in state[k].items()} for k in ("exp_avg", "exp_avg_sq")}
        if save and ctx.rank == 0:
            state_mod.save(save, model, opt, step=opt.step_count)
        return (np.array(losses), np.array(norms), {n: p.numpy().copy() for n, p in model.named_parameters()},
                moments, ctx.comm.calls)

    return _run_ranks(world, fn)


def _train_reference(world, clip, bf16=False, steps=slice(None), resume=None, lean=False):
    """One model; each step the ranks' gradients are computed one after another and averaged in
    numpy the way the stand-in collectives do, then the usual clip and AdamW."""
    config = TransformerConfig(**SMALL, bf16=bf16, lean_activations=lean)
    model, opt = _model_and_adamw(config, resume)
    if resume:
        resume.load_optimizer(opt)
    params = model.parameters()
    losses, norms = [], []
    for w in _batches(world)[steps]:
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
@pytest.mark.parametrize("bf16,lean", [(False, False), (True, False), (True, True)],
                         ids=["float32", "bf16", "bf16-lean"])
def test_data_parallel_adamw_matches_adamw_on_the_averaged_gradients(shard, bf16, lean):
    """No clipping (max_norm above the norm): every element takes the same arithmetic as the
    plain step on the averaged gradient, so parameters and moments match bit for bit (lean: the
    reference casts on use, the sharded ranks gather the flat copies)."""
    ref_losses, ref_norms, ref_params, ref_state = _train_reference(2, clip=1e6, bf16=bf16, lean=lean)
    results = _train_dp(2, shard, clip=1e6, bf16=bf16, lean=lean)
    for losses, norms, params, state, calls in results:
        np.testing.assert_array_equal(losses, ref_losses)
        np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
        for name, want in ref_params.items():
            np.testing.assert_array_equal(params[name], want, err_msg=name)
        for key in state:
            for name, want in ref_state[key].items():
                np.testing.assert_array_equal(state[key][name], want, err_msg=f"{key} {name}")
        if shard:  # one reduce-scatter, one scalar all-reduce, one all-gather per step; at the end one
            # all-gather per moment (into a temporary full buffer) and, bf16, one of the float32 weights
            assert calls == ["reduce_scatter", "all_reduce", "all_gather"] * STEPS + ["all_gather"] * (2 + bf16)
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
    """Chunk edges fall inside parameters; the padded flat length divides by the ranks; each rank's
    moments cover its chunks only, and gathered they are the reference's, bit for bit."""
    ref_losses, _, ref_params, ref_state = _train_reference(3, clip=1e6)
    results = _train_dp(3, shard=True, clip=1e6, born_sharded=True)
    for losses, _, params, state, _ in results:
        np.testing.assert_array_equal(losses, ref_losses)
        for name, want in ref_params.items():
            np.testing.assert_array_equal(params[name], want, err_msg=name)
        for key in state:
            for name, want in ref_state[key].items():
                np.testing.assert_array_equal(state[key][name], want, err_msg=f"{key} {name}")


def test_sharded_moments_live_on_their_rank_only():
    """ZeRO-1's memory half: each rank allocates the moments of its chunks (1/N of the layout) and
    nothing else; reading them needs a gather, and a gather to rank 0 leaves the others without."""
    def fn(ctx):
        model = TinyTransformer(TransformerConfig(**SMALL, bf16=True), device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        full = opt.flat_m.numel()
        dp = DataParallelAdamW(opt, ctx)
        assert opt.sharded and opt.exp_avg is None
        assert opt.flat_m.numel() == opt.flat_v.numel() == full // ctx.world_size
        assert [(lo, hi) for lo, hi, _ in opt.moment_chunks] == dp.chunks
        born = AdamW(model.named_parameters(), shard=(ctx.rank, ctx.world_size))  # never holds the full moments
        assert born.moment_chunks == opt.moment_chunks and born.flat_v.numel() == full // ctx.world_size
        with pytest.raises(ValueError, match="divides 6720"):
            AdamW(model.named_parameters(), shard=(0, 11))
        with pytest.raises(RuntimeError, match="gather_state"):
            opt.moment_arrays()
        with pytest.raises(RuntimeError, match="DataParallelAdamW.step"):
            opt.step()
        x = np.arange(B * S).reshape(B, S) % SMALL["vocab_size"]
        _, loss = model(x, x)
        loss.backward()
        dp.step(1.0)
        dp.gather_state(root=0)
        if ctx.rank == 0:
            m, v = opt.moment_arrays()
            assert set(m) == set(dict(model.named_parameters())) and any(a.any() for a in v.values())
        else:
            with pytest.raises(RuntimeError, match="gather_state"):
                opt.state_dict()
        return True

    assert _run_ranks(2, fn) == [True, True]


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
def test_a_sharded_checkpoint_is_gathered_on_save_and_scattered_on_resume(tmp_path, bf16):
    """2 steps on 2 ranks, a checkpoint (rank 0 writes the moments gathered there), 2 more steps
    from it, is the 4-step run bit for bit: resumed on 2 sharded ranks (each takes its chunks of
    the loaded moments) and on one process with plain AdamW (the same file format)."""
    full_losses, _, full_params, full_state, _ = _train_dp(2, True, clip=1e6, bf16=bf16)[0]
    _train_dp(2, True, clip=1e6, bf16=bf16, steps=slice(0, 2), save=tmp_path / "ckpt")
    ckpt = state_mod.load(tmp_path / "ckpt")
    assert ckpt.step == 2
    resumed = [r[:4] for r in _train_dp(2, True, clip=1e6, bf16=bf16, steps=slice(2, None), resume=ckpt)]
    resumed.append(_train_reference(2, clip=1e6, bf16=bf16, steps=slice(2, None), resume=ckpt))
    for losses, _, params, state in resumed:
        np.testing.assert_array_equal(losses, full_losses[2:])
        for name, want in full_params.items():
            np.testing.assert_array_equal(params[name], want, err_msg=name)
        for key in state:
            for name, want in full_state[key].items():
                np.testing.assert_array_equal(state[key][name], want, err_msg=f"{key} {name}")


def test_layout_and_errors():
    def fn(ctx):
        model = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        dp = DataParallelAdamW(opt, ctx)
        regions = [r for r in model.store.regions if r.used]
        assert len(dp.chunks) == len(regions)
        for (lo, hi), r in zip(dp.chunks, regions):
            assert hi - lo == r.length // ctx.world_size and lo % store_mod.ALIGN == 0
            assert lo == r.start + ctx.rank * (hi - lo)
        x = np.zeros((B, S), np.int64)
        _, loss = model(x, x)
        loss.backward()
        model.parameters()[0].grad = None  # a parameter without a gradient
        with pytest.raises(ValueError, match="has no gradient on rank"):
            dp.step(1.0)
        return True

    assert _run_ranks(2, fn) == [True, True]


def test_optimizer_state_loaded_after_construction_is_used():
    """load_state_dict writes into the flat moment buffers the sharded step works on (each rank
    its chunks of the state)."""
    def fn(ctx):
        model = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        dp = DataParallelAdamW(opt, ctx)
        loaded = {k: {n: np.full(p.shape, 0.5, np.float32) for n, p in model.named_parameters()}
                  for k in ("exp_avg", "exp_avg_sq")}
        opt.load_state_dict({**loaded, "step": 3, "hyper": opt.hyper()})
        x = np.ones((B, S), np.int64)
        _, loss = model(x, x)
        loss.backward()
        dp.step(1.0)
        dp.gather_state()
        m = opt.state_dict()["exp_avg"]
        return {n: t.numpy().copy() for n, t in m.items()}

    m0, m1 = _run_ranks(2, fn)
    for name in m0:
        np.testing.assert_array_equal(m0[name], m1[name])
        assert not np.allclose(m0[name], 0.5), name  # updated from the loaded 0.5


def test_gathered_bf16_copies_give_the_forward_of_the_cast_weights():
    """With a bf16 model the ranks gather bf16 copies of the Linear weights; the forward takes
    them instead of casting. Its loss and gradients must be those of casting the gathered float32
    weights; a write to the float32 weights while only each rank's shard is current is refused."""
    config = TransformerConfig(**SMALL, bf16=True)
    w = _batches(2)[0]

    def fn(ctx):
        model = TinyTransformer(config, device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        dp = DataParallelAdamW(opt, ctx)
        part = w[ctx.rank * B:(ctx.rank + 1) * B]
        _, loss = model(part[:, :-1], part[:, 1:])
        loss.backward()
        dp.step(1.0)
        _, with_copies = model(part[:, :-1], part[:, 1:])
        with_copies.backward()
        g_copies = [p.grad.numpy().copy() for p in model.parameters()]
        opt.zero_grad()
        model.norm.weight.copy_(model.norm.weight)  # a write while the float32 Linear weights are sharded
        with pytest.raises(RuntimeError, match="gather_state"):
            model(part[:, :-1], part[:, 1:])
        dp.gather_state()  # the float32 weights complete; a new write makes the forward cast them
        model.norm.weight.copy_(model.norm.weight)
        _, cast = model(part[:, :-1], part[:, 1:])
        cast.backward()
        assert with_copies.item() == cast.item()
        for a, p in zip(g_copies, model.parameters()):
            np.testing.assert_array_equal(a, p.grad.numpy())
        return True

    assert _run_ranks(2, fn) == [True, True]


@pytest.mark.parametrize("in_store", [True, False], ids=["store", "tensors"])
def test_clip_and_step_equals_clip_then_step(in_store, device):
    """The fused step reads each gradient times the clip factor; clip_grad_norm_ writes that
    product and the plain step reads it back: the same bits, with clipping active."""
    def run(fused):
        model = TinyTransformer(TransformerConfig(**SMALL, bf16=True), device=device, seed=0)
        named = list(model.named_parameters())
        params = named if in_store else [(n, xtrain.tensor(p.numpy(), device=device, requires_grad=True))
                                         for n, p in named]
        opt = AdamW(params, lr=1e-2, weight_decay=0.1)
        norms = []
        for step in range(3):
            _, loss = model(*_batch(step))
            loss.backward()
            if not in_store:
                for (_, p), (_, q) in zip(named, params):
                    q.grad = xtrain.tensor(p.grad.numpy(), device=device)
                model.store.zero_grad()
            if fused:
                norms.append(opt.clip_and_step(0.05, loss).item())
            else:
                norms.append(clip_grad_norm_(opt.params, 0.05).item())
                opt.step()
            opt.zero_grad()
            if not in_store:
                model.load_state_dict({n: q.numpy() for n, q in params})
        return norms, [q.numpy().copy() for _, q in params]

    (n1, w1), (n2, w2) = run(True), run(False)
    assert n1 == n2 and min(n1) > 0.05  # clipping acts on every step
    for a, b in zip(w1, w2):
        np.testing.assert_array_equal(a, b)
