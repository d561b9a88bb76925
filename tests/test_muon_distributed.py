"""Muon with data parallelism on the CPU (xtrain.launch.distributed.DataParallelMuon): each rank
orthogonalises its share of the matrices and broadcasts them. Rank threads with stand-in
collectives (tests/cpu_collectives.py) against one device on the same gradients, bit for bit; the
training loop as two rank threads and as two worker processes (collectives through files;
test_process_training's runners), the same checkpoint in both modes and a resume across them
bit-exact."""

import json

import numpy as np
import pytest

import xtrain
from cpu_collectives import ThreadCollectives
from modelhelp import batch, make_model, prepared_stories, small_config
from test_process_training import CpuLaunch, _log, _processes, _same_checkpoint, _threads
from xtrain.launch import distributed
from xtrain.launch.distributed import DataParallelMuon
from xtrain.optim import Muon
from xtrain.trainer.train import TrainConfig

WORLD = 2
RUN = dict(preset="tiny", seq=32, batch=2, lr=3e-3, warmup=1, decay_steps=4, eval_every=0, save_every=0,
           sample_tokens=4, progress=False, seed=0, optimizer="muon")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("muon-dp-data"))


def _matrices(model):
    return [n for n, p in model.named_parameters() if n.startswith("layers.") and len(p.shape) == 2]


def _muon_steps(ctx=None, steps=3):
    """Three Muon steps of a small model on the same batches (every rank the same: the average of
    equal gradients is that gradient); weights and momentum after gather_state()."""
    cfg = small_config()
    model = make_model(cfg, weights_seed=6)
    opt = Muon(model.named_parameters(), matrices=_matrices(model), lr=1e-2)
    dp = DataParallelMuon(opt, ctx) if ctx is not None else None
    for step in range(steps):
        ids, targets = batch(cfg, seed=step)
        _, loss = model(ids, targets)
        loss.backward()
        if dp is None:
            opt.clip_and_step(1.0, loss.detach())
            opt.zero_grad()
        else:
            dp.step(1.0, extra=[loss.detach()], guard=loss.detach())
    if dp is not None:
        dp.gather_state()
    return ({n: p.numpy().copy() for n, p in model.named_parameters()}, {f"{kind}.{n}": a for kind, arrays in opt.state_arrays().items() for n, a in arrays.items()},
            [opt.names[i] for i in opt.owned])


def test_shares_are_balanced_whole_matrices():
    model = make_model(small_config())
    opt = Muon(model.named_parameters(), matrices=_matrices(model))
    owners = DataParallelMuon.shares(opt, 3)
    assert sorted(owners) == opt.matrices and set(owners.values()) == {0, 1, 2}
    assert DataParallelMuon.shares(opt, 3) == owners  # a function of the shapes


def test_rank_threads_equal_one_device_bitwise():
    want = _muon_steps()
    launch = CpuLaunch(ThreadCollectives(WORLD), list(range(WORLD)), 30.0)
    ranks = launch.run(lambda ctx: _muon_steps(ctx))
    owned = [set(r[2]) for r in ranks]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    assert owned[0] | owned[1] == set(want[2])  # every matrix has one owner
    for weights, momentum, _ in ranks:
        for n in want[0]:
            np.testing.assert_array_equal(weights[n], want[0][n], err_msg=n)
        assert momentum.keys() == want[1].keys()
        for n in want[1]:
            np.testing.assert_array_equal(momentum[n], want[1][n], err_msg=n)


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
