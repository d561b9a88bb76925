"""The `xtrain` command: train, prepare, sample, export.

    xtrain train                                  # built-in stories: tiny (CPU), dim768 bf16 (GPU)
    xtrain train --resume --steps 2000            # continue it (runs/tiny-stories, runs/dim768-stories)
    xtrain train --preset dim384 --data corpus.jsonl --bf16 --steps 5000   # into runs/dim384-corpus
    xtrain train --out runs/d384 --resume         # continue runs/d384/ckpt with its config.toml
    xtrain train --config run.toml --steps 2000   # a config file; flags override it
    xtrain train --help                           # every option by section, with its default
    xtrain train --preset dim768 --bf16 --batch auto --batch-tokens 0.5M --recompute auto
    xtrain train --init-from Qwen/Qwen3-0.6B --data corpus.txt --bf16 --steps 500   # hub or local weights
    xtrain prepare corpus.jsonl --out data/corpus --vocab-size 8192
    xtrain prepare tinystories                    # from the Hugging Face hub into data/tinystories
    xtrain prepare hf:ORG/NAME --text-column text --split train --tokenizer gpt2
    xtrain prepare stories --tokens 25000000      # a finite copy of the built-in stream
    xtrain prepare corpus.txt --out data/c --tokenizer llama/tokenizer.json   # or a .model
    xtrain prepare data/openwebtext               # nanoGPT/llm.c token files: read in place (gpt2)
    xtrain prepare saved_ds --out data/s --tokenizer gpt2   # a datasets.save_to_disk directory
    xtrain sample --ckpt runs/tiny-stories --prompt "Once upon a time" --temperature 0.8 --top-k 50
    xtrain sample --ckpt runs/tiny-stories/ckpt --prompt "A cat" --prompt "The sun" --top-p 0.9 --seed 1
    xtrain export --ckpt runs/tiny-stories --out hf/tiny --dtype bf16   # a run folder: its ckpt/
    xtrain --version

The train flags are made from xtrain.trainer.runconfig's TrainConfig fields (and CommandOptions'):
a new option of a run is a new field declared with opt(), which gives it its flag, help, section,
default and check; nothing here changes.

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
import sys
from pathlib import Path

import xtrain
from xtrain import settings
from xtrain.trainer import runconfig


class UsageError(Exception):
    """A problem with the command line that argparse cannot see (e.g. a path that is missing)."""


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
_nonneg_float = _number(float, "number", lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0")
_probability = _number(float, "number", lambda v: 0 < v <= 1, "in (0, 1]")


def _seed(text: str) -> int:
    """A generator seed: 0 <= seed < 2**64 (what the engine's generators take)."""
    v = _nonneg_int(text)
    if v >= 2**64:
        raise argparse.ArgumentTypeError(f"must be below 2**64, got {v}")
    return v


class _Switch(argparse.Action):
    """The flags of a bool option in one help entry, each setting its value (--bf16: True,
    --fp32: False); two that disagree are an error, as in a mutually exclusive group. For options
    left out of the namespace until given (default=argparse.SUPPRESS)."""

    def __init__(self, option_strings, dest, values: dict, **kw):
        super().__init__(option_strings, dest, nargs=0, **kw)
        self.values = values

    def __call__(self, parser, namespace, _, option_string=None):
        value = self.values[option_string]
        if getattr(namespace, self.dest, value) is not value:
            other = next(f for f, v in self.values.items() if v is not value)
            parser.error(f"argument {option_string}: not allowed with argument {other}")
        setattr(namespace, self.dest, value)


def _add_train_options(t: argparse.ArgumentParser) -> None:
    """One flag (or pair of flags) per option of xtrain.trainer.runconfig (TrainConfig's fields and
    CommandOptions'), in its section, with its help and its default said once. Options not given
    are left out of the parsed namespace (so a flag given beats a config file); their text is read
    and checked by runconfig.value_of, as a config file's values are."""
    sections = {None: t, **{g: t.add_argument_group(g) for g in runconfig.GROUPS}}
    metavars = {int: "N", float: "X", tuple: "NAMES"}
    for name in runconfig.OPTIONS:
        o = runconfig.option(name)
        text = f"{o.help} (default: {runconfig.shown_default(name)})".replace("%", "%%")
        kw = dict(dest=name, default=argparse.SUPPRESS, help=text)
        if o.switch:
            kw.update(action=_Switch, values=o.switch)
        else:
            kw["metavar"] = o.metavar or ("{" + ",".join(o.choices) + "}" if o.choices else
                                          metavars.get(o.type, name.upper()))
            if o.alone is not None:
                kw.update(nargs="?", const=o.alone)
        sections[o.group].add_argument(*runconfig.flags_of(name), **kw)


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
    p.add_argument("--version", action="version", version=f"xtrain {xtrain.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    cpu, gpu = (runconfig.MACHINE_DEFAULTS[k] for k in ("cpu", "cuda"))
    t = sub.add_parser("train", help="train a model (default: on the built-in stories)",
                       usage="xtrain train [options]",
                       description=f"Train a transformer language model. With no options, trains on "
                       f"the built-in stories (an endless stream) and prints a sample, with defaults "
                       f"that fit the machine: the {cpu['preset']} preset on a CPU, {gpu['preset']}"
                       f"{' in bf16' if gpu['bf16'] else ''} on a GPU. Precedence, lowest first: those "
                       f"defaults, the run's record (--resume), a --config file, the flags given here.")
    _add_train_options(t)

    pr = sub.add_parser("prepare", help="tokenize a corpus into train/val shards",
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
    pr.add_argument("--vocab-size", type=_positive_int, default=4096, help="BPE vocabulary size (default: 4096)")
    pr.add_argument("--tokenizer", default=None, metavar="bpe|gpt2|PATH",
                    help="bpe (trained on the text), gpt2 (tiktoken), or a tokenizer file: a Hugging "
                         "Face tokenizer.json, a SentencePiece .model, or a directory holding one "
                         "(default: bpe; gpt2 for nanoGPT/llm.c token files)")
    pr.add_argument("--eot", default=None, metavar="TOKEN",
                    help="the end-of-text token of a tokenizer file, e.g. '</s>' (default: the "
                         "eos_token of a tokenizer_config.json beside it, the model's eos piece, or "
                         "the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> it has)")
    pr.add_argument("--val-fraction", type=float, default=0.01,
                    help="fraction of documents for validation (default: 0.01)")
    pr.add_argument("--seed", type=_seed, default=0, help="seed of the train/val split (default: 0)")
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

    s = sub.add_parser("sample", help="generate text from a checkpoint")
    s.add_argument("--ckpt", required=True, metavar="DIR",
                   help="a checkpoint directory, or a run folder: its ckpt/ (e.g. runs/tiny-stories)")
    s.add_argument("--prompt", action="append", default=None,
                   help="text to continue; repeat it for a batch of prompts, generated together "
                        "(default: the run's sample prompt, e.g. 'Once upon a time')")
    s.add_argument("--greedy", action="store_true", help="always take the most likely token")
    s.add_argument("--temperature", type=_nonneg_float, default=None,
                   help="sampling temperature, 0 for greedy (default: 0.8)")
    s.add_argument("--top-k", type=_positive_int, default=None, help="sample among the K most likely (default: 50)")
    s.add_argument("--top-p", type=_probability, default=None,
                   help="sample among the most likely tokens whose probabilities sum to P, in (0, 1] "
                        "(default: 1, off)")
    s.add_argument("--max-new-tokens", type=_nonneg_int, default=200,
                   help="tokens to generate per prompt (a sample also ends at the end-of-text token "
                        "or at the model's max_seq) (default: 200)")
    s.add_argument("--seed", type=_seed, default=0, help="sampling seed (default: 0)")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default: auto)")
    sgraphs = s.add_mutually_exclusive_group()
    sgraphs.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_const", const=True, default=True,
                         help="on a GPU, capture the decode step as a CUDA graph and replay it for every "
                              "token (the default; the same tokens; no effect on the CPU)")
    sgraphs.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_const", const=False,
                         help="run every decode step eagerly")

    e = sub.add_parser("export", help="export a checkpoint in the Hugging Face Qwen3 layout")
    e.add_argument("--ckpt", required=True, metavar="DIR",
                   help="a checkpoint directory, or a run folder: its ckpt/")
    e.add_argument("--out", required=True, help="output directory (loads with transformers)")
    e.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="weight dtype (default: bf16)")
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
        from xtrain.trainer.train import DivergedRunError, NonFiniteStepsError

        who = _who(args)
        if isinstance(e, RankStopped):  # another rank failed; its own message says why
            print(f"{who}stopped: {_first_line(e).split(' stopped because ', 1)[-1]}", file=sys.stderr)
            return EXIT_STOPPED
        if isinstance(e, (NonFiniteStepsError, DivergedRunError)):
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
    from xtrain.io.rundir import claim_run
    from xtrain.trainer.train import train

    group = _process_group()
    values = _train_values(args, group)
    if values["data"] is not None and not Path(values["data"]).exists():
        raise UsageError(f"--data {values['data']}: no such file or directory")
    if values["init_from"] is not None:  # a hub name: its snapshot in the Hugging Face cache, now
        from xtrain.models.hf_import import resolve_pretrained

        values["init_from"] = str(resolve_pretrained(values["init_from"]))
    cfg = runconfig.train_config(values)
    try:
        _check_train_config(cfg, values["devices"], group)
    except runconfig.ConfigError as e:
        raise _name_recorded(e, values.get(RECORDED, ())) from None

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


# _train_values's key for the names whose value came from the resumed run's record alone.
RECORDED = "_recorded"


def _name_recorded(e: Exception, recorded) -> Exception:
    """A configuration error that names a flag the user did not give, whose value came from the
    resumed run's record: said so, with how to change it."""
    text = str(e)
    for name in recorded:
        flag = runconfig.flags_of(name)[0]
        if text.startswith(flag + " "):
            return runconfig.ConfigError(
                f"the resumed run's {flag[2:]} (recorded in its {runconfig.CONFIG_FILE}, not given here): "
                f"{text}; pass {flag} to change it")
    return e


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
    from xtrain.trainer import batching, trackers

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
    """The train options' values, name -> value (xtrain.trainer.runconfig.OPTIONS): their defaults,
    then the machine's defaults (runconfig.MACHINE_DEFAULTS: a GPU trains dim768 in bf16, a CPU the
    tiny model), then the resumed run's record (OUT/config.toml), then the --config file, then the
    flags given on the command line, each value read and checked by runconfig. `group`: the process
    group this process is a rank of (its GPU count replaces --devices, which picks threads)."""
    from xtrain.io import state
    from xtrain.trainer.train import CKPT_DIR, resolve_device

    given = {name: runconfig.value_of(name, value) for name, value in vars(args).items() if name != "command"}
    file = runconfig.read_config(given["config"]) if "config" in given else {}
    # out None: runs/MODEL-DATA (default_out), once the model and the data are known
    defaults = {**{name: runconfig.default_of(name) for name in runconfig.OPTIONS}, "out": None}
    chosen = {**defaults, **file, **given}
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
    if chosen["init_from"] is not None and chosen["resume"] is not None:
        raise UsageError("--init-from starts a new run from pretrained weights and --resume continues a "
                         "checkpoint: give one of them")
    machine = runconfig.machine_defaults(resolve_device(chosen["device"]) if devices == 1 else "cuda")
    fresh = {**defaults, **machine, **file, **given}  # a new run's values: --resume alone finds its OUT
    if chosen["resume"] is not None or chosen["init_from"] is not None:
        machine.pop("preset")  # a resumed run keeps its model, --init-from brings one
    values = {**defaults, **machine}
    if given.get("resume") is not None:
        resume = fresh["resume"] or str(Path(fresh["out"] or default_out(fresh)) / CKPT_DIR)
        state.resolve(resume)  # a clear error now rather than after the data is prepared
        record = runconfig.read_record(resume)
        record.pop("init_from", None)  # how the run began: the checkpoint holds the model now
        record.setdefault("doc_mask", False)  # a record without it: a run from before --doc-mask, causal
        values.update(record)
        given["resume"] = resume
    recorded = {name for name in values if name in record} - set(file) - set(given) if given.get("resume") else set()
    values.update(file)
    values.update(given)
    values[RECORDED] = sorted(recorded)
    values["out"] = values["out"] or default_out(values)
    if group is not None:
        values["devices"] = group.world_size  # the record's GPU count, whatever it was
    return values


def default_out(values: dict) -> str:
    """runs/MODEL-DATA, the run directory when --out is not given: MODEL the preset (or the name of
    the --init-from model), DATA the name of --data (a file without its suffix; the built-in
    stories: stories), so that runs of one model on two datasets do not share a directory, and
    `--resume` alone, given the same --preset and --data, finds the run again."""
    if values.get("init_from") is not None:
        model = Path(values["init_from"]).name
    else:
        model = values["preset"] or "tiny"
    if values["data"] is None:
        data = "stories"
    else:
        path = Path(values["data"])
        data = (path.stem if path.is_file() else path.name) or path.resolve().name or "data"
    return f"runs/{model}-{data}"


def cmd_prepare(args) -> int:
    from xtrain.data import detect_format
    from xtrain.data.hub import default_out_dir, hub_source
    from xtrain.data.layout import read_meta
    from xtrain.data.saved import is_saved_dataset
    from xtrain.data.write import split_counts
    from xtrain.io.rundir import DirLock, check_prepare_dir, enclosing_run

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
    check_prepare_dir(out)
    run = enclosing_run(out)
    # A second prepare into the same directory refuses, and so does one into the folder of a run
    # that is training (RUN/data): it would replace the data under it.
    with DirLock(run, "xtrain prepare") if run is not None else contextlib.nullcontext():
        with DirLock(out, "xtrain prepare"):
            out = _prepare_into(args, name, hub, out, progress)
    print(f"prepared {out}")
    counts = split_counts(read_meta(out))
    if counts:
        print(counts)
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
    from xtrain.io.export import checkpoint_in
    from xtrain.trainer.train import SAMPLE_PROMPT, resolve_device, sample_texts

    if args.greedy and (args.temperature is not None or args.top_k is not None or args.top_p is not None):
        raise UsageError("--greedy cannot be combined with --temperature, --top-k or --top-p")
    runconfig.check("device", args.device)
    for text in args.prompt or ():
        _check_text(text, "--prompt")
    source = checkpoint_in(args.ckpt)
    with state.reading(source):  # a save into the run waits: one checkpoint's files
        ckpt = state.load(source)
        model = ckpt.build_model(resolve_device(args.device))
        tokenizer = ckpt.tokenizer()
    model.eval()
    prompts = args.prompt
    if prompts is None:  # the prompt of the run's own sample (the start of a validation document)
        prompts = [(ckpt.meta.get("train_args") or {}).get("sample_prompt") or SAMPLE_PROMPT]
    texts = sample_texts(model, tokenizer, prompts, args.max_new_tokens, seed=args.seed,
                         temperature=args.temperature if args.temperature is not None else 0.8,
                         top_k=args.top_k if args.top_k is not None else 50, top_p=args.top_p,
                         greedy=args.greedy, cuda_graphs=args.cuda_graphs)
    if len(texts) == 1:
        print(texts[0])
    else:
        for i, text in enumerate(texts):
            print(f"=== sample {i + 1} ===\n{text}")
    return 0


def _check_text(text: str, flag: str) -> None:
    """UsageError unless `text` (an argument) is UTF-8: bytes that are not arrive as lone
    surrogates (Python's surrogateescape), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"{flag}: not UTF-8 text (byte {e.object[e.start:e.end].encode('utf-8', 'surrogateescape')!r} "
                         f"at character {e.start})") from None


def cmd_export(args) -> int:
    from xtrain.io.export import checkpoint_in, export

    ckpt = checkpoint_in(args.ckpt)
    out = export(ckpt, args.out, dtype=args.dtype, overwrite=args.overwrite)
    print(f"exported {ckpt} to {out} ({args.dtype})")
    return 0


_COMMANDS = {"train": cmd_train, "prepare": cmd_prepare, "sample": cmd_sample, "export": cmd_export}


if __name__ == "__main__":
    sys.exit(main())
