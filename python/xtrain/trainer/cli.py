"""The `xtrain` command: train, prepare, sample, export.

    xtrain train                                  # built-in stories: tiny (CPU), dim768 bf16 (GPU)
    xtrain train --preset dim384 --data corpus.jsonl --bf16 --steps 5000 --out runs/d384
    xtrain train --out runs/d384 --resume         # continue runs/d384/ckpt with its config.toml
    xtrain train --config run.toml --steps 2000   # a config file; flags override it
    xtrain train --preset dim768 --bf16 --batch auto --batch-tokens 0.5M --recompute auto
    xtrain train --init-from Qwen3-0.6B --data corpus.txt --bf16 --steps 500   # from HF weights
    xtrain prepare corpus.jsonl --out data/corpus --vocab-size 8192
    xtrain prepare tinystories                    # from the Hugging Face hub into data/tinystories
    xtrain prepare hf:ORG/NAME --text-column text --split train --tokenizer gpt2
    xtrain prepare stories --tokens 25000000      # a finite copy of the built-in stream
    xtrain prepare corpus.txt --out data/c --tokenizer llama/tokenizer.json   # or a .model
    xtrain prepare data/openwebtext               # nanoGPT/llm.c token files: read in place (gpt2)
    xtrain prepare saved_ds --out data/s --tokenizer gpt2   # a datasets.save_to_disk directory
    xtrain sample --ckpt runs/tiny/ckpt --prompt "Once upon a time" --temperature 0.8 --top-k 50
    xtrain sample --ckpt runs/tiny/ckpt --prompt "A cat" --prompt "The sun" --top-p 0.9 --seed 1
    xtrain export --ckpt runs/tiny/ckpt --out hf/tiny --dtype bf16

Several GPUs: `--devices N` runs one process with a thread per GPU; under a launcher each process
drives one GPU (docs/distributed.md):
    torchrun --nproc-per-node 8 -m xtrain train --preset dim768 --bf16
    srun --ntasks-per-node 8 --gpus-per-node 8 python -m xtrain train ...
    mpirun -np 8 python -m xtrain train ... [--rendezvous mpi|tcp|file:PATH]

Errors a user can fix (bad flags, missing paths, a checkpoint or dataset that does not fit, a
locked or occupied directory, a full disk, a launcher environment that does not add up) print
one line `xtrain: error: ...` and exit with status 2; anything else prints one
`xtrain: internal error: ...` line and exits with 1, never a raw traceback. XTRAIN_DEBUG=1 shows
the traceback instead. With several processes every line names the rank (`xtrain: rank 3: ...`);
the rank that failed exits with its error's status, and every other rank exits with status 3
after printing `xtrain: rank R: stopped: rank 3 failed: ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from pathlib import Path

from xtrain import settings
from xtrain.models.transformer import PRESETS
from xtrain.trainer.schedule import DEFAULT_DECAY_FRAC, SCHEDULES

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class UsageError(Exception):
    """A problem with the command line that argparse cannot see (e.g. a path that is missing)."""


def parse_size(text: str) -> int:
    """'32GiB' -> 34359738368, '500MB' -> 500000000, '1.5G' -> 1610612736, '4096' -> 4096.
    KiB/MiB/GiB/TiB and K/M/G/T are powers of 1024; KB/MB/GB/TB are powers of 1000."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (examples: 32GiB, 500MB, 1.5G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _number(parse, what: str, ok, rule: str):
    """An argparse type: parse(text) (ValueError: "invalid WHAT"), then ok(value), else "must be RULE"."""
    def convert(text: str):
        try:
            v = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text.strip()}")
        return v
    return convert


_positive_int = _number(int, "positive integer", lambda v: v > 0, "a positive integer")
_nonneg_int = _number(int, "non-negative integer", lambda v: v >= 0, ">= 0")
_positive_float = _number(float, "number", lambda v: v > 0, "> 0")
_nonneg_float = _number(float, "number", lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0")
_probability = _number(float, "number", lambda v: 0 < v <= 1, "in (0, 1]")


def _seed(text: str) -> int:
    """A generator seed: 0 <= seed < 2**64 (what the engine's generators take)."""
    v = _nonneg_int(text)
    if v >= 2**64:
        raise argparse.ArgumentTypeError(f"must be below 2**64, got {v}")
    return v


def _devices_arg(text: str):
    return "all" if text.strip().lower() == "all" else _positive_int(text)


def _rendezvous_arg(text: str) -> str:
    kind, _, arg = text.partition(":")
    if text in ("tcp", "mpi") or (kind == "file" and arg) or (kind == "tcp" and arg.rpartition(":")[2].isdigit()
                                                             and arg.rpartition(":")[0]):
        return text
    raise argparse.ArgumentTypeError(f"expected tcp, tcp:HOST:PORT, file:PATH or mpi, got {text!r}")


def _batch_arg(text: str):
    return "auto" if text.strip().lower() == "auto" else _positive_int(text)


def _recompute_arg(text: str):
    value = {"on": True, "true": True, "off": False, "false": False, "auto": "auto"}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected on, off or auto, got {text!r}")
    return value


def _token_count(text: str) -> int:
    """'524288', '512K' or '0.5M' (K and M are powers of 1024 here too)."""
    v = parse_size(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of tokens, got {text!r}")
    return v


class _Default:
    """A train flag's default, marked so cmd_train can tell a flag given on the command line
    (which overrides a config file and the resumed run's record) from one left at its default;
    --help prints the value."""

    def __init__(self, value):
        self.value = value

    def __str__(self):
        return str(self.value)


def _mark_defaults(parser) -> None:
    for action in parser._actions:
        if action.dest != "help":
            action.default = _Default(action.default)
    parser.set_defaults(_parser=parser)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # One line, no usage block: the user asked for --help if they want it. Subcommands
        # (prog "xtrain train") name themselves after the common prefix.
        command = self.prog.partition(" ")[2]
        self.exit(2, f"xtrain: error: {command + ': ' if command else ''}{message} "
                     f"(see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="xtrain", description="Train small transformer language models with xtrain.",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="Run `xtrain COMMAND --help` for the options of a command.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    fmt = argparse.ArgumentDefaultsHelpFormatter

    t = sub.add_parser("train", help="train a model (default: on the built-in stories)",
                       formatter_class=fmt, description="Train a TinyTransformer. With no options, "
                       "trains on the built-in stories, an endless stream, and prints a sample: "
                       "on a CPU the `tiny` preset (a few minutes on two cores), on a GPU `dim768` "
                       "in bf16 (3000 steps of 32 x 256 tokens, a few minutes on an H200). Flags "
                       "marked 'machine' default to those settings.")
    t.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model size (default: machine, or the checkpoint's model with --resume)")
    t.add_argument("--data", default=None,
                   help="a prepared data directory, a nanoGPT/llm.c token directory (read in place, "
                        "GPT-2 unless `xtrain prepare DIR --tokenizer` named another), or a "
                        ".txt/.jsonl/.parquet file or directory or a save_to_disk dataset to prepare "
                        "into OUT/data (default: the built-in stories, made on the fly)")
    t.add_argument("--out", default=None,
                   help="run directory: log, checkpoint, plot, sample (default: runs/PRESET)")
    t.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    prec = t.add_mutually_exclusive_group()
    prec.add_argument("--bf16", dest="bf16", action="store_const", const=True, default=False,
                      help="mixed precision: bf16 compute, fp32 master weights (the default on a GPU)")
    prec.add_argument("--fp32", dest="bf16", action="store_const", const=False,
                      help="float32 throughout (the default on a CPU)")
    t.add_argument("--recompute", nargs="?", const=True, default=False, type=_recompute_arg, metavar="on|off|auto",
                   help="activation recompute: checkpoint every block (bitwise-identical results); auto: "
                        "only if the micro-batch does not fit without it")
    t.add_argument("--dropout", type=float, default=0.0, help="dropout on embeddings and residual branches")
    t.add_argument("--batch", type=_batch_arg, default=16, metavar="N|auto",
                   help="sequences per micro-batch on each device; auto: the largest that fits "
                        "(--memory-limit, or the GPU's memory)")
    t.add_argument("--grad-accum", type=_positive_int, default=None, metavar="N",
                   help="micro-batches per optimizer step (default: 1, or from --batch-tokens)")
    t.add_argument("--batch-tokens", type=_token_count, default=None, metavar="T",
                   help="global batch in tokens per optimizer step, e.g. 0.5M (= 524288); gives "
                        "--grad-accum = T / (batch x seq x GPUs)")
    t.add_argument("--seq", type=_positive_int, default=128, help="tokens per sequence")
    t.add_argument("--steps", type=_positive_int, default=800,
                   help="total optimizer steps (with --resume: the new total)")
    t.add_argument("--schedule", choices=SCHEDULES, default="cosine",
                   help="LR schedule after the warm-up: cosine or linear decay to --min-lr, constant, or "
                        "wsd (stable, then a linear decay over the last --decay-frac)")
    t.add_argument("--decay-steps", type=_positive_int, default=None,
                   help="length of the LR schedule (default: --steps; with --resume the run's own, so "
                        "steps added by a larger --steps run at --min-lr)")
    t.add_argument("--decay-frac", type=float, default=DEFAULT_DECAY_FRAC,
                   help="wsd: share of the schedule spent decaying")
    t.add_argument("--lr", type=_positive_float, default=None,
                   help="peak learning rate (default: per preset, tiny 2e-3 ... dim1024 5e-4; "
                        "the checkpoint's with --resume)")
    t.add_argument("--min-lr", type=float, default=None, help="final learning rate (default: lr/10)")
    t.add_argument("--warmup", type=_nonneg_int, default=50, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (2-D weights)")
    t.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    t.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2")
    t.add_argument("--grad-clip", type=float, default=1.0, help="global grad-norm clip (0: off)")
    t.add_argument("--nonfinite-limit", type=_positive_int, default=3, metavar="K",
                   help="a step whose loss or gradient norm is NaN/Inf is skipped (no update); stop after "
                        "K such steps in a row")
    t.add_argument("--eval-every", type=_nonneg_int, default=None,
                   help="validation every N steps (0: off; default: machine)")
    t.add_argument("--eval-batches", type=_positive_int, default=20, help="validation batches per eval")
    t.add_argument("--save-every", type=_nonneg_int, default=1000,
                   help="checkpoint every N steps (0: only at the end)")
    t.add_argument("--resume", nargs="?", const="", default=None, metavar="CKPT",
                   help="continue from a checkpoint directory (no value: OUT/ckpt)")
    t.add_argument("--init-from", default=None, metavar="DIR",
                   help="start a new run (step 0, new optimizer) from a Hugging Face Qwen3 or Llama "
                        "directory (config.json, safetensors, tokenizer); the data must use its tokenizer "
                        "(a raw --data source is tokenized with it)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (its checkpoint, log, plot and sample)")
    t.add_argument("--memory-limit", type=parse_size, default=None, metavar="SIZE",
                   help="cap the device allocator, e.g. 32GiB or 500MB (default: no cap)")
    t.add_argument("--threads", type=_positive_int, default=None, metavar="N",
                   help="CPU matrix-multiply threads (default: OPENBLAS_NUM_THREADS, else every core); on a "
                        "machine whose cores are busy with other work, fewer threads avoid oversubscription")
    t.add_argument("--seed", type=_seed, default=0, help="seed for weights, data order and sampling")
    t.add_argument("--devices", type=_devices_arg, default=1,
                   help="GPUs for data parallelism: N (the first N) or all; --batch is per GPU")
    t.add_argument("--rendezvous", type=_rendezvous_arg, default=None, metavar="tcp|file:PATH|mpi",
                   help="under torchrun, srun or mpirun: how the processes meet (tcp: at MASTER_ADDR:MASTER_PORT, "
                        "+1 under torchrun, or tcp:HOST:PORT; file:PATH: a file on a shared filesystem; mpi: "
                        "mpi4py's broadcast). Default: mpi under mpirun when mpi4py is installed, else tcp")
    t.add_argument("--no-shard-optimizer", action="store_true",
                   help="with --devices: all-reduce the gradients and run AdamW on every GPU, instead of "
                        "reduce-scatter, AdamW on each GPU's share and all-gather (the default; same results)")
    graphs = t.add_mutually_exclusive_group()
    graphs.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_const", const=True, default=True,
                        help="on a GPU, capture the training step as CUDA graphs after two eager steps and "
                             "replay them (the default; bitwise the same results; data-parallel ranks too; a "
                             "capture that fails leaves the steps eager and the run says why)")
    graphs.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_const", const=False,
                        help="run every step eagerly (no graph capture)")
    t.add_argument("--vocab-size", type=_positive_int, default=4096,
                   help="BPE vocabulary when --data is a raw source")
    t.add_argument("--sample-tokens", type=_nonneg_int, default=200, help="length of the final sample")
    t.add_argument("--sample-prompt", default=None,
                   help="prompt of the final sample (default: 'Once upon a time' on the built-in stories, "
                        "else the start of a validation document)")
    t.add_argument("--tracker", default=None, metavar="NAMES",
                   help="metric sinks beside log.jsonl, comma-separated: tensorboard, wandb (offline); "
                        "pip install 'xtrain[tensorboard]' / 'xtrain[wandb]'")
    t.add_argument("--config", default=None, metavar="TOML",
                   help="read flags from a TOML file (keys as the flags: steps = 800, grad-accum = 4); "
                        "flags given here override it")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    _mark_defaults(t)

    pr = sub.add_parser("prepare", help="tokenize a corpus into train/val shards", formatter_class=fmt,
                        description="Train a byte-level BPE (or use GPT-2's, or a tokenizer file) on "
                        "SOURCE and write tokenizer, train.bin, val.bin and meta.json into --out. "
                        "SOURCE is files or directories, or one name: `tinystories` or `hf:ORG/NAME` "
                        "(a Hugging Face hub dataset, downloaded once into its cache; needs "
                        "`datasets`), or `stories` (a finite copy of the built-in stream). A nanoGPT "
                        "or llm.c token directory is not re-tokenised: without --out, meta.json and "
                        "the tokenizer are written beside its files, which are read in place; with "
                        "--out, its tokens are copied into shards. A `datasets` save_to_disk "
                        "directory: its text column is tokenized, its input_ids used as they are.")
    pr.add_argument("source", nargs="+",
                    help=".txt/.jsonl/.parquet files or directories, a nanoGPT/llm.c token "
                         "directory, a save_to_disk directory; or tinystories, hf:ORG/NAME or stories")
    pr.add_argument("--out", default=None,
                    help="output directory (required for files; default data/NAME for a name, the "
                         "directory itself for token files)")
    pr.add_argument("--vocab-size", type=_positive_int, default=4096, help="BPE vocabulary size")
    pr.add_argument("--tokenizer", default=None, metavar="bpe|gpt2|PATH",
                    help="bpe (trained on the text), gpt2 (tiktoken), or a tokenizer file: a Hugging "
                         "Face tokenizer.json, a SentencePiece .model, or a directory holding one "
                         "(default: bpe; gpt2 for nanoGPT/llm.c token files)")
    pr.add_argument("--eot", default=None, metavar="TOKEN",
                    help="the end-of-text token of a tokenizer file, e.g. '</s>' (default: the "
                         "eos_token of a tokenizer_config.json beside it, the model's eos piece, or "
                         "the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> it has)")
    pr.add_argument("--val-fraction", type=float, default=0.01, help="fraction of documents for validation")
    pr.add_argument("--seed", type=_seed, default=0, help="seed of the train/val split")
    pr.add_argument("--overwrite", action="store_true", help="replace a directory prepared differently")
    pr.add_argument("--text-column", default=None,
                    help="hub and saved datasets: the text column (default: text; a saved dataset's "
                         "input_ids column, when it has one, is used as it is)")
    pr.add_argument("--split", default=None,
                    help="hub and saved datasets: the training split (default: train)")
    pr.add_argument("--val-split", default=None,
                    help="hub and saved datasets: a held-out split to validate on (tinystories and "
                         "saved datasets: validation when there; default: --val-fraction of the "
                         "training split)")
    pr.add_argument("--tokens", type=_positive_int, default=None,
                    help="stories: training tokens in the copy (default: 1200000)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar")

    s = sub.add_parser("sample", help="generate text from a checkpoint", formatter_class=fmt)
    s.add_argument("--ckpt", required=True, help="checkpoint directory (e.g. runs/tiny/ckpt)")
    s.add_argument("--prompt", action="append", default=None,
                   help="text to continue; repeat it for a batch of prompts, generated together "
                        "(default: the run's sample prompt, e.g. 'Once upon a time')")
    s.add_argument("--greedy", action="store_true", help="always take the most likely token")
    s.add_argument("--temperature", type=_nonneg_float, default=None,
                   help="sampling temperature, 0 for greedy (default 0.8)")
    s.add_argument("--top-k", type=_positive_int, default=None, help="sample among the K most likely (default 50)")
    s.add_argument("--top-p", type=_probability, default=None,
                   help="sample among the most likely tokens whose probabilities sum to P, in (0, 1] "
                        "(default 1: off)")
    s.add_argument("--max-new-tokens", type=_nonneg_int, default=200,
                   help="tokens to generate per prompt (a sample also ends at the end-of-text token "
                        "or at the model's max_seq)")
    s.add_argument("--seed", type=_seed, default=0, help="sampling seed")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    sgraphs = s.add_mutually_exclusive_group()
    sgraphs.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_const", const=True, default=True,
                         help="on a GPU, capture the decode step as a CUDA graph and replay it for every "
                              "token (the default; the same tokens; no effect on the CPU)")
    sgraphs.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_const", const=False,
                         help="run every decode step eagerly")

    e = sub.add_parser("export", help="export a checkpoint in the Hugging Face Qwen3 layout", formatter_class=fmt)
    e.add_argument("--ckpt", required=True, help="checkpoint directory")
    e.add_argument("--out", required=True, help="output directory (loads with transformers)")
    e.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="weight dtype")
    e.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out, replacing the files an export writes")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print(f"{_who(args)}interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if settings.get("XTRAIN_DEBUG"):
            raise
        import xtrain
        from xtrain.launch.rendezvous import EXIT_STOPPED, RankStopped, RendezvousError
        from xtrain.trainer.train import NonFiniteStepsError

        who = _who(args)
        if isinstance(e, RankStopped):  # another rank failed; its own message says why
            print(f"{who}stopped: {_first_line(e).split(' stopped because ', 1)[-1]}", file=sys.stderr)
            return EXIT_STOPPED
        if isinstance(e, NonFiniteStepsError):
            print(f"{who}training stopped: {_first_line(e)}", file=sys.stderr)
            return 1
        if isinstance(e, (xtrain.OutOfMemoryError, MemoryError)):
            print(f"{who}out of memory: {_first_line(e)}", file=sys.stderr)
            return 1
        if isinstance(e, (UsageError, ValueError)):
            print(f"{who}error: {_first_line(e)}", file=sys.stderr)
            return 2
        if isinstance(e, RendezvousError):
            print(f"{who}error: {_first_line(e)}", file=sys.stderr)
            return 1
        if isinstance(e, OSError):  # a missing path, a full disk, permissions
            text = e.strerror or _first_line(e)
            print(f"{who}error: {f'{e.filename}: {text}' if e.filename else text}", file=sys.stderr)
            return 2
        print(f"{who}internal error: {type(e).__name__}: {_first_line(e)} (XTRAIN_DEBUG=1 "
              f"shows the traceback)", file=sys.stderr)
        return 1


def _who(args) -> str:
    """The message prefix: "xtrain: ", or "xtrain: rank R: " in a process of a process group."""
    if getattr(args, "command", None) == "train":
        from xtrain.launch import env as launch_env

        try:
            env = launch_env.detect()
        except ValueError:
            env = None
        if env is not None and env.world_size > 1:
            return f"xtrain: rank {env.rank}: "
    return "xtrain: "


def _first_line(e: BaseException) -> str:
    msg = str(e).strip()
    return msg.splitlines()[0] if msg else type(e).__name__


def cmd_train(args) -> int:
    from xtrain.trainer import runconfig
    from xtrain.io.rundir import claim_run
    from xtrain.trainer.train import TrainConfig, train

    group = _process_group()
    values = _train_values(args, group)
    if values["data"] is not None and not Path(values["data"]).exists():
        raise UsageError(f"--data {values['data']}: no such file or directory")
    cfg = TrainConfig(**runconfig.train_config_kwargs(values, TrainConfig.__dataclass_fields__))
    _check_train_config(cfg, values["devices"], group)

    @contextlib.contextmanager
    def claimed():
        with claim_run(cfg.out, cfg.resume, values["overwrite"]) as lock:  # refuses a locked or occupied --out
            if lock.took_over:
                print(f"xtrain: note: {cfg.out} was locked by pid {lock.took_over.get('pid')}, which is no "
                      f"longer running; taking it over", file=sys.stderr)
            yield lock

    if group is not None:  # one process per GPU: rank 0 holds the run directory
        from xtrain.trainer.train import train_processes

        train_processes(cfg, group, rendezvous=values["rendezvous"], claim=claimed)
        return 0
    if values["rendezvous"] is not None:
        raise UsageError("--rendezvous applies when torchrun, srun or mpirun starts several processes")
    with claimed():
        if values["devices"] == 1:
            train(cfg)
        else:
            from xtrain.trainer.train import train_data_parallel

            train_data_parallel(cfg, values["devices"])
    return 0


def _process_group():
    """The launch this process is one rank of (xtrain.launch.env.LaunchEnv), or None: no launcher,
    or a world of one process (which trains as a plain single-GPU run)."""
    from xtrain.launch import env as launch_env

    try:
        env = launch_env.detect()
    except launch_env.LaunchError as e:
        raise UsageError(f"launcher environment: {e}") from None
    return env if env is not None and env.world_size > 1 else None


def _check_train_config(cfg, devices, group=None) -> None:
    """The configuration errors that need no data or model, now: values, trackers, and the batch
    arithmetic (the whole plan where nothing is probed; else whether probing is possible)."""
    import xtrain
    from xtrain.trainer import batching, runconfig, trackers

    runconfig.validate(cfg)
    trackers.check_available(cfg.trackers)
    world = 1
    if group is not None:
        world, devices = group.world_size, group.world_size
    elif devices != 1:
        from xtrain.launch import distributed

        world = len(distributed.resolve_devices(devices))
    on_gpu = devices != 1 or cfg.device.startswith("cuda") or (cfg.device == "auto" and xtrain.cuda.is_available())
    searching = cfg.batch == "auto" or cfg.recompute == "auto"
    if not searching or (cfg.memory_limit is None and not on_gpu):
        batching.plan(cfg.batch, cfg.grad_accum, cfg.batch_tokens, cfg.seq, world, cfg.recompute)


def _train_values(args, group=None) -> dict:
    """The train flags' values: their defaults, then the machine's defaults (xtrain.trainer.train.
    MACHINE_DEFAULTS: a GPU trains dim768 in bf16, a CPU the tiny model), then the resumed run's
    record (OUT/config.toml), then the --config file, then the flags given on the command line
    (xtrain.trainer.runconfig). `group`: the process group this process is a rank of (its GPU count
    replaces --devices, which picks threads)."""
    from xtrain.trainer import runconfig
    from xtrain.io import state
    from xtrain.trainer.train import CKPT_DIR, machine_defaults, resolve_device

    parser = args._parser
    given = {k: v for k, v in vars(args).items() if not isinstance(v, _Default) and k not in ("command", "_parser")}
    values = {k: v.value for k, v in vars(args).items() if isinstance(v, _Default)}
    layers = {}
    if given.get("config") is not None:
        layers["file"] = _coerce(parser, runconfig.read_toml(given["config"]), f"--config {given['config']}")
    chosen = {**values, **layers.get("file", {}), **given}
    devices = chosen["devices"]
    if group is not None:
        if devices != 1:
            raise UsageError(f"--devices {devices} runs one process with a thread per GPU; under {group.launcher} "
                             f"(world size {group.world_size}) each process drives one GPU: drop --devices")
        devices = group.world_size
        from xtrain.launch import distributed

        try:
            distributed.require_available("one process per GPU")
        except RuntimeError as e:
            raise UsageError(f"{group.launcher} started {group.world_size} processes: {e}") from None
    elif devices != 1:
        from xtrain.launch import distributed

        try:
            distributed.require_available()
            distributed.resolve_devices(devices)
        except (RuntimeError, ValueError) as e:
            raise UsageError(f"--devices {devices}: {e}") from None
    if chosen.get("init_from") is not None and chosen.get("resume") is not None:
        raise UsageError("--init-from starts a new run from pretrained weights and --resume continues a "
                         "checkpoint: give one of them")
    _check_device(chosen["device"])
    machine = machine_defaults(resolve_device(chosen["device"]) if devices == 1 else "cuda")
    if chosen.get("resume") is not None or chosen.get("init_from") is not None:
        machine.pop("preset")  # a resumed run keeps its model, --init-from brings one
    values.update(machine)
    if given.get("resume") is not None or layers.get("file", {}).get("resume") is not None:
        first = {**values, **layers.get("file", {}), **given}
        out = first["out"] or f"runs/{first['preset'] or 'tiny'}"
        resume = first["resume"] or str(Path(out) / CKPT_DIR)
        state.resolve(resume)  # a clear error now rather than after the data is prepared
        record = _coerce(parser, runconfig.read_record(resume), f"the record of {resume}")
        record.pop("init_from", None)  # how the run began: the checkpoint holds the model now
        values.update(record)
        given["resume"] = resume
    for layer in layers.values():
        values.update(layer)
    values.update(given)
    values["out"] = values["out"] or f"runs/{values['preset'] or 'tiny'}"
    if group is not None:
        values["devices"] = group.world_size  # the record's GPU count, whatever it was
    return values


def _coerce(parser, values: dict, where: str) -> dict:
    """Config-file or record values (TOML types) as the flags' own parsing would give them."""
    from xtrain.trainer import runconfig

    actions = {}
    for a in parser._actions:  # the first flag of a dest names it (--bf16, not --fp32)
        if a.dest != "help":
            actions.setdefault(a.dest, a)
    out = {}
    for key, value in values.items():
        action = actions.get(key)
        if value is None and action is not None:  # an older checkpoint's record: the default
            continue
        if action is None or key in runconfig.NOT_RECORDED:
            raise UsageError(f"{where}: unknown key {key!r} (the keys are the flags of xtrain train, "
                             f"e.g. steps = 800, grad-accum = 4)")
        flag = action.option_strings[0]
        if action.nargs == 0 or isinstance(value, bool):  # store_true flags, --recompute true/false
            if not isinstance(value, bool) or (action.nargs != 0 and action.const is not True):
                raise UsageError(f"{where}: {flag} = {value!r}: expected true or false"
                                 if action.nargs == 0 else f"{where}: {flag} = {value!r}: expected a value")
            out[key] = value
            continue
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        try:
            parsed = action.type(text) if action.type else text
        except (argparse.ArgumentTypeError, ValueError) as e:
            raise UsageError(f"{where}: {flag} = {value!r}: {e}") from None
        if action.choices is not None and parsed not in action.choices:
            raise UsageError(f"{where}: {flag} = {value!r}: choose from {', '.join(map(str, action.choices))}")
        out[key] = parsed
    return out


def cmd_prepare(args) -> int:
    from xtrain.data import detect_format
    from xtrain.data.hub import default_out_dir, hub_source
    from xtrain.data.saved import is_saved_dataset
    from xtrain.io.rundir import DirLock

    name = args.source[0] if len(args.source) == 1 else None
    hub = hub_source(name, args.text_column, args.split, args.val_split) if name else None
    named = hub is not None or name == "stories"
    token_dir = not named and name is not None and detect_format(name) is not None
    saved = not named and name is not None and is_saved_dataset(name)
    if name == "stories" and (args.tokenizer is not None or args.eot is not None):
        raise UsageError("stories are tokenized with the built-in stream's own BPE: --tokenizer and "
                         "--eot do not apply")
    if not named:
        table = [(f, v) for f, v in (("--text-column", args.text_column), ("--split", args.split),
                                     ("--val-split", args.val_split)) if v]
        if table and not saved:
            raise UsageError(f"{table[0][0]} applies to tinystories, hf:ORG/NAME or a saved "
                             f"dataset only")
        if args.tokens:
            raise UsageError("--tokens applies to stories only")
        for src in args.source:
            if not Path(src).exists():
                raise UsageError(f"source {src}: no such file or directory")
        if args.out is None and not token_dir:
            raise UsageError("--out is required when preparing files")
    out = args.out if args.out is not None else (name if token_dir else default_out_dir(name))
    progress = not args.no_progress
    with DirLock(out, "xtrain prepare"):  # a second prepare into the same directory refuses
        out = _prepare_into(args, name, hub, out, progress)
    print(f"prepared {out}")
    return 0


def _prepare_into(args, name, hub, out, progress: bool):
    if name == "stories":
        from xtrain.data import open_stream, write_stream_copy
        from xtrain.data.stream import DEFAULT_COPY_TOKENS

        return write_stream_copy(open_stream(progress=progress), out,
                                 args.tokens or DEFAULT_COPY_TOKENS, progress=progress)
    if hub is not None:
        from xtrain.data.hub import prepare_hub

        return prepare_hub(hub, out, vocab_size=args.vocab_size, tokenizer=args.tokenizer,
                          val_fraction=args.val_fraction, seed=args.seed,
                          overwrite=args.overwrite, progress=progress, eot=args.eot)
    from xtrain.data import prepare

    table = {k: v for k, v in (("text_column", args.text_column), ("split", args.split),
                               ("val_split", args.val_split)) if v is not None}
    return prepare(args.source if len(args.source) > 1 else args.source[0], out,
                   vocab_size=args.vocab_size, tokenizer=args.tokenizer,
                   val_fraction=args.val_fraction, seed=args.seed, overwrite=args.overwrite,
                   progress=progress, eot=args.eot, **table)


def cmd_sample(args) -> int:
    from xtrain.io import state
    from xtrain.trainer.train import SAMPLE_PROMPT, resolve_device, sample_texts

    if args.greedy and (args.temperature is not None or args.top_k is not None or args.top_p is not None):
        raise UsageError("--greedy cannot be combined with --temperature, --top-k or --top-p")
    _check_device(args.device)
    ckpt = state.load(args.ckpt)
    model = ckpt.build_model(resolve_device(args.device))
    model.eval()
    prompts = args.prompt
    if prompts is None:  # the prompt of the run's own sample (the start of a validation document)
        prompts = [(ckpt.meta.get("train_args") or {}).get("sample_prompt") or SAMPLE_PROMPT]
    texts = sample_texts(model, ckpt.tokenizer(), prompts, args.max_new_tokens, seed=args.seed,
                         temperature=args.temperature if args.temperature is not None else 0.8,
                         top_k=args.top_k if args.top_k is not None else 50, top_p=args.top_p,
                         greedy=args.greedy, cuda_graphs=args.cuda_graphs)
    if len(texts) == 1:
        print(texts[0])
    else:
        for i, text in enumerate(texts):
            print(f"=== sample {i + 1} ===\n{text}")
    return 0


def cmd_export(args) -> int:
    from xtrain.io.export import export

    out = export(args.ckpt, args.out, dtype=args.dtype, overwrite=args.overwrite)
    print(f"exported {args.ckpt} to {out} ({args.dtype})")
    return 0


def _check_device(device: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise UsageError(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")


_COMMANDS = {"train": cmd_train, "prepare": cmd_prepare, "sample": cmd_sample, "export": cmd_export}


if __name__ == "__main__":
    sys.exit(main())
