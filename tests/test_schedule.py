"""LR schedules (xtrain.trainer.schedule): the shape of each, cosine_lr unchanged, and the notes a run
prints (peak never reached, steps past the schedule's end, a schedule changed on resume)."""

import math

import pytest

from xtrain.trainer.schedule import cosine_lr
from xtrain.trainer.schedule import Schedule


def _lrs(kind, steps=120, **kw):
    s = Schedule(kind, **{**dict(max_lr=1.0, min_lr=0.1, warmup=10, decay_steps=100), **kw})
    return [s(i) for i in range(steps)]


def test_warmup_is_shared_and_linear():
    for kind in ("cosine", "linear", "constant", "wsd"):
        lrs = _lrs(kind)
        assert lrs[:10] == pytest.approx([(i + 1) / 10 for i in range(10)]), kind


def test_cosine_is_nanogpts():
    lrs = _lrs("cosine")
    assert lrs == [cosine_lr(i, 1.0, 0.1, 10, 100) for i in range(120)]
    assert lrs[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[100] == lrs[119] == 0.1


def test_linear_constant_and_wsd_shapes():
    lin = _lrs("linear")
    assert lin[10] == 1.0 and lin[55] == pytest.approx(0.55) and lin[100] == lin[119] == 0.1
    assert all(a > b for a, b in zip(lin[10:100], lin[11:100]))
    assert _lrs("constant")[10:] == [1.0] * 110
    wsd = _lrs("wsd", decay_frac=0.2)
    assert wsd[10:80] == [1.0] * 70                                  # stable
    assert wsd[90] == pytest.approx(0.55)                            # linear over the last 20 steps
    assert all(a > b for a, b in zip(wsd[80:100], wsd[81:100])) and wsd[100] == 0.1
    assert Schedule("wsd", 1.0, 0.1, 10, 100, decay_frac=1.0).decay_start == 10  # never before the warm-up ends
    with pytest.raises(ValueError, match="decay_frac"):
        Schedule("wsd", 1.0, 0.1, 10, 100, decay_frac=0.0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        Schedule("step", 1.0, 0.1, 10, 100)


def test_notes():
    s = Schedule("cosine", 2e-3, 2e-4, 50, 30)
    assert not s.reaches_peak(30) and s.reaches_peak(50)
    notes = s.notes(0, 30)
    assert len(notes) == 1 and "never reaches its peak 0.002: --warmup 50 is longer than --steps 30" in notes[0]
    # Extending a run keeps the recorded schedule: the new steps run at min_lr, and it says so.
    s = Schedule("cosine", 1e-3, 1e-4, 10, 100)
    assert s(150) == 1e-4
    assert "steps 100-200 run at --min-lr 0.0001" in " ".join(s.notes(100, 200, previous=s))
    # A re-planned schedule on resume: the LR jumps at the resumed step.
    longer = Schedule("cosine", 1e-3, 1e-4, 10, 200)
    assert "lr at step 100 is" in " ".join(longer.notes(100, 200, previous=s))
    assert Schedule("constant", 1e-3, 1e-4, 10, 100).notes(0, 500) == []
