"""Metric sinks beside the run's log.jsonl: TensorBoard event files and Weights & Biases.

    xtrain train --tracker tensorboard,wandb        # pip install 'xtrain[tensorboard,wandb]'
    tensorboard --logdir runs/tiny/tensorboard

Every record the training loop writes to log.jsonl goes to each tracker too, so all sinks hold
the same scalars under the same names (SCALARS: train/loss, train/lr, train/grad_norm,
train/tok_s, train/mfu on a GPU, train/mem_mb; val/loss and val/perplexity at evaluations), at
the record's step. Only rank 0 opens trackers.

Decisions:
- TensorBoard through tensorboardX's SummaryWriter: a maintained writer whose only dependencies
  are numpy and protobuf (torch.utils.tensorboard needs torch; the `tensorboard` package's own
  tensorboard.summary.Writer is marked experimental). The extra also installs `tensorboard`, the
  viewer. A resumed run writes with purge_step = the resumed step, so TensorBoard drops the
  points a crashed run wrote after its checkpoint, as log.jsonl does.
- Weights & Biases in offline mode by default (WANDB_MODE in the environment overrides it):
  the run is written under OUT/wandb and `wandb sync` uploads it later; nothing here needs the
  network. The run's config is the record of the run (xtrain.trainer.runconfig).
- A tracker whose package is missing is a ConfigError naming the extra to install, raised before
  training starts (check_available).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from xtrain.trainer.runconfig import ConfigError

TRACKERS = ("tensorboard", "wandb")
# log.jsonl key -> tracker tag
SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "tok_s": "train/tok_s",
           "mfu": "train/mfu", "mem_mb": "train/mem_mb", "val_loss": "val/loss", "val_ppl": "val/perplexity"}
_PACKAGE = {"tensorboard": "tensorboardX", "wandb": "wandb"}
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"


def unavailable_reason(name: str) -> str | None:
    """Why tracker `name` cannot be used here, or None when it can."""
    if importlib.util.find_spec(_PACKAGE[name]) is None:
        return f"--tracker {name} needs the {_PACKAGE[name]} package: pip install 'xtrain[{name}]'"
    return None


def check_available(names) -> None:
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"--tracker {name!r}: choose from {', '.join(TRACKERS)}")
        reason = unavailable_reason(name)
        if reason:
            raise ConfigError(reason)


def open_trackers(names, out: Path, config: dict, start_step: int) -> list:
    check_available(names)
    kinds = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker}
    return [kinds[n](Path(out), config, start_step) for n in names]


def scalars_of(record: dict) -> dict:
    """tag -> value for the scalars in a log record."""
    return {SCALARS[k]: float(v) for k, v in record.items() if k in SCALARS and v is not None}


class TensorBoardTracker:
    def __init__(self, out: Path, config: dict, start_step: int):
        from tensorboardX import SummaryWriter

        self.path = out / TENSORBOARD_DIR
        self.writer = SummaryWriter(logdir=str(self.path), purge_step=start_step or None)

    def log(self, record: dict) -> None:
        for tag, value in scalars_of(record).items():
            self.writer.add_scalar(tag, value, record["step"])

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, out: Path, config: dict, start_step: int):
        import wandb

        self.path = out / WANDB_DIR
        self.path.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "xtrain"), name=out.name,
                              dir=str(out), config=config, mode=os.environ.get("WANDB_MODE", "offline"),
                              reinit="create_new", settings=wandb.Settings(silent=True))

    def log(self, record: dict) -> None:
        self.run.log(scalars_of(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()
