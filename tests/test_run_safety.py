"""A run that is never lost and says what it does: checkpoints at every evaluation and RUN/best,
SIGINT saving and saying how to resume (a real `python -m xtrain train` process), step times that
leave evaluations and saves out, plain log lines off a terminal and a bar that fits 80 columns,
resume keeping the first run's results, a finished run left alone, the warning on a small corpus
read many times while validation rises."""

import io
import os
import signal
import subprocess
import sys
import time

import pytest

import xtrain
from modelhelp import cli_env, prepared_stories, run_cli, run_log, tiny_run
from xtrain.io import rundir
from xtrain.io import state as ckpt_state
from xtrain.trainer import progress, stopping
from xtrain.trainer import train as train_mod
from xtrain.trainer.train import train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("safety-data"))


def _scripted_eval(monkeypatch, losses, pause=0.0):
    """evaluate() returning `losses` in turn (after `pause` seconds); the steps it was called at."""
    calls, it = [], iter(losses)

    def fake(run):
        train_mod.settle(run)  # as evaluate() does: the pending step is logged first
        calls.append(run.step)
        time.sleep(pause)
        return next(it)

    monkeypatch.setattr(train_mod, "evaluate", fake)
    return calls


def test_checkpoints_at_every_evaluation_and_the_best_beside_the_latest(tmp_path, data, monkeypatch, capsys):
    saved = []
    real_save = ckpt_state.save
    monkeypatch.setattr(ckpt_state, "save", lambda path, *a, **kw: saved.append(a[2]) or real_save(path, *a, **kw))
    evals = _scripted_eval(monkeypatch, [3.0, 2.0, 2.5, 2.6])
    summary = train(tiny_run(tmp_path, data, 6, eval_every=2, save_every=None))
    assert evals == [0, 2, 4, 6] and saved == [2, 4, 6]
    assert ckpt_state.load(tmp_path / "ckpt").step == 6 and ckpt_state.load(tmp_path / "best").step == 2
    assert summary["steps"] == 6
    out = capsys.readouterr().out
    assert f"best {tmp_path / 'best'} (step 2, val loss 2.0000)" in out


def test_save_minutes_saves_on_the_clock(tmp_path, data, monkeypatch):
    saved = []
    real_save = ckpt_state.save
    monkeypatch.setattr(ckpt_state, "save", lambda path, *a, **kw: saved.append(a[2]) or real_save(path, *a, **kw))
    clock = iter(range(0, 10_000, 61))  # a minute passes between any two readings
    monkeypatch.setattr(train_mod.time, "monotonic", lambda: float(next(clock)))
    train(tiny_run(tmp_path, data, 3, save_minutes=2.0))
    assert saved == [2, 3]  # 2 minutes after the start (step 2), then the end


def test_sigint_finishes_the_step_saves_and_says_how_to_resume(tmp_path, data):
    out = tmp_path / "run"
    env = cli_env()
    args = ["train", "--data", str(data), "--out", str(out), "--preset", "tiny", "--fp32", "--batch", "4",
            "--seq", "32", "--steps", "100000", "--eval-every", "0", "--device", "cpu", "--log-every", "1",
            "--sample-tokens", "4"]
    proc = subprocess.Popen([sys.executable, "-m", "xtrain", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "log.jsonl").is_file() or (out / "log.jsonl").read_text().count("\n") < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    steps = [r["step"] for r in run_log(out) if "loss" in r]
    assert ckpt_state.load(out / "ckpt").step == len(steps) == steps[-1] + 1  # every logged step saved
    assert f"to continue: xtrain train --out {out} --resume" in stdout
    assert "SIGINT: finishing this step, then saving" in stderr and "Traceback" not in stderr
    # the message and the checkpoint agree: --resume continues it
    done = run_cli(*args[:args.index("--steps")], "--steps", len(steps) + 2, "--eval-every", "0", "--device",
                   "cpu", "--no-progress", "--resume", "--sample-tokens", "4")
    assert done.returncode == 0, done.stderr
    assert [r["step"] for r in run_log(out) if "loss" in r] == list(range(len(steps) + 2))


def test_a_second_signal_aborts_at_once():
    stop, before = stopping.StopRequest(), signal.getsignal(signal.SIGINT)
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs between bytecodes of the main thread
        assert stop.is_set() and stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) is before  # put back on leaving the block


def test_a_run_without_a_checkpoint_says_so(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 0, "loss": 6.0}\n')
    with pytest.raises(rundir.RunDirError, match="saved no checkpoint.*--overwrite"):
        rundir.check_run_dir(tmp_path)
    with pytest.raises(ckpt_state.CheckpointError, match="saved none.*--overwrite"):
        ckpt_state.resolve(tmp_path / "ckpt")


DEVICES = ["cpu"] + (["cuda:0"] if xtrain.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_step_time_leaves_out_evaluation_and_saving(tmp_path, data, monkeypatch, device):
    real_save = ckpt_state.save

    def slow_save(*a, **kw):
        time.sleep(0.5)
        return real_save(*a, **kw)

    monkeypatch.setattr(ckpt_state, "save", slow_save)
    _scripted_eval(monkeypatch, [3.0, 2.9, 2.8, 2.7, 2.6], pause=0.5)
    threads = xtrain.get_num_threads()
    try:  # one BLAS thread: spinning threads on shared cores make steps of a second (docs/training.md)
        summary = train(tiny_run(tmp_path, data, 8, device=device, eval_every=2, save_every=None, threads=1))
    finally:
        xtrain.set_num_threads(threads)
    ms = [r["ms"] for r in run_log(tmp_path) if "loss" in r]
    assert len(ms) == 8 and max(ms) < 400, ms  # no step holds an evaluation's or a save's 0.5 s
    # nor is one cut short: each holds its forward, backward and update (the step before an
    # evaluation was once timed from its update alone)
    assert min(ms) > sorted(ms)[4] / 4, ms
    assert summary["median_ms"] < 400 and summary["median_tok_s"] > 0


def test_plain_lines_when_stdout_is_not_a_terminal(tmp_path, data, capsys):
    train(tiny_run(tmp_path, data, 7, progress=True, log_every=3))
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("step ") and "loss" in line]
    assert [line.split(":")[0] for line in lines] == ["step 1/7", "step 3/7", "step 6/7", "step 7/7"]
    assert all(", tok/s" not in line and " tok/s, " in line and line.endswith(" MB") for line in lines)
    assert "\r" not in captured.out + captured.err
    assert "median step" in captured.out


def test_the_bar_fits_the_terminal_and_never_cuts_tok_s():
    line = progress.StepLine(step=359, total=800, loss=2.12345, lr=1e-3, ms=512.0, tok_s=123456.0,
                             mem_mb=20480.0, mfu=0.314, note="")
    for width in (200, 120, 80, 60, 40, 30):
        bar = progress.Bar(800, 0, io.StringIO(), width=lambda: width)
        bar.last, bar.avg_s = line, 0.5
        text = bar.render(width)
        assert len(text) <= width - 1 or width < 30, (width, text)
        assert "123,456 tok/s" in text and "360/800" in text
        if width >= 80:
            assert "20,480 MB" in text and "loss 2.1235" in text
    stream = io.StringIO()
    bar = progress.Bar(800, 0, stream, width=lambda: 0)  # a terminal reporting no width: 80 columns
    bar.step(line)
    assert 0 < len(stream.getvalue().lstrip("\r")) < 80


def test_lines_instead_of_a_bar_off_a_terminal_or_without_width():
    assert isinstance(progress.open_progress(10, 0, 5, True, io.StringIO()), progress.Lines)

    class ZeroWidthTerminal(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(progress.open_progress(10, 0, 5, True, ZeroWidthTerminal()), progress.Lines)


def test_resume_keeps_the_final_validation_and_a_finished_run_is_left_alone(tmp_path, data, capsys):
    kw = dict(eval_every=2, eval_batches=1, decay_steps=8)
    train(tiny_run(tmp_path, data, 5, **kw))
    first = [r for r in run_log(tmp_path) if "val_loss" in r]
    assert [r["step"] for r in first] == [0, 2, 4, 5]
    train(tiny_run(tmp_path, data, 8, resume=str(tmp_path / "ckpt"), **kw))
    vals = [r for r in run_log(tmp_path) if "val_loss" in r]
    assert [r["step"] for r in vals] == [0, 2, 4, 5, 6, 8] and vals[:4] == first
    # a finished run: one line, nothing evaluated, sampled or written
    files = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert train(tiny_run(tmp_path, data, 8, resume=str(tmp_path / "ckpt"), **kw)) is None
    assert capsys.readouterr().out.strip().splitlines() == [
        f"xtrain: nothing to do: {tmp_path / 'ckpt'} is at step 8 and --steps is 8; pass a larger --steps to "
        f"train further"]
    assert files == {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()}


def test_a_warning_when_a_small_corpus_is_read_many_times_while_validation_rises(tmp_path, monkeypatch, capsys):
    from xtrain.data import prepare, write_corpus

    data = prepare(write_corpus(tmp_path / "small.txt", 6_000), tmp_path / "small", vocab_size=300,
                   val_fraction=0.2, progress=False)
    _scripted_eval(monkeypatch, [3.0, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7])
    # 3,956 training tokens read 256 at a step: more than 4 times from step 62 on
    train(tiny_run(tmp_path / "run", data, 80, eval_every=10, eval_batches=1, batch=8, save_every=None))
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "read its training data 4.5 times" in warnings[0]
    assert str(tmp_path / "run" / "best") in warnings[0]
    assert ckpt_state.load(tmp_path / "run" / "best").step == 10


def test_rank_threads_stop_together_at_the_agreed_step(tmp_path, data, monkeypatch):
    """Two CPU rank threads (the launcher of --devices N): a stop request seen by rank 1 at step 3
    stops both ranks after step CONTROL_EVERY, with one checkpoint of that step."""
    from cpu_collectives import ThreadCollectives
    from test_process_training import WORLD, CpuLaunch
    from xtrain.trainer.train import open_inputs

    stop = stopping.StopRequest()
    real_step = train_mod.train_step

    def step_then_ask(run):
        real_step(run)
        if run.ctx.rank == 1 and run.step == 3:
            stop.request("SIGTERM")

    monkeypatch.setattr(train_mod, "train_step", step_then_ask)
    cfg = tiny_run(tmp_path, data, 100, batch=2)
    dataset, _ = open_inputs(cfg, False)
    xtrain.manual_seed(cfg.seed)
    launch = CpuLaunch(ThreadCollectives(WORLD), list(range(WORLD)), 30.0)
    with pytest.raises(stopping.StopRequested):
        launch.run(lambda ctx: train(cfg, ctx=ctx, prepared=(dataset, None), stop=stop))
    assert ckpt_state.load(tmp_path / "ckpt").step == train_mod.CONTROL_EVERY
    assert [r["step"] for r in run_log(tmp_path) if "loss" in r] == list(range(train_mod.CONTROL_EVERY))
