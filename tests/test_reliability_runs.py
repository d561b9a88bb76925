"""Never lose a run, part two (issue 36): one test or more per numbered defect, then the smaller
ones, then external inputs bounded before they are read. Each guards a defect and failed before
its change (docs/reliability.md lists them).

1 prepare never writes into a checkpoint directory
2, 3 --init-from configs are bounded: no per-layer table from a huge layer count, no max_seq a
  checkpoint could not record
4 a --resume with nothing to do writes nothing
5 sample/export of a run that is saving read one complete checkpoint
6 a prepare into a training run's folder (RUN/data) refuses, as does a run whose data is being prepared
7 prepare reads nothing outside a source directory, and no special file
8 a diverged save goes aside; the last good checkpoint stays
"""

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import xtrain
from modelhelp import cli_env, make_model, prepared_stories, run_log, small_config, tiny_run
from xtrain.data import DataError, generate_stories, prepare, train_bpe
from xtrain.data import bounded
from xtrain.io import rundir, state
from xtrain.io.export import export
from xtrain.models import TransformerConfig, generate, hf_import
from xtrain.optim import AdamW
from xtrain.trainer import cli, train as train_mod
from xtrain.trainer.train import train


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe(generate_stories(50), 300)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("reliability-runs-data"))


VOCAB = 320  # at least the test tokenizer's ids


def _checkpoint(path, tokenizer, step=1, seed=None):
    model = make_model(small_config(vocab_size=VOCAB), "cpu", weights_seed=step if seed is None else seed)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    return state.save(path, model, opt, step, loader_state={"version": 1, "step": step},
                      tokenizer=tokenizer, dataset="data", train_args={"lr": 1e-3})


def _files(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def _cli(capsys, *argv):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def _one_error_line(code, err, *fragments):
    assert code == 2 and len(err) == 1 and err[0].startswith("xtrain: error: "), (code, err)
    for f in fragments:
        assert f in err[0], (f, err[0])


def _corpus(path, animal="cat"):
    path.write_text("".join(f"Story {i}: a small {animal} saw {i % 7} birds.\n\n" for i in range(400)))
    return path


TRAIN = ("--preset", "tiny", "--batch", "2", "--seq", "16", "--eval-every", "0", "--sample-tokens", "2",
         "--no-progress", "--device", "cpu")


# ---------------------------------------------------------------- 1: prepare into a checkpoint

@pytest.mark.parametrize("where", ["ckpt", "ckpt/sub", "best"])
def test_prepare_never_writes_into_a_checkpoint(tmp_path, tokenizer, capsys, where):
    run = tmp_path / "run"
    _checkpoint(run / "ckpt", tokenizer)
    state.copy(run / "ckpt", run / "best")
    before = _files(run)
    code, err, _ = _cli(capsys, "prepare", _corpus(tmp_path / "c.txt"), "--out", run / where, "--no-progress")
    _one_error_line(code, err, "refusing to prepare data into", "checkpoint directory")
    assert _files(run) == before
    state.load(run / "ckpt")


def test_prepare_refuses_a_runs_checkpoint_name_before_the_first_save(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text('{"step": 0, "loss": 5.0}\n')
    code, err, _ = _cli(capsys, "prepare", _corpus(tmp_path / "c.txt"), "--out", run / "ckpt", "--no-progress")
    _one_error_line(code, err, "holds a run, which writes ckpt itself")
    assert not (run / "ckpt").exists()


# ---------------------------------------------------------------- 2, 3: --init-from bounds

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tokenizer):
    """A small Hugging Face directory (an export of a small checkpoint)."""
    root = tmp_path_factory.mktemp("hf-src")
    model = make_model(small_config(vocab_size=tokenizer.vocab_size), "cpu")
    state.save(root / "ckpt", model, None, 0, tokenizer=tokenizer)
    return export(root / "ckpt", root / "hf", dtype="f32")


def _hf_copy(hf_dir, tmp_path, **changes):
    out = tmp_path / "hf"
    out.mkdir(parents=True)
    for f in hf_dir.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    config = json.loads((out / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps(config))
    return out


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("layers, message", [
    (10**12, "num_hidden_layers must be an integer in [1, 2147483647], got 1000000000000"),
    (2**31 - 1, "the config implies 23,622,320,120 tensors (2,147,483,647 layers)"),
    (1e12, "num_hidden_layers must be an integer"),
    (10**400, "an integer of 1329 bits"),
])
def test_init_from_a_huge_layer_count_is_refused_without_allocating(hf_dir, tmp_path, layers, message):
    path = _hf_copy(hf_dir, tmp_path)
    text = (path / "config.json").read_text()
    (path / "config.json").write_text(text.replace('"num_hidden_layers": 2', f'"num_hidden_layers": {layers!r}'))
    t0 = time.monotonic()

    def read():
        with pytest.raises(hf_import.PretrainedError, match=message.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("]", r"\]")):
            hf_import.read_pretrained(path, TransformerConfig)
    assert _peak_bytes(read) < 32 << 20 and time.monotonic() - t0 < 10


@pytest.mark.parametrize("key, value", [("max_position_embeddings", 2**31), ("max_position_embeddings", 2**40),
                                        ("num_key_value_heads", 2**33), ("vocab_size", 2**31)])
def test_init_from_config_ints_beyond_what_a_checkpoint_records_are_refused(hf_dir, tmp_path, key, value):
    path = _hf_copy(hf_dir, tmp_path, **{key: value})
    with pytest.raises(hf_import.PretrainedError, match=f"{key} must be an integer in \\[1, 2147483647\\]"):
        hf_import.read_pretrained(path, TransformerConfig)


@pytest.mark.parametrize("key, value, message", [
    ("rms_norm_eps", "1e-6", "rms_norm_eps must be a finite positive number"),
    ("rope_theta", -1.0, "rope_theta must be a finite positive number"),
    ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false"),
])
def test_init_from_config_floats_and_switches_are_checked(hf_dir, tmp_path, key, value, message):
    path = _hf_copy(hf_dir, tmp_path, **{key: value})
    with pytest.raises(hf_import.PretrainedError, match=message):
        hf_import.read_pretrained(path, TransformerConfig)


def test_init_from_the_largest_max_seq_trains_and_its_checkpoint_loads(hf_dir, tmp_path, data, tokenizer):
    """max_position_embeddings 2**31 - 1 is accepted and the run's checkpoint loads again."""
    path = _hf_copy(hf_dir, tmp_path, max_position_embeddings=2**31 - 1)
    pre = hf_import.read_pretrained(path, TransformerConfig)
    assert pre.config.max_seq == 2**31 - 1
    model = pre.build(xtrain.models.TinyTransformer)
    state.save(tmp_path / "ckpt", model, None, 0, tokenizer=tokenizer)
    assert state.load(tmp_path / "ckpt").config.max_seq == 2**31 - 1


def test_a_run_from_pretrained_weights_on_raw_text_resumes(hf_dir, tmp_path):
    """--init-from with a raw text --data prepares OUT/data with the model's tokenizer; the resume
    (no --init-from: the checkpoint carries the tokenizer) once prepared it again as a new BPE and
    refused: 'OUT/data holds a dataset prepared with other settings'."""
    from xtrain.data import write_corpus

    corpus = write_corpus(tmp_path / "stories.txt", 700_000)  # 2 validation documents
    out = tmp_path / "run"
    base = dict(data=str(corpus), out=str(out), device="cpu", batch=2, seq=16, lr=1e-4, warmup=1, eval_every=0,
                sample_tokens=4, progress=False, decay_steps=4)
    train(train_mod.TrainConfig(init_from=str(hf_dir), steps=2, **base))
    summary = train(train_mod.TrainConfig(resume=str(out / "ckpt"), steps=4, **base))
    assert summary["steps"] == 4 and state.load(out / "ckpt").step == 4


def _rewrite_weights(path, edit):
    """Rewrite model.safetensors' header with edit(header dict) (the data section unchanged)."""
    f = path / "model.safetensors"
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    f.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def test_init_from_overlapping_tensors_are_refused(hf_dir, tmp_path):
    path = _hf_copy(hf_dir, tmp_path)

    def overlap(header):
        names = sorted(k for k in header if k != "__metadata__" and header[k]["shape"] == header["model.norm.weight"]["shape"])
        a, b = names[0], names[1]
        header[b]["data_offsets"] = header[a]["data_offsets"]
    _rewrite_weights(path, overlap)
    with pytest.raises(hf_import.PretrainedError, match="overlap"):
        hf_import.read_pretrained(path, TransformerConfig)


def test_init_from_non_finite_weights_are_refused_at_once(hf_dir, tmp_path):
    path = _hf_copy(hf_dir, tmp_path)
    f = path / "model.safetensors"
    raw = bytearray(f.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    begin = json.loads(raw[8:8 + n])["model.norm.weight"]["data_offsets"][0]
    raw[8 + n + begin:8 + n + begin + 4] = np.float32(np.nan).tobytes()
    f.write_bytes(bytes(raw))
    with pytest.raises(hf_import.PretrainedError, match="model.norm.weight holds 1 non-finite"):
        hf_import.read_pretrained(path, TransformerConfig)


# ---------------------------------------------------------------- 4: nothing to do

def test_a_resume_with_nothing_to_do_changes_nothing(tmp_path, data, capsys):
    run = tmp_path / "run"
    code, err, _ = _cli(capsys, "train", "--data", data, "--out", run, "--steps", "2", *TRAIN)
    assert code == 0, err
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, err, out = _cli(capsys, "train", "--out", run, "--resume", "--steps", "2", "--lr", "5", "--bf16",
                          "--no-progress")
    assert code == 0 and "nothing to do" in out, (err, out)
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- 5: readers during saves

def test_a_save_waits_for_a_reader_of_the_run(tmp_path, tokenizer):
    ckpt = _checkpoint(tmp_path / "ckpt", tokenizer, step=1)
    saved = threading.Event()

    def save():
        _checkpoint(tmp_path / "ckpt", tokenizer, step=2)
        saved.set()

    with state.reading(ckpt):
        first = state.load(ckpt)
        writer = threading.Thread(target=save)
        writer.start()
        time.sleep(0.5)  # the save has written ckpt.tmp and waits to publish it
        assert not saved.is_set() and first.step == 1
        weights = first.model_tensors()  # the files of step 1, whole
        assert first.tokenizer().fingerprint == tokenizer.fingerprint
    writer.join(30)
    assert saved.is_set() and state.load(ckpt).step == 2
    assert set(weights) == set(state.load(ckpt).model_tensors())
    with pytest.raises(state.CheckpointError, match="replaced by a newer save"):
        first.model_tensors()  # read after the save, outside reading(): refused, not mixed


_SAVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from modelhelp import make_model, small_config
    from xtrain.data import generate_stories, train_bpe
    from xtrain.io import state
    from xtrain.optim import AdamW
    tok = train_bpe(generate_stories(50), 300)
    for step in range(1, int(sys.argv[3]) + 1):
        model = make_model(small_config(vocab_size=320), "cpu", weights_seed=step)
        state.save(sys.argv[1], model, AdamW(model.named_parameters(), lr=1e-3), step,
                   loader_state={"version": 1, "step": step}, tokenizer=tok)
        print(step, flush=True)
""")


def test_finding_a_runs_checkpoint_waits_for_a_save_between_its_renames(tmp_path, tokenizer):
    """A save publishes RUN/ckpt with two renames under the writer's lock (ckpt -> ckpt.old, then
    ckpt.tmp -> ckpt). Looking for the run's checkpoint between them once found neither name and
    said `no checkpoint at RUN` (1 in ~120 reads in CI); the look now waits for the publish."""
    import fcntl
    from xtrain.io.export import checkpoint_in
    run = tmp_path / "run"
    _checkpoint(run / "ckpt", tokenizer, step=0)
    found = []
    looker = threading.Thread(target=lambda: found.append(checkpoint_in(run)))
    with state._parent_lock(run / "ckpt", fcntl.LOCK_EX):
        os.rename(run / "ckpt", run / "ckpt.old")  # the first rename of a publish
        looker.start()
        time.sleep(0.3)
        assert looker.is_alive() and not found  # it waits for the writer's lock
        os.rename(run / "ckpt.old", run / "ckpt")  # (the test's second rename puts it back)
    looker.join(10)
    assert found == [run / "ckpt"]


def test_sample_and_export_of_a_run_that_is_saving_never_see_a_corrupt_checkpoint(tmp_path, tokenizer, capsys):
    """A process saves RUN/ckpt over and over while sample and export read the run: every read
    is a complete checkpoint (before, 4 in 40 reads said optim.safetensors was corrupt)."""
    run = tmp_path / "run"
    _checkpoint(run / "ckpt", tokenizer, step=0)
    saver = subprocess.Popen([sys.executable, "-c", _SAVER, str(run / "ckpt"), str(Path(__file__).parent), "400"],
                             stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert saver.stdout.readline().strip() == "1"
        errors, reads = [], 0
        while saver.poll() is None and reads < 60:
            code, err, _ = _cli(capsys, "sample", "--ckpt", run, "--max-new-tokens", "1", "--prompt", "a")
            errors += err if code else []
            code, err, _ = _cli(capsys, "export", "--ckpt", run, "--out", tmp_path / "hf", "--overwrite",
                                "--dtype", "f32")
            errors += err if code else []
            reads += 1
        assert reads >= 10 and not errors, (reads, errors[:3])
    finally:
        saver.kill()
        saver.wait()


# ---------------------------------------------------------------- 6: RUN/data while the run trains

def _hold_lock(path, what):
    code = textwrap.dedent("""
        import sys, time
        from xtrain.io.rundir import DirLock
        DirLock(sys.argv[1], sys.argv[2]).acquire()
        print("locked", flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), what], stdout=subprocess.PIPE, text=True,
                            env=cli_env())
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_prepare_into_the_data_of_a_training_run_refuses(tmp_path, data, capsys):
    run = tmp_path / "run"
    corpus = _corpus(tmp_path / "c.txt")
    code, err, _ = _cli(capsys, "train", "--data", corpus, "--out", run, "--steps", "1", *TRAIN)
    assert code == 0, err
    before = _files(run / "data")
    holder = _hold_lock(run, "xtrain train")  # the run, training again
    try:
        other = _corpus(tmp_path / "other.txt", "dog")
        code, err, _ = _cli(capsys, "prepare", other, "--out", run / "data", "--overwrite", "--no-progress")
        _one_error_line(code, err, f"{run} is in use by xtrain train")
    finally:
        holder.kill()
        holder.wait()
    assert _files(run / "data") == before
    code, err, _ = _cli(capsys, "train", "--out", run, "--resume", "--steps", "2", "--no-progress")
    assert code == 0, err


def test_a_run_whose_data_is_being_prepared_refuses(tmp_path, capsys):
    run = tmp_path / "run"
    holder = _hold_lock(run / "data", "xtrain prepare")
    try:
        code, err, _ = _cli(capsys, "train", "--data", _corpus(tmp_path / "c.txt"), "--out", run, "--steps", "1",
                            *TRAIN)
        _one_error_line(code, err, f"{run / 'data'} is in use by xtrain prepare")
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- 7: prepare's sources

def test_prepare_refuses_a_link_out_of_its_source_directory(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("a password that must never be tokenised\n")
    src = tmp_path / "src"
    src.mkdir()
    _corpus(src / "a.txt")
    (src / "p.txt").symlink_to(secret)
    code, err, _ = _cli(capsys, "prepare", src, "--out", tmp_path / "out", "--no-progress")
    _one_error_line(code, err, "p.txt is a symbolic link to", "outside the source directory")
    assert not (tmp_path / "out" / "meta.json").exists()
    (src / "p.txt").unlink()
    (src / "d").symlink_to(tmp_path, target_is_directory=True)  # a directory link: not walked into
    (src / "b.txt").symlink_to(src / "a.txt")                   # a link inside: read once
    code, err, _ = _cli(capsys, "prepare", src, "--out", tmp_path / "out", "--no-progress")
    assert code == 0, err
    files = json.loads((tmp_path / "out" / "meta.json").read_text())["source"]["files"]
    assert [Path(f).name for f in files] == ["a.txt"]


def test_prepare_refuses_special_files(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    _corpus(src / "a.txt")
    os.mkfifo(src / "pipe.txt")
    code, err, _ = _cli(capsys, "prepare", src, "--out", tmp_path / "out", "--no-progress")
    _one_error_line(code, err, "pipe.txt is not a regular file")
    code, err, _ = _cli(capsys, "prepare", src / "pipe.txt", "--out", tmp_path / "out", "--no-progress")
    _one_error_line(code, err, "pipe.txt is not a regular file")


# ---------------------------------------------------------------- 8: diverged weights

def test_a_diverged_save_never_replaces_the_last_good_checkpoint(tmp_path, data):
    train(tiny_run(tmp_path, data, 4, save_every=2))
    good = _files(tmp_path / "ckpt")
    with pytest.raises(train_mod.DivergedRunError, match=r"step 6: the weights diverged .* saved aside as .*ckpt.suspect "
                                               r"and .*ckpt keeps step 4\. To go on, resume from the good one"):
        train(tiny_run(tmp_path, data, 12, save_every=2, lr=1e6, warmup=0, grad_clip=0.0,
                       resume=str(tmp_path / "ckpt"), nonfinite_limit=100))
    assert _files(tmp_path / "ckpt") == good
    suspect = state.load(tmp_path / "ckpt.suspect")
    assert suspect.step == 6 and state.max_abs(suspect.model_tensors()) > 1e6
    # the good checkpoint resumes; the suspect one can be resumed deliberately too
    assert train(tiny_run(tmp_path, data, 6, resume=str(tmp_path / "ckpt")))["steps"] == 6


def test_the_divergence_rule(monkeypatch):
    """Note [Diverged checkpoints]: weights x100 the last good ones, a loss window far above the
    best of earlier saves, or no finite loss at all; otherwise the save is good and the reference
    moves."""
    class FakeRun:
        good_max_w, good_loss = 2.0, None
    run = FakeRun()
    w = {"a": np.array([150.0], np.float32)}
    assert train_mod.diverged(run, w, 3.0) is None and run.good_max_w == 150.0
    assert "weights diverged" in train_mod.diverged(run, {"a": np.array([2e4], np.float32)}, 3.0)
    assert "not finite" in train_mod.diverged(run, w, float("nan"))
    run.good_loss = 3.0
    assert train_mod.diverged(run, w, 4.9) is None                       # within 2 nats
    assert "loss diverged" in train_mod.diverged(run, w, 5.1)
    run.good_loss = 6.0
    assert train_mod.diverged(run, w, 8.9) is None                       # within half of it
    assert "loss diverged" in train_mod.diverged(run, w, 9.1)


def test_a_save_logs_every_step_it_holds_first(tmp_path, data, monkeypatch):
    """A kill right after a save loses no log line: the log holds the checkpoint's steps when it
    is written (it was one step behind: 4 of 14 kills lost a line)."""
    real, seen = state.save, {}

    def spy(path, model, optimizer=None, step=0, **kw):
        seen[step] = [r["step"] for r in run_log(tmp_path) if "loss" in r]
        return real(path, model, optimizer, step, **kw)
    monkeypatch.setattr(state, "save", spy)
    train(tiny_run(tmp_path, data, 5, save_every=2))
    assert seen == {2: [0, 1], 4: [0, 1, 2, 3], 5: [0, 1, 2, 3, 4]}


# ---------------------------------------------------------------- smaller ones

def test_wrong_types_in_a_checkpoints_train_args_are_one_error_line(tmp_path, data, capsys):
    run = tmp_path / "run"
    code, err, _ = _cli(capsys, "train", "--data", data, "--out", run, "--steps", "2", *TRAIN)
    assert code == 0, err
    meta = json.loads((run / "ckpt" / "state.json").read_text())
    meta["train_args"]["decay_steps"] = "many"
    (run / "ckpt" / "state.json").write_text(json.dumps(meta))
    code, err, _ = _cli(capsys, "train", "--out", run, "--resume", "--steps", "4", "--no-progress")
    _one_error_line(code, err, "train_args: --decay-steps 'many': expected an integer")


def test_non_utf8_text_arguments_are_one_error_line(tmp_path, data, capsys):
    run = tmp_path / "run"
    code, err, _ = _cli(capsys, "train", "--data", data, "--out", run, "--steps", "2", *TRAIN)
    assert code == 0, err
    bad = b"ab\xff\xfe".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
    code, err, _ = _cli(capsys, "sample", "--ckpt", run, "--prompt", bad)
    _one_error_line(code, err, "--prompt: not UTF-8 text")
    code, err, _ = _cli(capsys, "train", "--out", run, "--resume", "--steps", "3", "--sample-prompt", bad)
    _one_error_line(code, err, "--sample-prompt: not UTF-8 text")


def test_a_flag_from_the_resumed_record_is_named_as_such(tmp_path, data, capsys):
    run = tmp_path / "run"
    code, err, _ = _cli(capsys, "train", "--data", data, "--out", run, "--steps", "2", *TRAIN)
    assert code == 0, err
    code, err, _ = _cli(capsys, "train", "--out", run, "--resume", "--seq", "64", "--steps", "4")
    _one_error_line(code, err, "the resumed run's batch-tokens (recorded in its config.toml, not given here)",
                    "pass --batch-tokens to change it")


def test_config_file_switches_both_ways_and_never_two_ways_at_once(tmp_path):
    from xtrain.trainer import runconfig

    for text, bf16 in (("fp32 = true", False), ("bf16 = false", False), ("fp32 = false", True),
                       ("fp32 = true\nbf16 = false", False)):
        (tmp_path / "run.toml").write_text(text + "\n")
        assert runconfig.read_config(tmp_path / "run.toml") == {"bf16": bf16}
    (tmp_path / "run.toml").write_text("bf16 = true\nfp32 = true\n")  # the later key silently won
    with pytest.raises(runconfig.ConfigError, match="keys 'bf16' and 'fp32' set one option two ways"):
        runconfig.read_config(tmp_path / "run.toml")


def test_numpy_of_a_tensor_is_a_read_only_view():
    w = xtrain.tensor(np.ones((2, 2), np.float32), requires_grad=True)
    a = w.numpy()
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 5.0
    (w * w).sum().backward()
    assert np.array_equal(w.grad.numpy(), np.full((2, 2), 2.0, np.float32))
    assert a.copy().flags.writeable


def test_generate_arguments(tokenizer):
    model = make_model(small_config(), "cpu")
    out = generate.generate(model, [[1, 2]], 2**64, greedy=True, stop_token=None)
    assert out.shape[1] == model.config.max_seq  # capped at max_seq, not an OverflowError
    for kw, err, message in [(dict(generator="x"), TypeError, "generator must be a numpy.random.Generator"),
                             (dict(seed=-1), ValueError, "seed must be an integer"),
                             (dict(seed="x"), ValueError, "seed must be an integer"),
                             (dict(temperature=10**400), ValueError, "an integer of 1329 bits"),
                             (dict(top_k=True), ValueError, "top_k must be a positive integer"),
                             (dict(top_p=float("nan")), ValueError, "top_p must be in")]:
        with pytest.raises(err, match=message):
            generate.generate(model, [[1, 2]], 2, **kw)


def _limited(limit):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("limit, fragment", [(0, ".xtrain.lock: File too large"),
                                             (20_000, "file too large (a file size limit: ulimit -f?) while "
                                                      "writing checkpoint")])
def test_a_file_size_limit_is_one_line_with_the_path(tmp_path, data, limit, fragment):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "xtrain", "train", "--data", str(data), "--out", str(run),
                           "--steps", "2", *TRAIN], env=cli_env(), capture_output=True, text=True,
                          preexec_fn=_limited(limit), timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and err[-1].startswith("xtrain: error: ") and fragment in err[-1], proc.stderr
    assert not (run / rundir.LOCK_FILE).exists() and not (run / "ckpt.tmp").exists()


# ---------------------------------------------------------------- external inputs, bounded

def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_oversized_external_files_are_refused_before_reading(hf_dir, tmp_path, tokenizer):
    path = _hf_copy(hf_dir, tmp_path)
    _sparse(path / "config.json", bounded.MAX_JSON_BYTES + 1)
    with pytest.raises(hf_import.PretrainedError, match="model config .* more than such a file ever needs"):
        hf_import.read_pretrained(path, TransformerConfig)
    path = _hf_copy(hf_dir, tmp_path / "2")
    _sparse(path / "model.safetensors.index.json", bounded.MAX_JSON_BYTES + 1)
    with pytest.raises(hf_import.PretrainedError, match="safetensors index"):
        hf_import.read_pretrained(path, TransformerConfig)
    path = _hf_copy(hf_dir, tmp_path / "3")
    _sparse(path / "tokenizer.json", bounded.MAX_TOKENIZER_BYTES + 1)
    with pytest.raises(DataError, match="tokenizer file .* more than such a file ever needs"):
        hf_import.read_pretrained(path, TransformerConfig)
    path = _hf_copy(hf_dir, tmp_path / "4")
    raw = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes((2**40).to_bytes(8, "little") + raw[8:])
    with pytest.raises(hf_import.PretrainedError, match="impossible header length"):
        hf_import.read_pretrained(path, TransformerConfig)
    toml = _sparse(tmp_path / "run.toml", bounded.MAX_TOML_BYTES + 1)
    from xtrain.trainer import runconfig
    with pytest.raises(runconfig.ConfigError, match="more than such a file ever needs"):
        runconfig.read_config(toml)


def test_a_fifo_where_a_file_is_expected_is_refused_not_waited_on(hf_dir, tmp_path):
    path = _hf_copy(hf_dir, tmp_path)
    (path / "config.json").unlink()
    os.mkfifo(path / "config.json")
    t0 = time.monotonic()
    with pytest.raises(hf_import.PretrainedError, match="config.json"):
        hf_import.read_pretrained(path, TransformerConfig)
    os.unlink(path / "config.json")
    (path / "config.json").write_text(json.dumps(json.loads((hf_dir / "config.json").read_text())))
    (path / "tokenizer_config.json").unlink()
    os.mkfifo(path / "tokenizer_config.json")  # not a file: as if absent
    assert hf_import.read_pretrained(path, TransformerConfig).tokenizer is not None
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("suffix, text", [(".txt", "word " * 300), (".jsonl", '{"text": "' + "w" * 3000 + '"}\n'),
                                          (".txt", "<|endoftext|>" + "word " * 300)])
def test_a_source_document_is_bounded(tmp_path, monkeypatch, suffix, text):
    """A source file with no separator was read whole into memory (one line, one document)."""
    from xtrain.data import readers

    monkeypatch.setattr(readers, "MAX_DOCUMENT_CHARS", 1000)
    f = tmp_path / f"one{suffix}"
    f.write_text("a short first document\n\n" * (suffix == ".txt" and "<|" not in text) + text * 5)
    with pytest.raises(DataError, match="longer than 1,000 characters"):
        list(readers.read_file(f))
    monkeypatch.setattr(readers, "MAX_DOCUMENT_CHARS", 100_000)
    assert list(readers.read_file(f))
