"""The CUDA backend against the CPU one, and the GPU-only guarantees.

- Every op, forward and gradients, float32 and bf16: CUDA agrees with the CPU within the dtype's
  tolerance (ophelp.TOLERANCE), on shapes large enough to reach the multi-block paths
  (chunked reductions, block-per-row softmax and cross-entropy, multi-launch optimizer lists).
- Determinism on CUDA: the same step twice gives the same bits, including embedding backward
  with many repeated ids (flash_attention's: tests/test_flash_attention.py).
- Steady state: after warm-up, a training-like step makes zero raw cudaMalloc calls.
- Memory: a limit on cuda:0 raises xtrain.OutOfMemoryError and the device works afterwards; so
  does a request larger than the card.
- Recompute: checkpoint on vs off is bitwise equal on CUDA (float32 and bf16, with dropout).
- Random numbers: dropout masks and uniform draws are the same bits on CPU and CUDA.
"""
import gc

import numpy as np
import pytest

import xtrain
import xtrain.optim
from xtrain import ops
from ophelp import assert_close, bits, make_inputs, to_numpy64

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not xtrain.cuda.is_available(),
                       reason="no CUDA device (xtrain.cuda.is_available() is False): runs on the GPU machine"),
]

CUDA = "cuda:0"
DTYPES = ["float32", "bfloat16"]


def rng(seed):
    return np.random.default_rng(seed)


def randn(*shape, seed=0, scale=1.0):
    return scale * rng(seed).standard_normal(shape)


def positive(*shape, seed=0):
    return rng(seed).uniform(0.5, 2.0, shape)


def run_on(fn, arrays, dtype, device, seed):
    """fn on `device` with grads of every floating input under a fixed random upstream gradient."""
    xs, _ = make_inputs(arrays, dtype, device, requires_grad=True)
    out = fn(*xs)
    up = rng(seed).standard_normal(tuple(out.shape))
    out.backward_seeded(xtrain.tensor(up, dtype=out.dtype, device=device))
    grads = [x.grad for x in xs if x.dtype in ("float32", "bfloat16", "float64")]
    return out, grads


def check_cpu_vs_cuda(fn, arrays, dtype, seed=0, tol_scale=1.0):
    out_c, grads_c = run_on(fn, arrays, dtype, "cpu", seed)
    out_g, grads_g = run_on(fn, arrays, dtype, CUDA, seed)
    assert out_g.device == CUDA and out_g.dtype == out_c.dtype and out_g.shape == out_c.shape
    assert_close(to_numpy64(out_g), to_numpy64(out_c), dtype, "forward (cuda vs cpu)", tol_scale)
    for i, (gc_, gg) in enumerate(zip(grads_c, grads_g)):
        assert (gc_ is None) == (gg is None), f"grad {i}: present on one device only"
        if gc_ is None:
            continue
        assert gg.dtype == gc_.dtype and gg.device == CUDA
        assert_close(to_numpy64(gg), to_numpy64(gc_), dtype, f"grad of input {i} (cuda vs cpu)", tol_scale)


def ref_ids(n, vocab, seed, dtype=np.int64):
    return rng(seed).integers(0, vocab, n).astype(dtype)


# ---------------------------------------------------------------- every op, CPU vs CUDA

# name -> (fn, arrays, tolerance scale). Sizes reach the multi-block kernel paths.
OPS = {
    "add_same": (ops.add, [randn(33, 65, seed=1), randn(33, 65, seed=2)], 1),
    "add_bcast_rows": (ops.add, [randn(4096, 64, seed=3), randn(64, seed=4)], 1),  # chunked sum_to
    # sum_to's column sums (a bias gradient): 16-byte packs over many chunks; scalar loads (77
    # columns); a reduced dim between kept ones (the general kernel)
    "add_bcast_bias": (ops.add, [randn(3000, 768, seed=90), randn(768, seed=91)], 2),
    "add_bcast_bias_odd": (ops.add, [randn(4, 300, 77, seed=92), randn(77, seed=93)], 2),
    "mul_bcast_mid": (ops.mul, [randn(64, 5, 33, seed=94), randn(5, 1, seed=95)], 1),
    "sub_bcast_cols": (ops.sub, [randn(300, 1, seed=5), randn(1, 257, seed=6)], 1),
    "mul_bcast_3d": (ops.mul, [randn(2, 1, 4, 1, seed=7), randn(3, 1, 5, seed=8)], 1),
    "div_bcast": (ops.div, [randn(5, 7, seed=9), positive(7, seed=10)], 1),
    "add_scalar": (lambda x: ops.add_scalar(x, 1.5), [randn(1000, seed=11)], 1),
    "mul_scalar": (lambda x: ops.mul_scalar(x, -2.5), [randn(1000, seed=12)], 1),
    "rsub_scalar": (lambda x: ops.rsub_scalar(x, 3.0), [randn(1000, seed=13)], 1),
    "div_scalar": (lambda x: ops.div_scalar(x, 3.0), [randn(1000, seed=14)], 1),
    "rdiv_scalar": (lambda x: ops.rdiv_scalar(x, 2.0), [positive(1000, seed=15)], 1),
    "pow_scalar": (lambda x: ops.pow_scalar(x, 1.5), [positive(1000, seed=16)], 1),
    "neg": (ops.neg, [randn(1000, seed=17)], 1),
    "exp": (ops.exp, [randn(1000, seed=18)], 1),
    "log": (ops.log, [positive(1000, seed=19)], 1),
    "sqrt": (ops.sqrt, [positive(1000, seed=20)], 1),
    "silu": (ops.silu, [randn(1000, seed=21, scale=4)], 1),
    "swiglu": (ops.swiglu, [randn(64, 96, seed=22, scale=3), randn(64, 96, seed=23)], 1),
    "cast_roundtrip": (lambda x: ops.cast(ops.cast(x, "bfloat16"), "float32") if x.dtype == "float32"
                       else ops.cast(ops.cast(x, "float32"), "bfloat16"), [randn(500, seed=24)], 1),
    "sum_all_big": (lambda x: ops.sum(x), [randn(1000, 1000, seed=25)], 10),  # multi-block sum_all
    "sum_last_short": (lambda x: ops.sum(x, -1), [randn(300, 37, seed=26)], 1),
    "sum_last_long": (lambda x: ops.sum(x, -1, True), [randn(5, 5000, seed=27)], 4),  # block per row
    "mean_all": (lambda x: ops.mean(x), [randn(77, 13, seed=28)], 1),
    "mean_last": (lambda x: ops.mean(x, -1), [randn(6, 40, seed=29)], 1),
    "reshape_exp": (lambda x: ops.exp(ops.reshape(x, [16, -1])), [randn(8, 4, 6, seed=30)], 1),
    "transpose": (lambda x: ops.exp(ops.transpose(x, 0, 2)), [randn(3, 5, 7, seed=31)], 1),
    "permute_4d": (lambda x: ops.permute(x, [0, 2, 1, 3]), [randn(2, 9, 4, 8, seed=32)], 1),
    "matmul_2d": (ops.matmul, [randn(67, 45, seed=33), randn(45, 29, seed=34)], 1),
    "matmul_batched": (ops.matmul, [randn(3, 17, 24, seed=35), randn(3, 24, 11, seed=36)], 1),
    "linear": (ops.linear, [randn(4, 16, 48, seed=37), randn(80, 48, seed=38)], 1),
    "embedding": (lambda w, i: ops.embedding(w, i), [randn(50, 24, seed=39), ref_ids(2000, 50, 40)], 1),
    "embedding_i32": (lambda w, i: ops.embedding(w, i), [randn(30, 7, seed=41), ref_ids(99, 30, 42, np.int32)], 1),
    "rms_norm": (lambda x, w: ops.rms_norm(x, w, 1e-6), [randn(600, 96, seed=43), 1 + randn(96, seed=44, scale=0.3)],
                 2),
    "rms_norm_wide": (lambda x, w: ops.rms_norm(x, w, 1e-5), [randn(3, 3000, seed=45), randn(3000, seed=46)], 2),
    "rope": (lambda x: ops.rope(x), [randn(2, 16, 4, 32, seed=47)], 1),
    "rope_positions": (lambda x, p: ops.rope(x, p, theta=500.0),
                       [randn(2, 4, 3, 10, seed=48), np.array([3, 7, 8, 40], dtype=np.int64)], 1),
    "softmax": (lambda x: ops.softmax(x), [randn(40, 77, seed=49, scale=3)], 1),
    "softmax_long": (lambda x: ops.softmax(x), [randn(4, 3000, seed=50, scale=3)], 1),  # block per row
    "log_softmax": (lambda x: ops.log_softmax(x), [randn(40, 77, seed=51, scale=3)], 1),
    "log_softmax_long": (lambda x: ops.log_softmax(x), [randn(3, 5000, seed=52, scale=3)], 1),
    "flash_attention_causal": (lambda q, k, v: ops.flash_attention(q, k, v, causal=True),
                               [randn(2, 33, 3, 16, seed=s) for s in (53, 54, 55)], 1),
    "flash_attention_full": (lambda q, k, v: ops.flash_attention(q, k, v, causal=False, scale=0.3),
                             [randn(1, 20, 2, 8, seed=s) for s in (56, 57, 58)], 1),
    "flash_attention_long": (lambda q, k, v: ops.flash_attention(q, k, v, causal=True),
                             [randn(1, 1100, 1, 8, seed=s, scale=0.5) for s in (59, 60, 61)], 2),  # rows > 1024
    "cross_entropy": (lambda x, t: ops.cross_entropy(x, t), [randn(64, 50, seed=62, scale=2), ref_ids(64, 50, 63)],
                      1),
    "cross_entropy_big_vocab": (lambda x, t: ops.cross_entropy(x, t),
                                [randn(16, 6000, seed=64, scale=2), ref_ids(16, 6000, 65, np.int32)], 2),
    "cross_entropy_ignore": (lambda x, t: ops.cross_entropy(x, t, ignore_index=3),
                             [randn(40, 10, seed=66), ref_ids(40, 10, 67)], 1),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(OPS))
def test_op_cuda_matches_cpu(name, dtype):
    fn, arrays, scale = OPS[name]
    check_cpu_vs_cuda(fn, arrays, dtype, tol_scale=scale)


@pytest.mark.parametrize("name", ["add_bcast_rows", "add_bcast_bias_odd", "sum_all_big", "matmul_batched", "rms_norm", "softmax_long",
                                  "embedding", "flash_attention_causal", "cross_entropy"])
def test_op_cuda_matches_cpu_float64(name):
    fn, arrays, _ = OPS[name]
    check_cpu_vs_cuda(fn, arrays, "float64", tol_scale=100)  # fp64 on both sides; orders differ


def test_rms_norm_bf16_with_float32_weight_cuda_matches_cpu():
    x, w, dy = randn(300, 64, seed=70), randn(64, seed=71), randn(300, 64, seed=72)
    res = {}
    for dev in ("cpu", CUDA):
        xt = xtrain.tensor(x, dtype="bfloat16", device=dev, requires_grad=True)
        wt = xtrain.tensor(w, dtype="float32", device=dev, requires_grad=True)
        y = ops.rms_norm(xt, wt)
        y.backward_seeded(xtrain.tensor(dy, dtype="bfloat16", device=dev))
        res[dev] = (to_numpy64(y), to_numpy64(xt.grad), to_numpy64(wt.grad))
    for name, a, b in zip(("y", "dx", "dw"), res[CUDA], res["cpu"]):
        assert_close(a, b, "bfloat16" if name != "dw" else "float32", name, scale=1 if name != "dw" else 50)


def test_matmul_bf16_in_float32_out_matches_cpu():
    a, b = randn(40, 72, seed=73), randn(72, 24, seed=74)
    outs = {}
    for dev in ("cpu", CUDA):
        xa = xtrain.tensor(a, dtype="bfloat16", device=dev)
        xb = xtrain.tensor(b, dtype="bfloat16", device=dev)
        outs[dev] = to_numpy64(ops.matmul(xa, xb))
    assert_close(outs[CUDA], outs["cpu"], "bfloat16", "matmul bf16")


def _optim_lists(device, sizes, seed):
    g = rng(seed)
    mk = lambda s, scale=1.0: xtrain.tensor(scale * g.standard_normal(s), dtype="float32", device=device)  # noqa: E731
    params = [mk(s) for s in sizes]
    grads = [mk(s, 0.1) for s in sizes]
    m = [mk(s, 0.01) for s in sizes]
    v = [xtrain.tensor(np.abs(0.001 * g.standard_normal(s)), dtype="float32", device=device) for s in sizes]
    return params, grads, m, v


@pytest.mark.parametrize("sizes", [[(3000,), (7, 5), (1,), (64, 64)], [(3,)] * 300 + [(5000,)]],
                         ids=["few", "300-tensors"])
def test_adamw_global_norm_clip_cuda_match_cpu(sizes):
    res = {}
    for dev in ("cpu", CUDA):
        params, grads, m, v = _optim_lists(dev, sizes, seed=80)
        for step in (1, 2, 3):
            xtrain._C.optim.adamw_step(params, grads, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, step)
        norm = xtrain._C.optim.global_norm(grads)
        assert norm.device == dev and norm.shape == ()
        xtrain._C.optim.clip_by_norm_(grads, norm, 0.5)
        res[dev] = ([to_numpy64(t) for t in params + m + v + grads], norm.item())
    for a, b in zip(res[CUDA][0], res["cpu"][0]):
        assert_close(a, b, "float32", "optimizer state", scale=5)
    assert abs(res[CUDA][1] - res["cpu"][1]) <= 1e-5 * res["cpu"][1]


# ---------------------------------------------------------------- random numbers

@pytest.mark.parametrize("dtype", DTYPES + ["float64"])
def test_dropout_masks_equal_cpu_and_cuda(dtype):
    n, p = 50000, 0.3
    outs = {}
    for dev in ("cpu", CUDA):
        x = xtrain.tensor(randn(n, seed=90), dtype=dtype, device=dev, requires_grad=True)
        y = ops.dropout(x, p, generator=xtrain.Generator(1234))
        y.backward_seeded(xtrain.ones(n, dtype=dtype, device=dev))
        outs[dev] = (bits(y), to_numpy64(y) == 0, bits(x.grad))
    np.testing.assert_array_equal(outs[CUDA][1], outs["cpu"][1])  # the mask
    np.testing.assert_array_equal(outs[CUDA][0], outs["cpu"][0])  # the values, bit for bit
    np.testing.assert_array_equal(outs[CUDA][2], outs["cpu"][2])  # the gradient re-derives the mask


def test_rand_equal_and_randn_close_cpu_and_cuda():
    u = {d: xtrain.rand(10007, generator=xtrain.Generator(9), device=d).numpy() for d in ("cpu", CUDA)}
    np.testing.assert_array_equal(u[CUDA], u["cpu"])
    z = {d: xtrain.randn(10007, generator=xtrain.Generator(9), device=d).numpy() for d in ("cpu", CUDA)}
    np.testing.assert_allclose(z[CUDA], z["cpu"], rtol=1e-5, atol=1e-5)  # libm rounding may differ


# ---------------------------------------------------------------- determinism

def test_embedding_backward_many_repeats_is_deterministic():
    ids = np.concatenate([np.full(5000, 7), rng(100).integers(0, 40, 20000), np.full(3000, 39)]).astype(np.int64)
    rng(101).shuffle(ids)
    dout = randn(ids.size, 48, seed=102)
    runs = []
    for _ in range(2):
        w = xtrain.tensor(randn(40, 48, seed=103), dtype="float32", device=CUDA, requires_grad=True)
        out = ops.embedding(w, xtrain.tensor(ids, device=CUDA))
        out.backward_seeded(xtrain.tensor(dout, dtype="float32", device=CUDA))
        runs.append(bits(w.grad))
    np.testing.assert_array_equal(runs[0], runs[1])
    # and it is the right sum (float64 reference)
    ref = np.zeros((40, 48))
    np.add.at(ref, ids, dout.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(runs[0].view(np.float32).reshape(40, 48), ref, rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------- a small training step

V, DIM, HEADS, SEQ, BATCH, FFN = 64, 32, 4, 16, 4, 64


def make_model(device, seed=0):
    g = xtrain.Generator(seed)

    def p(*shape, scale=0.1):
        t = (xtrain.randn(*shape, generator=g, device=device) * scale).detach()
        t.requires_grad = True
        return t

    emb = p(V, DIM)
    blocks = [[xtrain.ones(DIM, device=device, requires_grad=True), p(DIM, DIM), p(DIM, DIM), p(DIM, DIM),
               p(DIM, DIM), xtrain.ones(DIM, device=device, requires_grad=True), p(FFN, DIM), p(FFN, DIM),
               p(DIM, FFN)]
              for _ in range(2)]
    head = p(V, DIM)
    return emb, blocks, head


def all_params(model):
    emb, blocks, head = model
    return [emb, head] + [p for blk in blocks for p in blk]


def block(x, params, bf16, dropout):
    """norm -> rope + causal attention -> residual, norm -> swiglu MLP (+dropout) -> residual."""
    n1, wq, wk, wv, wo, n2, wg, wu, wd = params
    hd = DIM // HEADS

    def w(t):
        return ops.cast(t, "bfloat16") if bf16 else t

    def split(t):  # [B*S, DIM] -> [B, S, H, hd]
        return t.reshape(BATCH, SEQ, HEADS, hd)

    h = ops.rms_norm(x, n1, 1e-6)
    q = ops.rope(split(ops.linear(h, w(wq))))
    k = ops.rope(split(ops.linear(h, w(wk))))
    v = split(ops.linear(h, w(wv)))
    a = ops.flash_attention(q, k, v, causal=True).reshape(BATCH * SEQ, DIM)
    x = x + ops.linear(a, w(wo))
    h = ops.rms_norm(x, n2, 1e-6)
    m = ops.swiglu(ops.linear(h, w(wg)), ops.linear(h, w(wu)))
    if dropout:
        m = ops.dropout(m, 0.1, True)
    return x + ops.linear(m, w(wd))


def forward_loss(model, ids, targets, recompute=False, bf16=False, dropout=False):
    emb, blocks, head = model
    x = ops.embedding(emb, ids)  # [B*S, DIM]
    if bf16:
        x = ops.cast(x, "bfloat16")
    for params in blocks:
        if recompute:
            x = xtrain.checkpoint(lambda xx, pp: block(xx, pp, bf16, dropout), x, params)
        else:
            x = block(x, params, bf16, dropout)
    logits = ops.linear(x, ops.cast(head, "bfloat16") if bf16 else head)
    return ops.cross_entropy(logits, targets), logits


def batch(device, seed):
    g = rng(seed)
    ids = xtrain.tensor(g.integers(0, V, BATCH * SEQ), device=device)
    targets = xtrain.tensor(g.integers(0, V, BATCH * SEQ), device=device)
    return ids, targets


def test_training_step_makes_no_raw_cudamalloc_after_warmup():
    model = make_model(CUDA)
    params = all_params(model)
    opt = xtrain.optim.AdamW(params, lr=1e-2)
    ids, targets = batch(CUDA, 0)

    def step():
        loss, _ = forward_loss(model, ids, targets)
        loss.backward()
        xtrain.optim.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(3):
        step()
    before = xtrain.memory_stats(CUDA)
    losses = [step().item() for _ in range(5)]
    after = xtrain.memory_stats(CUDA)
    assert after["num_raw_alloc"] == before["num_raw_alloc"], (before, after)
    assert after["num_cache_hits"] > before["num_cache_hits"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_training_step_is_bitwise_deterministic():
    def one_run():
        model = make_model(CUDA, seed=3)
        params = all_params(model)
        opt = xtrain.optim.AdamW(params, lr=1e-3)
        ids, targets = batch(CUDA, 1)
        xtrain.manual_seed(7)
        for _ in range(2):
            loss, _ = forward_loss(model, ids, targets, dropout=True)
            loss.backward()
            grads = [bits(p.grad) for p in params]
            opt.step()
            opt.zero_grad()
        return [bits(loss)] + grads + [bits(p) for p in params]

    for a, b in zip(one_run(), one_run()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("dropout", [False, True], ids=["nodrop", "dropout"])
def test_checkpoint_on_off_bitwise_equal_on_cuda(bf16, dropout):
    results = []
    for recompute in (False, True):
        model = make_model(CUDA, seed=5)
        ids, targets = batch(CUDA, 2)
        xtrain.manual_seed(11)
        loss, logits = forward_loss(model, ids, targets, recompute=recompute, bf16=bf16, dropout=dropout)
        loss.backward()
        params = all_params(model)
        assert all(p.grad is not None for p in params)
        results.append([bits(loss), bits(logits)] + [bits(p.grad) for p in params])
    for i, (a, b) in enumerate(zip(*results)):
        assert np.array_equal(a, b), f"item {i} differs between checkpoint on and off"


# ---------------------------------------------------------------- memory

def test_memory_limit_raises_oom_and_recovers():
    gc.collect()
    keep = xtrain.ones(1024, device=CUDA)
    stats = xtrain.memory_stats(CUDA)
    limit = stats["reserved_bytes.current"] + (4 << 20)
    xtrain.set_memory_limit(limit, CUDA)
    try:
        with pytest.raises(xtrain.OutOfMemoryError, match="out of memory"):
            xtrain.empty(64 << 20, device=CUDA)  # 256 MiB of float32
        small = xtrain.ones(1 << 18, device=CUDA)  # 1 MiB fits under the limit
        assert small.sum().item() == float(1 << 18)
        assert xtrain.memory_stats(CUDA)["num_ooms"] >= stats["num_ooms"] + 1
    finally:
        xtrain.set_memory_limit(None, CUDA)
    big = xtrain.ones(64 << 20, device=CUDA)
    assert big.sum().item() == float(64 << 20)
    assert keep.sum().item() == 1024.0


def test_request_larger_than_the_card_raises_oom_and_recovers():
    with pytest.raises(xtrain.OutOfMemoryError) as info:
        xtrain.empty(1 << 40, device=CUDA)  # 4 TiB of float32
    assert "cuda:0" in str(info.value)
    x = xtrain.ones(1000, device=CUDA)
    assert x.sum().item() == 1000.0


# ---------------------------------------------------------------- devices

def test_absent_device_is_a_clear_error():
    n = xtrain.cuda.device_count()
    with pytest.raises(RuntimeError, match=f"cuda:{n}"):
        xtrain.zeros(3, device=f"cuda:{n}")


def test_runtime_info_names_versions_and_device():
    info = xtrain.cuda.runtime_info()
    assert "cuBLAS" in info and "cuda:0" in info
    assert xtrain.cuda.device_name(0)


def test_events_time_the_device_work_between_them():
    """Event pairs measure the device's time between two points of this thread's stream, however
    late the host asks; recording inside a graph capture is refused."""
    a = xtrain.tensor(randn(2048, 2048), device=CUDA)
    start, end, mark = xtrain.cuda.Event(0), xtrain.cuda.Event(0), xtrain.cuda.Event(0)
    assert start.ready() and not start.recorded and start.device == 0
    with pytest.raises(RuntimeError, match="recorded first"):
        end.elapsed_ms_since(start)
    start.record()
    for _ in range(20):
        b = ops.matmul(a, a)
    mark.record()
    end.record()
    xtrain.cuda.synchronize()
    late = end.elapsed_ms_since(start)
    import time
    time.sleep(0.2)  # host time after the work must not count
    assert end.elapsed_ms_since(start) == late
    assert 0 < mark.elapsed_ms_since(start) <= late < 200, late  # 20 GEMMs of 2048^3: far under 200 ms
    assert end.ready() and b.shape == (2048, 2048)
    g = xtrain.cuda.Graph(0)
    g.capture_begin()
    try:
        with pytest.raises(RuntimeError, match="Event.record"):
            start.record()
    finally:
        g.abort_capture()
