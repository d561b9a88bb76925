"""The configuration of a training run, in one place: TrainConfig, whose fields make the flags of
`xtrain train`; the defaults that depend on the machine; config files and the record of a run;
one check of every value, whatever its source.

    xtrain train --config run.toml --steps 2000     # the file's values, --steps from the flag
    runs/x/config.toml                              # the record: every value the run used
    xtrain train --out runs/x --resume              # continues with the record's values

Each field is declared with opt(): its default, its help, its section of `--help`, its flags and
the rule its value follows (type, range, choices). xtrain.trainer.cli walks the fields to build
the flags; value_of() reads a value from a flag's text or from TOML and holds it to its rule, so
a bad value gives the same message from a flag, a config file or a record; validate() holds a
whole TrainConfig to the same rules, then to the rules between fields. CommandOptions declares,
the same way, the four train flags that are no field of a run (--config, --overwrite, --devices,
--rendezvous).

MACHINE_DEFAULTS is the one table of defaults that depend on the machine (CPU or GPU); TrainConfig's
own defaults are its CPU column, and `--help` prints both ("16 on CPU, 32 on GPU").

A config file and a record are the same thing: TOML with one key per option, the field's name
(`grad_accum = 4` or `grad-accum = 4`) or the name of one of its flags (`fp32 = true`, `tracker =
"wandb"`, `no-cuda-graphs = true`). Precedence, lowest first: the fields' defaults, the machine's
defaults, the record of the resumed run (`--resume`), the `--config` file, the flags given on the
command line. A key that names no option, or an option of the command line only (--config,
--resume, --overwrite), is an error naming the key.

The record (`OUT/config.toml`, and the same dict as `train_args` in every checkpoint) holds the
resolved values, not the requested ones: the preset, learning rates and schedule length filled in,
`--batch auto` and `--recompute auto` replaced by what was chosen, `--devices all` by the number,
`--data` as an absolute path. So a resumed run trains with exactly the configuration it started
with (bit-exact resume needs the same micro-batch) unless a flag says otherwise. TOML has no null:
a value that is None is left out, and reads back as the default. Settings of this invocation or
this machine (--threads, --no-progress) are not recorded.

Errors are ConfigError (a ValueError) with a one-line message naming the flag, which the CLI
prints as `xtrain: error: ...`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from xtrain.data.bounded import MAX_TOML_BYTES, read_text_bounded
from xtrain.io.rundir import writing
from xtrain.models import ALL_PRESETS
from xtrain.trainer.schedule import DEFAULT_DECAY_FRAC, SCHEDULES

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, packaged as tomli
    import tomli as tomllib

CONFIG_FILE = "config.toml"
OPTIMIZERS = ("adamw", "muon")  # --optimizer: xtrain.optim.AdamW, or xtrain.optim.Muon beside it


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the flag."""


# What `xtrain train` runs when a flag is not given, by the kind of device it trains on. CPU: the
# tiny model (800 steps, 98 s on 2 cores measured, README). GPU: a model that uses the card
# (dim768, 127M parameters in blocks, bf16: 26 ms a step, the 3000 steps in about 110 s on an
# H200, README). TrainConfig's own defaults are the CPU ones (its preset None means tiny).
MACHINE_DEFAULTS = {
    "cpu": dict(preset="tiny", bf16=False, batch=16, seq=128, steps=800, eval_every=200),
    "cuda": dict(preset="dim768", bf16=True, batch=32, seq=256, steps=3000, eval_every=500),
}
_CPU = MACHINE_DEFAULTS["cpu"]


def machine_defaults(device: str) -> dict:
    """MACHINE_DEFAULTS for a device string ("cpu", "cuda:0", ...)."""
    return dict(MACHINE_DEFAULTS["cuda" if device.startswith("cuda") else "cpu"])


# The sections of `xtrain train --help`, in order (an option's group; None: the general options).
GROUPS = ("model", "data", "batch and steps", "optimizer and schedule", "evaluation and checkpoints",
          "precision and memory", "devices and launch", "output")

_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_EXAMPLES = "examples: 32GiB, 500MB, 1.5G, 0.5M"


def parse_size(text: str) -> int:
    """'32GiB' -> 34359738368, '500MB' -> 500000000, '1.5G' -> 1610612736, '4096' -> 4096.
    KiB/MiB/GiB/TiB and K/M/G/T are powers of 1024; KB/MB/GB/TB are powers of 1000."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"invalid size {text!r} ({_SIZE_EXAMPLES})")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


# ---- how an option is declared

@dataclass(frozen=True)
class Option:
    """How a field is given and the rule its value follows (a field's metadata["option"])."""
    help: str
    group: str | None                  # a GROUPS section of --help; None: the general options
    type: type                         # int, float, str, bool, or tuple (a comma-separated list)
    flags: tuple = ()                  # () : --field-name
    switch: dict | None = None         # bool: flags that take no value -> the value each sets
    words: dict | None = None          # values written as words: "auto" -> "auto", "off" -> False
    choices: tuple | None = None
    gt: float | None = None            # the range: > gt, >= ge, < lt, <= le
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    size: bool = False                 # an int also written as 32GiB, 0.5M (parse_size)
    pattern: tuple | None = None       # (regex, the forms it accepts) for text
    shown: str | None = None           # the default in words, where the value says too little
    alone: object = None               # the value of the flag given without one (nargs="?")
    metavar: str | None = None
    in_file: bool = True               # may be set in a config file (else: on the command line only)
    recorded: bool = True              # kept in the run's record


def opt(default, help: str, group: str | None, type: type | None = None, **rule):
    """A dataclass field declared as an option: `default`, `help` (one line; --help adds the
    default), its `group` of --help, its `type` (default: the default's) and the `rule` keywords
    of Option."""
    if type is None:
        if default is None:
            raise TypeError("opt(): a field whose default is None needs type=")
        type = tuple if isinstance(default, tuple) else default.__class__
    if default is None and rule.get("shown") is None:
        raise TypeError("opt(): a field whose default is None says what None means (shown=)")
    return field(default=default, metadata={"option": Option(help, group, type, **rule)})


_ON_OFF = {"on": True, "off": False, "true": True, "false": False, "auto": "auto"}
_DEVICE = (r"auto|cpu|cuda(:\d+)?", "auto, cpu, cuda or cuda:N")
_RENDEZVOUS = (r"tcp|mpi|file:.+|tcp:.+:\d+", "tcp, tcp:HOST:PORT, file:PATH or mpi")


@dataclass
class TrainConfig:
    """A training run (xtrain.trainer.train.train). Each field is a flag of `xtrain train`."""
    # ---- model
    preset: str | None = opt(None, "model size: " + ", ".join(ALL_PRESETS) + " (gpt2-*: GPT-2 and its "
                             "sizes)", "model", str, choices=tuple(ALL_PRESETS), metavar="NAME",
                             shown="with --resume or --init-from, their model")
    init_from: str | None = opt(None, "start a new run (step 0) from a Hugging Face Qwen3, Llama or "
                                "GPT-2 directory, llm.c's GPT-2 model file (.bin), or a hub name such as "
                                "Qwen/Qwen3-0.6B (downloaded once; pip install 'xtrain[hub]'); --data is "
                                "tokenized with its tokenizer",
                                "model", str, metavar="DIR|FILE|ORG/NAME", shown="a new model of --preset")
    dropout: float = opt(0.0, "dropout on embeddings and residual branches", "model", ge=0, lt=1)
    doc_mask: bool = opt(True, "attention within documents: a token attends only to the tokens of its own "
                         "document (documents end at the tokenizer's end-of-text token; a sequence without "
                         "one is plain causal attention, bit for bit), or over the whole sequence",
                         "model", switch={"--doc-mask": True, "--no-doc-mask": False})
    doc_rope: bool = opt(False, "RoPE positions restarting per document (with --doc-mask; Qwen3/Llama "
                         "models): each token's position is its distance from its document's start, as "
                         "generation's prompts start at 0; off: positions 0..seq-1 along the row (with "
                         "the documents masked the two differ only in the angles' rounding)",
                         "model", switch={"--doc-rope": True, "--no-doc-rope": False})
    seed: int = opt(0, "seed of the weights, the data order and the sample", "model", ge=0, lt=2**64)
    # ---- data
    data: str | None = opt(None, "a prepared data directory, a nanoGPT/llm.c token directory (read in "
                           "place), or .txt/.jsonl/.parquet files or a save_to_disk dataset to "
                           "prepare into OUT/data", "data", str, metavar="PATH",
                           shown="the built-in stories, made on the fly")
    vocab_size: int = opt(4096, "BPE vocabulary when --data is a raw source", "data", ge=1)
    # ---- batch and steps
    batch: int | str = opt(_CPU["batch"], "sequences per micro-batch on each device; auto: the largest "
                           "that fits", "batch and steps", ge=1, words={"auto": "auto"}, metavar="N|auto")
    grad_accum: int | None = opt(None, "micro-batches per optimizer step", "batch and steps", int, ge=1,
                                 shown="1, or from --batch-tokens")
    batch_tokens: int | None = opt(None, "global batch in tokens per optimizer step, e.g. 0.5M; sets "
                                   "--grad-accum to T / (batch x seq x GPUs)", "batch and steps", int,
                                   ge=1, size=True, metavar="T", shown="batch x seq x GPUs x --grad-accum")
    seq: int = opt(_CPU["seq"], "tokens per sequence", "batch and steps", ge=1)
    steps: int = opt(_CPU["steps"], "total optimizer steps (with --resume: the new total)",
                     "batch and steps", ge=1)
    # ---- optimizer and schedule
    lr: float | None = opt(None, "peak learning rate", "optimizer and schedule", float, gt=0,
                           shown="per preset, 2e-3 for tiny to 5e-4 for dim1024; the run's with --resume")
    min_lr: float | None = opt(None, "final learning rate", "optimizer and schedule", float, ge=0,
                               shown="lr/10")
    schedule: str = opt("cosine", "LR after the warm-up: cosine or linear decay to --min-lr, constant, "
                        "or wsd (stable, then linear decay over --decay-frac)", "optimizer and schedule",
                        choices=SCHEDULES)
    warmup: int = opt(50, "linear warm-up steps", "optimizer and schedule", ge=0)
    decay_steps: int | None = opt(None, "length of the LR schedule", "optimizer and schedule", int, ge=1,
                                  shown="--steps; with --resume the run's own")
    decay_frac: float = opt(DEFAULT_DECAY_FRAC, "wsd: share of the schedule spent decaying",
                            "optimizer and schedule", gt=0, le=1)
    optimizer: str = opt("adamw", "adamw, or muon: Muon for the blocks' matrices, AdamW for the rest, with the "
                         "same --lr and --weight-decay", "optimizer and schedule", choices=OPTIMIZERS)
    weight_decay: float = opt(0.1, "AdamW weight decay (2-D weights)", "optimizer and schedule", ge=0)
    beta1: float = opt(0.9, "AdamW beta1", "optimizer and schedule", ge=0, lt=1)
    beta2: float = opt(0.95, "AdamW beta2", "optimizer and schedule", ge=0, lt=1)
    grad_clip: float = opt(1.0, "global gradient-norm clip (0: off)", "optimizer and schedule", ge=0)
    nonfinite_limit: int = opt(3, "stop after K steps in a row whose loss or gradient norm is NaN/Inf "
                               "(each is skipped)", "optimizer and schedule", ge=1, metavar="K")
    # ---- evaluation and checkpoints
    eval_every: int = opt(_CPU["eval_every"], "validation every N steps (0: off)",
                          "evaluation and checkpoints", ge=0)
    eval_batches: int = opt(20, "validation batches per evaluation", "evaluation and checkpoints", ge=1)
    save_every: int | None = opt(None, "checkpoint OUT/ckpt every N steps (0: only at the end); OUT/best "
                                 "keeps the one of lowest validation loss", "evaluation and checkpoints", int,
                                 ge=0, shown="after every evaluation; with --eval-every 0, at the end")
    save_minutes: float = opt(30.0, "also checkpoint when this many minutes have passed since the last "
                              "save (0: off)", "evaluation and checkpoints", ge=0, metavar="M")
    keep: int = opt(1, "keep the last N checkpoints: OUT/ckpt (the newest) and OUT/ckpt-STEP for the N-1 "
                    "saves before it, the oldest removed; OUT/best is kept besides", "evaluation and checkpoints",
                    ge=1, le=1_000_000, metavar="N")
    resume: str | None = opt(None, "continue from a checkpoint directory (alone: OUT/ckpt) with the "
                             "run's recorded configuration", "evaluation and checkpoints", str,
                             alone="", metavar="CKPT", shown="a new run", in_file=False, recorded=False)
    # ---- precision and memory
    bf16: bool = opt(_CPU["bf16"], "bf16 mixed precision (fp32 master weights), or float32 throughout",
                     "precision and memory", switch={"--bf16": True, "--fp32": False})
    recompute: bool | str = opt(False, "activation recompute of every block (bitwise the same results); "
                                "auto: only if the micro-batch does not fit without it",
                                "precision and memory", bool, words=_ON_OFF, alone=True, metavar="on|off|auto")
    fp8: bool = opt(False, "the blocks' linears in FP8 (E4M3 forward, E5M2 gradients, per-tensor scales; "
                    "bf16 elsewhere): cuBLASLt on a GPU, an exact emulation on the CPU",
                    "precision and memory", switch={"--fp8": True, "--no-fp8": False})
    memory_limit: int | None = opt(None, "cap the device allocator, e.g. 32GiB or 500MB",
                                   "precision and memory", int, ge=1, size=True, metavar="SIZE",
                                   shown="no cap")
    cuda_graphs: bool = opt(True, "on a GPU, replay the training step as CUDA graphs after two eager "
                            "steps (bitwise the same results), or run every step eagerly",
                            "precision and memory",
                            switch={"--cuda-graphs": True, "--no-cuda-graphs": False})
    # ---- devices and launch
    device: str = opt("auto", "auto (cuda if available, else cpu), cpu, cuda or cuda:N",
                      "devices and launch", pattern=_DEVICE)
    shard_optimizer: bool = opt(True, "with several GPUs: all-reduce the gradients and run AdamW on "
                                "every GPU instead of on each GPU's share (same results)",
                                "devices and launch", switch={"--no-shard-optimizer": False})
    threads: int | None = opt(None, "CPU matrix-multiply threads; fewer avoid oversubscribing cores "
                              "busy with other work", "devices and launch", int, ge=1,
                              shown="OPENBLAS_NUM_THREADS, else every core", recorded=False)
    # ---- output
    out: str = opt("runs/tiny", "run directory: log, config, checkpoint, plot, sample", "output",
                   metavar="DIR", shown="runs/PRESET-DATA, e.g. runs/tiny-stories")
    sample_tokens: int = opt(200, "length of the final sample", "output", ge=0)
    sample_prompt: str | None = opt(None, "prompt of the final sample", "output", str, metavar="TEXT",
                                    shown="'Once upon a time' on the built-in stories, else the start "
                                    "of a validation document")
    trackers: tuple = opt((), "metric sinks beside log.jsonl, comma-separated: tensorboard, wandb "
                          "(pip install 'xtrain[tensorboard]' / 'xtrain[wandb]')", "output",
                          flags=("--tracker",), metavar="NAMES")
    progress: bool = opt(True, "no progress bar: plain lines (as when stdout is not a terminal)", "output",
                         switch={"--no-progress": False}, recorded=False)
    log_every: int = opt(10, "without a progress bar (stdout not a terminal, or --no-progress), a line "
                         "every N steps: step, loss, lr, ms, tok/s, MFU, memory", "output", ge=1,
                         recorded=False)


@dataclass
class CommandOptions:
    """The flags of `xtrain train` that are no field of a run: this invocation's (--config,
    --overwrite) and the launch's (--devices, --rendezvous)."""
    config: str | None = opt(None, "read options from a TOML file (keys: the options' names, "
                             "steps = 800, grad-accum = 4); flags given here override it", None, str,
                             metavar="TOML", shown="none", in_file=False, recorded=False)
    devices: int | str = opt(1, "GPUs for data parallelism, one thread each: N (the first N) or all; "
                             "--batch is per GPU", "devices and launch", ge=1, words={"all": "all"},
                             metavar="N|all")
    rendezvous: str | None = opt(None, "under torchrun, srun or mpirun: how the processes meet: tcp "
                                 "(MASTER_ADDR:MASTER_PORT, +1 under torchrun), tcp:HOST:PORT, "
                                 "file:PATH on a shared filesystem, or mpi (mpi4py)", "devices and launch",
                                 str, pattern=_RENDEZVOUS, metavar="HOW",
                                 shown="mpi under mpirun with mpi4py, else tcp", recorded=False)
    overwrite: bool = opt(False, "replace the run already in --out (checkpoint, log, plot, sample)",
                          "output", switch={"--overwrite": True}, in_file=False, recorded=False)


def _declared(cls) -> dict:
    missing = [f.name for f in dataclasses.fields(cls) if "option" not in f.metadata]
    if missing:
        raise TypeError(f"{cls.__name__}.{missing[0]}: declare it with opt() (help, group, rule): "
                        f"every field is an option of xtrain train")
    return {f.name: f for f in dataclasses.fields(cls)}


# Every option of `xtrain train`, by name: TrainConfig's fields, then CommandOptions'.
_TRAIN_OPTIONS = _declared(TrainConfig)
OPTIONS = {**_TRAIN_OPTIONS, **_declared(CommandOptions)}


def option(name: str) -> Option:
    return OPTIONS[name].metadata["option"]


def default_of(name: str):
    return OPTIONS[name].default


def flags_of(name: str) -> tuple:
    o = option(name)
    return tuple(o.switch) if o.switch else (o.flags or (f"--{name.replace('_', '-')}",))


def shown_default(name: str) -> str:
    """The default of option `name` as --help prints it: MACHINE_DEFAULTS' two values for those it
    holds ("16 on CPU, 32 on GPU"), else the declared words, else the value."""
    o = option(name)
    if name in _CPU:
        both = f"{_show(o, _CPU[name])} on CPU, {_show(o, MACHINE_DEFAULTS['cuda'][name])} on GPU"
        return f"{both}; {o.shown}" if o.shown else both
    return o.shown if o.shown is not None else _show(o, default_of(name))


def _show(o: Option, value) -> str:
    """`value` as --help writes it: a switch's flag, a word, a number, names."""
    if o.switch:  # the flag that sets the value; a lone flag that sets the other value is off
        return next((f for f, v in o.switch.items() if v is value), "off")
    word = _word(o, value)
    if word is not None:
        return word
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return str(value)


# ---- values: read and checked, whatever their source

def value_of(name: str, value, flag: str | None = None):
    """Option `name`'s value from a flag's text or a TOML value, held to its rule; ConfigError
    naming `flag` (default: the option's first flag) otherwise."""
    o = option(name)
    flag = flag or flags_of(name)[0]
    if isinstance(value, str) and o.type is not str:
        value = _parse(o, flag, value)
    elif o.type is tuple and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        value = _names(",".join(value))
    elif o.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    check(name, value, flag)
    return value


def _parse(o: Option, flag: str, text: str):
    word = text.strip().lower()
    if o.words and word in o.words:
        return o.words[word]
    try:
        if o.type is int:
            return parse_size(text) if o.size else int(text)
        if o.type is float:
            return float(text)
        if o.type is tuple:
            return _names(text)
    except ValueError:
        pass
    raise ConfigError(f"{flag} {text!r}: {_expected(o)}")


def _word(o: Option, value) -> str | None:
    """The word that writes `value` ("auto"; recompute's False: "off"), or None."""
    return next((w for w, v in (o.words or {}).items() if type(v) is type(value) and v == value), None)


def _names(text: str) -> tuple:
    """'TensorBoard, wandb' -> ('tensorboard', 'wandb'): lower case, each once, in order."""
    return tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))


def _expected(o: Option) -> str:
    if o.size:
        return f"invalid size ({_SIZE_EXAMPLES})"
    what = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            tuple: "a comma-separated list of names"}[o.type]
    if o.words:
        words = list(dict.fromkeys(w for w in o.words if w not in ("true", "false")))
        what = ", ".join(words[:-1]) + f" or {words[-1]}" if o.type is bool else f"{what} or {' or '.join(words)}"
    return f"expected {what}"


def check(name: str, value, flag: str | None = None) -> None:
    """ConfigError unless `value` follows option `name`'s rule: its type, range, choices or form.
    None passes where None is the default."""
    o = option(name)
    flag = flag or flags_of(name)[0]
    if value is None and default_of(name) is None:
        return
    if _word(o, value) is not None:
        return
    if not _is_type(o.type, value):
        raise ConfigError(f"{flag} {value!r}: {_expected(o)}")
    if isinstance(value, str) and not _is_utf8(value):  # config.toml (UTF-8) records every value
        raise ConfigError(f"{flag}: not UTF-8 text ({value.encode('utf-8', 'surrogateescape')[:40]!r})")
    if o.choices is not None and value not in o.choices:
        raise ConfigError(f"{flag} {value!r}: invalid choice (choose from {', '.join(o.choices)})")
    if o.pattern is not None and not re.fullmatch(o.pattern[0], str(value)):
        raise ConfigError(f"{flag} {value!r}: expected {o.pattern[1]}")
    if o.type in (int, float) and not _in_range(o, value):
        raise ConfigError(f"{flag} must be {_rule(o)}, got {value}")


def _is_utf8(text: str) -> bool:
    """False for text with lone surrogates: bytes of an argument that were not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_type(kind: type, value) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    if kind is str:
        return isinstance(value, (str, os.PathLike))
    if kind is tuple:
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    return isinstance(value, kind)


def _in_range(o: Option, v) -> bool:
    return ((isinstance(v, int) or math.isfinite(v)) and (o.gt is None or v > o.gt)
            and (o.ge is None or v >= o.ge) and (o.lt is None or v < o.lt) and (o.le is None or v <= o.le))


def _rule(o: Option) -> str:
    """The range in words: 'a positive integer', 'a finite number >= 0', 'in [0, 1)'."""
    low, high = (o.gt, "(") if o.gt is not None else (o.ge, "["), (o.lt, ")") if o.lt is not None else (o.le, "]")
    if low[0] is not None and high[0] is not None:
        def bound(v):  # 2**64, not 18446744073709551616
            return f"2**{int(v).bit_length() - 1}" if v >= 2**32 and int(v) & (int(v) - 1) == 0 else f"{v:g}"
        span = f"{low[1]}{bound(low[0])}, {bound(high[0])}{high[1]}"
        return f"an integer in {span}" if o.type is int else f"in {span}"
    if o.type is int:
        return "a positive integer" if (o.gt == 0 or o.ge == 1) else "a non-negative integer"
    return f"a finite number {'>' if o.gt is not None else '>='} {low[0]:g}"


def validate(cfg: TrainConfig) -> None:
    """ConfigError for the first value of `cfg` that cannot work: each field held to its rule
    (check), then the rules between fields. The batch arithmetic (--batch-tokens against the
    micro-batch and the GPUs) is xtrain.trainer.batching.plan's, which knows both."""
    for name in _TRAIN_OPTIONS:
        check(name, getattr(cfg, name))
    if cfg.doc_rope and not cfg.doc_mask:
        raise ConfigError("--doc-rope restarts RoPE's positions per document, which needs attention within "
                          "documents: drop --no-doc-mask")
    if cfg.doc_rope and cfg.preset is not None and ALL_PRESETS[cfg.preset] != "qwen3":
        raise ConfigError(f"--doc-rope: --preset {cfg.preset} has learned positions, not RoPE")
    if cfg.fp8 and cfg.preset is not None and ALL_PRESETS[cfg.preset] != "qwen3":
        raise ConfigError(f"--fp8: --preset {cfg.preset} is GPT-2; FP8 runs the Qwen3/Llama block's linears")
    if cfg.min_lr is not None and cfg.lr is not None and cfg.min_lr > cfg.lr:
        raise ConfigError(f"--min-lr {cfg.min_lr:g} must be <= --lr {cfg.lr:g}")
    if cfg.init_from is not None:
        if cfg.resume:
            raise ConfigError("--init-from starts a new run from pretrained weights and --resume continues a "
                              "checkpoint: give one of them")
        if cfg.preset is not None:
            raise ConfigError(f"--init-from takes the model from {cfg.init_from}: drop --preset {cfg.preset}")


def train_config(values: dict) -> TrainConfig:
    """The TrainConfig of option name -> value (the CLI's merged values; other options ignored)."""
    return TrainConfig(**{name: values[name] for name in _TRAIN_OPTIONS if name in values})


# ---- files

# TOML key -> (option, the flag the key names): each option's name and its flags' names
_KEYS = {key: (name, flag) for name in OPTIONS
         for key, flag in [(name, None)] + [(f[2:].replace("-", "_"), f) for f in flags_of(name)]}


def read_toml(path, what: str = "--config") -> dict:
    """The key/values of a TOML file with keys normalised to option names' form (dashes ->
    underscores)."""
    path = Path(path)
    try:
        data = tomllib.loads(read_text_bounded(path, MAX_TOML_BYTES, what, ConfigError))
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise ConfigError(f"{what} {path}: invalid TOML ({e})") from None
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            raise ConfigError(f"{what} {path}: [{key}] tables are not supported; write options as "
                              f"top-level keys (e.g. steps = 800)")
        out[key.replace("-", "_")] = value
    return out


def read_config(path) -> dict:
    """A --config file's options, name -> value, each read and checked as its flag would be."""
    return values_of(read_toml(path), f"--config {path}")


def values_of(data: dict, where: str, record: bool = False) -> dict:
    """Option name -> value from TOML keys (or a checkpoint's train_args) -> values; `where` prefixes
    the errors. A record's keys of options it does not keep are dropped; None values are left out.
    The two keys of a switch that disagree (bf16 = true, fp32 = true) are an error."""
    out, keys = {}, {}
    for key, value in data.items():
        name, flag = _KEYS.get(key.replace("-", "_"), (None, None))
        if record and name is not None and not option(name).recorded:
            continue
        if name is None or not option(name).in_file:
            because = (f"{flags_of(name)[0]} is given on the command line only" if name is not None else
                       "the keys are the options of xtrain train, e.g. steps = 800, grad-accum = 4")
            raise ConfigError(f"{where}: unknown key {key!r} ({because})")
        if value is None:  # an older checkpoint's train_args: the default
            continue
        o = option(name)
        if o.switch and flag in o.switch:  # fp32 = true: what --fp32 sets; fp32 = false: the other
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {flag} {value!r}: expected true or false")
            value = o.switch[flag] if value else not o.switch[flag]
        try:
            value = value_of(name, value, flag)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        if o.switch and name in out and out[name] != value:
            raise ConfigError(f"{where}: keys {keys[name]!r} and {key!r} set one option two ways; keep one")
        out[name], keys[name] = value, key
    return out


def write_record(path, record: dict, notes=()) -> Path:
    """Write `record` (option name -> value) as TOML, None values left out, `notes` as comments."""
    path = Path(path)
    lines = ["# xtrain train: the resolved configuration of this run. `xtrain train --resume`",
             "# continues with these values (flags override them); `--config FILE` starts a new",
             "# run from them."]
    lines += [f"# {n}" for n in notes]
    lines += [_record_line(key, value) for key, value in record.items() if value is not None]
    tmp = path.with_name(path.name + ".tmp")
    try:
        with writing(path):
            tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


def read_record(ckpt_path) -> dict:
    """The options the run of checkpoint `ckpt_path` was made with, name -> value: RUN/config.toml
    beside the checkpoint directory when present, else the checkpoint's own copy (train_args)."""
    from xtrain.io import state

    path = state.resolve(ckpt_path)
    beside = path.parent / CONFIG_FILE
    data = read_toml(beside, "record") if beside.is_file() else state.load(path, verify=False).meta.get("train_args")
    return values_of(data or {}, f"the record of {ckpt_path}", record=True)


# Significant digits of the short form beside a long float in the record: a value typed or
# printed by a person has fewer; a computed one's tail (lr / 10) starts past them.
RECORD_SHORT_DIGITS = 12


def _record_line(key: str, value) -> str:
    """`key = value`; a float that arithmetic left with a long tail (lr / 10 is
    0.00030000000000000003 for --lr 3e-3) is written exactly, as repr's shortest round trip, and
    followed by the short value it stands for: the record must give a resumed run the same bits."""
    line = f"{key.replace('_', '-')} = {_toml_value(value)}"
    if isinstance(value, float) and math.isfinite(value):
        short = f"{value:.{RECORD_SHORT_DIGITS}g}"
        if float(short) != value:
            line += f"  # {short}, to the bit as the run used it"
    return line


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


def record_of(cfg: TrainConfig, **resolved) -> dict:
    """The record of `cfg`: its recorded options, name -> value, with the `resolved` values (and
    the GPU count, devices) replacing the requested ones."""
    values = {**dataclasses.asdict(cfg), **resolved}
    return {name: values[name] for name in OPTIONS if name in values and option(name).recorded}
