"""The configuration of a training run: config files, the record of a run, and checks of values.

    xtrain train --config run.toml --steps 2000     # the file's values, --steps from the flag
    runs/x/config.toml                              # the record: every value the run used
    xtrain train --out runs/x --resume              # continues with the record's values

A config file and a record are the same thing: TOML with one key per `xtrain train` flag
(`grad-accum = 4` or `grad_accum = 4`, `bf16 = true`, `batch = "auto"`). Precedence, lowest first:
the flags' defaults, the record of the resumed run (`--resume`), the `--config` file, the flags
given on the command line. Keys that are no flag are an error naming the key.

The record (`OUT/config.toml`, and the same dict as `train_args` in every checkpoint) holds the
resolved values, not the requested ones: the preset, learning rates and schedule length filled in,
`--batch auto` and `--recompute auto` replaced by what was chosen, `--devices all` by the number,
`--data` as an absolute path. So a resumed run trains with exactly the configuration it started
with (bit-exact resume needs the same micro-batch) unless a flag says otherwise. TOML has no null:
a value that is None is left out, and reads back as the flag's default (which is None for those).

validate() checks every numeric value up front and raises ConfigError (a ValueError) with a
one-line message naming the flag, which the CLI prints as `xtrain: error: ...`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, packaged as tomli
    import tomli as tomllib

CONFIG_FILE = "config.toml"
# Flags that are about this invocation, not the run: never read from a file nor recorded.
NOT_RECORDED = ("config", "resume", "no_progress", "overwrite", "threads")  # threads: this machine's
# TrainConfig fields whose flag has another name or meaning; the rest are named alike.
_FLAG_OF = {"progress": "no_progress", "shard_optimizer": "no_shard_optimizer", "trackers": "tracker"}


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the flag."""


# ---- files

def read_toml(path, what: str = "--config") -> dict:
    """The key/values of a TOML file with keys normalised to flag dests (dashes -> underscores)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path}: invalid TOML ({e})") from None
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(f"{what} {path}: [{key}] tables are not supported; write flags as "
                              f"top-level keys (e.g. steps = 800)")
        out[key.replace("-", "_")] = value
    return out


def write_record(path, record: dict, notes=()) -> Path:
    """Write `record` (flag dest -> value) as TOML, None values left out, `notes` as comments."""
    path = Path(path)
    lines = ["# xtrain train: the resolved configuration of this run. `xtrain train --resume`",
             "# continues with these values (flags override them); `--config FILE` starts a new",
             "# run from them."]
    lines += [f"# {n}" for n in notes]
    lines += [f"{key.replace('_', '-')} = {_toml_value(value)}" for key, value in record.items() if value is not None]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def read_record(ckpt_path) -> dict:
    """The record the run of checkpoint `ckpt_path` was made with: RUN/config.toml beside the
    checkpoint directory when present, else the checkpoint's own copy (train_args)."""
    from xtrain.io import state

    path = state.resolve(ckpt_path)
    beside = path.parent / CONFIG_FILE
    if beside.is_file():
        return read_toml(beside, "record")
    args = state.load(path, verify=False).meta.get("train_args") or {}
    return {_FLAG_OF.get(k, k): (not v if k in ("progress", "shard_optimizer") else v)
            for k, v in args.items() if k not in ("resume", "progress")}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to TOML")


# ---- TrainConfig <-> flags

def record_of(cfg, **resolved) -> dict:
    """The record of TrainConfig `cfg` in flag names, with the `resolved` values replacing the
    requested ones."""
    out = {}
    for key, value in {**asdict(cfg), **resolved}.items():
        flag = _FLAG_OF.get(key, key)
        if flag in NOT_RECORDED:
            continue
        if key == "shard_optimizer":
            value = not value
        if key == "trackers":
            value = ",".join(value) if value else None
        out[flag] = value
    return out


def train_config_kwargs(values: dict, fields) -> dict:
    """TrainConfig keyword arguments (`fields`: its field names) from flag dest -> value (the CLI's
    merged values)."""
    kw = {k: v for k, v in values.items() if k in fields}
    kw["progress"] = not values.get("no_progress", False)
    kw["shard_optimizer"] = not values.get("no_shard_optimizer", False)
    text = values.get("tracker")
    kw["trackers"] = tuple(dict.fromkeys(n.strip().lower() for n in str(text).split(",") if n.strip())) if text else ()
    return kw


# ---- checks

def validate(cfg) -> None:
    """ConfigError for the first value of TrainConfig `cfg` that cannot work."""
    def need(ok: bool, message: str):
        if not ok:
            raise ConfigError(message)

    def finite(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def pos_int(name: str, v, allow_zero=False):
        ok = isinstance(v, int) and not isinstance(v, bool) and (v >= 0 if allow_zero else v > 0)
        need(ok, f"--{name} must be {'a non-negative' if allow_zero else 'a positive'} integer, got {v!r}")

    from xtrain.trainer.schedule import SCHEDULES

    if cfg.batch != "auto":
        pos_int("batch", cfg.batch)
    for name in ("seq", "steps", "eval_batches", "vocab_size"):
        pos_int(name.replace("_", "-"), getattr(cfg, name))
    for name in ("warmup", "eval_every", "save_every", "seed", "sample_tokens"):
        pos_int(name.replace("_", "-"), getattr(cfg, name), allow_zero=True)
    for name in ("grad_accum", "batch_tokens", "decay_steps", "memory_limit", "threads"):
        if getattr(cfg, name) is not None:
            pos_int(name.replace("_", "-"), getattr(cfg, name))
    need(cfg.recompute in (True, False, "auto"), f"--recompute must be on, off or auto, got {cfg.recompute!r}")
    need(cfg.schedule in SCHEDULES, f"--schedule must be one of {', '.join(SCHEDULES)}, got {cfg.schedule!r}")
    if cfg.lr is not None:
        need(finite(cfg.lr) and cfg.lr > 0, f"--lr must be a finite number > 0, got {cfg.lr}")
    if cfg.min_lr is not None:
        need(finite(cfg.min_lr) and cfg.min_lr >= 0, f"--min-lr must be a finite number >= 0, got {cfg.min_lr}")
        if cfg.lr is not None:
            need(cfg.min_lr <= cfg.lr, f"--min-lr {cfg.min_lr:g} must be <= --lr {cfg.lr:g}")
    need(finite(cfg.decay_frac) and 0 < cfg.decay_frac <= 1,
         f"--decay-frac must be in (0, 1], got {cfg.decay_frac}")
    need(finite(cfg.grad_clip) and cfg.grad_clip >= 0,
         f"--grad-clip must be a finite number >= 0 (0: off), got {cfg.grad_clip}")
    need(isinstance(cfg.nonfinite_limit, int) and cfg.nonfinite_limit >= 1,
         f"--nonfinite-limit must be a positive integer, got {cfg.nonfinite_limit}")
    need(finite(cfg.weight_decay) and cfg.weight_decay >= 0,
         f"--weight-decay must be a finite number >= 0, got {cfg.weight_decay}")
    need(finite(cfg.dropout) and 0 <= cfg.dropout < 1, f"--dropout must be in [0, 1), got {cfg.dropout}")
    for name in ("beta1", "beta2"):
        v = getattr(cfg, name)
        need(finite(v) and 0 <= v < 1, f"--{name} must be in [0, 1), got {v}")
    if cfg.init_from is not None:
        need(not cfg.resume, "--init-from starts a new run from pretrained weights and --resume continues a "
                             "checkpoint: give one of them")
        need(cfg.preset is None, f"--init-from takes the model from {cfg.init_from}: drop --preset {cfg.preset}")
    # --batch-tokens against the micro-batch and the GPUs: xtrain.trainer.batching.plan, which knows both
