"""Checkpoint history and readers in parts (issue 36): `--keep N` keeps the last N saves as
OUT/ckpt plus OUT/ckpt-STEP, removes the oldest, never OUT/best; a resume reads the checkpoint
it verified even when the run it resumes from saves in the meantime (load(pin=True))."""

import os
from pathlib import Path

import numpy as np
import pytest

from modelhelp import make_model, prepared_stories, run_log, small_config, tiny_run
from xtrain.data import generate_stories, train_bpe
from xtrain.io import rundir, state
from xtrain.optim import AdamW
from xtrain.trainer import train as train_mod
from xtrain.trainer.runconfig import ConfigError
from xtrain.trainer.train import train

VOCAB = 320


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(generate_stories(50), 300)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("history-data"))


def _checkpoint(path, tokenizer, step, seed=None, keep_previous=None):
    model = make_model(small_config(vocab_size=VOCAB), "cpu", weights_seed=step if seed is None else seed)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    state.save(path, model, opt, step, loader_state={"version": 1, "step": step}, tokenizer=tokenizer,
               dataset="data", train_args={"lr": 1e-3}, keep_previous=keep_previous)
    return model


def _steps(out):
    return sorted(state.step_of(p) for p in rundir.checkpoint_history(out))


# ---- readers in parts (known issue 33 before)

def test_a_pinned_checkpoint_reads_what_it_verified_after_a_save_replaced_it(tmp_path, tokenizer):
    ckpt_dir = tmp_path / "run" / "ckpt"
    _checkpoint(ckpt_dir, tokenizer, step=1)
    pinned, plain = state.load(ckpt_dir, pin=True), state.load(ckpt_dir)
    first = pinned.model_tensors()
    _checkpoint(ckpt_dir, tokenizer, step=2)  # the run saves again: ckpt/ is another directory now
    with pytest.raises(state.CheckpointError, match="replaced by a newer save"):
        plain.model_tensors()
    again = pinned.model_tensors()
    assert set(again) == set(first) and all(np.array_equal(again[n], first[n]) for n in first)
    assert not all(np.array_equal(state.load(ckpt_dir).model_tensors()[n], first[n]) for n in first)
    model = make_model(small_config(vocab_size=VOCAB), "cpu")
    pinned.load_optimizer(AdamW(model.named_parameters(), lr=1e-3))  # the step-1 moments, whole


def test_a_resume_survives_its_source_run_saving_before_the_weights_are_read(tmp_path, data, monkeypatch):
    """The resume reads the state first and the weights once the data are open; the run it
    resumes from saving between the two once stopped it at setup ('replaced by a newer save')."""
    src = tmp_path / "src"
    train(tiny_run(src, data, 4))
    expected = state.load(src / "ckpt").model_tensors()
    opened, build = train_mod.open_data, state.Checkpoint.build_model

    def open_data_while_src_saves(*args, **kw):
        dataset = opened(*args, **kw)
        ckpt = state.load(src / "ckpt")
        model = build(ckpt, "cpu")
        model.load_state_dict({n: a + 1.0 for n, a in ckpt.model_tensors().items()}, strict=True)
        state.save(src / "ckpt", model, None, 9, loader_state=ckpt.loader_state,
                   tokenizer=ckpt.tokenizer(), train_args=ckpt.meta["train_args"])
        return dataset

    monkeypatch.setattr(train_mod, "open_data", open_data_while_src_saves)
    seen = {}

    def build_model(self, *args, **kw):
        model = build(self, *args, **kw)
        seen.update({n: a.copy() for n, a in model.store.state_arrays().items()})  # what the run starts from
        return model

    monkeypatch.setattr(state.Checkpoint, "build_model", build_model)
    summary = train(tiny_run(tmp_path / "dst", data, 6, resume=str(src / "ckpt")))
    assert state.step_of(src / "ckpt") == 9  # the source did save in between
    assert summary["steps"] == 6
    assert [r["step"] for r in run_log(tmp_path / "dst") if "loss" in r] == [4, 5]  # from step 4, not 9
    diffs = {n: float(np.max(np.abs(seen[n] - expected[n]))) for n in expected}
    assert set(seen) == set(expected) and not any(diffs.values()), diffs


# ---- --keep N

def test_keep_previous_moves_the_replaced_checkpoint_beside_it(tmp_path, tokenizer):
    run = tmp_path / "run"
    _checkpoint(run / "ckpt", tokenizer, step=1)
    _checkpoint(run / "ckpt", tokenizer, step=2, keep_previous=run / rundir.history_name(1))
    assert state.step_of(run / "ckpt") == 2 and state.load(run / "ckpt-1").step == 1
    assert sorted(p.name for p in run.iterdir()) == ["ckpt", "ckpt-1"]


def test_keep_n_keeps_the_last_n_saves_and_best(tmp_path, data, capsys):
    out = tmp_path / "run"
    train(tiny_run(out, data, 12, save_every=2, keep=3, eval_every=4, eval_batches=1))
    assert state.step_of(out / "ckpt") == 12 and _steps(out) == [8, 10]
    assert state.step_of(out / "best") in (4, 8, 12)
    for p in rundir.checkpoint_history(out):
        assert state.load(p).step == int(p.name.split("-")[1])  # each one whole and verified
    assert "older ckpt-10, ckpt-8 (--keep 3)" in capsys.readouterr().out


def test_keep_one_keeps_no_history(tmp_path, data):
    out = tmp_path / "run"
    train(tiny_run(out, data, 6, save_every=2))
    assert _steps(out) == [] and sorted(p.name for p in out.iterdir() if p.name.startswith("ckpt")) == ["ckpt"]


def test_a_resume_from_an_older_checkpoint_of_the_run_keeps_the_abandoned_newest(tmp_path, data):
    """Rolling back: --resume OUT/ckpt-4 continues the run from step 4; the later saves of the
    abandoned steps are kept as history (oldest save first out), nothing is lost at once."""
    out = tmp_path / "run"
    train(tiny_run(out, data, 8, save_every=2, keep=3))
    assert _steps(out) == [4, 6]
    train(tiny_run(out, data, 6, save_every=2, keep=3, resume=str(out / "ckpt-4")))
    assert state.step_of(out / "ckpt") == 6
    # the save at step 6 kept the abandoned step-8 checkpoint and dropped the oldest saves
    names = {p.name for p in rundir.checkpoint_history(out)}
    assert "ckpt-8" in names and len(names) == 2


def test_a_diverged_save_names_the_older_checkpoints(tmp_path, data, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(train_mod, "diverged", lambda run, params, loss: "diverged" if run.step == 6 else None)
    with pytest.raises(train_mod.DivergedRunError) as e:
        train(tiny_run(out, data, 8, save_every=2, keep=3))
    assert state.step_of(out / "ckpt") == 4 and _steps(out) == [2]
    assert f"older ones: {out / 'ckpt-2'}" in str(e.value)


def test_overwrite_clears_the_history_and_prepare_refuses_its_names(tmp_path, data):
    out = tmp_path / "run"
    train(tiny_run(out, data, 4, save_every=2, keep=2))
    assert _steps(out) == [2]
    with pytest.raises(rundir.RunDirError, match="holds a run"):
        rundir.check_prepare_dir(out / "ckpt-7")
    rundir.clear_run(out)
    assert not any(p.name.startswith("ckpt") for p in out.iterdir())


def test_keep_must_be_a_positive_count(tmp_path, data):
    with pytest.raises((ConfigError, ValueError), match="keep"):
        train(tiny_run(tmp_path / "run", data, 2, keep=0))


def test_history_lists_only_checkpoints_of_its_own_names(tmp_path, tokenizer):
    run = tmp_path / "run"
    _checkpoint(run / "ckpt-5", tokenizer, step=5)
    (run / "ckpt-6").mkdir()  # no state.json: not a checkpoint
    (run / "ckpt-x").mkdir()
    os.symlink(run / "ckpt-5", run / "ckpt-7")
    assert [p.name for p in rundir.checkpoint_history(run)] == ["ckpt-5"]
