"""The `xtrain` command: train, prepare, sample, export.

    xtrain train                                  # built-in stories: tiny (CPU), dim768 bf16 (GPU)
    xtrain train --preset dim384 --data corpus.jsonl --bf16 --steps 5000 --out runs/d384
    xtrain train --out runs/d384 --resume         # continue runs/d384/ckpt
    xtrain prepare corpus.jsonl --out data/corpus --vocab-size 8192
    xtrain prepare tinystories                    # from the Hugging Face hub into data/tinystories
    xtrain prepare hf:ORG/NAME --text-column text --split train --tokenizer gpt2
    xtrain prepare stories --tokens 25000000      # a finite copy of the built-in stream
    xtrain sample --ckpt runs/tiny/ckpt --prompt "Once upon a time" --temperature 0.8 --top-k 50
    xtrain export --ckpt runs/tiny/ckpt --out hf/tiny --dtype bf16

Errors a user can fix (bad flags, missing paths, a checkpoint or dataset that does not fit, a
locked or occupied directory, a full disk) print one line `xtrain: error: ...` and exit with
status 2; anything else prints one `xtrain: internal error: ...` line and exits with 1, never a
raw traceback. XTRAIN_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from xtrain.models.transformer import PRESETS

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


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid positive integer {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def _nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid non-negative integer {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _devices_arg(text: str):
    return "all" if text.strip().lower() == "all" else _positive_int(text)


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


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
                   help="a prepared data directory, or a .txt/.jsonl/.parquet file or directory to "
                        "prepare into OUT/data (default: the built-in stories, made on the fly)")
    t.add_argument("--out", default=None,
                   help="run directory: log, checkpoint, plot, sample (default: runs/PRESET)")
    t.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N")
    prec = t.add_mutually_exclusive_group()
    prec.add_argument("--bf16", dest="bf16", action="store_const", const=True, default=None,
                      help="mixed precision: bf16 compute, fp32 master weights (default: machine)")
    prec.add_argument("--fp32", dest="bf16", action="store_const", const=False,
                      help="float32 throughout")
    t.add_argument("--recompute", action="store_true",
                   help="activation recompute: checkpoint every block (bitwise-identical results)")
    t.add_argument("--dropout", type=float, default=0.0, help="dropout on embeddings and residual branches")
    t.add_argument("--batch", type=_positive_int, default=None,
                   help="sequences per step (default: machine)")
    t.add_argument("--seq", type=_positive_int, default=None,
                   help="tokens per sequence (default: machine)")
    t.add_argument("--steps", type=_positive_int, default=None,
                   help="total optimizer steps (default: machine)")
    t.add_argument("--decay-steps", type=_positive_int, default=None,
                   help="length of the cosine LR schedule (default: --steps)")
    t.add_argument("--lr", type=_positive_float, default=None,
                   help="peak learning rate (default: per preset, tiny 2e-3 ... dim1024 5e-4; "
                        "the checkpoint's with --resume)")
    t.add_argument("--min-lr", type=float, default=None, help="final learning rate (default: lr/10)")
    t.add_argument("--warmup", type=_nonneg_int, default=50, help="linear warm-up steps")
    t.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (2-D weights)")
    t.add_argument("--grad-clip", type=float, default=1.0, help="global grad-norm clip (0: off)")
    t.add_argument("--eval-every", type=_nonneg_int, default=None,
                   help="validation every N steps (0: off; default: machine)")
    t.add_argument("--eval-batches", type=_positive_int, default=20, help="validation batches per eval")
    t.add_argument("--save-every", type=_nonneg_int, default=1000,
                   help="checkpoint every N steps (0: only at the end)")
    t.add_argument("--resume", nargs="?", const="", default=None, metavar="CKPT",
                   help="continue from a checkpoint directory (no value: OUT/ckpt)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (its checkpoint, log, plot and sample)")
    t.add_argument("--memory-limit", type=parse_size, default=None, metavar="SIZE",
                   help="cap the device allocator, e.g. 32GiB or 500MB (default: no cap)")
    t.add_argument("--seed", type=_nonneg_int, default=0, help="seed for weights, data order and sampling")
    t.add_argument("--devices", type=_devices_arg, default=1,
                   help="GPUs for data parallelism: N (the first N) or all; --batch is per GPU")
    t.add_argument("--no-shard-optimizer", action="store_true",
                   help="with --devices: all-reduce the gradients and run AdamW on every GPU, instead of "
                        "reduce-scatter, AdamW on each GPU's share and all-gather (the default; same results)")
    t.add_argument("--vocab-size", type=_positive_int, default=4096,
                   help="BPE vocabulary when --data is a raw source")
    t.add_argument("--sample-tokens", type=_nonneg_int, default=200, help="length of the final sample")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")

    pr = sub.add_parser("prepare", help="tokenize a corpus into train/val shards", formatter_class=fmt,
                        description="Train a byte-level BPE (or use GPT-2's) on SOURCE and write "
                        "tokenizer, train.bin, val.bin and meta.json into --out. SOURCE is files "
                        "or directories, or one name: `tinystories` or `hf:ORG/NAME` (a Hugging "
                        "Face hub dataset, downloaded once into its cache; needs `datasets`), or "
                        "`stories` (a finite copy of the built-in stream).")
    pr.add_argument("source", nargs="+",
                    help=".txt/.jsonl/.parquet files or directories; or tinystories, "
                         "hf:ORG/NAME or stories")
    pr.add_argument("--out", default=None,
                    help="output directory (required for files; default data/NAME for a name)")
    pr.add_argument("--vocab-size", type=_positive_int, default=4096, help="BPE vocabulary size")
    pr.add_argument("--tokenizer", choices=("bpe", "gpt2"), default="bpe", help="tokenizer kind")
    pr.add_argument("--val-fraction", type=float, default=0.01, help="fraction of documents for validation")
    pr.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the train/val split")
    pr.add_argument("--overwrite", action="store_true", help="replace a directory prepared differently")
    pr.add_argument("--text-column", default=None,
                    help="hub datasets: the text column (default: text)")
    pr.add_argument("--split", default=None,
                    help="hub datasets: the training split (default: train)")
    pr.add_argument("--val-split", default=None,
                    help="hub datasets: a held-out split to validate on (tinystories: validation; "
                         "default: --val-fraction of the training split)")
    pr.add_argument("--tokens", type=_positive_int, default=None,
                    help="stories: training tokens in the copy (default: 1200000)")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar")

    s = sub.add_parser("sample", help="generate text from a checkpoint", formatter_class=fmt)
    s.add_argument("--ckpt", required=True, help="checkpoint directory (e.g. runs/tiny/ckpt)")
    s.add_argument("--prompt", default="Once upon a time", help="text to continue")
    s.add_argument("--greedy", action="store_true", help="always take the most likely token")
    s.add_argument("--temperature", type=_positive_float, default=None, help="sampling temperature (default 0.8)")
    s.add_argument("--top-k", type=_positive_int, default=None, help="sample among the K most likely (default 50)")
    s.add_argument("--max-new-tokens", type=_nonneg_int, default=200, help="tokens to generate")
    s.add_argument("--seed", type=_nonneg_int, default=0, help="sampling seed")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")

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
        print("xtrain: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("XTRAIN_DEBUG"):
            raise
        import xtrain

        if isinstance(e, (xtrain.OutOfMemoryError, MemoryError)):
            print(f"xtrain: out of memory: {_first_line(e)}", file=sys.stderr)
            return 1
        if isinstance(e, (UsageError, ValueError)):
            print(f"xtrain: error: {_first_line(e)}", file=sys.stderr)
            return 2
        if isinstance(e, OSError):  # a missing path, a full disk, permissions
            text = e.strerror or _first_line(e)
            print(f"xtrain: error: {f'{e.filename}: {text}' if e.filename else text}", file=sys.stderr)
            return 2
        print(f"xtrain: internal error: {type(e).__name__}: {_first_line(e)} (XTRAIN_DEBUG=1 "
              f"shows the traceback)", file=sys.stderr)
        return 1


def _first_line(e: BaseException) -> str:
    msg = str(e).strip()
    return msg.splitlines()[0] if msg else type(e).__name__


def cmd_train(args) -> int:
    from xtrain.train import CKPT_DIR, TrainConfig, machine_defaults, resolve_device, train

    if args.devices != 1:
        from xtrain import distributed

        try:
            distributed.require_available()
            distributed.resolve_devices(args.devices)
        except (RuntimeError, ValueError) as e:
            raise UsageError(f"--devices {args.devices}: {e}") from None
    if args.data is not None and not Path(args.data).exists():
        raise UsageError(f"--data {args.data}: no such file or directory")
    if not 0.0 <= args.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {args.dropout}")
    _check_device(args.device)
    # Flags not given take the defaults of the machine the run trains on (GPU or CPU).
    machine = machine_defaults(resolve_device(args.device) if args.devices == 1 else "cuda")
    for name in ("bf16", "batch", "seq", "steps", "eval_every"):
        if getattr(args, name) is None:
            setattr(args, name, machine[name])
    preset = args.preset if args.preset or args.resume is not None else machine["preset"]
    out = args.out or f"runs/{preset or machine['preset']}"
    resume = None
    if args.resume is not None:
        resume = args.resume or str(Path(out) / CKPT_DIR)
        from xtrain import state

        state.resolve(resume)  # a clear error now rather than after the data is prepared
    cfg = TrainConfig(preset=preset, data=args.data, out=out, device=args.device,
                      bf16=args.bf16, recompute=args.recompute, dropout=args.dropout,
                      batch=args.batch, seq=args.seq, steps=args.steps, decay_steps=args.decay_steps,
                      lr=args.lr, min_lr=args.min_lr, warmup=args.warmup,
                      weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                      eval_every=args.eval_every, eval_batches=args.eval_batches,
                      save_every=args.save_every, resume=resume, memory_limit=args.memory_limit,
                      seed=args.seed, vocab_size=args.vocab_size, sample_tokens=args.sample_tokens,
                      progress=not args.no_progress, shard_optimizer=not args.no_shard_optimizer)
    from xtrain.rundir import claim_run

    with claim_run(out, resume, args.overwrite) as lock:  # refuses a locked or occupied --out
        if lock.took_over:
            print(f"xtrain: note: {out} was locked by pid {lock.took_over.get('pid')}, which is no "
                  f"longer running; taking it over", file=sys.stderr)
        if args.devices == 1:
            train(cfg)
        else:
            from xtrain.train import train_data_parallel

            train_data_parallel(cfg, args.devices)
    return 0


def cmd_prepare(args) -> int:
    from xtrain.data.hub import default_out_dir, hub_source
    from xtrain.rundir import DirLock

    name = args.source[0] if len(args.source) == 1 else None
    hub = hub_source(name, args.text_column, args.split, args.val_split) if name else None
    named = hub is not None or name == "stories"
    if not named:
        given = [f for f, v in (("--text-column", args.text_column), ("--split", args.split),
                                ("--val-split", args.val_split), ("--tokens", args.tokens)) if v]
        if given:
            raise UsageError(f"{given[0]} applies to tinystories, hf:ORG/NAME or stories only")
        for src in args.source:
            if not Path(src).exists():
                raise UsageError(f"source {src}: no such file or directory")
        if args.out is None:
            raise UsageError("--out is required when preparing files")
    out = args.out if args.out is not None or not named else default_out_dir(name)
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
                          overwrite=args.overwrite, progress=progress)
    from xtrain.data import prepare

    return prepare(args.source if len(args.source) > 1 else args.source[0], out,
                   vocab_size=args.vocab_size, tokenizer=args.tokenizer,
                   val_fraction=args.val_fraction, seed=args.seed, overwrite=args.overwrite,
                   progress=progress)


def cmd_sample(args) -> int:
    from xtrain import state
    from xtrain.train import resolve_device, sample_text

    if args.greedy and (args.temperature is not None or args.top_k is not None):
        raise UsageError("--greedy cannot be combined with --temperature or --top-k")
    _check_device(args.device)
    ckpt = state.load(args.ckpt)
    model = ckpt.build_model(resolve_device(args.device))
    model.eval()
    text = sample_text(model, ckpt.tokenizer(), args.prompt, args.max_new_tokens, seed=args.seed,
                       temperature=args.temperature or 0.8,
                       top_k=args.top_k if args.top_k is not None else 50, greedy=args.greedy)
    print(text)
    return 0


def cmd_export(args) -> int:
    from xtrain.export import export

    out = export(args.ckpt, args.out, dtype=args.dtype, overwrite=args.overwrite)
    print(f"exported {args.ckpt} to {out} ({args.dtype})")
    return 0


def _check_device(device: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device):
        raise UsageError(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")


_COMMANDS = {"train": cmd_train, "prepare": cmd_prepare, "sample": cmd_sample, "export": cmd_export}


if __name__ == "__main__":
    sys.exit(main())
