"""Gradient accumulation (xtrain.trainer.train.accumulate_gradients and the loop around it): N micro-batches
give the gradient of one N-times-larger batch (float32 and bf16), deterministically, bitwise the
same with recompute; train() with accumulation matches the large batch, runs one collective per
optimizer step on the data-parallel path, logs the global-batch mean loss, and resumes bit-exactly."""


import numpy as np
import pytest

import xtrain
from modelhelp import (batch, bits_equal, grads_numpy, make_model, prepared_stories, run_cli, run_log, small_config,
                       tiny_run)
from test_distributed import two_gpus
from test_train import _OneRankContext
from xtrain.trainer.train import accumulate_gradients, train


cuda = pytest.mark.skipif(not xtrain.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_stories(tmp_path_factory.mktemp("accum-data"))


def _grads(cfg, x, y, accum, device="cpu"):
    model = make_model(cfg, device=device, weights_seed=0)
    loss = accumulate_gradients(model, x, y, accum)
    return grads_numpy(model), loss.item()


@pytest.mark.parametrize("bf16, rtol, atol", [(False, 2e-5, 1e-6), (True, 2e-2, 2e-4)])
def test_accumulated_gradient_equals_one_large_batch(device, bf16, rtol, atol):
    cfg = small_config(bf16=bf16)
    x, y = batch(cfg, B=8, S=16, seed=3)
    big, big_loss = _grads(cfg, x, y, 1, device)
    for accum in (2, 4):
        acc, acc_loss = _grads(cfg, x, y, accum, device)
        assert acc_loss == pytest.approx(big_loss, rel=1e-5 if not bf16 else 1e-3)
        for name, g in big.items():
            assert np.abs(g).max() > 0, name
            # bf16: each micro-batch's weight gradient is rounded to bf16 before the sum, so an element
            # that cancels to ~0 may be off by ~one bf16 ulp of the tensor's largest elements
            floor = 2.0 ** (np.floor(np.log2(np.abs(g).max())) - 7) if bf16 else 0.0
            np.testing.assert_allclose(acc[name], g, rtol=rtol, atol=max(atol, 2 * floor),
                                       err_msg=f"{name}, accum {accum}")
    # Deterministic: the same accumulation twice gives the same bits.
    again, again_loss = _grads(cfg, x, y, 4, device)
    assert again_loss == acc_loss and all(bits_equal(again[n], acc[n]) for n in acc)


@pytest.mark.parametrize("bf16", [False, True])
def test_accumulation_with_recompute_is_bitwise_the_same(device, bf16):
    cfg = small_config(bf16=bf16)
    x, y = batch(cfg, B=6, S=16, seed=4)
    plain, plain_loss = _grads(cfg, x, y, 3, device)
    rec, rec_loss = _grads(small_config(bf16=bf16, recompute=True), x, y, 3, device)
    assert rec_loss == plain_loss
    assert all(bits_equal(rec[n], plain[n]) for n in plain)


def _losses(out):
    return [(r["step"], r["loss"]) for r in run_log(out) if "loss" in r]


def test_train_with_accumulation_matches_the_large_batch(tmp_path, data):
    """batch 2 x accum 4 = batch_tokens 8 x 32 and batch 8: the same windows per step (one loader
    draw of the rank's share), the same losses and weights up to float rounding."""
    big = train(tiny_run(tmp_path / "big", data, 3, batch=8))
    acc = train(tiny_run(tmp_path / "acc", data, 3, batch=2, grad_accum=4))
    train(tiny_run(tmp_path / "tok", data, 3, batch=2, batch_tokens=8 * 32))
    a, b, c = _losses(tmp_path / "big"), _losses(tmp_path / "acc"), _losses(tmp_path / "tok")
    assert b == c  # --grad-accum 4 and --batch-tokens 256 are the same plan
    np.testing.assert_allclose([v for _, v in b], [v for _, v in a], rtol=1e-5)
    assert a[0][1] == pytest.approx(big["first_loss"]) and acc["steps"] == 3
    assert all(r["tok_s"] > 0 for r in run_log(tmp_path / "acc") if "loss" in r)
    rec = (tmp_path / "acc" / "config.toml").read_text()
    assert "batch = 2" in rec and "batch-tokens = 256" in rec and "grad-accum = 4 follows" in rec


def test_data_parallel_path_runs_one_collective_per_optimizer_step(tmp_path, data):
    ctx = _OneRankContext("cpu")
    cfg = tiny_run(tmp_path / "rank", data, 3, batch=2, grad_accum=4)
    xtrain.manual_seed(cfg.seed)
    from xtrain.data import open_dataset

    train(cfg, ctx=ctx, prepared=(open_dataset(data), None))
    train(tiny_run(tmp_path / "single", data, 3, batch=2, grad_accum=4))
    assert ctx.calls.count(("reduce_scatter", 1, "avg")) == 3  # per optimizer step, not per micro-batch
    assert _losses(tmp_path / "rank") == _losses(tmp_path / "single")


def test_resume_with_accumulation_is_bit_exact(tmp_path, data):
    kw = dict(decay_steps=6, dropout=0.1, batch=2, grad_accum=3)
    train(tiny_run(tmp_path / "straight", data, 6, **kw))
    train(tiny_run(tmp_path / "split", data, 3, **kw))
    train(tiny_run(tmp_path / "split", data, 6, resume=str(tmp_path / "split" / "ckpt"), **kw))
    assert _losses(tmp_path / "straight") == _losses(tmp_path / "split")
    for name in ("model.safetensors", "optim.safetensors"):
        assert (tmp_path / "straight" / "ckpt" / name).read_bytes() == \
            (tmp_path / "split" / "ckpt" / name).read_bytes(), name


# ---------------------------------------------------------------- GPUs (skipped without them)

def _cli_losses(out):
    return [r["loss"] for r in run_log(out) if "loss" in r]


@two_gpus
@pytest.mark.parametrize("flags", [(), ("--bf16",), ("--no-shard-optimizer",)])
def test_cli_two_devices_with_accumulation_matches_one_device_and_resumes(tmp_path, flags):
    """2 GPUs x micro-batch 2 x 2 accumulation steps = one GPU's batch of 8: the same losses; 3 + 3
    resumed steps are the 6-step run bit for bit."""
    data = prepared_stories(tmp_path)
    common = ("train", "--preset", "tiny", "--data", data, "--seq", "64", "--lr", "3e-3", "--warmup", "2",
              "--decay-steps", "6", "--eval-every", "0", "--sample-tokens", "4", "--no-progress", *flags)
    one = run_cli(*common, "--devices", "1", "--device", "cuda", "--batch", "8", "--steps", "6", "--out", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    acc = ("--devices", "2", "--batch", "2", "--batch-tokens", str(8 * 64))
    full = run_cli(*common, *acc, "--steps", "6", "--out", tmp_path / "full")
    assert full.returncode == 0, full.stderr
    assert "micro-batch 2 x 2 accumulation steps x 2 GPUs = 8 sequences" in full.stdout
    np.testing.assert_allclose(_cli_losses(tmp_path / "full"), _cli_losses(tmp_path / "one"),
                               rtol=1e-2 if "--bf16" in flags else 1e-5)
    r = run_cli(*common, *acc, "--steps", "3", "--out", tmp_path / "part")
    assert r.returncode == 0, r.stderr
    r = run_cli("train", "--out", tmp_path / "part", "--resume", "--steps", "6", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert _cli_losses(tmp_path / "part") == _cli_losses(tmp_path / "full")


@cuda
def test_cli_batch_auto_on_the_gpu_and_oom_is_an_error(tmp_path):
    data = prepared_stories(tmp_path)
    common = ("train", "--preset", "dim384", "--data", data, "--seq", "256", "--steps", "2", "--eval-every", "0",
              "--sample-tokens", "2", "--no-progress", "--device", "cuda", "--bf16")
    r = run_cli(*common, "--batch", "auto", "--batch-tokens", str(256 * 256), "--recompute", "auto",
                "--memory-limit", "3GiB", "--out", tmp_path / "auto")
    assert r.returncode == 0, r.stderr
    assert "--batch auto: micro-batch" in r.stdout and "recompute" in r.stdout
    rec = (tmp_path / "auto" / "config.toml").read_text()
    assert "batch-tokens = 65536" in rec
    assert all("mfu" in x for x in run_log(tmp_path / "auto") if "loss" in x)
    r = run_cli(*common, "--batch", "512", "--memory-limit", "2GiB", "--out", tmp_path / "oom")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "out of memory" in err[0] and "--batch auto" in err[0], err
