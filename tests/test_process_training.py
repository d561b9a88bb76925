"""The training loop as a process group, on the CPU: `xtrain.trainer.train.train_processes` in two worker
processes (collectives through files: tests/cpu_collectives.py) against the thread launcher's two
rank threads (the same stand-in collectives in memory). The checkpoint is the same file for the
same run in both modes, and a run saved in one mode resumes in the other bit for bit. The GPU runs
of both modes are in tests/test_distributed.py."""

import json
import os

import pytest

import xtrain
from cpu_collectives import ThreadCollectives
from modelhelp import prepared_stories
from procgroup import Group
from xtrain.launch import distributed
from xtrain.trainer.train import TrainConfig, open_inputs, train

WORLD = 2
RUN = dict(preset="tiny", seq=32, batch=2, lr=3e-3, warmup=1, decay_steps=4, eval_every=0, save_every=0,
           sample_tokens=4, progress=False, seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("process-training-data"))


class CpuLaunch(distributed._Launch):
    """The thread launcher with CPU ranks."""

    def device_name(self, index):
        return "cpu"

    def enter_device(self, index):
        pass

    def leave_device(self, index):
        pass


def _cfg(data, out, steps, resume=False):
    return TrainConfig(**RUN, data=str(data), out=str(out), steps=steps,
                       resume=str(out / "ckpt") if resume else None)


def _threads(cfg):
    """What train_data_parallel does, on CPU rank threads."""
    dataset, ckpt = open_inputs(cfg, False)
    if ckpt is None:
        xtrain.manual_seed(cfg.seed)
    launch = CpuLaunch(ThreadCollectives(WORLD), list(range(WORLD)), 30.0)
    return launch.run(lambda ctx: train(cfg, ctx=ctx, prepared=(dataset, ckpt)))[0]


def _processes(cfg, tmp_path):
    run = {k: v for k, v in vars(cfg).items()}
    # The worker processes use as many BLAS threads as this process does (the rank threads' GEMMs):
    # OpenBLAS may split a GEMM differently with another thread count, and the runs must be
    # bitwise equal. Unset here, OpenBLAS takes one thread per core on both sides.
    blas = os.environ.get("OPENBLAS_NUM_THREADS") or str(os.cpu_count())
    runs = Group(WORLD, {"train": run, "collectives": str(tmp_path / f"coll-{cfg.out.replace('/', '_')}")},
                 OPENBLAS_NUM_THREADS=blas).wait()
    for code, _, stderr, _ in runs:
        assert code == 0, stderr
    result = json.loads(runs[0][1].splitlines()[-1].split("RESULT ", 1)[1])
    assert result["steps"] == cfg.steps and len(result["devices"]) == WORLD
    return result


def _log(out):
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()
            if "loss" in json.loads(line)]


def _same_checkpoint(a, b, differ=()):
    """The two runs' checkpoints hold the same bytes and the same state.json, but for the output
    folder and the train_args keys in `differ` (flags the two runs were meant to differ in)."""
    for name in ("model.safetensors", "optim.safetensors"):
        assert (a / "ckpt" / name).read_bytes() == (b / "ckpt" / name).read_bytes(), name
    sa, sb = (json.loads((x / "ckpt" / "state.json").read_text()) for x in (a, b))
    for s in (sa, sb):
        for key in ("out", *differ):
            s["train_args"].pop(key, None)
    assert sa == sb  # format, step, rng and rank_rng, loader state, files: the same


def test_checkpoints_match_across_modes_and_resume_in_the_other(tmp_path, data):
    full = tmp_path / "threads-full"
    _threads(_cfg(data, full, 4))
    part_t, part_p = tmp_path / "threads-part", tmp_path / "processes-part"
    _threads(_cfg(data, part_t, 2))
    _processes(_cfg(data, part_p, 2), tmp_path)
    _same_checkpoint(part_t, part_p)  # 2 processes write what 2 threads write
    assert len(json.loads((part_p / "ckpt" / "state.json").read_text())["rank_rng"]) == WORLD

    _threads(_cfg(data, part_p, 4, resume=True))      # saved by processes, resumed on threads
    _processes(_cfg(data, part_t, 4, resume=True), tmp_path)  # saved by threads, resumed on processes
    want = _log(full)
    assert len(want) == 4
    for out in (part_p, part_t):
        assert _log(out) == want, out
        _same_checkpoint(out, full)
