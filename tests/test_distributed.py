"""Data-parallel training (xtrain.launch.distributed, xtrain._C.dist).

CPU (always): device resolution, the launcher's failure handling against a fake communicator
(original exception re-raised, peers stopped, bounded joins), and clear errors where NCCL or GPUs
are missing. Two GPUs (skipped otherwise): collectives against numpy, one-GPU equivalence of the
training step (2 ranks x batch B == 1 GPU x batch 2B, float32 / bf16 / recompute), a failing
rank, a collective that never completes, and `xtrain train --devices 2` with resume; one process
per GPU (a torchrun-style environment, tests/procgroup.py): the same run as two threads, a
raising or killed process ending the other within seconds, `xtrain train` resumed across the
modes and under the real torchrun; ZeRO-1's peak memory against the all-reduce step's. (The
process-group machinery without GPUs: tests/test_process_group.py, test_process_training.py.)

Tolerances of the equivalence tests (per-step loss, relative): the two runs differ only in how
sums are split (each rank's GEMMs and loss mean cover B sequences instead of 2B, then NCCL
averages two partial means), so float32 stays within LOSS_RTOL_F32 over 20 steps. In bf16 the
activations are rounded to 8 bits of mantissa after every op, so a GEMM that picks another
algorithm for the smaller batch moves some activations by one bf16 ulp (2^-8 relative) and the
runs drift apart faster: LOSS_RTOL_BF16. Across ranks the parameters are always bitwise equal:
both ranks apply the same averaged gradients to the same weights.
"""

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import xtrain
from modelhelp import prepared_stories, run_cli
from xtrain.launch import distributed
from xtrain.launch.distributed import (DataParallelAdamW, GradientReducer, RankStopped, all_reduce_gradients,
                                broadcast_parameters, launch, resolve_devices)
from xtrain.models import TinyTransformer, TransformerConfig
from xtrain.optim import AdamW, clip_grad_norm_

LOSS_RTOL_F32 = 1e-6
LOSS_RTOL_BF16 = 2e-2
PARAM_ATOL_ACROSS_RANKS = 1e-6

two_gpus = pytest.mark.skipif(
    not distributed.is_available() or xtrain.cuda.device_count() < 2,
    reason="needs an NCCL build of xtrain and at least 2 visible GPUs")


def _rank_threads():
    return [t for t in threading.enumerate() if t.name.startswith("xtrain-rank")]


# ---------------------------------------------------------------- CPU: pure logic

def test_resolve_devices():
    assert resolve_devices("all", available=4) == [0, 1, 2, 3]
    assert resolve_devices("ALL", available=1) == [0]
    assert resolve_devices(2, available=4) == [0, 1]
    assert resolve_devices([1, "cuda:3"], available=4) == [1, 3]
    assert resolve_devices(("2",), available=4) == [2]
    with pytest.raises(ValueError, match=">= 1"):
        resolve_devices(0, available=4)
    with pytest.raises(RuntimeError, match="5 GPUs requested but 4 visible"):
        resolve_devices(5, available=4)
    with pytest.raises(RuntimeError, match="cuda:7"):
        resolve_devices([7], available=4)
    with pytest.raises(ValueError, match="twice"):
        resolve_devices([1, "cuda:1"], available=4)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        resolve_devices("all", available=0)
    for bad in (True, "some", [], ["gpu0"], 1.5):
        with pytest.raises(TypeError):
            resolve_devices(bad, available=4)


class FakeComm:
    """Stands in for _C.dist.Communicator: wait() blocks like a rank stuck in NCCL until abort."""

    def __init__(self):
        self.aborted = threading.Event()
        self.reasons, self.closed = [], False

    def rank(self, r):
        return self

    def wait(self, seconds=60.0):
        if self.aborted.wait(seconds):
            raise RuntimeError(f"all_reduce: the communicator was aborted: {self.reasons[0]}")

    def abort(self, reason):
        self.reasons.append(reason)
        self.aborted.set()

    def close(self):
        self.closed = True


class CpuLaunch(distributed._Launch):
    def enter_device(self, index):
        pass

    def leave_device(self, index):
        pass


def _fake_launch(fn, n=2, stop_timeout=10.0, comm=None):
    comm = comm or FakeComm()
    t0 = time.monotonic()
    try:
        return comm, CpuLaunch(comm, list(range(n)), stop_timeout).run(fn), time.monotonic() - t0
    except BaseException as e:
        e.elapsed, e.comm = time.monotonic() - t0, comm
        raise


def test_launch_logic_returns_results_in_rank_order():
    comm, results, _ = _fake_launch(lambda ctx: (ctx.rank, ctx.world_size, ctx.device), n=3)
    assert results == [(0, 3, "cuda:0"), (1, 3, "cuda:1"), (2, 3, "cuda:2")]
    assert comm.closed and not comm.reasons
    assert not _rank_threads()


class BarrierComm(FakeComm):
    def __init__(self, n):
        super().__init__()
        self._barrier = threading.Barrier(n, timeout=10)

    def barrier(self):
        self._barrier.wait()


def test_exchange_gives_every_rank_all_values_in_rank_order():
    def fn(ctx):
        time.sleep(0.05 * (ctx.world_size - ctx.rank))  # arrive in reverse order
        first = ctx.exchange("a", ctx.rank * 10)
        second = ctx.exchange("a", -ctx.rank)         # the same key again, later
        return first, second

    _, results, _ = _fake_launch(fn, n=3, comm=BarrierComm(3))
    assert results == [([0, 10, 20], [0, -1, -2])] * 3


def test_launch_logic_reraises_the_original_error_and_unblocks_peers():
    boom = ValueError("rank 1 failed mid-step")

    def fn(ctx):
        if ctx.rank == 1:
            time.sleep(0.2)
            raise boom
        ctx.comm.wait()  # rank 0 "in NCCL", waiting for rank 1 forever unless aborted

    with pytest.raises(ValueError) as info:
        _fake_launch(fn)
    assert info.value is boom
    assert info.value.elapsed < 5
    comm = info.value.comm
    assert len(comm.reasons) == 1 and "rank 1" in comm.reasons[0] and "ValueError" in comm.reasons[0]
    assert not comm.closed
    assert not _rank_threads()


def test_launch_logic_stop_flag_stops_ranks_between_steps():
    stopped = []

    def fn(ctx):
        if ctx.rank == 0:
            raise KeyError("bad batch")
        try:
            while True:
                ctx.check()
                time.sleep(0.01)
        except RankStopped as e:
            stopped.append(str(e))
            raise

    with pytest.raises(KeyError, match="bad batch"):
        _fake_launch(fn, n=3)
    assert sorted(stopped) == ["rank 1 stopped because rank 0 failed",
                               "rank 2 stopped because rank 0 failed"]
    assert not _rank_threads()


def test_launch_logic_gives_up_on_a_rank_that_never_stops():
    release = threading.Event()

    def fn(ctx):
        if ctx.rank == 0:
            raise RuntimeError("rank 0 died")
        release.wait(30)  # ignores both the stop flag and the abort

    try:
        with pytest.raises(RuntimeError, match="rank 0 died") as info:
            _fake_launch(fn, stop_timeout=0.5)
        assert info.value.elapsed < 5
        notes = getattr(info.value, "__notes__", [])
        if hasattr(info.value, "add_note"):
            assert any("did not stop" in n for n in notes), notes
        assert all(t.daemon for t in _rank_threads())  # cannot keep the process alive
    finally:
        release.set()
        for t in _rank_threads():
            t.join(5)


@pytest.mark.skipif(distributed.is_available(), reason="NCCL and a GPU are available here")
def test_launch_without_backend_raises_clearly():
    called = []
    with pytest.raises(RuntimeError, match="NCCL|CUDA") as info:
        launch(called.append, devices=2)
    assert "xtrain.launch.distributed.launch" in str(info.value)
    assert not called and not _rank_threads()


@pytest.mark.skipif(distributed.is_available(), reason="NCCL and a GPU are available here")
def test_cli_devices_without_backend_is_a_usage_error():
    r = run_cli("train", "--devices", "2", "--steps", "1")
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xtrain: error: --devices 2:"), r.stderr
    assert "NCCL" in lines[0] or "CUDA" in lines[0]


def test_communicator_without_backend_raises_clearly():
    if distributed.is_available():
        pytest.skip("NCCL and a GPU are available here")
    with pytest.raises(RuntimeError, match="NCCL|CUDA|cuda"):
        xtrain._C.dist.Communicator([0, 1])


# ---------------------------------------------------------------- two GPUs: collectives

@two_gpus
def test_collectives_match_numpy():
    rng = np.random.default_rng(0)
    # Sizes on both sides of kInPlaceBytes (1 MiB): packed, in place, and a lone small bf16.
    shapes = [(3,), (700, 600), (17, 5), (1,), (300_000,)]
    host = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(2)]
    bf16_host = [rng.standard_normal((33,)).astype(np.float32) for _ in range(2)]

    def fn(ctx):
        mine = [xtrain.tensor(a, device=ctx.device) for a in host[ctx.rank]]
        summed = [xtrain.tensor(a, device=ctx.device) for a in host[ctx.rank]]
        b = xtrain.tensor(bf16_host[ctx.rank], dtype="bfloat16", device=ctx.device)
        ctx.all_reduce(mine + [b], "avg")
        ctx.all_reduce(summed, "sum")
        ids = xtrain.tensor(np.arange(5) + 10 * ctx.rank, dtype="int64", device=ctx.device)
        ctx.broadcast([ids], root=1)
        ctx.barrier()
        return ([t.numpy() for t in mine], [t.numpy() for t in summed], b.numpy(), ids.numpy())

    results = launch(fn, devices=[0, 1])
    for avg, summed, b, ids in results:
        for k in range(len(shapes)):
            np.testing.assert_allclose(avg[k], (host[0][k] + host[1][k]) / 2, rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(summed[k], host[0][k] + host[1][k], rtol=1e-6, atol=1e-7)
        bf = [xtrain.tensor(a, dtype="bfloat16").numpy() for a in bf16_host]
        np.testing.assert_allclose(b, (bf[0] + bf[1]) / 2, rtol=2**-7, atol=1e-2)
        np.testing.assert_array_equal(ids, np.arange(5) + 10)
    for k in range(len(shapes)):  # every rank holds the same bits
        np.testing.assert_array_equal(results[0][0][k], results[1][0][k])


@two_gpus
def test_reduce_scatter_and_all_gather_match_numpy():
    rng = np.random.default_rng(1)
    n = 2 * 300_001  # odd chunks: no alignment beyond the element
    host = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    loss = [np.float32(1.5), np.float32(2.5)]

    def fn(ctx):
        flat = xtrain.tensor(host[ctx.rank], device=ctx.device)
        bf = xtrain.tensor(host[ctx.rank][:64], dtype="bfloat16", device=ctx.device)
        extra = xtrain.tensor(np.array([loss[ctx.rank]]), device=ctx.device)
        ctx.comm.reduce_scatter(flat, "avg", [extra])
        ctx.comm.reduce_scatter(bf, "sum")
        mine = flat.numpy()[ctx.rank * (n // 2):(ctx.rank + 1) * (n // 2)].copy()
        ids = xtrain.tensor(np.arange(6) + 100 * ctx.rank, dtype="int64", device=ctx.device)
        ctx.comm.all_gather(ids)  # any dtype: chunk r comes from rank r
        ctx.comm.all_gather(flat)
        return mine, flat.numpy(), bf.numpy()[ctx.rank * 32:(ctx.rank + 1) * 32], extra.numpy(), ids.numpy()

    results = launch(fn, devices=[0, 1])
    avg = (host[0] + host[1]) / 2
    for rank, (mine, gathered, bf, extra, ids) in enumerate(results):
        np.testing.assert_allclose(mine, avg[rank * (n // 2):(rank + 1) * (n // 2)], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(gathered, avg, rtol=1e-6, atol=1e-7)
        b = [xtrain.tensor(h[:64], dtype="bfloat16").numpy() for h in host]
        np.testing.assert_allclose(bf, (b[0] + b[1])[rank * 32:(rank + 1) * 32], rtol=2**-7, atol=1e-2)
        np.testing.assert_array_equal(extra, [2.0])
        np.testing.assert_array_equal(ids, [0, 1, 2, 103, 104, 105])
    np.testing.assert_array_equal(results[0][1], results[1][1])


@two_gpus
def test_bad_collective_arguments_raise():
    def fn(ctx):
        other = f"cuda:{1 - ctx.rank}"
        with pytest.raises(ValueError, match="drives cuda"):
            ctx.all_reduce([xtrain.zeros((4,), device=other)])
        with pytest.raises(TypeError, match="float32 and bfloat16"):
            ctx.all_reduce([xtrain.zeros((4,), dtype="int64", device=ctx.device)])
        with pytest.raises(ValueError, match="avg"):
            ctx.all_reduce([xtrain.zeros((4,), device=ctx.device)], "max")
        t = xtrain.zeros((4,), device=ctx.device)
        with pytest.raises(ValueError, match="appear once|shares its memory"):
            ctx.all_reduce([t, t])
        with pytest.raises(ValueError, match="root"):
            ctx.broadcast([t], root=5)
        with pytest.raises(ValueError, match="not a multiple"):
            ctx.comm.reduce_scatter(xtrain.zeros((5,), device=ctx.device))
        with pytest.raises(ValueError, match="not a multiple"):
            ctx.comm.all_gather(xtrain.zeros((3,), dtype="int64", device=ctx.device))
        with pytest.raises(TypeError, match="float32 and bfloat16"):
            ctx.comm.reduce_scatter(xtrain.zeros((4,), dtype="int64", device=ctx.device))
        with pytest.raises(ValueError, match="drives cuda"):
            ctx.comm.all_gather(xtrain.zeros((4,), device=other))
        with pytest.raises(ValueError, match="shares its memory"):
            ctx.comm.reduce_scatter(t, "avg", [t])
        ctx.barrier()  # nothing was queued by the failed calls: the ranks still agree

    launch(fn, devices=[0, 1])


# ---------------------------------------------------------------- two GPUs: training equivalence

CONFIG = dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, head_dim=16, ffn_dim=160, max_seq=64)
B, S, STEPS, LR = 4, 32, 20, 3e-3


def _global_batches(vocab, steps=STEPS, seed=0):
    """Learnable windows (arithmetic sequences mod vocab), (2B, S) inputs and targets per step."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        start = rng.integers(0, vocab, size=(2 * B, 1))
        stride = rng.integers(1, 4, size=(2 * B, 1))
        w = (start + stride * np.arange(S + 1)[None, :]) % vocab
        out.append((w[:, :-1].astype(np.int64), w[:, 1:].astype(np.int64)))
    return out


def _train(config, batches, device, ctx=None, step="all_reduce", clip=1.0):
    """step: "all_reduce" (all_reduce_gradients, clip, AdamW), or DataParallelAdamW's "shard" /
    "flat" step."""
    model = TinyTransformer(config, device=device, seed=0)
    params = model.parameters()
    if ctx is not None:
        broadcast_parameters(params, ctx)
    shard = (ctx.rank, ctx.world_size) if ctx is not None and step == "shard" else None  # moments: the rank's only
    opt = AdamW(model.named_parameters(), lr=LR, weight_decay=0.1, shard=shard)
    dp = None
    if ctx is not None and step != "all_reduce":  # with bf16 the sharded step gathers bf16 weight copies
        dp = DataParallelAdamW(opt, ctx, shard=step == "shard")
    losses = []
    for x, y in batches:
        if ctx is not None:
            ctx.check()
            x, y = x[ctx.rank * B:(ctx.rank + 1) * B], y[ctx.rank * B:(ctx.rank + 1) * B]
        _, loss = model(x, y)
        loss.backward()
        loss = loss.detach()
        if dp is not None:
            dp.step(clip, extra=[loss])
        else:
            if ctx is not None:
                all_reduce_gradients(params, ctx, extra=[loss])
            clip_grad_norm_(params, clip)
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    if dp is not None:
        dp.gather_state()
    moments = {n: t.numpy() for n, t in opt.state_dict()["exp_avg_sq"].items()}
    return np.array(losses), {n: p.numpy() for n, p in model.named_parameters()}, moments


@two_gpus
@pytest.mark.parametrize("flags, rtol", [({}, LOSS_RTOL_F32),
                                         ({"recompute": True}, LOSS_RTOL_F32),
                                         ({"bf16": True}, LOSS_RTOL_BF16),
                                         ({"bf16": True, "n_kv_heads": 2, "tie_embeddings": True, "qk_norm": False}, LOSS_RTOL_BF16)],
                         ids=["float32", "recompute", "bf16", "bf16-gqa-tied-no-qk-norm"])
def test_two_gpus_match_one_gpu_with_the_same_global_batch(flags, rtol):
    config = TransformerConfig(**CONFIG, **flags)
    batches = _global_batches(config.vocab_size)
    ref_losses, _, _ = _train(config, batches, "cuda:0")
    results = launch(lambda ctx: _train(config, batches, ctx.device, ctx, step="shard"), devices=[0, 1])
    (loss0, params0, _), (loss1, params1, _) = results
    np.testing.assert_array_equal(loss0, loss1)  # the all-reduced loss: same bits on both ranks
    assert ref_losses[-1] < ref_losses[0] - 0.3, ref_losses  # the run learns something
    rel = np.abs(loss0 - ref_losses) / np.abs(ref_losses)
    assert rel.max() <= rtol, (rel.max(), loss0, ref_losses)
    worst = max(float(np.abs(params0[n] - params1[n]).max()) for n in params0)
    assert worst <= PARAM_ATOL_ACROSS_RANKS, worst


@two_gpus
@pytest.mark.parametrize("flags", [{}, {"recompute": True}, {"bf16": True}, {"bf16": True, "recompute": True, "n_kv_heads": 1, "tie_embeddings": True, "qk_norm": False}],
                         ids=["float32", "recompute", "bf16", "bf16-recompute-mqa-tied-no-qk-norm"])
def test_flat_and_sharded_steps_give_the_bits_of_the_all_reduce_step(flags):
    """DataParallelAdamW (flat gradient buffer; reduce-scatter, AdamW on each rank's chunk,
    all-gather) against all_reduce_gradients + clip + AdamW: without clipping (max_norm above the
    norm) every element takes the same arithmetic, so losses, weights and moments are bitwise
    equal on both ranks."""
    config = TransformerConfig(**CONFIG, **flags)
    batches = _global_batches(config.vocab_size, steps=8)
    runs = {step: launch(lambda ctx: _train(config, batches, ctx.device, ctx, step=step, clip=1e6),
                         devices=[0, 1]) for step in ("all_reduce", "flat", "shard")}
    for step in ("flat", "shard"):
        for rank in range(2):
            want_loss, want_params, want_v = runs["all_reduce"][rank]
            got_loss, got_params, got_v = runs[step][rank]
            np.testing.assert_array_equal(got_loss, want_loss, err_msg=step)
            for name, want in want_params.items():
                np.testing.assert_array_equal(got_params[name], want, err_msg=f"{step} {name}")
                np.testing.assert_array_equal(got_v[name], want_v[name], err_msg=f"{step} moment {name}")


# Every linear weight >= 1 MiB, so the reducer puts them in buckets (smaller ones are packed at
# the end): 3 layers x 7 weights + embedding + lm_head.
BIG = dict(vocab_size=512, dim=512, n_layers=3, n_heads=8, head_dim=64, ffn_dim=1024, max_seq=64)


def _train_reducing(config, batches, ctx, overlap):
    model = TinyTransformer(config, device=ctx.device, seed=0)
    params = model.parameters()
    broadcast_parameters(params, ctx)
    opt = AdamW(model.named_parameters(), lr=LR, weight_decay=0.1)
    reducer = GradientReducer(params, ctx, bucket_mb=1.0) if overlap else None
    losses, launched = [], []
    for x, y in batches:
        x, y = x[ctx.rank * B:(ctx.rank + 1) * B], y[ctx.rank * B:(ctx.rank + 1) * B]
        _, loss = model(x, y)
        if overlap:
            reducer.backward(loss, extra=[loss.detach()])
            launched.append(reducer.launched_during_backward)
        else:
            loss.backward()
            all_reduce_gradients(params, ctx, extra=[loss.detach()])
        clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().item())
    state = {n: p.numpy() for n, p in model.named_parameters()}
    return np.array(losses), state, (reducer.num_buckets if reducer else 0), launched


@two_gpus
@pytest.mark.parametrize("flags", [{}, {"recompute": True}, {"bf16": True},
                                   {"bf16": True, "n_kv_heads": 2, "tie_embeddings": True}],
                         ids=["float32", "recompute", "bf16", "bf16-gqa-tied"])
def test_overlapped_reduction_gives_the_bits_of_reduction_after_backward(flags):
    """GradientReducer launches bucket all-reduces from inside backward, on a side stream; the
    values must be exactly those of one all-reduce after backward, on both ranks."""
    config = TransformerConfig(**BIG, **flags)
    batches = _global_batches(config.vocab_size, steps=6)
    after = launch(lambda ctx: _train_reducing(config, batches, ctx, overlap=False), devices=[0, 1])
    during = launch(lambda ctx: _train_reducing(config, batches, ctx, overlap=True), devices=[0, 1])
    for rank in range(2):
        np.testing.assert_array_equal(during[rank][0], after[rank][0])
        for name, want in after[rank][1].items():
            np.testing.assert_array_equal(during[rank][1][name], want, err_msg=name)
    buckets, launched = during[0][2], during[0][3]
    assert buckets >= 10, buckets
    # All but the embedding's bucket (its gradient is the last one backward writes) and any
    # bucket behind it start before backward returns.
    assert min(launched) >= buckets - 2, (buckets, launched)


@two_gpus
def test_gradient_reducer_bad_inputs():
    def fn(ctx):
        w = xtrain.ones(4, device=ctx.device, requires_grad=True)
        unused = xtrain.ones(4, device=ctx.device, requires_grad=True)
        with pytest.raises(ValueError, match="appears twice"):
            GradientReducer([w, w], ctx)
        with pytest.raises(ValueError, match="no parameters"):
            GradientReducer([], ctx)
        with pytest.raises(ValueError, match="bucket_mb"):
            GradientReducer([w], ctx, bucket_mb=0)
        reducer = GradientReducer([w, unused], ctx)
        with pytest.raises(ValueError, match="has no gradient on rank"):
            reducer.backward(xtrain.ops.sum(xtrain.ops.scale(w, 2.0)))
        w.grad = None
        reducer = GradientReducer([w], ctx)
        reducer.backward(xtrain.ops.sum(xtrain.ops.scale(w, float(ctx.rank + 1))))
        return w.grad.numpy()

    g0, g1 = launch(fn, devices=[0, 1])
    np.testing.assert_array_equal(g0, np.full(4, 1.5, np.float32))  # mean of 1 and 2
    np.testing.assert_array_equal(g1, g0)


# ---------------------------------------------------------------- two GPUs: failures

@two_gpus
def test_a_rank_that_raises_stops_every_rank_within_seconds():
    config = TransformerConfig(**CONFIG)
    batches = _global_batches(config.vocab_size, steps=50)

    def fn(ctx):
        model = TinyTransformer(config, device=ctx.device, seed=0)
        params = model.parameters()
        for step, (x, y) in enumerate(batches):
            x, y = x[ctx.rank * B:(ctx.rank + 1) * B], y[ctx.rank * B:(ctx.rank + 1) * B]
            _, loss = model(x, y)
            if ctx.rank == 1 and step == 3:
                raise ArithmeticError("rank 1 failed mid-step")  # before its all-reduce
            loss.backward()
            all_reduce_gradients(params, ctx)
            for p in params:
                p.grad = None
            loss.item()  # rank 0 waits here on a stream blocked in NCCL until the abort

    t0 = time.monotonic()
    with pytest.raises(ArithmeticError, match="rank 1 failed mid-step"):
        launch(fn, devices=[0, 1])
    assert time.monotonic() - t0 < 30
    assert not _rank_threads()
    # The devices remain usable for a new communicator afterwards.
    assert launch(lambda ctx: ctx.barrier() or ctx.rank, devices=[0, 1]) == [0, 1]


@two_gpus
def test_a_collective_that_never_completes_times_out():
    def fn(ctx):
        if ctx.rank == 0:  # rank 1 never joins: rank 0's all-reduce cannot complete
            ctx.all_reduce([xtrain.ones((8,), device=ctx.device)])
            ctx.barrier()
        return ctx.rank

    t0 = time.monotonic()
    # Either the watchdog (the queued all-reduce never completes) or the first collective's
    # connection setup, which waits for the peer while queuing, gives up after the timeout.
    with pytest.raises(RuntimeError, match="has not completed|did not finish queuing"):
        launch(fn, devices=[0, 1], timeout=3.0)
    assert time.monotonic() - t0 < 30
    assert not _rank_threads()


# ---------------------------------------------------------------- two GPUs: `xtrain train --devices`

def _losses(out):
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return ([r["loss"] for r in records if "loss" in r],
            [r["val_loss"] for r in records if "val_loss" in r])


@two_gpus
def test_cli_two_devices_resume_with_dropout_is_bit_exact(tmp_path):
    # Each rank draws its own dropout masks from its device's generator; the checkpoint keeps
    # every rank's state ("rank_rng"), so 4 + 4 resumed steps are the 8-step run bit for bit.
    data = prepared_stories(tmp_path)
    common = ("train", "--preset", "tiny", "--data", data, "--seq", "64", "--lr", "3e-3",
              "--warmup", "2", "--decay-steps", "8", "--eval-every", "0", "--sample-tokens", "4",
              "--no-progress", "--devices", "2", "--batch", "4", "--dropout", "0.1")
    full = run_cli(*common, "--steps", "8", "--out", tmp_path / "full")
    assert full.returncode == 0, full.stderr
    part = tmp_path / "part"
    r = run_cli(*common, "--steps", "4", "--out", part)
    assert r.returncode == 0, r.stderr
    state = json.loads((part / "ckpt" / "state.json").read_text())
    assert len(state["rank_rng"]) == 2  # one (seed, offset) per rank
    r = run_cli(*common, "--steps", "8", "--out", part, "--resume")
    assert r.returncode == 0, r.stderr
    assert _losses(part)[0] == _losses(tmp_path / "full")[0]


@two_gpus
def test_cli_two_devices_matches_one_and_resumes(tmp_path):
    data = prepared_stories(tmp_path)
    common = ("train", "--preset", "tiny", "--data", data, "--seq", "64", "--lr", "3e-3",
              "--warmup", "2", "--decay-steps", "8", "--eval-every", "4", "--eval-batches", "2",
              "--sample-tokens", "8", "--no-progress")
    one = run_cli(*common, "--devices", "1", "--batch", "8", "--steps", "8", "--out", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    two = run_cli(*common, "--devices", "2", "--batch", "4", "--steps", "8", "--out", tmp_path / "two")
    assert two.returncode == 0, two.stderr
    assert "2 GPUs" in two.stdout and "sample:" in two.stdout
    (l1, v1), (l2, v2) = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(l2) == 8 and len(v2) == 3
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    np.testing.assert_allclose(v2, v1, rtol=1e-5)
    for name in ("loss.png", "sample.txt", "ckpt/state.json"):
        assert (tmp_path / "two" / name).is_file(), name
    # The unsharded step (all-reduce, AdamW on every GPU): the same run up to the order in which
    # the global gradient norm is summed (the clipping factor).
    flat = run_cli(*common, "--devices", "2", "--batch", "4", "--steps", "8", "--out", tmp_path / "flat",
                   "--no-shard-optimizer")
    assert flat.returncode == 0, flat.stderr
    np.testing.assert_allclose(_losses(tmp_path / "flat")[0], l2, rtol=1e-6)

    # Resume on the same number of GPUs: 4 steps, then 4 more == the 8-step run, bit for bit.
    part = tmp_path / "part"
    r = run_cli(*common, "--devices", "2", "--batch", "4", "--steps", "4", "--out", part)
    assert r.returncode == 0, r.stderr
    r = run_cli(*common, "--devices", "2", "--batch", "4", "--steps", "8", "--out", part, "--resume")
    assert r.returncode == 0, r.stderr
    lp, vp = _losses(part)
    assert lp == l2 and vp == v2, (lp, l2, vp, v2)


@two_gpus
def test_cli_two_devices_bf16_sharded_resume_is_bit_exact(tmp_path):
    # bf16 with the sharded step: the ranks gather bf16 weight copies and each holds its own
    # chunk of the float32 weights between checkpoints; a checkpoint gathers them first, so
    # 4 + 4 resumed steps are the 8-step run bit for bit, and the all-reduce step gives the same
    # run up to the clipping factor's rounding.
    data = prepared_stories(tmp_path)
    common = ("train", "--preset", "tiny", "--data", data, "--seq", "64", "--lr", "3e-3",
              "--warmup", "2", "--decay-steps", "8", "--eval-every", "4", "--eval-batches", "2",
              "--sample-tokens", "4", "--no-progress", "--devices", "2", "--batch", "4", "--bf16")
    full = run_cli(*common, "--steps", "8", "--out", tmp_path / "full")
    assert full.returncode == 0, full.stderr
    part = tmp_path / "part"
    r = run_cli(*common, "--steps", "4", "--out", part)
    assert r.returncode == 0, r.stderr
    r = run_cli(*common, "--steps", "8", "--out", part, "--resume")
    assert r.returncode == 0, r.stderr
    assert _losses(part) == _losses(tmp_path / "full")
    flat = run_cli(*common, "--steps", "8", "--out", tmp_path / "flat", "--no-shard-optimizer")
    assert flat.returncode == 0, flat.stderr
    np.testing.assert_allclose(_losses(tmp_path / "flat")[0], _losses(tmp_path / "full")[0], rtol=1e-4)


# ---------------------------------------------------------------- two GPUs: one process per GPU

def _processes(scenario=None, cmd=None, wait_s=300, **env):
    """Two processes under a torchrun-style environment (tests/procgroup.py), waited for."""
    from procgroup import Group

    return Group(2, scenario, cmd=cmd, wait_s=wait_s, **env).wait()


def _worker_results(runs):
    for code, _, stderr, _ in runs:
        assert code == 0, stderr
    return [json.loads(out.splitlines()[-1].split("RESULT ", 1)[1]) for _, out, _, _ in runs]


@two_gpus
@pytest.mark.parametrize("flags", [{}, {"bf16": True}], ids=["float32", "bf16"])
def test_two_processes_match_two_threads_and_one_gpu(flags):
    """The same DataParallelAdamW and step in two processes (a one-rank communicator each, rank 0's
    unique id through the TCP rendezvous) as in two threads: with two ranks every reduction is one
    commutative add, so the runs agree bit for bit; against one GPU with the twice larger batch,
    float32 losses stay within LOSS_RTOL_F32. Weights are identical across the processes."""
    config = TransformerConfig(**CONFIG, **flags)
    batches = _global_batches(config.vocab_size)
    procs = _worker_results(_processes({"gpu": {"flags": flags}}))
    threads = launch(lambda ctx: _train(config, batches, ctx.device, ctx, step="shard"), devices=[0, 1])
    ref_losses, _, _ = _train(config, batches, "cuda:0")
    assert procs[0]["params"] == procs[1]["params"]  # every weight, bit for bit, on both ranks
    assert procs[0]["losses"] == procs[1]["losses"]
    np.testing.assert_array_equal(np.array(procs[0]["losses"]), threads[0][0])
    import hashlib
    want = {n: hashlib.sha256(a.tobytes()).hexdigest() for n, a in threads[0][1].items()}
    assert procs[0]["params"] == want
    if not flags:
        rel = np.abs(np.array(procs[0]["losses"]) - ref_losses) / np.abs(ref_losses)
        assert rel.max() <= LOSS_RTOL_F32, (rel.max(), procs[0]["losses"], ref_losses)


@two_gpus
def test_a_raising_process_stops_the_other_within_seconds():
    """Rank 1 raises before its reduce-scatter; rank 0 is left waiting inside NCCL for it. The
    rendezvous tells rank 0, which aborts its communicator and exits with EXIT_STOPPED, naming rank 1."""
    from xtrain.launch.rendezvous import EXIT_STOPPED

    runs = _processes({"gpu": {"steps": 50}, "fail": {"rank": 1, "at": 3}}, wait_s=120)
    code1, _, err1, t1 = runs[1]
    code0, _, err0, t0 = runs[0]
    assert code1 == 1 and "ArithmeticError: rank 1 failed at step 3" in err1, err1
    assert code0 == EXIT_STOPPED and "stopped: rank 1 failed: ArithmeticError" in err0, err0
    assert t0 - t1 < 10, (t0, t1)


def _cli_cmd(*args):
    return [sys.executable, "-m", "xtrain", *map(str, args)]


@two_gpus
def test_cli_two_processes_train_as_two_threads_and_resume_across_modes(tmp_path):
    """`xtrain train` as two processes (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set as
    torchrun sets them) logs the losses of `--devices 2` bit for bit and writes the same checkpoint;
    a run saved by processes resumes on threads and one saved by threads resumes on processes,
    dropout included (each rank's generator, rank_rng), to the uninterrupted run's bits."""
    data = prepared_stories(tmp_path)
    common = ("train", "--preset", "tiny", "--data", data, "--seq", "64", "--lr", "3e-3", "--warmup", "2",
              "--decay-steps", "8", "--eval-every", "4", "--eval-batches", "2", "--sample-tokens", "4",
              "--no-progress", "--batch", "4", "--dropout", "0.1")
    full = run_cli(*common, "--devices", "2", "--steps", "8", "--out", tmp_path / "threads")
    assert full.returncode == 0, full.stderr
    procs = _processes(cmd=_cli_cmd(*common, "--steps", "8", "--out", tmp_path / "procs"))
    for code, _, stderr, _ in procs:
        assert code == 0, stderr
    assert "2 processes (torchrun" in procs[0][1]
    assert _losses(tmp_path / "procs") == _losses(tmp_path / "threads")
    for name in ("model.safetensors", "optim.safetensors"):
        assert (tmp_path / "procs" / "ckpt" / name).read_bytes() == (tmp_path / "threads" / "ckpt" / name).read_bytes()
    def threads(*args):
        r = run_cli(*common, "--devices", "2", *args)
        assert r.returncode == 0, r.stderr

    def processes(*args):
        for code, _, stderr, _ in _processes(cmd=_cli_cmd(*common, *args)):
            assert code == 0, stderr

    # 4 steps by processes, resumed by threads; 4 by threads, resumed by processes
    for first, second, out in ((processes, threads, "p2t"), (threads, processes, "t2p")):
        first("--steps", "4", "--out", tmp_path / out)
        second("--steps", "8", "--out", tmp_path / out, "--resume")
        assert _losses(tmp_path / out) == _losses(tmp_path / "threads"), out


@two_gpus
@pytest.mark.parametrize("victim", [1, 0])
def test_cli_a_killed_process_ends_the_run_within_10_s(tmp_path, victim):
    """SIGKILL one rank of `xtrain train` mid-run: the other sees its connection close, aborts its
    communicator (it is likely waiting inside NCCL for the dead rank) and exits with status 3,
    naming the rank, within 10 s."""
    import signal

    from procgroup import Group
    from xtrain.launch.rendezvous import EXIT_STOPPED

    data = prepared_stories(tmp_path)
    out = tmp_path / "run"
    group = Group(2, cmd=_cli_cmd("train", "--preset", "tiny", "--data", data, "--seq", "64", "--batch", "4",
                                  "--steps", "100000", "--eval-every", "0", "--no-progress", "--out", out),
                  wait_s=300)
    deadline = time.monotonic() + 240
    while not (out / "log.jsonl").exists() or len((out / "log.jsonl").read_text().splitlines()) < 5:
        group.poll()
        assert all(t is None for t in group.ended), group.wait()
        assert time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    group.procs[victim].send_signal(signal.SIGKILL)
    killed_at = time.monotonic() - group.t0
    runs = group.wait()
    survivor = 1 - victim
    code, _, stderr, ended = runs[survivor]
    assert code == EXIT_STOPPED, stderr
    assert f"xtrain: rank {survivor}: stopped: rank {victim} failed: its process exited or was killed" in stderr, stderr
    assert ended - killed_at < 10, (ended, killed_at)


@two_gpus
def test_cli_under_torchrun(tmp_path):
    """The real torchrun: its agent serves a store at MASTER_PORT, xtrain's rendezvous takes the port
    after it; the run is the hand-made environment's run."""
    pytest.importorskip("torch.distributed.run")
    data = prepared_stories(tmp_path)
    common = ("train", "--preset", "tiny", "--data", data, "--seq", "64", "--batch", "4", "--steps", "4",
              "--eval-every", "0", "--sample-tokens", "4", "--no-progress")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "xtrain", *map(str, common), "--out", str(tmp_path / "torchrun")],
                       capture_output=True, text=True, timeout=300, env=_cli_env())
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    runs = _processes(cmd=_cli_cmd(*common, "--out", tmp_path / "env"))
    assert all(code == 0 for code, *_ in runs), runs
    assert _losses(tmp_path / "torchrun") == _losses(tmp_path / "env")


def _cli_env():
    from procgroup import clean_environ

    return clean_environ()


@two_gpus
def test_zero1_peak_memory_is_below_the_all_reduce_steps():
    """ZeRO-1's memory half: with the sharded step each GPU holds the AdamW moments of its half of
    the weights only, so its peak is below the flat all-reduce step's by about half the moments
    (2 x 4 bytes x numel / 2)."""
    config = TransformerConfig(**BIG, bf16=True)
    batches = _global_batches(config.vocab_size, steps=4)

    def peak(step):
        def fn(ctx):
            xtrain.empty_cache(ctx.device)
            xtrain.reset_peak_memory_stats(ctx.device)
            _train(config, batches, ctx.device, ctx, step=step)
            return xtrain.memory_stats(ctx.device)["allocated_bytes.peak"]
        return launch(fn, devices=[0, 1])

    numel = TinyTransformer(config, device="cpu", seed=0).store.numel
    shard, flat = peak("shard"), peak("flat")
    saved = 4 * numel  # two float32 moments, half of them on each of 2 GPUs
    for s, f in zip(shard, flat):
        assert s < f - saved // 2, (s, f, saved)
