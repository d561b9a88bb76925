"""The batch plan (xtrain.trainer.batching): --batch-tokens arithmetic and its errors, the micro-batch search
(logic with a stand-in for the probe, then the real probe under a CPU memory limit), --recompute
auto, and an OOM during training becoming an error that names the flags."""

import numpy as np
import pytest

import xtrain
from modelhelp import prepared_stories
from xtrain.trainer import batching
from xtrain.models import TinyTransformer, config_for
from xtrain.trainer.runconfig import ConfigError
from xtrain.trainer.train import TrainConfig, train


def test_explicit_plans_and_their_errors():
    p = batching.plan(16, None, 524288, 1024, 2, False)
    assert (p.micro_batch, p.accum, p.global_batch, p.tokens) == (16, 16, 512, 524288)
    assert batching.plan(8, 3, None, 128, 1, True).accum == 3
    assert batching.plan(8, 4, 8 * 4 * 128, 128, 1, False).accum == 4  # consistent: fine
    with pytest.raises(ConfigError, match=r"--batch-tokens 100000 is not a multiple of --seq 128 x 1 device = 128 "
                                          r"tokens \(nearest: 99968 or 100096\)"):
        batching.plan("auto", None, 100000, 128, 1, False, lambda b, rc: True)
    with pytest.raises(ConfigError, match=r"--batch-tokens 100000 is not a multiple of --batch 16 x --seq 128 x "
                                          r"1 device = 2048 tokens \(nearest: 98304 or 100352\)"):
        batching.plan(16, None, 100000, 128, 1, False)
    with pytest.raises(ConfigError, match=r"not a multiple of --batch 16 x --seq 128 x 2 devices = 4096 tokens"):
        batching.plan(16, None, 128 * 2 * 24, 128, 2, False)
    with pytest.raises(ConfigError, match="--grad-accum 3 disagrees with --batch-tokens"):
        batching.plan(8, 3, 8 * 4 * 128, 128, 1, False)
    with pytest.raises(ConfigError, match="--batch auto needs a GPU or --memory-limit"):
        batching.plan("auto", None, None, 128, 1, False)
    with pytest.raises(ConfigError, match="--recompute auto needs"):
        batching.plan(8, None, None, 128, 1, "auto")


@pytest.mark.parametrize("limit", [1, 2, 7, 24, 25, 95, 96, 500])
def test_search_finds_the_largest_divisor_that_fits(limit):
    calls = []

    def fits(b, recompute):
        calls.append(b)
        assert recompute is False
        return b <= limit

    p = batching.plan("auto", None, 96 * 64, 64, 1, False, fits)
    divisors = [d for d in range(1, 97) if 96 % d == 0]
    best = max(d for d in divisors if d <= limit)
    assert (p.micro_batch, p.accum, p.tokens) == (best, 96 // best, 96 * 64)
    assert len(calls) <= 2 * len(divisors).bit_length() + 1  # gallop + bisect, not a scan
    assert f"micro-batch {best} is the largest divisor of 96" in p.why


def test_search_without_batch_tokens_and_with_grad_accum():
    p = batching.plan("auto", 3, None, 64, 1, False, lambda b, rc: b <= 37)
    assert (p.micro_batch, p.accum) == (37, 3)
    assert batching.plan("auto", None, None, 64, 1, False, lambda b, rc: True).micro_batch == batching.AUTO_MAX_BATCH
    with pytest.raises(ConfigError, match="not even micro-batch 1 fits"):
        batching.plan("auto", None, None, 64, 1, False, lambda b, rc: False)
    # --grad-accum with --batch-tokens fixes the micro-batch: it must still fit.
    assert batching.plan("auto", 4, 64 * 32, 64, 1, False, lambda b, rc: b <= 8).micro_batch == 8


def test_recompute_auto_turns_it_on_only_where_needed():
    def fits(b, rc):
        return b <= (16 if rc else 4)

    assert batching.plan(4, None, None, 64, 1, "auto", fits).recompute is False
    p = batching.plan(8, None, None, 64, 1, "auto", fits)
    assert p.recompute is True and "does not fit without it" in p.why
    with pytest.raises(ConfigError, match="does not fit even with recompute"):
        batching.plan(32, None, None, 64, 1, "auto", fits)
    # --batch auto: off while any micro-batch fits without it ...
    p = batching.plan("auto", None, 64 * 64, 64, 1, "auto", fits)
    assert (p.micro_batch, p.recompute) == (4, False)
    # ... on when none does
    p = batching.plan("auto", None, 64 * 64, 64, 1, "auto", lambda b, rc: rc and b <= 16)
    assert (p.micro_batch, p.accum, p.recompute) == (16, 4, True)


def test_largest_fitting_matches_a_scan():
    rng = np.random.default_rng(0)
    for _ in range(200):
        cands = sorted(set(rng.integers(1, 300, size=rng.integers(1, 40)).tolist()))
        t = int(rng.integers(0, 320))
        expect = max((c for c in cands if c <= t), default=None)
        assert batching.largest_fitting(cands, lambda c: c <= t) == expect


def _model():
    return TinyTransformer(config_for("tiny", 512), device="cpu")


def test_real_search_under_a_cpu_memory_limit():
    """The probe on the real model: the chosen micro-batch's step fits under the search limit and
    the next divisor's does not; the probes leave no gradients and the generator untouched."""
    import gc

    model = _model()
    gc.collect()  # blocks cached by earlier tests would count in base and be freed by the probes
    xtrain.empty_cache("cpu")
    base = xtrain.memory_stats("cpu")["reserved_bytes.current"]
    limit = base + 40 * 2**20
    rng = xtrain.get_rng_state("cpu")
    fits = batching.probe(model, 64, "cpu")
    with batching.search_limit("cpu", limit):
        p = batching.plan("auto", None, 64 * 64, 64, 1, False, fits, batching.memory_note(limit))
        divisors = [d for d in range(1, 65) if 64 % d == 0]
        nxt = divisors[divisors.index(p.micro_batch) + 1]
        assert fits(p.micro_batch, False) and not fits(nxt, False)
    assert 1 < p.micro_batch < 64 and p.accum == 64 // p.micro_batch
    assert "% of --memory-limit" in p.why
    assert xtrain.memory_stats("cpu")["limit_bytes"] == limit  # restored after the search
    assert all(prm.grad is None for prm in model.parameters())
    assert xtrain.get_rng_state("cpu") == rng
    xtrain.set_memory_limit(None, "cpu")


def test_oom_during_training_names_the_flags(tmp_path):
    data = prepared_stories(tmp_path)
    limit = xtrain.memory_stats("cpu")["reserved_bytes.current"] + 48 * 2**20  # the model fits, batch 64 not
    cfg = TrainConfig(preset="tiny", data=str(data), out=str(tmp_path / "run"), device="cpu", batch=64,
                      seq=128, steps=2, eval_every=0, progress=False, memory_limit=limit)
    try:
        with pytest.raises(xtrain.OutOfMemoryError) as e:
            train(cfg)
    finally:
        xtrain.set_memory_limit(None, "cpu")
    msg = str(e.value)
    assert "at step 0 with micro-batch 64 x seq 128" in msg
    for flag in ("--batch", "--grad-accum", "--recompute", "--batch auto", "--memory-limit"):
        assert flag in msg, flag
