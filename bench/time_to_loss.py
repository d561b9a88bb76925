"""Time to a good model: xtrain's recipes against PyTorch's, to validation-loss targets.

    python bench/time_to_loss.py --data DIR --preset dim768 --batch 32 --seq 512 --steps 1500 \\
        --eval-every 50 --targets 2.5,2.0,1.7 --lrs 3e-4,6e-4,1.2e-3
    python bench/time_to_loss.py --device cpu --preset tiny --batch 4 --seq 64 --steps 6 \\
        --eval-every 3 --eval-batches 2 --targets 7,6 --lrs 1e-3 --arms xtrain-adamw,torch-adamw \
        --compile-mode none   # smoke
    python bench/time_to_loss.py --corpus .gpu/corpus --preset gpt2-124m ...   # the race's corpus

--stream races on the built-in stories as `xtrain train` streams them by default (every step fresh
stories, the same order for every arm: the stream's loader with --seed; its held-out set), where
the default --data (the built-in stories' prepared copy, 1.2M tokens) is read many times over and
overfits within a few hundred steps of dim768.
--corpus DIR reads the folder scripts/race_corpus.py writes (English documentation of the Python,
Perl and Vim projects from Debian's packages, GPT-2's tokenizer, 5% of the documents held out):
its data/ is the prepared directory, its manifest.json goes into the result. --preset takes any
architecture's preset: the Qwen3-style ones (tiny ... dim1024) or GPT-2's (gpt2-124m is d12).

Every arm trains the same model from the same initial weights (xtrain's init for --seed, copied
into the PyTorch model) on the same token order (the prepared --data directory's training windows
drawn with --seed: the loader `xtrain train` itself uses), with the same LR schedule (linear
warm-up, then --schedule down to --min-lr-ratio x lr at --steps: default cosine to lr/10; wsd
holds the peak and decays linearly over the last 20%), clipping at 1.0, and evaluates on the same validation batches
every --eval-every steps. Per arm and learning rate it records the validation curve against
training tokens and training wall time (evaluations left out) and, per target, the first
evaluation at or below it: its step, tokens and seconds. Arms:

  xtrain-adamw, xtrain-muon             `xtrain train` itself (CUDA graphs, fused kernels), with
                                         attention within documents (--doc-mask, its default)
  xtrain-adamw-nodoc, xtrain-muon-nodoc  the same with --no-doc-mask
  torch-adamw                            the same model in PyTorch under a whole-model
                                         torch.compile, fused AdamW: bench/torch_model.py's peer,
                                         or for GPT-2 transformers' GPT2LMHeadModel (SDPA
                                         attention, bf16 autocast) with the same weights
  torch-muon                             the same with torch.optim.Muon for the blocks' matrices
                                         (AdamW for the rest, as xtrain's Muon splits them; GPT-2's
                                         GPT2LMHeadModel holds q, k and v as one c_attn matrix,
                                         which Muon orthogonalises whole: xtrain's are three)

Every arm runs each LR of --lrs (the sweep is recorded); an arm's best LR per target is the one
that reaches it soonest. `speedup_vs_pytorch` per target: the best PyTorch arm's seconds over the
best xtrain arm's; `muon_token_ratio`: AdamW's tokens over Muon's (xtrain, doc mask on; `_nodoc`:
off; `torch_muon_token_ratio`: PyTorch's arms). Time
counts what a user waits for: the xtrain arms' step times as `xtrain train` logs them (device
events; the first steps include the CUDA graphs' warm-up and capture), the PyTorch arms' training
segments between evaluations with a device sync at each end (the first includes compilation).

Results: bench/results/time_to_loss-PRESET-DATE.json, and beside it the curves as a .png (validation
loss against training seconds and against tokens, one line per arm and LR), rewritten after every run (a call cut short
keeps the runs it finished). --merge FILE... writes one result from several calls' files of the same
preset, batch, seq, steps, schedule and evaluations (a sweep split over calls), summarised together
(files written before --schedule existed count as cosine to lr/10).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

import common
from xtrain.trainer.schedule import SCHEDULES

ARMS = ("xtrain-adamw", "xtrain-muon", "xtrain-adamw-nodoc", "xtrain-muon-nodoc", "torch-adamw", "torch-muon")
BETAS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 0.1, 1.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", help="a prepared data directory (default: the built-in stories' prepared copy)")
    src.add_argument("--corpus", help="a folder written by scripts/race_corpus.py (its data/ and manifest.json)")
    src.add_argument("--stream", action="store_true",
                     help="the built-in stories as `xtrain train` streams them by default (fresh stories every step, "
                          "the stream's held-out set): no corpus to overfit")
    p.add_argument("--device", default="auto")
    p.add_argument("--preset", default="dim768")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=1000, help="steps of every run (the schedule's length)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--schedule", default="cosine", choices=SCHEDULES,
                   help="the LR after the warm-up, for every arm (xtrain train's --schedule)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="the schedule's final LR as a share of each run's peak LR (default 0.1)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=10)
    p.add_argument("--targets", help="validation-loss targets, comma-separated (required unless --merge)")
    p.add_argument("--lrs", help="peak learning rates of the sweep, comma-separated (required unless --merge)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--fp32", action="store_true", help="float32 (default: bf16 mixed precision)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode of the PyTorch arms (none: eager, for a CPU smoke run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(common.RESULTS_DIR))
    p.add_argument("--tag", default="")
    p.add_argument("--merge", nargs="+", metavar="FILE",
                   help="combine earlier result files of one setting (their runs, summarised together; with "
                        "--targets, at those targets, read off each run's curve); runs nothing")
    args = p.parse_args(argv)
    if args.targets is not None:
        try:
            args.targets = sorted((float(t) for t in args.targets.split(",")), reverse=True)
        except ValueError:
            p.error(f"--targets takes numbers separated by commas, got {args.targets!r}")
    if args.merge:
        return args
    if not args.targets or not args.lrs:
        p.error("--targets and --lrs are required (unless --merge)")
    args.lrs = [float(v) for v in args.lrs.split(",")]
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in args.arms if a not in ARMS]
    if bad or not args.arms:
        p.error(f"unknown arms {bad}; choose from {', '.join(ARMS)}")
    for name in ("batch", "seq", "steps", "eval_every", "eval_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.min_lr_ratio <= 1:
        p.error(f"--min-lr-ratio must be in [0, 1], got {args.min_lr_ratio}")
    return args


def reached(curve: list, targets: list) -> dict:
    """Per target, the first evaluation at or below it: {target: {step, tokens, seconds}} (None:
    not reached). curve: [{step, tokens, seconds, val_loss}] in step order."""
    out = {}
    for t in targets:
        hit = next((c for c in curve if c["val_loss"] <= t), None)
        out[str(t)] = None if hit is None else {k: hit[k] for k in ("step", "tokens", "seconds")}
    return out


def run_xtrain(args, arm: str, lr: float, data: str, device: str) -> list:
    """`xtrain train` for one arm and LR; the curve from its log.jsonl: after each evaluation's
    step, the tokens trained and the sum of the logged step times (evaluations left out)."""
    from xtrain.trainer.train import TrainConfig, train

    with tempfile.TemporaryDirectory(prefix="ttl-") as out:
        cfg = dict(preset=args.preset, data=data, out=out, device=device, batch=args.batch, seq=args.seq,
                   steps=args.steps, lr=lr, min_lr=lr * args.min_lr_ratio, warmup=args.warmup,
                   schedule=args.schedule,
                   eval_every=args.eval_every, eval_batches=args.eval_batches, save_every=0, save_minutes=0,
                   sample_tokens=0, progress=False, seed=args.seed, bf16=not args.fp32, grad_clip=CLIP,
                   beta1=BETAS[0], beta2=BETAS[1], weight_decay=WEIGHT_DECAY,
                   doc_mask=not arm.endswith("-nodoc"))
        if "-muon" in arm:
            cfg["optimizer"] = "muon"
        train(TrainConfig(**cfg))
        records = [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]
    curve, seconds, tokens, steps_done = [], 0.0, 0, 0
    for r in records:
        if "loss" in r and "ms" in r:
            seconds += r["ms"] / 1e3
            steps_done = r["step"] + 1
            tokens = steps_done * args.batch * args.seq
        elif "val_loss" in r and r["step"] > 0:
            curve.append({"step": r["step"], "tokens": tokens, "seconds": seconds, "val_loss": r["val_loss"]})
    return curve


def torch_gpt2(weights: dict, cfg, device: str):
    """transformers' GPT2LMHeadModel with xtrain's GPT-2 weights (models/hf_gpt2.py's names), SDPA
    attention, float32 master weights under bf16 autocast (float32 with --fp32), returning
    (logits, mean cross-entropy) as the xtrain model does. named: (name, parameter) pairs."""
    import torch
    import torch.nn.functional as F
    import transformers

    from xtrain.models import hf_gpt2

    hf = transformers.GPT2Config(**{k: v for k, v in hf_gpt2.hf_config(cfg, "float32", 0).items()
                                    if k not in ("architectures", "torch_dtype")})
    hf._attn_implementation = "sdpa"
    hf.use_cache = False
    inner = transformers.GPT2LMHeadModel(hf)
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in hf_gpt2.hf_tensors(weights, cfg).items()}
    missing, unexpected = inner.load_state_dict(tensors, strict=False)
    if unexpected or any(k != "lm_head.weight" and not k.endswith(".attn.bias") for k in missing):
        raise RuntimeError(f"GPT-2 peer: weights missing {missing[:4]}, unexpected {unexpected[:4]}")

    class LossModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, ids, targets):
            with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                logits = self.inner(input_ids=ids).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
            return logits, loss

    model = LossModel().to(device)
    model.named = list(inner.named_parameters())
    return model


def torch_optimizers(arm: str, model, lr: float) -> list:
    """AdamW over every parameter, or (torch-muon) torch.optim.Muon for the blocks' matrices
    beside AdamW for the rest, xtrain's split (bench/torch_model.py's helpers)."""
    import torch_model
    from xtrain.optim import block_matrices

    named = model.named if hasattr(model, "named") else list(zip(model.names, model.params))
    if arm != "torch-muon":
        return [torch_model.adamw(model, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY)]
    # GPT2LMHeadModel's names run "transformer.h.<i>.": its blocks' matrices by the same rule
    matrices = set(block_matrices((n.removeprefix("transformer."), p) for n, p in named))
    return torch_model.muon_and_adamw([p for n, p in named if n.removeprefix("transformer.") in matrices],
                                      [p for n, p in named if n.removeprefix("transformer.") not in matrices],
                                      lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


def run_torch(args, arm: str, lr: float, ds, weights: dict, cfg, device: str) -> list:
    """The PyTorch arm: the same weights, windows, schedule and evaluations; the curve as above."""
    import torch

    import torch_model
    from xtrain.models import GPT2Config
    from xtrain.trainer.schedule import Schedule

    compile = None if args.compile_mode == "none" else args.compile_mode
    if isinstance(cfg, GPT2Config):
        model = torch_gpt2(weights, cfg, device)
        opts = torch_optimizers(arm, model, lr)
        if compile is not None:
            model = torch.compile(model, mode=compile, dynamic=False)
    else:
        model = torch_model.build(weights, cfg, device, compile=compile)
        opts = torch_optimizers(arm, model, lr)
    params = list(model.parameters())
    loader = ds.loader("train", args.batch, args.seq, args.seed)
    evals = list(ds.loader("val", args.batch, args.seq, args.seed).iter_eval(args.batch, args.seq, args.eval_batches))
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    as_t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    curve, seconds = [], 0.0
    schedule = Schedule(args.schedule, lr, lr * args.min_lr_ratio, args.warmup, args.steps)
    sync()
    t0 = time.perf_counter()
    for step in range(args.steps):
        lr_now = schedule(step)
        for opt in opts:
            for group in opt.param_groups:
                group["lr"] = lr_now
        x, y = loader.next_batch()
        _, loss = model(as_t(x), as_t(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            sync()
            seconds += time.perf_counter() - t0
            with torch.no_grad():
                val = float(np.mean([model(as_t(a), as_t(b))[1].item() for a, b in evals]))
            curve.append({"step": step + 1, "tokens": (step + 1) * args.batch * args.seq, "seconds": seconds,
                          "val_loss": val})
            if not math.isfinite(val):
                break
            sync()
            t0 = time.perf_counter()
    del model, opts, params
    common.free_torch(device)
    return curve


def best(runs: dict, arms: list, target: str, key: str):
    """The soonest (by `key`) of the arms' runs to reach `target`: (arm, lr, value) or None."""
    hits = [(r["reached"][target][key], arm, lr) for arm in arms for lr, r in runs.get(arm, {}).items()
            if r["reached"][target] is not None]
    if not hits:
        return None
    value, arm, lr = min(hits)
    return {"arm": arm, "lr": lr, key: value}


def summarize(args, runs: dict) -> dict:
    xt = [a for a in runs if a.startswith("xtrain")]
    pt = [a for a in runs if a.startswith("torch")]
    out = {}
    for t in map(str, args.targets):
        row = {"xtrain_best": best(runs, xt, t, "seconds"), "pytorch_best": best(runs, pt, t, "seconds")}
        if row["xtrain_best"] and row["pytorch_best"]:
            row["speedup_vs_pytorch"] = row["pytorch_best"]["seconds"] / row["xtrain_best"]["seconds"]
        for key, adam_arm, muon_arm in (("muon_token_ratio", "xtrain-adamw", "xtrain-muon"),
                                        ("muon_token_ratio_nodoc", "xtrain-adamw-nodoc", "xtrain-muon-nodoc"),
                                        ("torch_muon_token_ratio", "torch-adamw", "torch-muon")):
            adam, muon = best(runs, [adam_arm], t, "tokens"), best(runs, [muon_arm], t, "tokens")
            if adam and muon:
                row[key] = adam["tokens"] / muon["tokens"]
        out[t] = row
    return out


# What the merged files must share: the runs are comparable only on the same model, data, order,
# schedule and evaluations.
MERGE_KEYS = ("data", "config", "batch", "seq", "steps", "warmup", "schedule", "min_lr_ratio", "eval_every",
              "eval_batches", "targets")
SETTING_DEFAULTS = {"schedule": "cosine", "min_lr_ratio": 0.1}  # what files without the key ran


def setting(result: dict, key: str):
    return result.get(key, SETTING_DEFAULTS.get(key))


def merge(args) -> None:
    """One result of several calls' files (--merge): their runs side by side, summarised together."""
    files = [json.loads(Path(f).read_text()) for f in args.merge]
    first = files[0]
    # --targets with --merge: every run's targets are read again off its curve (evaluations every
    # eval_every steps), so files written with other targets merge, and one file can be summarised
    # at targets chosen after its run.
    keys = [k for k in MERGE_KEYS if k != "targets" or args.targets is None]
    for f, r in zip(args.merge[1:], files[1:]):
        diff = [k for k in keys if setting(r, k) != setting(first, k)]
        if diff:
            raise SystemExit(f"--merge: {f} differs from {args.merge[0]} in {', '.join(diff)}")
    runs: dict = {}
    for f, r in zip(args.merge, files):
        for arm, by_lr in r["runs"].items():
            for lr, run in by_lr.items():
                if lr in runs.get(arm, {}):
                    raise SystemExit(f"--merge: {arm} at LR {lr} appears twice (again in {f})")
                runs.setdefault(arm, {})[lr] = {**run, "env": r.get("env")}
                if args.targets is not None:  # a failed run has no curve: reaches nothing
                    runs[arm][lr]["reached"] = reached(run.get("curve") or [], args.targets)
    if args.targets is None:
        args.targets = first["targets"]
    lrs = sorted({float(lr) for by_lr in runs.values() for lr in by_lr})
    summary = summarize(args, {arm: {float(lr): r for lr, r in by_lr.items()} for arm, by_lr in runs.items()})
    report(summary)
    payload = {**{k: setting(first, k) for k in ("benchmark", "env", "corpus", *MERGE_KEYS)}, "targets": args.targets,
               "lrs": lrs,
               "merged_from": [Path(f).name for f in args.merge], "runs": runs, "summary": summary}
    write(common.result_name(f"time_to_loss-{first['config']['preset']}", args.tag), payload, args.out, None)


def plot(payload: dict, path: Path) -> Path:
    """The validation curves of every run: loss against training seconds (left) and tokens (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_tokens) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm, by_lr in payload["runs"].items():
        for lr, run in by_lr.items():
            curve = run.get("curve") or []
            if not curve:
                continue
            label = f"{arm} lr {float(lr):g}"
            style = "-" if arm.startswith("xtrain") else "--"
            by_time.plot([c["seconds"] for c in curve], [c["val_loss"] for c in curve], style, label=label)
            by_tokens.plot([c["tokens"] / 1e6 for c in curve], [c["val_loss"] for c in curve], style, label=label)
    for ax, xlabel in ((by_time, "training seconds (PyTorch: compile included)"), (by_tokens, "tokens (M)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
        for t in payload["targets"]:
            ax.axhline(t, color="grey", lw=0.5, ls=":")
    by_time.legend(fontsize=8)
    corpus = "English manuals (Python, Perl, Vim)" if payload.get("corpus") else Path(str(payload.get("data", ""))).name
    fig.suptitle(f"time to loss: {payload['config']['preset']}, batch {payload['batch']} x seq {payload['seq']}, "
                 f"{corpus}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write(name: str, payload: dict, out: str, date: str | None, quiet: bool = False) -> Path:
    """The result's JSON and its curves' PNG (same name)."""
    path = common.write_json(name, payload, out, date=date, quiet=quiet)
    plot(payload, path.with_suffix(".png"))
    return path


def report(summary: dict) -> None:
    for t, row in summary.items():
        print(f"target {t}: xtrain best {row['xtrain_best']}, PyTorch best {row['pytorch_best']}, "
              f"speedup {row.get('speedup_vs_pytorch', float('nan')):.2f}, "
              f"Muon token ratio {row.get('muon_token_ratio', row.get('muon_token_ratio_nodoc', float('nan'))):.2f}",
              flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.merge:
        return merge(args)
    device, tdevice = common.resolve_device(args.device)
    if any(a.startswith("torch") for a in args.arms):
        common.setup_torch(device)
    from xtrain.data import default_dataset, open_dataset, open_stream
    from xtrain.models import model_class, preset_config

    manifest = None
    if args.corpus:
        manifest = json.loads((Path(args.corpus) / "manifest.json").read_text())
        ds = open_dataset(Path(args.corpus) / manifest["data"])
    elif args.stream:
        ds = open_stream(progress=False)
    else:
        ds = open_dataset(args.data or default_dataset(progress=False))
    data = str(ds.path)
    cfg = preset_config(args.preset, ds.vocab_size, bf16=not args.fp32)
    if args.seq > cfg.max_seq:
        raise SystemExit(f"--seq {args.seq} exceeds {args.preset}'s max_seq {cfg.max_seq}")
    weights = {n: p.numpy().copy() for n, p in model_class(cfg)(cfg, device="cpu", seed=args.seed).named_parameters()}
    print(f"time_to_loss: {args.preset} on {data} ({ds.vocab_size} tokens), batch {args.batch} x seq {args.seq}, "
          f"{args.steps} steps, targets {args.targets}, LRs {args.lrs}, {device}", flush=True)
    runs: dict = {}
    date = common.stamp()

    def payload() -> dict:
        return {"benchmark": "time_to_loss", "env": common.env_info(device), "data": data, "corpus": manifest,
                "config": {**cfg.to_dict(), "preset": args.preset}, "batch": args.batch, "seq": args.seq,
                "steps": args.steps, "warmup": args.warmup, "schedule": args.schedule,
                "min_lr_ratio": args.min_lr_ratio, "eval_every": args.eval_every,
                "eval_batches": args.eval_batches, "targets": args.targets, "lrs": args.lrs,
                "runs": {arm: {str(lr): r for lr, r in by_lr.items()} for arm, by_lr in runs.items()},
                "summary": summarize(args, runs)}

    for arm in args.arms:
        for lr in args.lrs:
            t0 = time.perf_counter()
            try:
                curve = (run_xtrain(args, arm, lr, data, device) if arm.startswith("xtrain")
                         else run_torch(args, arm, lr, ds, weights, cfg, tdevice))
            except Exception as e:  # one arm's failure (e.g. no compiler) keeps the others
                print(f"{arm} lr {lr:g}: failed: {type(e).__name__}: {e}", flush=True)
                runs.setdefault(arm, {})[lr] = {"error": f"{type(e).__name__}: {str(e)[:500]}",
                                                "reached": {str(t): None for t in args.targets}}
                continue
            r = {"curve": curve, "reached": reached(curve, args.targets), "call_s": time.perf_counter() - t0}
            runs.setdefault(arm, {})[lr] = r
            hits = ", ".join(f"{t}: " + ("-" if h is None else f"{h['seconds']:.1f}s/{h['tokens']:,} tok")
                             for t, h in r["reached"].items())
            final = curve[-1]["val_loss"] if curve else float("nan")
            print(f"{arm} lr {lr:g}: final val {final:.4f}; {hits}", flush=True)
            write(common.result_name(f"time_to_loss-{args.preset}", args.tag), payload(), args.out, date, quiet=True)
    report(summarize(args, runs))
    write(common.result_name(f"time_to_loss-{args.preset}", args.tag), payload(), args.out, date)


if __name__ == "__main__":
    main()
