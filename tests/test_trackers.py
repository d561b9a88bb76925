"""Trackers (xtrain.trainer.trackers): the log's scalars reach TensorBoard (read back with tensorboard's own
event reader) and an offline Weights & Biases run directory; a missing extra is a clear error."""

import json

import pytest

from modelhelp import prepared_stories
from xtrain.trainer import trackers
from xtrain.trainer.runconfig import ConfigError
from xtrain.trainer.train import TrainConfig, train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("trackers-data"))


def _cfg(out, data, names):
    return TrainConfig(preset="tiny", data=str(data), out=str(out), device="cpu", batch=2, seq=32, steps=3,
                       warmup=1, eval_every=2, eval_batches=1, save_every=0, sample_tokens=2, progress=False,
                       trackers=names)


def test_tensorboard_reader_sees_the_logged_scalars(tmp_path, data):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed (pip install 'xtrain[tensorboard]')")
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="tensorboard (the reader) is not installed (pip install 'xtrain[tensorboard]')")
    train(_cfg(tmp_path, data, ("tensorboard",)))
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tok_s", "train/mem_mb",
            "val/loss", "val/perplexity"} <= tags
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    losses = [(r["step"], r["loss"]) for r in log if "loss" in r]
    seen = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in seen] == [s for s, _ in losses]
    assert [v for _, v in seen] == pytest.approx([v for _, v in losses], rel=1e-6)
    assert [e.step for e in acc.Scalars("val/loss")] == [0, 2, 3]


def test_wandb_writes_an_offline_run(tmp_path, data, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'xtrain[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(_cfg(tmp_path, data, ("wandb",)))
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb")), list((tmp_path / "wandb").iterdir())


def test_missing_extra_or_unknown_tracker_is_a_clear_error(monkeypatch):
    with pytest.raises(ConfigError, match="choose from tensorboard, wandb"):
        trackers.check_available(["mlflow"])
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"--tracker wandb needs the wandb package: pip install 'xtrain\[wandb\]'"):
        trackers.check_available(["wandb"])
