"""Checkpoints: round trip, atomic replacement (a crash mid-save leaves the previous checkpoint
loadable), and clear errors for truncated, corrupt or mismatched checkpoints."""

import json
import os

import pytest

import xtrain
from modelhelp import batch, bits_equal, make_model, small_config
from xtrain.io import state
from xtrain.data import generate_stories, train_bpe
from xtrain.optim import AdamW


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(generate_stories(50), 300)


def _trained(device, steps=2):
    model = make_model(small_config(), device, weights_seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    ids, targets = batch(model.config)
    for _ in range(steps):
        _, loss = model(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _save(path, model, opt, step, tokenizer):
    return state.save(path, model, opt, step, loader_state={"step": step}, tokenizer=tokenizer,
                      dataset="somewhere", train_args={"lr": 1e-3})


def test_round_trip(tmp_path, device, tokenizer):
    model, opt = _trained(device)
    xtrain.manual_seed(5)
    xtrain.randn((3,), device=device)  # move the default generator off its seed
    _save(tmp_path / "ckpt", model, opt, 2, tokenizer)
    expected = xtrain.randn((4,), device=device).numpy().copy()

    ckpt = state.load(tmp_path / "ckpt")
    assert ckpt.step == 2 and ckpt.config == model.config and ckpt.loader_state == {"step": 2}
    loaded = ckpt.build_model(device)
    for (n, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
        assert bits_equal(a.numpy(), b.numpy()) and b.device == a.device, n
    opt2 = AdamW(loaded.named_parameters(), lr=0.5)
    ckpt.load_optimizer(opt2)
    assert opt2.step_count == 2 and opt2.lr == 1e-3
    for a, b in zip(opt.exp_avg + opt.exp_avg_sq, opt2.exp_avg + opt2.exp_avg_sq):
        assert bits_equal(a.numpy(), b.numpy())
    assert ckpt.tokenizer().fingerprint == tokenizer.fingerprint
    ckpt.restore_rng()
    assert bits_equal(xtrain.randn((4,), device=device).numpy(), expected)
    meta = json.loads((tmp_path / "ckpt" / "state.json").read_text())
    assert set(meta["files"]) == {"model.safetensors", "optim.safetensors", "tokenizer.json"}


def test_save_replaces_and_leaves_nothing_behind(tmp_path, device, tokenizer):
    model, opt = _trained(device, 1)
    _save(tmp_path / "ckpt", model, opt, 1, tokenizer)
    _save(tmp_path / "ckpt", model, opt, 7, tokenizer)
    assert state.load(tmp_path / "ckpt").step == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_crash_between_renames_keeps_previous_loadable(tmp_path, device, tokenizer, monkeypatch):
    model, opt = _trained(device, 1)
    path = tmp_path / "ckpt"
    _save(path, model, opt, 1, tokenizer)
    real_rename = os.rename

    def crash_on_promote(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("simulated crash")
        real_rename(src, dst)

    monkeypatch.setattr(state.os, "rename", crash_on_promote)
    with pytest.raises(OSError, match="simulated"):
        _save(path, model, opt, 2, tokenizer)
    monkeypatch.undo()
    assert not path.exists() and (tmp_path / "ckpt.old").is_dir()  # the crash window
    assert state.exists(path)
    recovered = state.load(path)
    assert recovered.step == 1 and recovered.path.name == "ckpt.old"
    recovered.build_model(device)
    _save(path, model, opt, 3, tokenizer)  # the next save heals the directory
    assert state.load(path).step == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_crash_while_writing_keeps_previous(tmp_path, device, tokenizer, monkeypatch):
    model, opt = _trained(device, 1)
    path = tmp_path / "ckpt"
    _save(path, model, opt, 1, tokenizer)
    real_write = state._write_safetensors

    def crash_on_optim(p, tensors):
        if p.name == state.OPTIM_FILE:
            p.write_bytes(b"partial")
            raise OSError("simulated crash")
        return real_write(p, tensors)

    monkeypatch.setattr(state, "_write_safetensors", crash_on_optim)
    with pytest.raises(OSError):
        _save(path, model, opt, 2, tokenizer)
    monkeypatch.undo()
    assert state.load(path).step == 1
    _save(path, model, opt, 2, tokenizer)
    assert state.load(path).step == 2 and not (tmp_path / "ckpt.tmp").exists()


def test_truncated_and_corrupt_files(tmp_path, device, tokenizer):
    model, opt = _trained(device, 1)
    path = _save(tmp_path / "ckpt", model, opt, 1, tokenizer)
    f = path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(state.CheckpointError, match="truncated") as e:
        state.load(path)
    assert isinstance(e.value, ValueError)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(flipped))
    with pytest.raises(state.CheckpointError, match="corrupt"):
        state.load(path)
    f.unlink()
    with pytest.raises(state.CheckpointError, match="missing"):
        state.load(path)


def test_mismatched_config_and_optimizer(tmp_path, device, tokenizer):
    model, opt = _trained(device, 1)
    path = _save(tmp_path / "ckpt", model, opt, 1, tokenizer)
    meta = json.loads((path / "state.json").read_text())
    ckpt = state.load(path)
    other = make_model(small_config(ffn_dim=64), device)
    with pytest.raises(state.CheckpointError, match="does not match the optimizer"):
        ckpt.load_optimizer(AdamW(other.named_parameters()))
    meta["config"]["dim"] = 64  # refused by load(), from the tensor headers, before any build
    (path / "state.json").write_text(json.dumps(meta))
    with pytest.raises(state.CheckpointError, match="do not match the model config"):
        state.load(path)
    meta["config"]["n_layers"] = -1
    (path / "state.json").write_text(json.dumps(meta))
    with pytest.raises(state.CheckpointError, match="config.n_layers must be an integer"):
        state.load(path)
    (path / "state.json").write_text("{not json")
    with pytest.raises(state.CheckpointError, match="invalid JSON"):
        state.load(path)


def test_missing_checkpoints(tmp_path):
    with pytest.raises(state.CheckpointError, match="no checkpoint at"):
        state.load(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(state.CheckpointError, match="not a complete checkpoint"):
        state.load(tmp_path / "empty")
    assert not state.exists(tmp_path / "empty")
