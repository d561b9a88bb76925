"""The `xtrain` command, run as `python -m xtrain` in a subprocess: train (loss falls), sample and
export on its checkpoint, --help, and bad flags/paths -> one line on stderr, exit status 2."""

import json

import pytest

from modelhelp import prepared_stories, run_cli
from xtrain.trainer.runconfig import parse_size


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    data = prepared_stories(root)
    out = root / "run"
    r = run_cli("train", "--preset", "tiny", "--steps", "30", "--data", data, "--out", out,
                "--batch", "8", "--seq", "64", "--lr", "3e-3", "--warmup", "5", "--eval-every", "15",
                "--eval-batches", "2", "--sample-tokens", "20", "--no-progress", "--device", "cpu",
                "--sample-prompt", "Once upon a time")
    return root, out, r


def test_train_runs_and_loss_falls(trained):
    _, out, r = trained
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(vals) == 3 and vals[-1] < vals[0]
    assert "sample:" in r.stdout and "Once upon a time" in r.stdout
    for name in ("loss.png", "sample.txt", "ckpt/state.json", "ckpt/model.safetensors"):
        assert (out / name).is_file(), name


def test_sample_and_export_on_the_checkpoint(trained):
    root, out, _ = trained
    r = run_cli("sample", "--ckpt", out / "ckpt", "--prompt", "Once upon a time", "--greedy",
                "--max-new-tokens", "10", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon a time")
    again = run_cli("sample", "--ckpt", out / "ckpt", "--prompt", "Once upon a time", "--greedy",
                    "--max-new-tokens", "10", "--device", "cpu")
    assert again.stdout == r.stdout
    r = run_cli("sample", "--ckpt", out / "ckpt", "--temperature", "0.7", "--top-k", "20",
                "--max-new-tokens", "10", "--seed", "3")
    assert r.returncode == 0, r.stderr
    r = run_cli("export", "--ckpt", out / "ckpt", "--out", root / "hf", "--dtype", "f32")
    assert r.returncode == 0, r.stderr
    assert (root / "hf" / "model.safetensors").is_file() and (root / "hf" / "config.json").is_file()


def test_sample_batched_prompts_and_sampling_flags(trained):
    _, out, _ = trained
    ckpt = out / "ckpt"
    prompts = ("--prompt", "Once upon a time", "--prompt", "The dog")
    r = run_cli("sample", "--ckpt", ckpt, *prompts, "--greedy", "--max-new-tokens", "8", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("=== sample ")
    assert len(blocks) == 3 and blocks[1].startswith("1 ===\nOnce upon a time") and blocks[2].startswith("2 ===\nThe dog")
    # A batched prompt continues as it does alone (greedy), and --temperature 0 is greedy.
    alone = run_cli("sample", "--ckpt", ckpt, "--prompt", "The dog", "--temperature", "0", "--max-new-tokens", "8",
                    "--device", "cpu")
    assert alone.returncode == 0, alone.stderr
    assert blocks[2] == "2 ===\n" + alone.stdout
    flags = ("--temperature", "1.2", "--top-k", "30", "--top-p", "0.9", "--seed", "5", "--max-new-tokens", "8",
             "--device", "cpu")
    a = run_cli("sample", "--ckpt", ckpt, *prompts, *flags)
    assert a.returncode == 0, a.stderr
    assert run_cli("sample", "--ckpt", ckpt, *prompts, *flags).stdout == a.stdout  # seeded
    r = run_cli("sample", "--ckpt", ckpt, "--prompt", "Once " * 3000, "--max-new-tokens", "2", "--device", "cpu")
    assert r.returncode == 2 and "max_seq" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_sample_cuda_graphs_switch(trained):
    from xtrain.trainer.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["sample", "--ckpt", "x"]).cuda_graphs is True
    assert parser.parse_args(["sample", "--ckpt", "x", "--no-cuda-graphs"]).cuda_graphs is False
    with pytest.raises(SystemExit):
        parser.parse_args(["sample", "--ckpt", "x", "--cuda-graphs", "--no-cuda-graphs"])
    _, out, _ = trained
    args = ("sample", "--ckpt", out / "ckpt", "--prompt", "Once upon a time", "--prompt", "The dog",
            "--temperature", "0.9", "--seed", "2", "--max-new-tokens", "8")
    on, off = run_cli(*args), run_cli(*args, "--no-cuda-graphs")  # the default device: a GPU if present
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert on.stdout == off.stdout and "CUDA graph" not in on.stderr


def test_resume_continues_the_run(trained, tmp_path):
    root, out, _ = trained
    data = prepared_stories(root)
    r = run_cli("train", "--preset", "tiny", "--steps", "32", "--data", data, "--out", out,
                "--batch", "8", "--seq", "64", "--eval-every", "0", "--sample-tokens", "5",
                "--no-progress", "--resume")
    assert r.returncode == 0, r.stderr
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == list(range(32))


def test_resume_with_the_preset_takes_its_max_seq(trained, tmp_path):
    """max_seq sizes no weight: a checkpoint saved when the preset's max_seq was lower (tiny had 256
    before flash attention) resumes under --preset with the preset's max_seq."""
    import shutil

    root, out, _ = trained
    run = tmp_path / "run"
    shutil.copytree(out / "ckpt", run / "ckpt")
    state = json.loads((run / "ckpt" / "state.json").read_text())
    state["config"]["max_seq"] = 256
    (run / "ckpt" / "state.json").write_text(json.dumps(state))
    # one step past the checkpoint (which another test may have resumed further)
    r = run_cli("train", "--preset", "tiny", "--steps", state["step"] + 1, "--data", prepared_stories(root),
                "--out", run,
                "--batch", "8", "--seq", "64", "--eval-every", "0", "--sample-tokens", "0", "--no-progress",
                "--resume", run / "ckpt", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "ckpt" / "state.json").read_text())["config"]["max_seq"] == 2048


def test_help():
    r = run_cli("--help")
    assert r.returncode == 0 and all(c in r.stdout for c in ("train", "prepare", "sample", "export"))
    r = run_cli("train", "--help")
    assert r.returncode == 0
    for flag in ("--preset", "--data", "--device", "--bf16", "--recompute", "--batch", "--seq",
                 "--steps", "--lr", "--warmup", "--eval-every", "--save-every", "--out",
                 "--resume", "--memory-limit", "--seed", "--devices", "--grad-accum", "--batch-tokens",
                 "--schedule", "--decay-frac", "--min-lr", "--config", "--tracker", "--sample-prompt"):
        assert flag in r.stdout, flag


@pytest.mark.parametrize("args, message", [
    ((), "required"),
    (("train", "--bogus"), "unrecognized arguments"),
    (("train", "--steps", "-3"), "--steps"),
    (("train", "--preset", "huge"), "invalid choice"),
    (("train", "--memory-limit", "12XB"), "invalid size"),
    (("train", "--devices", "0"), "--devices"),
    (("train", "--data", "/nonexistent/corpus.txt"), "no such file"),
    (("train", "--device", "tpu"), "--device"),
    (("train", "--resume", "/nonexistent/ckpt"), "no checkpoint"),
    (("sample", "--ckpt", "/nonexistent/ckpt"), "no checkpoint"),
    (("sample", "--ckpt", "x", "--greedy", "--top-k", "3"), "--greedy"),
    (("sample", "--ckpt", "x", "--greedy", "--top-p", "0.5"), "--greedy"),
    (("sample", "--ckpt", "x", "--top-p", "0"), "--top-p"),
    (("sample", "--ckpt", "x", "--top-p", "1.5"), "--top-p"),
    (("sample", "--ckpt", "x", "--temperature", "-1"), "--temperature"),
    (("sample", "--ckpt", "x", "--max-new-tokens", "-1"), "--max-new-tokens"),
    (("export", "--ckpt", "x", "--out", "y", "--dtype", "f16"), "invalid choice"),
    (("export", "--ckpt", "/nonexistent/ckpt", "--out", "/tmp/xtrain-never"), "no checkpoint"),
    (("prepare", "/nonexistent/corpus.txt", "--out", "/tmp/xtrain-never"), "no such file"),
])
def test_bad_arguments_exit_2_with_one_line(args, message):
    r = run_cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xtrain") and message in lines[0], r.stderr


def test_parse_size():
    assert parse_size("32GiB") == 32 * 2**30
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("1.5G") == int(1.5 * 2**30)
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="invalid size 'lots'"):
        parse_size("lots")
