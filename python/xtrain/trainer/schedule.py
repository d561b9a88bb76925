"""Learning-rate schedules: the LR as a plain function of the optimizer step.

    sched = Schedule("wsd", max_lr=2e-3, min_lr=2e-4, warmup=50, decay_steps=800, decay_frac=0.2)
    opt.lr = sched(step)                      # step 0-based, one value per optimizer step

Every schedule starts with the same linear warm-up (step s < warmup: max_lr * (s + 1) / warmup),
then:
    cosine     cosine from max_lr down to min_lr at step decay_steps (nanoGPT's get_lr)
    linear     straight line from max_lr down to min_lr at step decay_steps
    constant   max_lr for ever (min_lr and decay_steps unused)
    wsd        warm-up, stable at max_lr, then a linear decay to min_lr over the last
               decay_frac of decay_steps ("warmup-stable-decay")
and min_lr from decay_steps on (also where a warm-up is longer than decay_steps). The schedule holds no state, so a resumed run needs none: the
step alone gives the LR, which is what makes resume bit-exact.

Extending a run (`--resume --steps N` beyond decay_steps) keeps decay_steps as recorded: the extra
steps run at min_lr (constant: at max_lr). A new --decay-steps re-plans the schedule from the
start, so the LR jumps at the resumed step; Schedule.describe_resume says by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("cosine", "linear", "constant", "wsd")
DEFAULT_DECAY_FRAC = 0.2   # wsd: the last 20% of the steps decay (Hägele et al. 2024 use 10-20%)


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup: int, total: int) -> float:
    """LR for `step` (0-based): linear warm-up over `warmup` steps, then cosine decay to min_lr at
    step `total`, min_lr afterwards (nanoGPT's get_lr)."""
    return Schedule("cosine", max_lr, min_lr, warmup, total)(step)


@dataclass(frozen=True)
class Schedule:
    kind: str
    max_lr: float
    min_lr: float
    warmup: int
    decay_steps: int
    decay_frac: float = DEFAULT_DECAY_FRAC

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.kind!r}")
        if not 0.0 < self.decay_frac <= 1.0:
            raise ValueError(f"decay_frac must be in (0, 1], got {self.decay_frac}")

    @property
    def decay_start(self) -> int:
        """The step where the LR starts to fall from max_lr (constant: never, decay_steps)."""
        if self.kind == "wsd":
            return max(self.warmup, self.decay_steps - math.ceil(self.decay_frac * self.decay_steps))
        if self.kind == "constant":
            return self.decay_steps
        return self.warmup

    def __call__(self, step: int) -> float:
        if self.kind != "constant" and step >= self.decay_steps:
            return self.min_lr  # past the schedule's end, even inside a warm-up longer than it
        if step < self.warmup:
            return self.max_lr * (step + 1) / self.warmup
        if self.kind == "constant":
            return self.max_lr
        start = self.decay_start
        if step < start:
            return self.max_lr
        ratio = (step - start) / max(1, self.decay_steps - start)
        if self.kind == "cosine":
            return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.max_lr - self.min_lr)
        return self.max_lr - ratio * (self.max_lr - self.min_lr)

    def reaches_peak(self, steps: int) -> bool:
        """Whether a run of `steps` optimizer steps gets to max_lr (the last warm-up step is
        warmup - 1)."""
        return self.warmup <= steps

    def describe(self) -> str:
        if self.kind == "constant":
            return f"constant lr {self.max_lr:.3g} after {self.warmup} warm-up steps"
        tail = f", decaying from step {self.decay_start}" if self.kind == "wsd" else ""
        return (f"{self.kind} lr {self.max_lr:.3g} -> {self.min_lr:.3g} at step {self.decay_steps}, "
                f"{self.warmup} warm-up steps{tail}")

    def notes(self, step: int, steps: int, previous: "Schedule | None" = None) -> list[str]:
        """What a run from `step` to `steps` should know about its LR: the peak never reached
        (warm-up longer than the run), steps past the schedule's end, and a resumed run whose
        schedule (`previous`, from its record) differs, so the LR jumps at `step`."""
        out = []
        if not self.reaches_peak(steps):
            out.append(f"the LR never reaches its peak {self.max_lr:.3g}: --warmup {self.warmup} is longer than "
                       f"--steps {steps} (the last step's lr is {self(steps - 1):.3g}); lower --warmup")
        if self.kind != "constant" and steps > self.decay_steps:
            out.append(f"steps {max(step, self.decay_steps)}-{steps} run at --min-lr {self.min_lr:.3g}: the schedule "
                       f"ends at --decay-steps {self.decay_steps}; give --decay-steps {steps} to re-plan it over the run")
        if previous is not None and step > 0 and previous(step) != self(step):
            out.append(f"the LR schedule differs from the resumed run's: lr at step {step} is {self(step):.3g}, "
                       f"where the run's own schedule gives {previous(step):.3g}")
        return out
