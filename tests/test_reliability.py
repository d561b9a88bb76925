"""Never lose a run (issue 18): one test, or a few, per numbered problem. Each failed before the
change it names and passes now.

1 non-finite checkpoints are never written, never exported; clipping with a non-finite norm
2 a rerun into an existing run needs --resume or --overwrite
3 run and prepared-data directories are locked (and a dead holder's lock is taken over)
4 export never writes into a checkpoint, nor into a non-empty directory without --overwrite
5 a full disk: one clear error, no temporary files, the previous checkpoint intact
6 a checkpoint reads only plain, listed, hash-checked files inside itself
7 state.json is validated in full (types, ranges, sizes against the tensor headers) first
9 no uninitialised Tensor; integer tensors refuse values they cannot hold
10 --out naming a file; a parquet text column of integers
"""

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import xtrain
from modelhelp import make_model, prepared_stories, small_config
from xtrain.trainer import cli
from xtrain.io import rundir, schema, state
from xtrain.data import DataError, generate_stories, prepare, train_bpe
from xtrain.io.export import export
from xtrain.optim import AdamW, clip_grad_norm_


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(generate_stories(50), 300)


def _checkpoint(path, tokenizer, step=1, poison=None):
    """A small checkpoint with optimizer and tokenizer at `step`; `poison` (a parameter name)
    gets a NaN in its weight."""
    model = make_model(small_config(), "cpu", weights_seed=step)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    if poison:
        dict(model.named_parameters())[poison].fill_(float("nan"))
    return state.save(path, model, opt, step, loader_state={"version": 1, "step": step},
                      tokenizer=tokenizer, dataset="data", train_args={"lr": 1e-3})


def _files(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def _edit_state(path, edit):
    meta = json.loads((path / "state.json").read_text())
    edit(meta)
    (path / "state.json").write_text(json.dumps(meta))


def _relist(path, name):
    """Record `name`'s current size and sha256 in state.json (what an attacker would do)."""
    data = (path / name).read_bytes()
    _edit_state(path, lambda m: m["files"].update({name: {"bytes": len(data),
                                                          "sha256": hashlib.sha256(data).hexdigest()}}))


def _cli(capsys, *argv):
    """xtrain.trainer.cli.main in this process: (exit status, stderr lines)."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _assert_one_error_line(code, err, *fragments):
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("xtrain: error:"), err
    assert all(f in err[0] for f in fragments), err


# ---------------------------------------------------------------- 1: non-finite values

@pytest.mark.parametrize("where", ["weight", "moment"])
def test_save_refuses_non_finite_and_keeps_the_previous_checkpoint(tmp_path, tokenizer, where):
    path = _checkpoint(tmp_path / "ckpt", tokenizer, step=1)
    before = _files(path)
    model = make_model(small_config(), "cpu", weights_seed=2)
    opt = AdamW(model.named_parameters())
    target = opt.exp_avg_sq[3] if where == "moment" else dict(model.named_parameters())["norm.weight"]
    target.fill_(float("inf"))
    with pytest.raises(state.NonFiniteError, match=f"{where}.*non-finite.*previous checkpoint is kept"):
        state.save(tmp_path / "ckpt", model, opt, 2, tokenizer=tokenizer)
    assert _files(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_export_refuses_non_finite_weights(tmp_path, tokenizer, capsys):
    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    tensors["lm_head.weight"][0, 0] = np.nan
    save_file(tensors, str(path / "model.safetensors"))
    _relist(path, "model.safetensors")  # a checkpoint written by an older xtrain, say
    with pytest.raises(state.CheckpointError, match="lm_head.weight holds 1 non-finite"):
        export(path, tmp_path / "hf")
    code, err = _cli(capsys, "export", "--ckpt", path, "--out", tmp_path / "hf2")
    _assert_one_error_line(code, err, "refusing to export")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf2").exists()


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_clip_grad_norm_leaves_gradients_alone_when_the_norm_is_not_finite(bad):
    a = xtrain.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    b = xtrain.tensor(np.ones(4, np.float32), requires_grad=True)
    a.grad = xtrain.tensor(np.array([[1, 2, 3], [4, bad, 6]], np.float32))
    b.grad = xtrain.tensor(np.full(4, 0.5, np.float32))
    norm = clip_grad_norm_([a, b], 1.0).item()
    assert not np.isfinite(norm) and (np.isnan(norm) == np.isnan(bad))
    np.testing.assert_array_equal(b.grad.numpy(), np.full(4, 0.5, np.float32))  # was 0 for Inf
    np.testing.assert_array_equal(a.grad.numpy()[0], [1, 2, 3])
    b.grad = xtrain.tensor(np.full(4, 4.0, np.float32))  # finite norms still clip
    a.grad = None
    assert clip_grad_norm_([a, b], 1.0).item() == 8.0
    np.testing.assert_allclose(b.grad.numpy(), np.full(4, 0.5), rtol=1e-6)
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm_([b], float("nan"))


# ---------------------------------------------------------------- 2: reruns into a run

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("reliability-data"))


TRAIN = ("--preset", "tiny", "--steps", "2", "--batch", "2", "--seq", "16", "--eval-every", "0",
         "--sample-tokens", "2", "--no-progress", "--device", "cpu")


def test_rerun_into_an_existing_run_needs_resume_or_overwrite(tmp_path, tokenizer, data, capsys):
    run = tmp_path / "run"
    _checkpoint(run / "ckpt", tokenizer)
    (run / "log.jsonl").write_text('{"step": 0, "loss": 5.0}\n')
    before = _files(run)
    code, err = _cli(capsys, "train", "--data", data, "--out", run, *TRAIN)
    _assert_one_error_line(code, err, "already holds a run", "--resume", "--overwrite")
    code, err = _cli(capsys, "train", "--data", data, "--out", run, "--resume", tmp_path / "elsewhere", *TRAIN)
    assert code == 2 and "no checkpoint" in err[0]
    other = _checkpoint(tmp_path / "other" / "ckpt", tokenizer)
    code, err = _cli(capsys, "train", "--data", data, "--out", run, "--resume", other, *TRAIN)
    _assert_one_error_line(code, err, "holds another run", "--overwrite")
    assert _files(run) == before  # untouched by all three refusals

    code, err = _cli(capsys, "train", "--data", data, "--out", run, "--overwrite", *TRAIN)
    assert code == 0, err
    steps = [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert steps == [0, 1] and state.load(run / "ckpt").step == 2
    code, err = _cli(capsys, "train", "--data", data, "--out", run, "--resume", "--overwrite", *TRAIN)
    _assert_one_error_line(code, err, "--overwrite would delete the checkpoint")


# ---------------------------------------------------------------- 3: locks

def _hold_lock(path):
    """A process holding `path`'s lock until killed; returns it once the lock is taken."""
    code = textwrap.dedent("""
        import sys, time
        from xtrain.io.rundir import DirLock
        DirLock(sys.argv[1], "holder").acquire()
        print("locked", flush=True)
        time.sleep(300)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(xtrain.__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_locked_directory_is_refused_and_a_dead_holders_lock_taken_over(tmp_path, capsys):
    target = tmp_path / "target"
    holder = _hold_lock(target)
    try:
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("One story.\n\nAnother story.\n" * 40)
        code, err = _cli(capsys, "prepare", corpus, "--out", target, "--no-progress")
        _assert_one_error_line(code, err, "in use by holder", f"pid {holder.pid}")
        code, err = _cli(capsys, "train", "--data", corpus, "--out", target, *TRAIN)
        _assert_one_error_line(code, err, "in use by holder")
        with pytest.raises(rundir.LockedError):
            rundir.DirLock(target).acquire()
        assert sorted(p.name for p in target.iterdir()) == [rundir.LOCK_FILE]  # nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (target / rundir.LOCK_FILE).exists()  # left behind by the killed holder...
    with rundir.DirLock(target, "second") as lock:  # ...and recognised as stale
        assert lock.took_over["pid"] == holder.pid
        with pytest.raises(rundir.LockedError, match=r"in use by second \(pid \d+ on "):
            rundir.DirLock(target).acquire()  # one process, two holders: still exclusive
    assert not (target / rundir.LOCK_FILE).exists()  # freed on exit


# ---------------------------------------------------------------- 4: export targets

def test_export_never_writes_into_a_checkpoint_nor_a_non_empty_directory(tmp_path, tokenizer, capsys):
    ckpt = _checkpoint(tmp_path / "run" / "ckpt", tokenizer)
    before = _files(ckpt)
    code, err = _cli(capsys, "export", "--ckpt", ckpt, "--out", ckpt)
    _assert_one_error_line(code, err, "inside the checkpoint directory")
    for target in (ckpt / "hf", ckpt, ckpt / "hf"):
        with pytest.raises(rundir.RunDirError, match="checkpoint directory"):
            export(ckpt, target, overwrite=True)
    assert _files(ckpt) == before and state.load(ckpt).step == 1
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "config.json").write_text("mine")
    (taken / "notes.txt").write_text("mine too")
    code, err = _cli(capsys, "export", "--ckpt", ckpt, "--out", taken)
    _assert_one_error_line(code, err, "is not empty", "--overwrite")
    assert (taken / "config.json").read_text() == "mine"
    code, err = _cli(capsys, "export", "--ckpt", ckpt, "--out", taken, "--overwrite")
    assert code == 0, err
    assert json.loads((taken / "config.json").read_text())["model_type"] == "qwen3"
    assert (taken / "notes.txt").read_text() == "mine too"
    assert sorted(p.name for p in taken.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                       "notes.txt", "tokenizer.json", "tokenizer_config.json"]


# ---------------------------------------------------------------- 5: a full disk

def _no_space_on(name, real):
    def write(path, data):
        if Path(path).name == name:
            Path(path).write_bytes(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, data)
    return write


def test_full_disk_during_save_is_one_clear_error_and_leaves_nothing(tmp_path, tokenizer, monkeypatch, capsys):
    path = _checkpoint(tmp_path / "ckpt", tokenizer, step=1)
    before = _files(path)
    monkeypatch.setattr(state, "write_synced", _no_space_on("state.json", state.write_synced))
    model = make_model(small_config(), "cpu", weights_seed=5)
    with pytest.raises(OSError, match="no space left on device while writing checkpoint .* previous "
                                      "checkpoint is intact.*partial files were removed") as e:
        state.save(path, model, AdamW(model.named_parameters()), 2, tokenizer=tokenizer)
    assert e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"] and _files(path) == before
    assert state.load(path).step == 1
    # Export goes through the same staging: the target is left as it was.
    monkeypatch.setattr(state, "write_synced", _no_space_on("model.safetensors", state.write_synced))
    (tmp_path / "hf").mkdir()
    code, err = _cli(capsys, "export", "--ckpt", path, "--out", tmp_path / "hf")
    _assert_one_error_line(code, err, "no space left on device while writing the export")
    assert list((tmp_path / "hf").iterdir()) == []


FULL_DISK_SCRIPT = """
import json, subprocess, sys
from pathlib import Path
from xtrain.io import state
data, mnt = sys.argv[1], Path(sys.argv[2])
args = [sys.executable, "-m", "xtrain", "train", "--data", data, "--out", str(mnt / "run"), *sys.argv[3:]]
first = subprocess.run(args, capture_output=True, text=True)
model = (mnt / "run/ckpt/model.safetensors").read_bytes() if first.returncode == 0 else b""
second = subprocess.run(args + ["--resume", "--steps", "4"], capture_output=True, text=True)
print(json.dumps({"first": [first.returncode, first.stderr], "second": [second.returncode, second.stderr],
                  "left": sorted(p.name for p in (mnt / "run").iterdir()),
                  "step": state.load(mnt / "run/ckpt").step if first.returncode == 0 else None,
                  "same_model": (mnt / "run/ckpt/model.safetensors").read_bytes() == model}))
"""


def test_full_disk_for_real_on_a_small_tmpfs(tmp_path, data):
    """The same through the CLI on a real 16 MiB tmpfs (a private mount namespace): the first
    run's checkpoint (12 MB) fits, the resumed run's second copy does not."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1) to mount a private tmpfs")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(xtrain.__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=16m tmpfs "$1" && shift && exec "$@"',
                        "sh", str(mnt), sys.executable, "-c", FULL_DISK_SCRIPT, str(data), str(mnt), *TRAIN],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["first"][0] == 0, out["first"][1]
    code, err = out["second"]
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("xtrain: error: no space left on device while writing checkpoint")
    assert "ckpt.tmp" not in out["left"] and out["step"] == 2 and out["same_model"], out


# ---------------------------------------------------------------- 6: what a checkpoint may name

def test_a_checkpoint_reads_only_plain_listed_files_inside_itself(tmp_path, tokenizer, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret\n")
    path = _checkpoint(tmp_path / "run" / "ckpt", tokenizer)
    pristine = json.loads((path / "state.json").read_text())
    cases = {
        "parent path": lambda m: m["tokenizer"].update(file="../../secret.txt"),
        "absolute path": lambda m: m["tokenizer"].update(file=str(secret)),
        "listed outside": lambda m: m["files"].update({"../../secret.txt": {"bytes": 11, "sha256": "0" * 64}}),
        "unknown name": lambda m: m["files"].update({"notes.txt": {"bytes": 1, "sha256": "0" * 64}}),
    }
    for name, edit in cases.items():
        _edit_state(path, edit)
        with pytest.raises(state.CheckpointError, match="tokenizer.file|not a plain file name|not a checkpoint file"):
            state.load(path)
        (path / "state.json").write_text(json.dumps(pristine))
    # A symlink to the secret, listed with the secret's true size and hash: refused all the same.
    (path / "tokenizer.json").unlink()
    (path / "tokenizer.json").symlink_to(secret)
    _relist(path, "tokenizer.json")
    with pytest.raises(state.CheckpointError, match="symbolic link"):
        state.load(path)
    code, err = _cli(capsys, "export", "--ckpt", path, "--out", tmp_path / "hf")
    _assert_one_error_line(code, err, "symbolic link")
    assert not (tmp_path / "hf").exists()
    # A tokenizer file the integrity list does not name is never read.
    (path / "tokenizer.json").unlink()
    (path / "tokenizer.json").write_text("{}")
    _edit_state(path, lambda m: (m.update(tokenizer=None), m["files"].pop("tokenizer.json")))
    with pytest.raises(state.CheckpointError, match="not listed"):
        state.load(path)


def test_a_prepared_dataset_names_only_plain_files(tmp_path, data):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    meta = json.loads((copy / "meta.json").read_text())
    for bad in ("../secret.bin", "/etc/passwd", ".."):
        meta["files"]["train"] = bad
        (copy / "meta.json").write_text(json.dumps(meta))
        with pytest.raises(DataError, match="not a plain file name"):
            xtrain.data.open_dataset(copy)
    (copy / "meta.json").write_text("[]")
    with pytest.raises(DataError, match="malformed"):
        xtrain.data.open_dataset(copy)


# ---------------------------------------------------------------- 7: state.json against its schema

STATE_EDITS = [
    ("step is null", lambda m: m.update(step=None), "step must be an integer"),
    ("huge n_layers", lambda m: m["config"].update(n_layers=10**12), "config.n_layers must be an integer"),
    ("n_layers off by one", lambda m: (m["config"].update(n_layers=3), m.update(optimizer=None),
                                       m["files"].pop("optim.safetensors")), "holds 25 tensors; the config implies 36"),
    ("dim a string", lambda m: m["config"].update(dim="32"), "config.dim must be an integer"),
    ("config missing", lambda m: m.pop("config"), "missing keys ['config']"),
    ("unknown key", lambda m: m.update(extra=1), "unknown keys ['extra']"),
    ("eps NaN", lambda m: m["config"].update(norm_eps=float("nan")), "config.norm_eps must be a finite number"),
    ("bf16 a number", lambda m: m["config"].update(bf16=1), "config.bf16 must be true or false"),
    ("betas short", lambda m: m["optimizer"]["hyper"].update(betas=[0.9]), "betas must be a list of two"),
    ("names renamed", lambda m: m["optimizer"]["names"].__setitem__(0, "x"), "optimizer.names are not"),
    ("rng seed negative", lambda m: m["rng"].update(cpu=[-1, 0]), "rng.cpu must be an integer"),
    ("rng device", lambda m: m["rng"].update({"tpu": [0, 0]}), "unknown device 'tpu'"),
    ("loader step null", lambda m: m["data"].update(step=None), "data.step must be an integer"),
    ("tokenizer kind", lambda m: m["tokenizer"].update(kind=["bpe"]), "tokenizer.kind must be one of"),
    ("eot out of range", lambda m: m["tokenizer"].update(eot_id=10**9), "tokenizer.eot_id must be"),
    ("lr a string", lambda m: m["train_args"].update(lr="fast"), "train_args.lr must be a finite number"),
    ("sha256 short", lambda m: m["files"]["model.safetensors"].update(sha256="abc"), "sha256 must be 64 hex"),
    ("bytes null", lambda m: m["files"]["model.safetensors"].update(bytes=None), "bytes must be an integer"),
    ("empty object", lambda m: m.clear(), "is not an xtrain checkpoint"),
]


@pytest.mark.parametrize("name, edit, message", STATE_EDITS, ids=[e[0] for e in STATE_EDITS])
def test_edited_state_json_is_refused_before_anything_is_allocated(tmp_path, tokenizer, name, edit, message):
    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    _edit_state(path, edit)
    allocated = xtrain.memory_stats("cpu")["allocated_bytes.current"]
    with pytest.raises(state.CheckpointError) as e:
        state.load(path)
    assert message in str(e.value) and str(e.value).startswith(str(path))
    assert xtrain.memory_stats("cpu")["allocated_bytes.current"] == allocated


def test_edited_state_json_is_one_line_from_the_cli(tmp_path, tokenizer, capsys):
    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    _edit_state(path, lambda m: m["config"].update(n_layers=10**12))
    for argv in (("sample", "--ckpt", path), ("export", "--ckpt", path, "--out", tmp_path / "hf")):
        code, err = _cli(capsys, *argv)
        _assert_one_error_line(code, err, "config.n_layers must be an integer")


def test_tensor_headers_must_match_the_config(tmp_path, tokenizer):
    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    tensors["norm.weight"] = tensors["norm.weight"].astype(np.float64)
    save_file(tensors, str(path / "model.safetensors"))
    _relist(path, "model.safetensors")
    with pytest.raises(state.CheckpointError, match="norm.weight is F64, expected F32"):
        state.load(path)
    (path / "model.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    _relist(path, "model.safetensors")
    with pytest.raises(state.CheckpointError, match="impossible header length"):
        state.load(path)


@pytest.mark.parametrize("config", [small_config(), small_config(n_layers=3, n_heads=3, head_dim=8, ffn_dim=40)])
def test_the_schemas_shapes_are_the_models(config):
    model = make_model(config)
    assert schema.param_shapes(config.to_dict()) == {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert schema.param_count(config.to_dict()) == len(list(model.named_parameters()))


# ---------------------------------------------------------------- 9: the engine's inputs

UNINITIALISED = {
    "Tensor.__new__": "xtrain.Tensor.__new__(xtrain.Tensor)",
    "Tensor()": "xtrain.Tensor()",
    "base __new__": "xtrain.Tensor.__mro__[1].__new__(xtrain.Tensor)",
    "object.__new__": "object.__new__(xtrain.Tensor)",
    "subclass": "type('Sub', (xtrain.Tensor,), {})()",
    "copy": "__import__('copy').copy(xtrain.ones(2))",
}


@pytest.mark.parametrize("route", list(UNINITIALISED))
def test_no_uninitialised_tensor_can_be_made(route):
    # In a subprocess: before the fix, touching such a tensor was a segfault. Should a route
    # ever hand one out again, every method and property is tried on it.
    code = textwrap.dedent(f"""
        import xtrain
        try:
            t = {UNINITIALISED[route]}
        except TypeError as e:
            print("refused:", e)
            raise SystemExit(0)
        for name in dir(xtrain.Tensor):
            try:
                attr = getattr(t, name)
                if callable(attr) and not name.startswith("__"):
                    attr()
            except Exception:
                pass
        print("made one")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(xtrain.__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.startswith("refused:"), r.stdout


@pytest.mark.parametrize("make, message", [
    (lambda: xtrain.tensor(np.uint64([2**63 + 5])), "do not fit in int64"),
    (lambda: xtrain.tensor([1.0, float("nan")], dtype="int64"), "NaN or Inf cannot be stored in int64"),
    (lambda: xtrain.tensor([2**40], dtype="int32"), "do not fit in int32"),
    (lambda: xtrain.tensor(2**70), "integers beyond 64 bits"),
    (lambda: xtrain.full((2,), float("nan"), dtype="int64"), "fill_value nan cannot be stored in int64"),
    (lambda: xtrain.full((2,), 2.0**31, dtype="int32"), "cannot be stored in int32"),
    (lambda: xtrain.zeros(2, dtype="int32").fill_(float("inf")), "cannot be stored in int32"),
    (lambda: xtrain.zeros((2**63,)), "shape entry 9223372036854775808 does not fit in int64"),
    (lambda: xtrain.zeros(2**64, 2), "does not fit in int64"),
    (lambda: xtrain.arange(0, 1e300), "would have"),
    (lambda: xtrain.arange(2**63, 2**63 + 4), "cannot be stored in int64"),
    (lambda: xtrain.ones(3).size(2**70), "does not fit in int64"),
])
def test_values_a_tensor_cannot_hold_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()
    assert xtrain.full((2,), -2**63, dtype="int64").numpy().tolist() == [-2**63, -2**63]  # the edges still work


# ---------------------------------------------------------------- 10: CLI leftovers

def test_out_naming_a_file_is_one_error_line(tmp_path, tokenizer, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One story.\n\nAnother story.\n" * 40)
    ckpt = _checkpoint(tmp_path / "ckpt", tokenizer)
    for argv in (("train", "--data", corpus, "--out", a_file, *TRAIN),
                 ("train", "--data", corpus, "--out", a_file / "sub", *TRAIN),
                 ("export", "--ckpt", ckpt, "--out", a_file),
                 ("prepare", corpus, "--out", a_file, "--no-progress")):
        code, err = _cli(capsys, *argv)
        _assert_one_error_line(code, err, str(a_file), "not a directory")
    assert a_file.read_text() == "keep me"


def test_parquet_text_column_of_integers_is_a_clear_error(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": list(range(50))}), src)
    with pytest.raises(DataError, match="'text' column holds int64, not strings"):
        prepare(src, tmp_path / "out", vocab_size=300, progress=False)
    code, err = _cli(capsys, "prepare", src, "--out", tmp_path / "out2", "--no-progress")
    _assert_one_error_line(code, err, "not strings")
    assert not (tmp_path / "out2").exists()  # the lock's directory goes again when nothing was made
