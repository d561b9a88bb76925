"""Muon with data parallelism on the CPU (xtrain.launch.distributed.DataParallelMuon): each rank
orthogonalises its share of the matrices and updates its share of AdamW's part, broadcasts them and
keeps their momentum and moments only (ZeRO-1).
Rank threads with stand-in collectives (tests/cpu_collectives.py) against one device on the same
gradients, bit for bit, and the sharded state's rules (read through a gather, loaded as shares, a
stand-in graph capture); real worker processes (tests/muon_worker.py, collectives through files):
per-rank momentum bytes, steps and the gathered checkpoint equal to one device's, a resume on 1, 2
and 4 ranks; the training loop as two rank threads and as two worker processes
(test_process_training's runners), the same checkpoint in both modes and a resume across them
bit-exact."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import muon_worker
import xtrain
from cpu_collectives import ThreadCollectives
from modelhelp import batch, make_model, prepared_stories, small_config
from procgroup import Group
from xtrain.io import state as ckpt_state
from test_process_training import CpuLaunch, _log, _processes, _same_checkpoint, _threads
from xtrain.launch import distributed
from xtrain.launch.distributed import DataParallelMuon
from xtrain.optim import AdamW, Muon, block_matrices
from xtrain.trainer.train import TrainConfig

WORLD = 2
RUN = dict(preset="tiny", seq=32, batch=2, lr=3e-3, warmup=1, decay_steps=4, eval_every=0, save_every=0,
           sample_tokens=4, progress=False, seed=0, optimizer="muon")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("muon-dp-data"))


def _matrices(model):
    return [n for n, p in model.named_parameters() if n.startswith("layers.") and len(p.shape) == 2]


def _muon_steps(ctx=None, steps=3, n_matrices=None):
    """Three Muon steps of a small model on the same batches (every rank the same: the average of
    equal gradients is that gradient); weights and momentum after gather_state(), the matrices
    this rank owns, its momentum buffer (None: no matrix)."""
    cfg = small_config()
    model = make_model(cfg, weights_seed=6)
    opt = Muon(model.named_parameters(), matrices=_matrices(model)[:n_matrices], lr=1e-2)
    dp = DataParallelMuon(opt, ctx) if ctx is not None else None
    muon_worker.run_steps(model, opt, 0, steps, dp)
    if dp is not None:
        dp.gather_state()
    state = {f"{kind}.{n}": a for kind, arrays in opt.state_arrays().items() for n, a in arrays.items()}
    return ({n: p.numpy().copy() for n, p in model.named_parameters()}, state,
            [opt.names[i] for i in opt.owned], opt.flat_momentum)


def test_shares_are_balanced_whole_matrices():
    model = make_model(small_config())
    opt = Muon(model.named_parameters(), matrices=_matrices(model))
    owners = DataParallelMuon.shares(opt, 3)
    assert sorted(owners) == opt.matrices and set(owners.values()) == {0, 1, 2}
    assert DataParallelMuon.shares(opt, 3) == owners  # a function of the shapes


def test_adamw_part_shares_tile_its_parameters():
    """AdamW.share_chunks over Muon's AdamW part: for 1 to 7 ranks (and more ranks than 64-element
    pieces: some shares empty) the shares are consecutive, in rank order, cut at 64-element
    offsets of the layout, nearly equal, and together exactly the ranges one device updates; one
    rank's share is all of it. AdamW(only=..., shard=...) keeps those moments from the start and
    keep_moments() refuses ranges outside its parameters."""
    model, opt = _small_muon()
    a = opt.adamw
    cover = a.share_chunks(0, 1)
    assert [(lo, hi) for lo, hi, _ in a.moment_chunks] == cover  # unsharded: the whole part
    total = sum(hi - lo for lo, hi in cover)
    bounds = {lo for lo, _ in cover} | {hi for _, hi in cover}
    for world in (1, 2, 3, 4, 7, 4096):
        shares = [a.share_chunks(r, world) for r in range(world)]
        flat = [c for share in shares for c in share]
        assert all(lo < hi for lo, hi in flat) and all(x[1] <= y[0] for x, y in zip(flat, flat[1:]))
        assert sum(hi - lo for lo, hi in flat) == total
        assert all(x % 64 == 0 or x in bounds for c in flat for x in c)
        if world < 100:
            sizes = [sum(hi - lo for lo, hi in share) for share in shares]
            assert max(sizes) - min(sizes) <= 64 * (len(cover) + 1), sizes
        else:
            assert sum(1 for share in shares if share) <= -(-total // 64) + len(cover)
    for bad in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="shard must be"):
            a.share_chunks(*bad)
    named = list(model.named_parameters())
    others = [n for n, _ in named if n not in set(_matrices(model))]
    built = AdamW(named, only=others, shard=(1, 3))
    assert built.sharded and [(lo, hi) for lo, hi, _ in built.moment_chunks] == a.share_chunks(1, 3)
    assert built.flat_m.numel() == sum(hi - lo for lo, hi in a.share_chunks(1, 3))
    with pytest.raises(RuntimeError, match="sharded"):
        built.step()
    with pytest.raises(ValueError, match="within the moments kept here"):
        AdamW(named, only=others).keep_moments([(0, 64)])  # a matrix's elements
    with pytest.raises(ValueError, match="already kept for other chunks"):
        built.keep_moments(a.share_chunks(0, 3))


@pytest.mark.parametrize("n_matrices", [None, 1], ids=["every-matrix", "one-matrix"])
def test_rank_threads_equal_one_device_bitwise(n_matrices):
    """Every matrix owned by one rank (with more ranks than matrices, a rank owns none and holds
    no momentum buffer at all); weights and the gathered momentum one device's, bit for bit."""
    want = _muon_steps(n_matrices=n_matrices)
    launch = CpuLaunch(ThreadCollectives(WORLD), list(range(WORLD)), 30.0)
    ranks = launch.run(lambda ctx: _muon_steps(ctx, n_matrices=n_matrices))
    owned = [set(r[2]) for r in ranks]
    assert sorted(n for o in owned for n in o) == sorted(want[2])  # every matrix has one owner
    assert all(owned) == (n_matrices is None)
    assert [r[3] is None for r in ranks] == [not o for o in owned]  # no buffer where no matrix
    for weights, momentum, *_ in ranks:
        for n in want[0]:
            np.testing.assert_array_equal(weights[n], want[0][n], err_msg=n)
        assert momentum.keys() == want[1].keys()
        for n in want[1]:
            np.testing.assert_array_equal(momentum[n], want[1][n], err_msg=n)


def _context(rank, world):
    """A rank's context for what needs no collective (building DataParallelMuon)."""
    return distributed.LocalContext("cpu") if world == 1 else \
        type("Ctx", (), {"rank": rank, "world_size": world, "comm": None})()


def _small_muon():
    model = make_model(small_config(), weights_seed=6)
    return model, Muon(model.named_parameters(), matrices=_matrices(model), lr=1e-2)


def test_a_rank_keeps_its_share_and_refuses_another():
    """keep_momentum: the current values of the share stay, the rest go; one rank's optimizer
    cannot become another rank's (nor another world size's); one rank keeps everything."""
    model, opt = _small_muon()
    muon_worker.run_steps(model, opt, 0, 2)
    before = dict(zip(opt.matrices, (b.numpy().copy() for b in opt.momentum_buffers)))
    DataParallelMuon(opt, _context(0, 1))
    assert not opt.sharded and opt.owned == opt.matrices  # one rank: nothing to drop
    DataParallelMuon(opt, _context(1, 2))
    owners = DataParallelMuon.shares(opt, 2)
    assert opt.sharded and opt.owned == [i for i in opt.matrices if owners[i] == 1]
    assert opt.flat_momentum.numel() == opt.momentum_layout(opt.owned)[1] < opt.momentum_layout(opt.matrices)[1]
    for i, b in zip(opt.owned, opt.momentum_buffers):
        np.testing.assert_array_equal(b.numpy(), before[i])
    DataParallelMuon(opt, _context(1, 2))  # the same share again: nothing changes
    for rank, world in ((0, 2), (1, 3)):
        with pytest.raises(ValueError, match=f"rank {rank} of {world}.*already kept"):
            DataParallelMuon(opt, _context(rank, world))
    built = Muon(model.named_parameters(), matrices=_matrices(model), shard=(1, 2))
    assert built.owned == opt.owned and built.flat_momentum.numel() == opt.flat_momentum.numel()
    DataParallelMuon(built, _context(1, 2))  # built with its share: nothing to drop
    with pytest.raises(ValueError, match="rank 0 of 2.*already kept"):
        DataParallelMuon(built, _context(0, 2))
    for bad in ((2, 2), (-1, 2), (0, 0), (0.0, 2), 3, (1, 2, 3), "ab"):
        with pytest.raises(ValueError, match="shard must be"):
            Muon(model.named_parameters(), matrices=_matrices(model), shard=bad)
    with pytest.raises(ValueError, match="not distinct indices"):
        Muon(model.named_parameters(), matrices=_matrices(model)).keep_momentum([0])  # the embedding
    with pytest.raises(ValueError, match="parameter indices"):
        Muon(model.named_parameters(), matrices=_matrices(model)).keep_momentum(["q"])


def test_the_sharded_momentum_is_read_through_a_gather_and_loads_as_shares():
    """A rank's state reads only from a gathered copy: before gather_state() a RuntimeError naming
    it; gather_state(root=0) on rank 0 only; stale (refused again) after a step or a graph
    replay. A full state loads as each rank's share, checked whole first."""
    model, opt = _small_muon()
    muon_worker.run_steps(model, opt, 0, 2)
    full = opt.state_arrays()

    def rank(ctx):
        model, opt = _small_muon()
        dp = DataParallelMuon(opt, ctx)
        with pytest.raises(KeyError, match="momentum_buffer"):
            broken = {**full, "momentum_buffer": dict(list(full["momentum_buffer"].items())[1:])}
            opt.load_state_dict({"step": 2, "hyper": opt.hyper(), **broken})
        opt.load_state_dict({"step": 2, "hyper": opt.hyper(), **full})
        shares = [(opt.names[i], b.numpy().copy()) for i, b in zip(opt.owned, opt.momentum_buffers)]
        refused = []
        for read in (opt.state_arrays, opt.state_dict):
            with pytest.raises(RuntimeError, match="gather_state"):
                read()
        dp.gather_state(root=0)
        try:  # (copies: AdamW's part reads views of its live CPU buffers)
            got = {kind: {n: a.copy() for n, a in arrays.items()} for kind, arrays in opt.state_arrays().items()}
        except RuntimeError:
            got = None
            refused.append("root")
        muon_worker.run_steps(model, opt, 2, 1, dp)
        with pytest.raises(RuntimeError, match="gather_state"):
            opt.state_arrays()
        dp.gather_state()
        opt.state_dict()
        dp.replayed()
        with pytest.raises(RuntimeError, match="gather_state"):
            opt.state_dict()
        return shares, got, refused

    ranks = CpuLaunch(ThreadCollectives(WORLD), list(range(WORLD)), 30.0).run(rank)
    assert [r[2] for r in ranks] == [[], ["root"]]
    assert sorted(n for shares, _, _ in ranks for n, _ in shares) == sorted(full["momentum_buffer"])
    for shares, _, _ in ranks:
        for n, a in shares:
            np.testing.assert_array_equal(a, full["momentum_buffer"][n], err_msg=n)
    for kind, arrays in full.items():  # the loaded state, gathered back: the one-device state
        for n, a in arrays.items():
            np.testing.assert_array_equal(ranks[0][1][kind][n], a, err_msg=f"{kind}.{n}")


def test_the_captured_step_with_sharded_momentum_equals_eager(monkeypatch):
    """StepGraphs(dp=DataParallelMuon) with test_graphs' stand-in Graph (the captured work runs at
    once): the capture step gives every rank the eager step's values, weights and gathered state
    (the step reads and writes only the rank's own momentum buffers, at fixed addresses); a
    replay makes a gathered copy stale, so the state is read again only after a new gather."""
    from test_graphs import _RankGraph, _rank_generators
    from xtrain import graphs

    monkeypatch.setattr(xtrain.cuda, "Graph", _RankGraph)
    monkeypatch.setattr(_RankGraph, "counts", {})
    monkeypatch.setattr(_RankGraph, "fail_at", None)
    _rank_generators(monkeypatch)

    def rank(ctx, use_graphs):
        model, opt = _small_muon()
        dp = DataParallelMuon(opt, ctx)
        sg = graphs.StepGraphs(model, opt, 1, 1.0, note=lambda _: None, dp=dp) if use_graphs else None
        buffers = [b.data_ptr() for b in opt.momentum_buffers]
        values = []
        for step in range(3):
            ids, targets = batch(model.config, seed=step)
            out = sg.step(ids, targets) if sg is not None else None
            if out is None:
                loss = graphs.forward_backward(model, ids, targets, 1)
                out = (loss, dp.step(1.0, extra=[loss], guard=loss))
                if sg is not None:
                    sg.eager()
            values.append((out[0].item(), out[1].item()))
        dp.gather_state()
        state = {k: {n: a.copy() for n, a in arrays.items()} for k, arrays in opt.state_arrays().items()}
        if sg is not None:
            assert sg.active and [b.data_ptr() for b in opt.momentum_buffers] == buffers
            assert sg.step(*batch(model.config, seed=3)) is not None  # a replay (the stand-in runs nothing)
            with pytest.raises(RuntimeError, match="gather_state"):
                opt.state_arrays()
        return values, {n: p.numpy().copy() for n, p in model.named_parameters()}, state

    runs = [CpuLaunch(ThreadCollectives(WORLD), list(range(WORLD)), 30.0).run(lambda ctx: rank(ctx, on))
            for on in (False, True)]
    for eager, captured in zip(*runs):
        assert eager[0] == captured[0]
        for n, a in eager[1].items():
            np.testing.assert_array_equal(captured[1][n], a, err_msg=n)
        for kind, arrays in eager[2].items():
            for n, a in arrays.items():
                np.testing.assert_array_equal(captured[2][kind][n], a, err_msg=f"{kind}.{n}")


def _cfg(data, out, steps, resume=False):
    return TrainConfig(**RUN, data=str(data), out=str(out), steps=steps,
                       resume=str(out / "ckpt") if resume else None)


def test_threads_and_processes_write_the_same_checkpoint_and_resume_in_the_other(tmp_path, data):
    full = tmp_path / "threads-full"
    _threads(_cfg(data, full, 4))
    part_t, part_p = tmp_path / "threads-part", tmp_path / "processes-part"
    _threads(_cfg(data, part_t, 2))
    _processes(_cfg(data, part_p, 2), tmp_path)
    _same_checkpoint(part_t, part_p)  # the weights, the moments and state.json
    state = json.loads((part_p / "ckpt" / "state.json").read_text())
    assert state["optimizer"]["hyper"]["optimizer"] == "muon"
    _threads(_cfg(data, part_p, 4, resume=True))               # saved by processes, resumed on threads
    _processes(_cfg(data, part_t, 4, resume=True), tmp_path)   # saved by threads, resumed on processes
    want = _log(full)
    assert len(want) == 4 and want[-1] < want[0]
    for out in (part_p, part_t):
        assert _log(out) == want, out
        _same_checkpoint(out, full)


@pytest.mark.skipif(not distributed.is_available(), reason="needs an NCCL build of xtrain and a GPU")
@pytest.mark.parametrize("devices", [[0], [0, 1]], ids=["one-rank", "two-ranks"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_data_parallel_muon_graphs_equal_eager_and_resume_bit_exact(tmp_path, data, devices, bf16):
    """On GPUs over NCCL: the captured step (the all-reduce, Muon's share and the broadcasts in
    the update graph) equals the eager step bit for bit, and 2 + 2 steps resumed equal 4."""
    from modelhelp import run_log, tiny_run
    from xtrain.trainer.train import train_data_parallel

    if len(devices) > xtrain.cuda.device_count():
        pytest.skip(f"needs {len(devices)} GPUs")
    kw = dict(optimizer="muon", bf16=bf16, decay_steps=6)
    for name, on in (("eager", False), ("graphs", True)):
        train_data_parallel(tiny_run(tmp_path / name, data, 6, "cuda", cuda_graphs=on, **kw), devices)
    train_data_parallel(tiny_run(tmp_path / "split", data, 3, "cuda", **kw), devices)
    train_data_parallel(tiny_run(tmp_path / "split", data, 6, "cuda", resume=str(tmp_path / "split" / "ckpt"),
                                 **kw), devices)
    losses = {name: [(r["step"], r["loss"], r["grad_norm"]) for r in run_log(tmp_path / name) if "loss" in r]
              for name in ("eager", "graphs", "split")}
    assert losses["graphs"] == losses["eager"] == losses["split"]
    assert any(r.get("graph") for r in run_log(tmp_path / "graphs"))
    _same_checkpoint(tmp_path / "graphs", tmp_path / "eager", differ=("cuda_graphs",))
    _same_checkpoint(tmp_path / "split", tmp_path / "eager", differ=("cuda_graphs",))


# ---------------------------------------------------------------- ZeRO-1: real processes

STATE_FILES = ("model.safetensors", "optim.safetensors")


def _ranks(world, tmp_path, name, **scenario):
    """`world` worker processes (tests/muon_worker.py) with `scenario`; each rank's result. The
    workers use as many BLAS threads as this process (test_process_training's _processes: the
    GEMMs must split alike for the bits to match the one-device run here)."""
    blas = os.environ.get("OPENBLAS_NUM_THREADS") or str(os.cpu_count())
    scenario = {"collectives": str(tmp_path / f"collectives-{name}"), "load": None, "save": None, **scenario}
    runs = Group(world, cmd=[sys.executable, str(muon_worker.__file__), json.dumps(scenario)], wait_s=180,
                 OPENBLAS_NUM_THREADS=blas).wait()
    for code, _, stderr, _ in runs:
        assert code == 0, stderr
    return [json.loads(out.splitlines()[-1].split("RESULT ", 1)[1]) for _, out, _, _ in runs]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """One device's run of muon_worker's model: the optimizer state's live bytes (and AdamW's part
    alone), the matrices' aligned sizes, and the run saved after 3 and after 6 steps."""
    root = tmp_path_factory.mktemp("muon-one-device")
    model, make_opt = muon_worker.build(None)
    named = list(model.named_parameters())
    matrices = block_matrices(named)
    base = muon_worker.allocated()
    adamw = AdamW(named, lr=1e-2, only=[n for n, _ in named if n not in matrices])
    adamw_bytes = muon_worker.allocated() - base
    del adamw
    base = muon_worker.allocated()
    opt = make_opt()
    state_bytes = muon_worker.allocated() - base
    sizes = {n: -(-p.numel() // 64) * 64 for n, p in named if n in matrices}
    out = {"adamw_bytes": adamw_bytes, "state_bytes": state_bytes, "sizes": sizes,
           "momentum_elements": opt.flat_momentum.numel(),
           "adamw_cover": [[lo, hi] for lo, hi in opt.adamw.share_chunks(0, 1)]}
    for first, name in ((0, "3"), (3, "6")):
        muon_worker.run_steps(model, opt, first, 3)
        ckpt_state.save(root / name, model, opt, opt.step_count)
        out[name] = (root / name, muon_worker.weight_hashes(model))
    return out


def _assert_shares(ranks, one):
    """Every matrix owned by one rank; each rank holds the momentum of its own matrices only (their
    aligned sizes), the shares summing to one device's buffer; AdamW's part split into consecutive
    pieces of the layout, one per rank in rank order, of nearly equal size (64-element cuts) that
    tile one device's; and the allocator agrees: a rank's optimizer state is its momentum plus two
    moments of its piece (sizes rounded to one of 8 classes per octave: at most 1/8 more, and a
    block's 512-byte granule each), about 1/N of one device's."""
    owned = [r["owned"] for r in ranks]
    assert sorted(n for o in owned for n in o) == sorted(one["sizes"])
    assert sum(r["momentum_elements"] for r in ranks) == one["momentum_elements"] == sum(one["sizes"].values())
    pieces = [tuple(c) for r in ranks for c in r["adamw_chunks"]]
    merged = []
    for lo, hi in pieces:  # consecutive pieces of one range join again
        if merged and merged[-1][1] == lo:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    assert merged == [tuple(c) for c in one["adamw_cover"]]
    cover = sum(hi - lo for lo, hi in one["adamw_cover"])
    for r in ranks:
        assert abs(r["adamw_elements"] - cover / len(ranks)) <= 64 * len(one["adamw_cover"]), r["adamw_chunks"]
        share = sum(one["sizes"][n] for n in r["owned"])
        assert r["momentum_elements"] == share, r["owned"]
        want = 4 * share + 8 * r["adamw_elements"]
        assert want <= r["state_bytes"] <= 9 / 8 * want + 3 * 512, (r["state_bytes"], want, r["owned"])
    assert sum(r["state_bytes"] for r in ranks) <= 9 / 8 * one["state_bytes"] + 3 * 512 * len(ranks)


def test_a_muon_built_with_its_share_never_holds_the_whole_state(one_device):
    """Muon(..., shard=(rank, world_size)): the allocator's peak while it is built is the rank's
    share of the momentum and of AdamW's moments, never the whole of either (keep_momentum and
    keep_moments, after a full build, hold both for a moment)."""
    model, _ = muon_worker.build(None)
    named = list(model.named_parameters())
    for rank in range(2):
        base = muon_worker.allocated()
        xtrain.reset_peak_memory_stats("cpu")
        opt = Muon(named, matrices=block_matrices(named), lr=1e-2, shard=(rank, 2))
        peak = xtrain.memory_stats("cpu")["allocated_bytes.peak"] - base
        share = sum(one_device["sizes"][opt.names[i]] for i in opt.owned)
        assert opt.flat_momentum.numel() == share < one_device["momentum_elements"]
        pieces = opt.adamw.share_chunks(rank, 2)
        assert [(lo, hi) for lo, hi, _ in opt.adamw.moment_chunks] == pieces and opt.adamw.sharded
        adamw = sum(hi - lo for lo, hi in pieces)
        assert opt.adamw.flat_m.numel() == opt.adamw.flat_v.numel() == adamw
        assert peak <= 9 / 8 * (4 * share + 8 * adamw) + 3 * 512 < one_device["state_bytes"], (peak, share, adamw)
        del opt


def _same_state(a, b):
    for name in STATE_FILES:
        assert (Path(a) / name).read_bytes() == (Path(b) / name).read_bytes(), name


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, one_device):
    """Three steps on two worker processes, rank 0 saving the gathered state."""
    root = tmp_path_factory.mktemp("muon-two-ranks")
    return root / "ckpt", _ranks(2, root, "two", first=0, steps=3, save=str(root / "ckpt"))


def test_processes_hold_their_share_of_the_momentum_and_step_as_one_device(one_device, two_ranks):
    """ZeRO-1 on two processes: per-rank momentum bytes are the rank's share (before the sharding,
    every rank held all of it: 2x a share and the check failed); three steps give one device's
    weights on every rank, and the checkpoint gathered from the two ranks is one device's, byte
    for byte (weights, AdamW's moments and every matrix's momentum)."""
    ckpt, ranks = two_ranks
    _assert_shares(ranks, one_device)
    path, hashes = one_device["3"]
    for r in ranks:
        assert r["weights"] == hashes
    _same_state(ckpt, path)


def test_a_two_rank_checkpoint_resumes_bit_exactly_on_one_two_and_four_ranks(tmp_path, one_device, two_ranks):
    """Loading the full state gives each rank its share (four ranks: the shares of four, each
    holding its own only); 3 + 3 steps equal one device's 6 on 1, 2 and 4 ranks. (Powers of two:
    the average of N equal gradients is that gradient exactly only for those N.)"""
    ckpt, _ = two_ranks
    want_path, want_hashes = one_device["6"]
    model, make_opt = muon_worker.build(str(ckpt))
    opt = make_opt()
    ckpt_state.load(ckpt).load_optimizer(opt)
    muon_worker.run_steps(model, opt, 3, 3)
    ckpt_state.save(tmp_path / "one", model, opt, opt.step_count)
    assert muon_worker.weight_hashes(model) == want_hashes
    _same_state(tmp_path / "one", want_path)
    for world in (2, 4):
        out = tmp_path / f"world{world}"
        ranks = _ranks(world, tmp_path, f"resume{world}", first=3, steps=3, load=str(ckpt), save=str(out))
        _assert_shares(ranks, one_device)
        for r in ranks:
            assert r["weights"] == want_hashes, world
        _same_state(out, want_path)


@pytest.mark.skipif(not distributed.is_available(), reason="needs an NCCL build of xtrain and a GPU")
def test_two_gpus_hold_their_share_and_gather_one_state():
    """Over NCCL on two GPUs (the lead's GPU run): each rank's optimizer state on its device is its
    share of the momentum and of AdamW's moments (at most 60% of one device's optimizer state), and
    after two steps the gathered state and the weights are the same bits on both ranks, every
    matrix's momentum present once."""
    if xtrain.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")

    def allocated(device):
        xtrain.empty_cache(device)
        return xtrain.memory_stats(device)["allocated_bytes.current"]

    def build(device, shard=None):
        model = make_model(muon_worker.model_config(), device=device, weights_seed=6)
        named = list(model.named_parameters())
        base = allocated(device)
        opt = Muon(named, matrices=block_matrices(named), lr=1e-2, shard=shard)
        return model, opt, allocated(device) - base

    _, one, one_bytes = build("cuda:0")
    full_elements = one.flat_momentum.numel()
    del one

    def rank(ctx):
        model, opt, state_bytes = build(ctx.device, (ctx.rank, ctx.world_size))
        dp = DataParallelMuon(opt, ctx)
        muon_worker.run_steps(model, opt, 0, 2, dp)
        dp.gather_state()
        state = {f"{k}.{n}": a.copy() for k, arrays in opt.state_arrays().items() for n, a in arrays.items()}
        return (opt.flat_momentum.numel(), state_bytes, state,
                {n: p.numpy().copy() for n, p in model.named_parameters()})

    ranks = distributed.launch(rank, devices=[0, 1])
    assert sum(r[0] for r in ranks) == full_elements
    for elements, state_bytes, _, _ in ranks:
        assert state_bytes <= 0.6 * one_bytes, (state_bytes, one_bytes, elements)
    (_, _, s0, w0), (_, _, s1, w1) = ranks
    assert s0.keys() == s1.keys() and sum(k.startswith("momentum_buffer.") for k in s0) == len(block_matrices(
        make_model(muon_worker.model_config()).named_parameters()))
    for n in s0:
        np.testing.assert_array_equal(s0[n], s1[n], err_msg=n)
    for n in w0:
        np.testing.assert_array_equal(w0[n], w1[n], err_msg=n)
