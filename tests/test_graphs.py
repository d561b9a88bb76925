"""CUDA graphs of the training step (xtrain.cuda.Graph, xtrain.graphs, train.py's switch).

On the CPU (always): the switch's plumbing (CLI flag, config file, record, TrainConfig), the CPU
no-op, AdamW's device-resident per-step constants (bitwise equal to launch arguments), and the
StepGraphs bookkeeping around a capture with a stand-in Graph that runs the captured work at once
(capture step equal to an eager step, both fallbacks). On a GPU (skipped without one): the capture
facility (replay, private pool, refusals inside a capture) and N training steps with graphs equal
to N eager steps, bitwise (fp32, bf16, accumulation, recompute, dropout, a poisoned step)."""

import json
import math
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import xtrain
from cpu_collectives import ThreadCollectives, run_rank_threads
from modelhelp import prepared_stories, run_log, tiny_run
from xtrain import graphs, ops
from xtrain.trainer import runconfig
from xtrain.launch.distributed import DataParallelAdamW, RankContext
from xtrain.models import TinyTransformer, TransformerConfig
from xtrain.optim import AdamW
from xtrain.trainer.train import TrainConfig, train

needs_gpu = pytest.mark.skipif(not xtrain.cuda.is_available(),
                               reason="needs a CUDA GPU (the lead runs these on the H200)")
SMALL = dict(vocab_size=64, dim=32, n_layers=2, n_heads=2, head_dim=16, ffn_dim=64, max_seq=16)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("graphs-data"))


def _step_values(out):
    """(step, loss, grad_norm, skipped) per step; json.dumps makes NaN comparable."""
    return [json.dumps([r["step"], r["loss"], r["grad_norm"], r.get("skipped", False)])
            for r in run_log(out) if "loss" in r]


def _same_checkpoints(a, b):
    for name in ("model.safetensors", "optim.safetensors"):
        assert (a / "ckpt" / name).read_bytes() == (b / "ckpt" / name).read_bytes(), name


# ---------------------------------------------------------------- the switch (CPU)

def test_cli_flag_config_file_and_record(tmp_path):
    from xtrain.trainer.cli import _train_values, build_parser

    parser = build_parser()
    assert _train_values(parser.parse_args(["train", "--device", "cpu"]))["cuda_graphs"] is True
    assert _train_values(parser.parse_args(["train", "--device", "cpu", "--no-cuda-graphs"]))["cuda_graphs"] is False
    (tmp_path / "run.toml").write_text("cuda-graphs = false\n")
    values = _train_values(parser.parse_args(["train", "--device", "cpu", "--config", str(tmp_path / "run.toml")]))
    assert values["cuda_graphs"] is False
    values = _train_values(parser.parse_args(["train", "--device", "cpu", "--config", str(tmp_path / "run.toml"),
                                              "--cuda-graphs"]))
    assert values["cuda_graphs"] is True  # the command line wins over the file
    assert runconfig.record_of(TrainConfig(cuda_graphs=False))["cuda_graphs"] is False
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--cuda-graphs", "--no-cuda-graphs"])


def test_help_lists_the_switch(capsys):
    from xtrain.trainer.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    text = capsys.readouterr().out
    assert "--cuda-graphs" in text and "--no-cuda-graphs" in text


def test_switch_is_a_no_op_on_the_cpu(tmp_path, data):
    on = train(tiny_run(tmp_path / "on", data, 4, "cpu", cuda_graphs=True))
    off = train(tiny_run(tmp_path / "off", data, 4, "cpu", cuda_graphs=False))
    assert on["steps"] == off["steps"] == 4
    assert _step_values(tmp_path / "on") == _step_values(tmp_path / "off")
    assert not any(r.get("graph") for r in run_log(tmp_path / "on"))
    _same_checkpoints(tmp_path / "on", tmp_path / "off")


def test_graph_blockers():
    # the device alone decides: neither dropout (Note [Random draws in captured graphs]) nor data
    # parallel (StepGraphs(dp=...)) blocks the capture any more
    assert graphs.graph_blockers("cpu") == "not a CUDA device"
    if not xtrain.cuda.is_available():
        assert graphs.graph_blockers("cuda:0") == "CUDA is not available"
    else:
        assert graphs.graph_blockers("cuda:0") is None


def test_graph_needs_a_gpu():
    if xtrain.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA"):
        xtrain.cuda.Graph(0)
    with pytest.raises(RuntimeError, match="CUDA"):
        xtrain.cuda.Event(0)
    assert xtrain.cuda.is_capturing() is False
    stats = xtrain.memory_stats("cpu")
    assert stats["pool_bytes.current"] == 0 and stats["num_pools"] == 0


# ---------------------------------------------------------------- AdamW's device constants

def test_adamw_consts_are_the_kernel_constants():
    lr, b1, b2, wd, step = 3e-4, 0.9, 0.95, 0.1, 7
    decay, step_size, bc2_sqrt = xtrain._C.optim.adamw_consts(lr, b1, b2, 1e-8, wd, step)
    f = np.float32
    assert decay == f(1) - f(lr) * f(wd)
    assert step_size == f(lr) / f(1 - b1 ** step)
    assert bc2_sqrt == np.sqrt(f(1 - b2 ** step))
    with pytest.raises(ValueError, match="step must be >= 1"):
        xtrain._C.optim.adamw_consts(lr, b1, b2, 1e-8, wd, 0)


def _train_small(device, hyper: bool, prepared: bool = False, steps: int = 6, store: bool = True):
    model = TinyTransformer(TransformerConfig(**SMALL), device=device, seed=0)
    named = model.named_parameters() if store else [(n, p) for n, p in model.named_parameters()][:-1]
    opt = AdamW(named, lr=1e-2, weight_decay=0.1)
    if hyper:
        opt.use_device_hyper()
    rng = np.random.default_rng(0)
    losses = []
    for step in range(steps):
        opt.lr = 1e-2 * (step + 1) / steps  # a changing LR: the constants must follow it
        ids = rng.integers(0, 64, (2, 16))
        _, loss = model(ids, ids)
        loss.backward()
        if prepared:
            opt.prepare_step()
            opt.clip_and_step(0.5, loss, prepared=True)
        else:
            opt.clip_and_step(0.5, loss)
        opt.zero_grad()
        losses.append(loss.item())
    m, v = opt.moment_arrays()
    return losses, {n: p.numpy().copy() for n, p in model.named_parameters()}, m, v, opt.step_count


@pytest.mark.parametrize("store", [True, False], ids=["flat", "per-tensor"])
def test_device_constants_give_the_same_bits(device, store):
    base = _train_small(device, hyper=False, store=store)
    for prepared in (False, True):
        got = _train_small(device, hyper=True, prepared=prepared, store=store)
        assert got[0] == base[0] and got[4] == base[4] == 6
        for a, b in zip(got[1:4], base[1:4]):
            for n in b:
                np.testing.assert_array_equal(a[n], b[n], err_msg=n)


def test_prepare_step_needs_device_constants():
    model = TinyTransformer(TransformerConfig(**SMALL), device="cpu")
    opt = AdamW(model.named_parameters())
    with pytest.raises(RuntimeError, match="use_device_hyper"):
        opt.prepare_step()
    with pytest.raises(RuntimeError, match="use_device_hyper"):
        opt.step(prepared=True)


# ---------------------------------------------------------------- StepGraphs around a capture (CPU)

class _RunAtOnce:
    """Stands in for xtrain.cuda.Graph on the CPU: the 'captured' work runs as it is queued and
    replay() does nothing, so a capture step must equal an eager step. fail_at: which capture
    raises (1: the forward+backward, 2: clip + AdamW)."""
    made = 0
    fail_at = None

    def __init__(self, device=0, share_pool_with=None):
        type(self).made += 1
        self.index = type(self).made
        self.num_nodes, self.replays, self.memsets_as_kernels = 10 * self.index, 0, self.index

    def capture_begin(self):
        if self.index == type(self).fail_at:
            raise RuntimeError("a host-to-device copy cannot run while this thread captures a CUDA graph")

    def capture_end(self):
        pass

    def abort_capture(self):
        pass

    def replay(self):
        self.replays += 1


def _eager_step(model, opt, x, y, accum):
    loss = graphs.forward_backward(model, x, y, accum)
    norm = opt.clip_and_step(1.0, loss)
    opt.zero_grad(set_to_none=True)
    return loss.item(), norm.item()


@pytest.mark.parametrize("fail_at", [None, 1, 2])
@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_capture_step_bookkeeping(monkeypatch, fail_at, accum, dropout):
    monkeypatch.setattr(xtrain.cuda, "Graph", _RunAtOnce)
    monkeypatch.setattr(_RunAtOnce, "made", 0)
    monkeypatch.setattr(_RunAtOnce, "fail_at", fail_at)
    rng = np.random.default_rng(1)
    batches = [(b, b) for b in (rng.integers(0, 64, (2 * accum, 16)) for _ in range(4))]
    results = []
    for use_graphs in (False, True):
        xtrain.manual_seed(5)  # the dropout masks: the same generator states in both runs
        model = TinyTransformer(TransformerConfig(**SMALL, dropout=dropout), device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        notes, settled = [], []
        sg = graphs.StepGraphs(model, opt, accum, 1.0, note=notes.append)
        values = []
        for i, (x, y) in enumerate(batches[:3]):
            out = sg.step(x, y, settle=lambda: settled.append(i)) if use_graphs else None
            if out is None:
                values.append(_eager_step(model, opt, x, y, accum))
                sg.eager()
            else:
                values.append((out[0].item(), out[1].item()))
        results.append((values, {n: p.numpy().copy() for n, p in model.named_parameters()},
                        opt.moment_arrays(), opt.step_count, xtrain.default_generator("cpu").get_state()))
        if use_graphs:
            if fail_at is None:
                # the capture drew the step's dropout counters relative to device words it keeps
                assert (sg.draws > 0) == (dropout > 0) and (sg.rng is not None) == (dropout > 0)
                assert sg.active and sg.num_nodes == 30 and settled == [2]
                assert "captured after 2 eager steps, 30 nodes per replay" in notes[0]
                assert all(p.grad is None for p in opt.params)  # as zero_grad(set_to_none=True) leaves it
                # the next step replays: batch in, graph 1, settle, constants, graph 2
                assert sg.step(*batches[3], settle=lambda: settled.append(3)) is not None
                assert settled == [2, 3] and sg.fwd.replays == 2 and sg.upd.replays == 2
                assert opt.step_count == 4
                # another batch shape runs eagerly (this step only)
                assert sg.step(batches[0][0][:1], batches[0][1][:1]) is None and "runs eagerly" in notes[-1]
            else:
                stage = "forward and backward" if fail_at == 1 else "clip + AdamW"
                assert sg.disabled.startswith(f"capture of the {stage} failed: RuntimeError")
                assert "CUDA graphs off" in notes[0] and not sg.active
                assert sg.step(*batches[3]) is None  # off for good
    (v0, p0, (m0, s0), c0, g0), (v1, p1, (m1, s1), c1, g1) = results
    assert v0 == v1 and c0 == c1 == 3
    assert g0 == g1, "the capture step advances the generator as an eager step does"
    for n in p0:
        np.testing.assert_array_equal(p0[n], p1[n], err_msg=n)
        np.testing.assert_array_equal(m0[n], m1[n], err_msg=n)
        np.testing.assert_array_equal(s0[n], s1[n], err_msg=n)


class _RankGraph(_RunAtOnce):
    """_RunAtOnce for rank threads: fail_at = (thread name, n): that thread's n-th graph fails to
    capture (1: its forward+backward, 2: its update). capturing(): whether this thread is inside
    a capture."""
    counts = {}
    _local = threading.local()

    def __init__(self, device=0, share_pool_with=None):
        super().__init__(device, share_pool_with)
        me = threading.current_thread().name
        self.counts[me] = self.counts.get(me, 0) + 1
        self.nth = (me, self.counts[me])

    def capture_begin(self):
        if self.nth == type(self).fail_at:
            raise RuntimeError("a host-to-device copy cannot run while this thread captures a CUDA graph")
        self.deferred = []
        self._local.graph = self

    def capture_end(self):
        self._local.graph = None

    def abort_capture(self):
        self._local.graph = None

    def replay(self):
        super().replay()
        for run in getattr(self, "deferred", []):
            run()

    @classmethod
    def capturing(cls):
        """The stand-in graph this thread is capturing, or None."""
        return getattr(cls._local, "graph", None)


class _CapturedCollectives:
    """A rank's stand-in collectives that, as NCCL's, do not run while the thread captures: they
    run at each replay of the stand-in graph (the other captured work ran at once)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
            return attr

        def collective(*args, **kw):
            g = _RankGraph.capturing()
            if g is not None:
                self.inner.calls.append(f"captured {name}")
                g.deferred.append(lambda: attr(*args, **kw))
                return None
            return attr(*args, **kw)
        return collective


def _rank_generators(monkeypatch):
    """One generator per rank thread for StepGraphs' capture bookkeeping: the rank threads of these
    CPU tests share the one CPU device (on GPUs each rank's device has its own generator)."""
    gens = {}
    monkeypatch.setattr(xtrain, "default_generator",
                        lambda device=None: gens.setdefault(threading.current_thread().name, xtrain._C.Generator()))


def _dp_run(world, shard, bf16, use_graphs, steps=3, defer=False, gather_between=False):
    """`world` rank threads (stand-in collectives), each a TinyTransformer + DataParallelAdamW over
    its rows of the same batches; with use_graphs through StepGraphs(dp=...), else dp.step. Returns
    per rank: the (loss, norm) values, the weights, the moments, the step count, the notes, the
    StepGraphs and the collectives called. defer: collectives queued inside a capture are
    recorded, not run (_CapturedCollectives). gather_between: after the replay, gather_state()
    (a checkpoint's) and one more replay."""
    shared = ThreadCollectives(world)
    launch = SimpleNamespace(shared={}, stop=threading.Event(), origin=None, devices=list(range(world)))
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 64, (2 * world, 17)) for _ in range(steps + 1)]

    def main(rank):
        comm = shared.rank(rank)
        ctx = RankContext(rank, world, "cpu", _CapturedCollectives(comm) if defer else comm, launch)
        model = TinyTransformer(TransformerConfig(**SMALL, bf16=bf16), device="cpu", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
        dp = DataParallelAdamW(opt, ctx, shard=shard)
        notes = []
        sg = graphs.StepGraphs(model, opt, 1, 1.0, note=notes.append, dp=dp) if use_graphs else None
        values = []
        for w in batches[:steps]:
            w = w[2 * rank:2 * rank + 2]
            out = sg.step(w[:, :-1], w[:, 1:]) if sg is not None else None
            if out is None:
                loss = graphs.forward_backward(model, w[:, :-1], w[:, 1:], 1)
                norm = dp.step(1.0, extra=[loss], guard=loss)
                if sg is not None:
                    sg.eager()
                out = (loss, norm)
            values.append((out[0].item(), out[1].item()))
        if sg is not None and sg.active:  # one replay: nothing runs (stand-in), bookkeeping only
            w = batches[steps][2 * rank:2 * rank + 2]
            assert sg.step(w[:, :-1], w[:, 1:]) is not None
            if gather_between:
                dp.gather_state()
                assert sg.step(w[:, :-1], w[:, 1:]) is not None
        dp.gather_state()
        return (values, {n: p.numpy().copy() for n, p in model.named_parameters()},
                opt.moment_arrays(), opt.step_count, notes, sg, ctx.comm.calls, model.store)

    return run_rank_threads(shared, main)


@pytest.mark.parametrize("fail_at", [None, ("rank1", 1), ("rank0", 1)],
                         ids=["captured", "rank1-forward-fails", "rank0-forward-fails"])
@pytest.mark.parametrize("shard,bf16", [(True, True), (True, False), (False, True)],
                         ids=["shard-bf16", "shard-fp32", "allreduce-bf16"])
def test_data_parallel_capture_step_equals_eager_on_every_rank(monkeypatch, shard, bf16, fail_at):
    """StepGraphs(dp=...): the capture step (the stand-in runs the captured work at once) gives
    every rank the eager data-parallel step's values, weights and moments; a capture that fails on
    one rank turns the graphs off on every rank, agreed before anything captured runs."""
    monkeypatch.setattr(xtrain.cuda, "Graph", _RankGraph)
    monkeypatch.setattr(_RankGraph, "counts", {})
    monkeypatch.setattr(_RankGraph, "fail_at", fail_at)
    _rank_generators(monkeypatch)
    eager = _dp_run(2, shard, bf16, use_graphs=False)
    captured = _dp_run(2, shard, bf16, use_graphs=True)
    for rank in range(2):
        (v0, p0, (m0, s0), c0, _, _, _, _), (v1, p1, (m1, s1), c1, _, sg, calls, store) = eager[rank], captured[rank]
        assert v0 == v1, rank
        for n in p0:
            np.testing.assert_array_equal(p0[n], p1[n], err_msg=f"rank {rank} {n}")
            np.testing.assert_array_equal(m0[n], m1[n], err_msg=f"rank {rank} {n}")
            np.testing.assert_array_equal(s0[n], s1[n], err_msg=f"rank {rank} {n}")
        if fail_at is None:
            # captured at step 2 on both ranks, then one replay: its count, its watchdog note
            assert sg.active and sg.replays == 2 and c1 == c0 + 1 == 4
            assert calls.count("note_replay") == 2
            # sharded bf16: the update gathers the bf16 copies, which stay current after a replay
            # (only this rank's chunk of the float32 weights is); else the next eager forward casts
            assert store._partial is False  # gather_state() at the end made the weights whole
        else:
            assert not sg.active and sg.disabled.startswith("capture of the forward and backward failed")
            own = fail_at[0] == f"rank{rank}"
            assert ("RuntimeError: a host-to-device copy" in sg.disabled) == own, sg.disabled
            assert ("another rank's capture failed" in sg.disabled) == (not own), sg.disabled
            assert "note_replay" not in calls and c1 == c0 == 3


@pytest.mark.parametrize("failing", [0, 1])
def test_data_parallel_update_capture_failing_on_one_rank(monkeypatch, failing):
    """The update's capture fails on one rank only: no rank launches its captured update (NCCL
    wants a collective graph-launched on every rank or on none); every rank runs the update
    eagerly from the gradients the capture left set, and eagerly from then on. The stand-in
    collectives of a capture are recorded, not run (as NCCL's: they run at a replay), so only the
    bookkeeping is compared here; the values are the GPU tests'."""
    monkeypatch.setattr(xtrain.cuda, "Graph", _RankGraph)
    monkeypatch.setattr(_RankGraph, "counts", {})
    monkeypatch.setattr(_RankGraph, "fail_at", (f"rank{failing}", 2))
    _rank_generators(monkeypatch)
    results = _dp_run(2, True, True, use_graphs=True, defer=True)
    for rank, (values, _, _, count, notes, sg, calls, _) in enumerate(results):
        own = rank == failing
        assert len(values) == 3 and count == 3 and not sg.active, rank
        assert sg.disabled.startswith("capture of the gradient average + clip + AdamW failed"), sg.disabled
        assert ("another rank's capture failed" in sg.disabled) == (not own), sg.disabled
        captured = [c for c in calls if c.startswith("captured")]
        # the rank whose capture succeeded queued its collectives into the graph, never launched
        assert (captured == ["captured reduce_scatter", "captured all_reduce", "captured all_gather"]) == (not own), calls
        assert "note_replay" not in calls, calls
        # then the same eager collectives on both ranks: 2 warm-up steps and this one
        eager = [c for c in calls if c in ("reduce_scatter", "all_reduce", "all_gather")]
        assert eager[:9] == ["reduce_scatter", "all_reduce", "all_gather"] * 3, calls


def test_data_parallel_replay_keeps_gathered_bf16_copies_current(monkeypatch):
    """Sharded bf16: after a replay the store marks the compute copies current (the update graph
    gathered them), so an eager forward between replays (an evaluation) reads them instead of
    casting from float32 weights that are current in this rank's chunk only."""
    monkeypatch.setattr(xtrain.cuda, "Graph", _RankGraph)
    monkeypatch.setattr(_RankGraph, "counts", {})
    monkeypatch.setattr(_RankGraph, "fail_at", None)
    _rank_generators(monkeypatch)
    seen = []
    real = graphs.StepGraphs._weights_changed

    def spy(self):
        real(self)
        store = self.model.store
        seen.append((store._partial, store._compute_version == store._params_version()))

    monkeypatch.setattr(graphs.StepGraphs, "_weights_changed", spy)
    _dp_run(2, shard=True, bf16=True, use_graphs=True, gather_between=True)
    # per rank: the capture step, a replay, and a replay after gather_state() made the float32
    # weights whole (and the store's record not partial): the copies marked current each time
    assert len(seen) == 6 and all(partial and current for partial, current in seen), seen


def test_closed_step_graphs_run_eagerly(monkeypatch):
    monkeypatch.setattr(xtrain.cuda, "Graph", _RunAtOnce)
    monkeypatch.setattr(_RunAtOnce, "made", 0)
    monkeypatch.setattr(_RunAtOnce, "fail_at", None)
    model = TinyTransformer(TransformerConfig(**SMALL), device="cpu", seed=0)
    sg = graphs.StepGraphs(model, AdamW(model.named_parameters(), lr=1e-2), 1, 1.0, note=lambda m: None, warmup=0)
    ids = np.zeros((2, 16), np.int64)
    assert sg.step(ids, ids) is not None and sg.active
    sg.close()
    assert not sg.active and sg.loss is None and sg.disabled.startswith("closed")
    assert sg.step(ids, ids) is None  # the caller runs it eagerly


def test_blocked_step_graphs_never_capture():
    model = TinyTransformer(TransformerConfig(**SMALL), device="cpu")
    sg = graphs.StepGraphs(model, AdamW(model.named_parameters()), 1, 1.0, blocked="switched off", warmup=0)
    ids = np.zeros((2, 16), np.int64)
    assert sg.step(ids, ids) is None and not sg.active and sg.num_nodes == 0


# ---------------------------------------------------------------- the capture facility (GPU)

@needs_gpu
def test_capture_and_replay_follow_the_static_input():
    x = xtrain.tensor(np.arange(6, dtype=np.float32), device="cuda")
    ops.mul(x, 1.0).numpy()  # warm-up outside the capture
    before = xtrain.memory_stats("cuda")
    g = xtrain.cuda.Graph(0)
    with xtrain.cuda.graph(g):
        y = ops.add(ops.mul(x, 2.0), 1.0)
    assert g.captured and g.num_nodes >= 2 and g.pool_id > 0
    stats = xtrain.memory_stats("cuda")
    assert stats["num_pools"] == before["num_pools"] + 1 and stats["pool_bytes.current"] > 0
    ptr = y.data_ptr() if hasattr(y, "data_ptr") else None
    for k in range(3):
        x.copy_(xtrain.tensor(np.arange(6, dtype=np.float32) * (k + 1)))
        g.replay()
        np.testing.assert_array_equal(y.numpy(), np.arange(6, dtype=np.float32) * (k + 1) * 2 + 1)
    if ptr is not None:
        assert y.data_ptr() == ptr
    assert g.replays == 3
    del g
    assert xtrain.memory_stats("cuda")["num_pools"] == before["num_pools"]
    np.testing.assert_array_equal(y.numpy(), np.arange(6, dtype=np.float32) * 3 * 2 + 1)  # y outlives it


@needs_gpu
@pytest.mark.parametrize("what, call", [
    ("device-to-host copy", lambda x: x.numpy()),
    ("host-to-device copy", lambda x: xtrain.tensor(np.ones(3, np.float32), device="cuda")),
    ("read_async", lambda x: xtrain.cuda.read_async([ops.sum(x)])),
    ("read_async", lambda x: xtrain.cuda.read_array_async(x)),
    ("synchronize", lambda x: xtrain.cuda.synchronize()),
    ("empty_cache", lambda x: xtrain.cuda.empty_cache()),
])
def test_what_cannot_be_captured_raises_and_the_stream_recovers(what, call):
    x = xtrain.tensor(np.arange(4, dtype=np.float32), device="cuda")
    g = xtrain.cuda.Graph(0)
    with pytest.raises(RuntimeError, match=what):
        with xtrain.cuda.graph(g):
            ops.mul(x, 3.0)
            call(x)
    assert not g.captured and not xtrain.cuda.is_capturing()
    assert ops.sum(ops.mul(x, 3.0)).item() == 18.0  # the stream works eagerly again
    g2 = xtrain.cuda.Graph(0)
    with pytest.raises(RuntimeError, match="replay: nothing was captured"):
        g2.replay()


@needs_gpu
def test_replay_from_another_thread_is_refused():
    import threading

    x = xtrain.tensor(np.ones(4, np.float32), device="cuda")
    g = xtrain.cuda.Graph(0)
    with xtrain.cuda.graph(g):
        ops.mul(x, 2.0)
    errors = []

    def other():
        try:
            g.replay()
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors and "thread that captured it" in errors[0]


@needs_gpu
def test_graph_replayed_on_an_ended_thread_is_freed_safely():
    # a data-parallel rank's graphs can outlive its thread (freed later by the garbage collector,
    # elsewhere): that thread's stream is destroyed at its exit, so the graph must not sync it
    held = []

    def rank():
        x = xtrain.tensor(np.ones(1 << 16, np.float32), device="cuda")
        g = xtrain.cuda.Graph(0)
        with xtrain.cuda.graph(g):
            y = ops.mul(x, 2.0)
        g.replay()
        held.append((g, y.numpy()))

    t = threading.Thread(target=rank)
    t.start()
    t.join()
    g, y = held.pop()
    assert g.replays == 1 and float(y[0]) == 2.0
    del g
    xtrain.cuda.synchronize()
    assert ops.sum(ops.mul(xtrain.tensor(np.ones(4, np.float32), device="cuda"), 2.0)).item() == 8.0


@needs_gpu
def test_graph_freed_on_a_later_thread_with_the_same_id_is_freed_safely():
    # the C library reuses an ended thread's id for the next thread: a graph captured on thread A
    # and dropped on a later thread B (a garbage collection in the next rank's thread) must not
    # take B for its owner and synchronize A's destroyed stream
    held, ids = [], []

    def capture():
        ids.append(threading.get_ident())
        x = xtrain.tensor(np.ones(1 << 16, np.float32), device="cuda")
        g = xtrain.cuda.Graph(0)
        with xtrain.cuda.graph(g):
            y = ops.mul(x, 2.0)
        g.replay()
        held.append((g, y))

    def drop():
        ids.append(threading.get_ident())
        g, y = held.pop()
        assert float(y.numpy()[0]) == 2.0
        del g, y

    for target in (capture, drop):
        t = threading.Thread(target=target)
        t.start()
        t.join()
    assert not held
    xtrain.cuda.synchronize()
    assert ops.sum(ops.mul(xtrain.tensor(np.ones(4, np.float32), device="cuda"), 2.0)).item() == 8.0


@needs_gpu
def test_train_drops_its_graphs_when_the_steps_end(tmp_path, data, monkeypatch):
    closed = []
    real = graphs.StepGraphs.close

    def close(self):
        closed.append(self.replays)
        real(self)
        assert self.fwd is None and self.upd is None and not self.active

    monkeypatch.setattr(graphs.StepGraphs, "close", close)
    train(tiny_run(tmp_path, data, 5, "cuda", cuda_graphs=True))
    assert closed == [5 - graphs.WARMUP_STEPS]


# ---------------------------------------------------------------- training with graphs (GPU)

@needs_gpu
@pytest.mark.parametrize("kw", [{}, {"bf16": True}, {"grad_accum": 2}, {"recompute": True, "bf16": True},
                                {"dropout": 0.1, "bf16": True},
                                {"dropout": 0.1, "recompute": True, "grad_accum": 2}],
                         ids=["fp32", "bf16", "accum2", "recompute-bf16", "dropout-bf16", "dropout-recompute-accum2"])
def test_graph_steps_equal_eager_steps_bitwise(tmp_path, data, kw):
    steps = 8
    # evaluations between replays: their bf16 weight copies must be cast from the replayed updates
    ev = dict(eval_every=3, eval_batches=1)
    train(tiny_run(tmp_path / "eager", data, steps, "cuda", cuda_graphs=False, **ev, **kw))
    train(tiny_run(tmp_path / "graphs", data, steps, "cuda", cuda_graphs=True, **ev, **kw))
    assert _step_values(tmp_path / "graphs") == _step_values(tmp_path / "eager")
    vals = [[(r["step"], r["val_loss"]) for r in run_log(tmp_path / name) if "val_loss" in r]
            for name in ("eager", "graphs")]
    assert vals[0] == vals[1] and [s for s, _ in vals[0]] == [0, 3, 6, 8]
    replayed = [r["step"] for r in run_log(tmp_path / "graphs") if r.get("graph")]
    assert replayed == list(range(graphs.WARMUP_STEPS, steps))  # the capture step and the replays
    assert not any(r.get("graph") for r in run_log(tmp_path / "eager"))
    _same_checkpoints(tmp_path / "graphs", tmp_path / "eager")


@pytest.mark.skipif(not xtrain.launch.distributed.is_available(), reason="needs an NCCL build of xtrain and a GPU")
@pytest.mark.parametrize("devices", [[0], [0, 1]], ids=["one-rank", "two-ranks"])
@pytest.mark.parametrize("kw", [{"bf16": True}, {"bf16": True, "shard_optimizer": False}, {},
                                {"dropout": 0.1, "bf16": True, "grad_accum": 2}],
                         ids=["shard-bf16", "allreduce-bf16", "shard-fp32", "dropout-bf16-accum2"])
def test_data_parallel_graph_steps_equal_eager_steps_bitwise(tmp_path, data, devices, kw):
    """Data parallel with the step captured (its NCCL collectives inside the update graph) against
    the same run eager: the same losses, norms, evaluations and checkpoints, bit for bit; with one
    rank on one GPU, and with two where there are two."""
    from xtrain.trainer.train import train_data_parallel

    if len(devices) > xtrain.cuda.device_count():
        pytest.skip(f"needs {len(devices)} GPUs")
    steps = 8
    # a checkpoint at step 4 gathers the sharded weights between replays; the evaluations after
    # it must still read the bf16 copies the replayed updates gathered
    ev = dict(eval_every=3, eval_batches=1, save_every=4)
    for name, on in (("eager", False), ("graphs", True)):
        train_data_parallel(tiny_run(tmp_path / name, data, steps, "cuda", cuda_graphs=on, **ev, **kw), devices)
    assert _step_values(tmp_path / "graphs") == _step_values(tmp_path / "eager")
    vals = [[(r["step"], r["val_loss"]) for r in run_log(tmp_path / name) if "val_loss" in r]
            for name in ("eager", "graphs")]
    assert vals[0] == vals[1] and [s for s, _ in vals[0]] == [0, 3, 6, 8]
    replayed = [r["step"] for r in run_log(tmp_path / "graphs") if r.get("graph")]
    assert replayed == list(range(graphs.WARMUP_STEPS, steps))
    _same_checkpoints(tmp_path / "graphs", tmp_path / "eager")


@needs_gpu
def test_poisoned_steps_are_skipped_the_same_with_graphs(tmp_path, data):
    from xtrain.trainer.train import NonFiniteStepsError

    # no saves on the way: at lr 1e6 a save would stop the run as diverged (Note [Diverged
    # checkpoints]) before the poisoned steps this test is about
    for name, on in (("eager", False), ("graphs", True)):
        cfg = tiny_run(tmp_path / name, data, 40, "cuda", lr=1e6, warmup=1, save_every=0, save_minutes=0,
                       nonfinite_limit=3, cuda_graphs=on)
        with pytest.raises(NonFiniteStepsError, match="3 steps in a row"):
            train(cfg)
    a, b = _step_values(tmp_path / "eager"), _step_values(tmp_path / "graphs")
    assert a == b and sum('true]' in r for r in b) == 3  # every step's loss and norm, skips included
    assert any(r.get("graph") for r in run_log(tmp_path / "graphs"))


@needs_gpu
def test_captured_dropout_outside_capture_mode_raises():
    # a hand-made capture whose generator is not in capture mode would replay one mask forever
    x = xtrain.tensor(np.ones(64, np.float32), device="cuda")
    g = xtrain.cuda.Graph(0)
    with pytest.raises(RuntimeError, match="needs its generator in capture mode"):
        with xtrain.cuda.graph(g):
            ops.dropout(x, 0.5)
    assert not g.captured and not xtrain.cuda.is_capturing()


@needs_gpu
def test_hand_captured_dropout_draws_fresh_masks_per_replay():
    x = xtrain.tensor(np.ones(4096, np.float32), device="cuda")
    gen = xtrain.Generator(9)
    eager = [ops.dropout(x, 0.5, generator=gen).numpy() for _ in range(3)]
    gen.set_state((9, 0))
    words = xtrain.zeros((2,), dtype="int64", device="cuda")
    g = xtrain.cuda.Graph(0)
    gen.begin_capture(words)
    try:
        with xtrain.cuda.graph(g):
            y = ops.dropout(x, 0.5, generator=gen)
    finally:
        draws = gen.end_capture()
    assert draws == 4096
    for want in eager:
        seed, offset = gen.get_state()
        words.copy_(xtrain.tensor(np.array([seed, offset], np.uint64).view(np.int64)))
        gen.set_state((seed, offset + draws))
        g.replay()
        np.testing.assert_array_equal(y.numpy(), want)


@needs_gpu
def test_step_graphs_zero_raw_allocations_and_node_count():
    model = TinyTransformer(TransformerConfig(**SMALL), device="cuda", seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-2)
    sg = graphs.StepGraphs(model, opt, 1, 1.0, note=lambda m: None)
    rng = np.random.default_rng(0)
    for i in range(6):
        ids = rng.integers(0, 64, (2, 16))
        out = sg.step(ids, ids)
        if out is None:
            _eager_step(model, opt, ids, ids, 1)
            sg.eager()
        if i == 3:
            raw = xtrain.memory_stats("cuda")["num_raw_alloc"]
    assert sg.active and sg.replays == 4 and sg.num_nodes > 20  # the capture step's replay and 3 more
    assert xtrain.memory_stats("cuda")["num_raw_alloc"] == raw
    assert math.isfinite(sg.loss.item()) and math.isfinite(sg.norm.item())


@needs_gpu
@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "recompute"])
def test_lean_model_casting_on_use_replays_its_eager_steps_bitwise(recompute):
    """A lean bf16 model's store casts on use: each block's weights are cast inside the captured
    forward and cast again inside the captured backward (Note [Casts saved as their source]). The
    replays give the eager steps' losses, norms and weights bit for bit, and no flat copy of the
    weights is ever made."""
    cfg = TransformerConfig(**SMALL, bf16=True, lean_activations=True, tie_embeddings=True, recompute=recompute)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, SMALL["vocab_size"], (2, 16)) for _ in range(7)]
    runs = []
    for captured in (False, True):
        model = TinyTransformer(cfg, device="cuda", seed=0)
        opt = AdamW(model.named_parameters(), lr=1e-2)
        sg = graphs.StepGraphs(model, opt, 1, 1.0, note=lambda m: None) if captured else None
        out = []
        for ids in batches:
            got = sg.step(ids, ids) if sg is not None else None
            if got is None:
                out.append(_eager_step(model, opt, ids, ids, 1))
                if sg is not None:
                    sg.eager()
            else:
                out.append((got[0].item(), got[1].item()))
        assert model.store.cast_on_use and model.store.compute is None
        if captured:
            assert sg.active and sg.replays == len(batches) - graphs.WARMUP_STEPS
        runs.append((out, model.store.params.numpy().copy()))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_capture_holds_the_garbage_collector_off():
    """A collection inside a capture could release pinned memory or events of dead objects (an
    unsafe call on the capturing thread): xtrain.cuda.graph collects first and disables the
    collector until the capture ends or aborts, then restores it."""
    import gc

    seen = []

    class Stub:
        def capture_begin(self):
            seen.append(("begin", gc.isenabled()))

        def capture_end(self):
            seen.append(("end", gc.isenabled()))

        def abort_capture(self):
            seen.append(("abort", gc.isenabled()))

    assert gc.isenabled()
    with xtrain.cuda.graph(Stub()):
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with xtrain.cuda.graph(Stub()):
            raise ValueError("inside")
    assert gc.isenabled() and seen == [("begin", False), ("end", False), ("begin", False), ("abort", False)]
    gc.disable()
    try:
        with xtrain.cuda.graph(Stub()):
            pass
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.enable()
