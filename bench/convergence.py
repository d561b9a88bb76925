"""bf16 mixed precision against float32: do they learn the same? xtrain and PyTorch side by side.

    python bench/convergence.py                        # dim768, 150 steps, batch 16 x seq 256
    python bench/convergence.py --seeds 4              # the same for seeds 0..3 (the result)
    python bench/convergence.py --device cpu --preset tiny --steps 3 --batch 2 --seq 32   # smoke

Four runs from the same initial weights (xtrain's init for --seed, copied into torch) on the same
batches of the built-in story corpus (xtrain.data.default_dataset(), prepared on first use), with
the same schedule (peak LR: the preset's `xtrain train` default unless --lr; linear warm-up,
cosine decay to lr/10), AdamW (0.9, 0.95, weight decay 0.1) and
clipping at 1.0: xtrain bf16, xtrain float32, PyTorch eager bf16 (autocast), PyTorch eager float32
(--no-torch drops the last two). Each run's loss is read once at the end (no per-step sync).

Outputs in bench/results/: convergence-PRESET-DATE.png (the loss curves, and bf16 - float32 and
xtrain - torch differences, smoothed) and convergence-PRESET-DATE.json (every loss, the final
train loss (mean of the last 10 steps), a validation loss over --eval-batches batches, and the
gaps between the runs).

Several seeds (--seeds N > 1): one seed cannot tell precision from trajectory noise (at lr 1e-3
two float32 runs that differ only in summation order drift apart by several percent after ~10
steps), so the whole four-run comparison repeats for seeds --seed, --seed+1, ..., --seed+N-1. A
seed sets both the initial weights and the training batches (the loader's window draws), so every
seed is an independent trajectory; the validation batches are the same for every seed. Reported:
per configuration the mean and standard deviation over seeds of the last-10-mean train loss and of
the validation loss; per seed the relative gap (bf16 - fp32) / fp32 of each framework; and the
headline, per framework, the relative gap of the seed means |mean_bf16 - mean_fp32| / mean_fp32
with its standard error (delta method on the paired per-seed values: bf16 and fp32 of one seed
share weights and batches). The target is "within 1%"; the verdict says met (gap + 2 SE < 1%),
missed (gap - 2 SE > 1%) or unresolved (more seeds or steps needed). The noise yardstick beside it
is xtrain fp32 against torch fp32 (same precision, different summation order): the relative gap of
their means with its standard error, and the RMS of their per-seed relative gaps (how far apart
one seed's two float32 runs land by noise alone). Outputs: convergence-PRESET-seedsN-DATE.json
(every seed's runs with every loss, the per-seed gaps and the summary) and .png (left: the mean of
each configuration's EMA-smoothed curves with a +-1 std band over seeds; right: every seed's final
train loss per configuration as points, with the seed means).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import common


CONFIGS = ("xtrain bf16", "xtrain fp32", "torch bf16", "torch fp32")
METRICS = (("final_loss_avg10", "last-10 mean train loss"), ("val_loss", "validation loss"))
# (label, a, b): the relative gap (a - b) / b over seeds. The first two are the question (bf16
# against float32 in each framework); the third is the noise yardstick (same precision, only the
# summation order differs); the fourth completes the picture.
PAIRS = (("xtrain bf16 vs fp32", "xtrain bf16", "xtrain fp32"),
         ("torch bf16 vs fp32", "torch bf16", "torch fp32"),
         ("fp32 xtrain vs torch (noise)", "xtrain fp32", "torch fp32"),
         ("bf16 xtrain vs torch", "xtrain bf16", "torch bf16"))
TARGET = 0.01  # "bf16 final loss within 1% of float32's"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="dim768")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=None,
                   help="peak LR (default: the preset's, as `xtrain train` picks it: 6e-4 for dim768)")
    p.add_argument("--lr-warmup", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=10)
    p.add_argument("--no-torch", action="store_true", help="xtrain only (not a result: no peer)")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=1,
                   help="repeat the comparison for seeds --seed .. --seed+N-1 (weights and batches "
                        "both change) and report means, spreads and the gap of the means")
    p.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                   help="no runs: pool the seeds of earlier --seeds results (same preset, batch, seq, "
                        "steps, LR and warm-up; each seed once) and report them as one result")
    p.add_argument("--out", default=str(common.RESULTS_DIR))
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be at least 1")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.lr is None:
        from xtrain.trainer.train import PRESET_LR

        if args.preset not in PRESET_LR:
            p.error(f"no default LR for preset {args.preset!r}: pass --lr")
        args.lr = PRESET_LR[args.preset]
    return args


def lr_at(args, step):
    from xtrain.optim import cosine_lr

    return cosine_lr(step, args.lr, args.lr / 10, args.lr_warmup, args.steps)


def run_xtrain(args, cfg, batches, evals, device, seed):
    import xtrain
    from xtrain.models import TinyTransformer
    from xtrain.optim import AdamW, clip_grad_norm_

    model = TinyTransformer(cfg, device=device, seed=seed)
    weights = {n: p.numpy().copy() for n, p in model.named_parameters()}
    params = model.parameters()
    opt = AdamW(model.named_parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    logits = loss = None
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches):
        opt.lr = lr_at(args, step)
        logits, loss = model(x, y)
        loss.backward()
        clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    losses = [v.item() for v in losses]  # sync point: the curve comes to the host once
    seconds = time.perf_counter() - t0
    model.eval()
    with xtrain.no_grad():
        val = [model(x, y)[1].item() for x, y in evals]
    # The last step's logits and loss too: the next run (or seed) must start on an empty cache.
    del model, params, opt, logits, loss
    common.free_xtrain(device)
    return {"losses": losses, "val_loss": float(np.mean(val)) if val else None,
            "seconds": seconds}, weights


def run_torch(args, cfg, batches, evals, weights, device):
    import torch

    import torch_model

    model = torch_model.build(weights, cfg, device)
    params = list(model.parameters())
    opt = torch_model.adamw(model, lr=args.lr)
    losses = []
    logits = loss = None
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr_at(args, step)
        logits, loss = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    losses = torch.stack(losses).cpu().tolist()  # sync point: once
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        val = [model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))[1].item()
               for x, y in evals]
    del model, params, opt, logits, loss
    common.free_torch(device)
    return {"losses": losses, "val_loss": float(np.mean(val)) if val else None, "seconds": seconds}


def ema(values, beta=0.9):
    out, avg = [], None
    for v in values:
        avg = v if avg is None else beta * avg + (1 - beta) * v
        out.append(avg)
    return out


def plot(runs: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, dax) = plt.subplots(1, 2, figsize=(13, 4.5))
    styles = {"xtrain bf16": ("C0", "-"), "xtrain fp32": ("C1", "-"),
              "torch bf16": ("C0", "--"), "torch fp32": ("C1", "--")}
    for name, r in runs.items():
        color, ls = styles.get(name, (None, "-"))
        steps = np.arange(len(r["losses"]))
        ax.plot(steps, r["losses"], color=color, ls=ls, lw=1.0, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    for a, b, color in (("xtrain bf16", "xtrain fp32", "C0"), ("torch bf16", "torch fp32", "C2"),
                        ("xtrain fp32", "torch fp32", "C3"), ("xtrain bf16", "torch bf16", "C4")):
        if a in runs and b in runs:
            diff = np.array(runs[a]["losses"]) - np.array(runs[b]["losses"])
            dax.plot(ema(diff.tolist()), color=color, lw=1.2, label=f"{a} - {b} (EMA 0.9)")
    dax.axhline(0.0, color="k", lw=0.5)
    dax.set_xlabel("step")
    dax.set_ylabel("loss difference")
    dax.grid(alpha=0.3)
    dax.legend(fontsize=8)
    dax.set_title("differences")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


STYLES = {"xtrain bf16": ("C0", "-"), "xtrain fp32": ("C1", "-"),
          "torch bf16": ("C2", "--"), "torch fp32": ("C3", "--")}


def plot_seeds(per_seed: list, summary: dict, path: Path, title: str) -> None:
    """Left: per configuration, the mean over seeds of the EMA-smoothed curves, +-1 std shaded.
    Right: every seed's last-10-mean train loss per configuration, and the seed mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, pax) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name in CONFIGS:
        curves = [ema(e["runs"][name]["losses"]) for e in per_seed if name in e["runs"]]
        if not curves:
            continue
        curves = np.array(curves)
        mean = curves.mean(0)
        std = curves.std(0, ddof=1) if len(curves) > 1 else np.zeros_like(mean)
        steps = np.arange(curves.shape[1])
        color, ls = STYLES[name]
        ax.plot(steps, mean, color=color, ls=ls, lw=1.2, label=f"{name} (n={len(curves)})")
        ax.fill_between(steps, mean - std, mean + std, color=color, alpha=0.15, lw=0)
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo > 3:  # the end of the curve is where the runs differ: give it room
        from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (EMA 0.9), mean +- 1 std over seeds")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    ax.set_title(title)

    seeds = [e["seed"] for e in per_seed]
    jitter = np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else [0.0]
    for k, e in enumerate(per_seed):
        xs = [i + jitter[k] for i, n in enumerate(CONFIGS) if n in e["runs"]]
        ys = [e["runs"][n]["final_loss_avg10"] for n in CONFIGS if n in e["runs"]]
        pax.plot(xs, ys, "o-", color=f"C{k % 10}", ms=5, lw=0.6, alpha=0.8,
                 label=f"seed {e['seed']}")
    for i, name in enumerate(CONFIGS):
        s = summary["configs"].get(name, {}).get("final_loss_avg10")
        if s and s["n"]:
            pax.hlines(s["mean"], i - 0.3, i + 0.3, color="k", lw=1.5,
                       label="seed mean" if i == 0 else None)
    pax.set_xticks(range(len(CONFIGS)), CONFIGS)
    pax.set_ylabel("final train loss (last-10 mean)")
    pax.grid(alpha=0.3, axis="y")
    pax.legend(fontsize=8)
    head = summary["pairs"]["final_loss_avg10"]
    bits = [f"{lab.split()[0]} {_pct(head[lab]['rel_gap'])} +- {_pct(head[lab]['se'], '')}"
            for lab, _, _ in PAIRS[:2] if lab in head]
    pax.set_title("final train loss per seed (a line joins one seed's runs)\n"
                  "bf16 vs fp32, gap of means +- SE: " + ", ".join(bits), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def _pct(v, sign="+"):
    return "n/a" if v is None else format(v, f"{sign}.2%")


def run_seed(args, seed: int, ds, device: str, label: str = "") -> dict:
    """The four runs for one seed: xtrain's init for `seed` (copied into torch) and the training
    windows drawn with `seed`; the validation batches do not depend on the seed."""
    from xtrain.models import config_for

    loader = ds.loader("train", args.batch, args.seq, seed)
    batches = [loader.next_batch() for _ in range(args.steps)]
    evals = list(ds.loader("val", args.batch, args.seq, seed)
                 .iter_eval(args.batch, args.seq, args.eval_batches))
    runs, weights = {}, None
    for bf16 in (True, False):
        cfg = config_for(args.preset, ds.vocab_size, bf16=bf16)
        name = f"xtrain {'bf16' if bf16 else 'fp32'}"
        runs[name], w = run_xtrain(args, cfg, batches, evals, device, seed)
        weights = weights or w
        del w
        print(f"  {label}{name}: final {runs[name]['losses'][-1]:.4f}, val "
              f"{runs[name]['val_loss']}, {runs[name]['seconds']:.1f}s", flush=True)
    if not args.no_torch:
        for bf16 in (True, False):
            cfg = config_for(args.preset, ds.vocab_size, bf16=bf16)
            name = f"torch {'bf16' if bf16 else 'fp32'}"
            try:
                runs[name] = run_torch(args, cfg, batches, evals, weights, device)
            except Exception as e:  # keep xtrain's curves if the peer cannot run
                print(f"  {label}{name} failed: {type(e).__name__}: {e}", flush=True)
                common.free_torch(device)
                continue
            print(f"  {label}{name}: final {runs[name]['losses'][-1]:.4f}, val "
                  f"{runs[name]['val_loss']}, {runs[name]['seconds']:.1f}s", flush=True)
    del weights, batches, evals

    for r in runs.values():
        r["final_loss"] = r["losses"][-1]
        r["final_loss_avg10"] = float(np.mean(r["losses"][-10:]))
        r["first_loss"] = r["losses"][0]
    return runs


def run_gaps(runs: dict) -> dict:
    gaps = {}
    for a, b in (("xtrain bf16", "xtrain fp32"), ("torch bf16", "torch fp32"),
                 ("xtrain bf16", "torch bf16"), ("xtrain fp32", "torch fp32")):
        if a in runs and b in runs:
            gaps[f"{a} - {b}"] = {
                "final_loss_avg10": runs[a]["final_loss_avg10"] - runs[b]["final_loss_avg10"],
                "val_loss": (None if runs[a]["val_loss"] is None or runs[b]["val_loss"] is None
                             else runs[a]["val_loss"] - runs[b]["val_loss"]),
                "max_abs_step_diff": float(np.max(np.abs(np.array(runs[a]["losses"]) -
                                                         np.array(runs[b]["losses"]))))}
    return gaps


def mean_std(values: list) -> dict:
    v = np.array([x for x in values if x is not None], dtype=float)
    return {"n": len(v), "mean": float(v.mean()) if len(v) else None,
            "std": float(v.std(ddof=1)) if len(v) > 1 else None}


def pair_stats(per_seed: list, metric: str, a: str, b: str) -> dict | None:
    """Relative gap of the seed means, (mean_a - mean_b) / mean_b, over the seeds that have both
    runs, with its standard error by the delta method on the paired values: with r = mean_a /
    mean_b, SE(r) = sd(a_i - r * b_i) / (sqrt(n) * mean_b) (the pairing, same weights and batches
    per seed, enters through the covariance of a and b). Also the per-seed relative gaps."""
    rows = [(e["seed"], e["runs"][a][metric], e["runs"][b][metric]) for e in per_seed
            if a in e["runs"] and b in e["runs"]
            and e["runs"][a][metric] is not None and e["runs"][b][metric] is not None]
    if not rows:
        return None
    va = np.array([r[1] for r in rows], dtype=float)
    vb = np.array([r[2] for r in rows], dtype=float)
    n, ma, mb = len(rows), float(va.mean()), float(vb.mean())
    r = ma / mb
    se = float(np.std(va - r * vb, ddof=1) / (np.sqrt(n) * mb)) if n > 1 else None
    per = (va - vb) / vb
    gap = r - 1.0
    out = {"a": a, "b": b, "n": n, "mean_a": ma, "mean_b": mb, "rel_gap": gap,
           "abs_rel_gap": abs(gap), "se": se,
           "per_seed": {str(s): float(g) for (s, _, _), g in zip(rows, per, strict=True)},
           "per_seed_std": float(per.std(ddof=1)) if n > 1 else None,
           "per_seed_rms": float(np.sqrt(np.mean(per ** 2)))}
    if se is None:
        out["verdict"] = "unresolved (one seed: no standard error)"
    elif abs(gap) + 2 * se < TARGET:
        out["verdict"] = f"within {TARGET:.0%} (|gap| + 2 SE < {TARGET:.0%})"
    elif abs(gap) - 2 * se > TARGET:
        out["verdict"] = f"outside {TARGET:.0%} (|gap| - 2 SE > {TARGET:.0%})"
    else:
        out["verdict"] = "unresolved (1% lies within 2 SE: more seeds or steps)"
    return out


def summarize(per_seed: list) -> dict:
    configs = {}
    for name in CONFIGS:
        have = [e["runs"][name] for e in per_seed if name in e["runs"]]
        if have:
            configs[name] = {m: {**mean_std([r[m] for r in have]),
                                 "values": [r[m] for r in have]} for m, _ in METRICS}
            configs[name]["seconds_mean"] = float(np.mean([r["seconds"] for r in have]))
    pairs = {m: {lab: st for lab, a, b in PAIRS if (st := pair_stats(per_seed, m, a, b))}
             for m, _ in METRICS}
    return {"configs": configs, "pairs": pairs}


def print_seeds(per_seed: list, summary: dict) -> None:
    n = len(per_seed)
    print(f"\nper configuration, over {n} seeds (mean and std; std uses n-1):")
    rows = []
    for name, c in summary["configs"].items():
        tr, va = c["final_loss_avg10"], c["val_loss"]
        rows.append({"run": name, "n": tr["n"], "tm": tr["mean"], "ts": tr["std"],
                     "vm": va["mean"], "vs": va["std"], "s": c["seconds_mean"]})
    common.print_table(rows, [("run", "run", ""), ("n", "seeds", "d"),
                              ("tm", "last-10 mean", ".4f"), ("ts", "std", ".4f"),
                              ("vm", "val", ".4f"), ("vs", "std", ".4f"), ("s", "s/run", ".1f")])
    short = {"xtrain bf16 vs fp32": "xt bf16/fp32", "torch bf16 vs fp32": "torch bf16/fp32",
             "fp32 xtrain vs torch (noise)": "fp32 xt/torch"}
    for metric, what in METRICS:
        print(f"\nper seed, {what} (gaps are (a - b) / b):")
        rows = []
        for e in per_seed:
            row = {"seed": e["seed"], **{c: e["runs"][c][metric] for c in CONFIGS if c in e["runs"]}}
            for lab, col in short.items():
                row[col] = summary["pairs"][metric].get(lab, {}).get("per_seed", {}).get(str(e["seed"]))
            rows.append(row)
        common.print_table(rows, [("seed", "seed", "d")] + [(c, c, ".4f") for c in CONFIGS] +
                           [(col, col, "+.2%") for col in short.values()])
    print(f"\nheadline: relative gap of the seed means |mean_bf16 - mean_fp32| / mean_fp32 +- SE "
          f"(target: within {TARGET:.0%}), {n} seeds")
    for metric, what in METRICS:
        pairs = summary["pairs"][metric]
        print(f"  {what}:")
        for lab, _, _ in PAIRS[:2]:
            if lab in pairs:
                p = pairs[lab]
                print(f"    {lab:<21} {p['mean_a']:.4f} vs {p['mean_b']:.4f}: |gap| "
                      f"{p['abs_rel_gap']:.2%} +- {_pct(p['se'], '')} (signed {p['rel_gap']:+.2%}) "
                      f"-> {p['verdict']}")
        noise = pairs.get("fp32 xtrain vs torch (noise)")
        if noise:
            print(f"    noise yardstick, fp32 xtrain vs torch: gap of means "
                  f"{noise['rel_gap']:+.2%} +- {_pct(noise['se'], '')}, per-seed |gap| RMS "
                  f"{noise['per_seed_rms']:.2%}")


def _headline(summary: dict) -> dict:
    """Per metric and pair: the seed means, the gap of the means with its SE and the verdict."""
    return {m: {lab: {k: summary["pairs"][m][lab][k]
                      for k in ("mean_a", "mean_b", "rel_gap", "abs_rel_gap", "se", "verdict", "per_seed_rms")}
                for lab, _, _ in PAIRS[:3] if lab in summary["pairs"][m]}
            for m, _ in METRICS}


SAME_PROTOCOL = ("preset", "batch", "seq", "steps", "lr", "lr_warmup", "eval_batches")


def combine(args) -> dict:
    """Pool the per-seed runs of several --seeds results of one protocol into one summary (the
    xtrain pair is in every file; the torch pairs only where the files have them)."""
    per_seed, sources, first = [], [], None
    for f in args.combine:
        d = json.loads(Path(f).read_text())
        if "per_seed" not in d:
            raise SystemExit(f"{f}: not a --seeds result (no per_seed)")
        proto = {k: d["args"].get(k) for k in SAME_PROTOCOL}
        if first is None:
            first = proto
        elif proto != first:
            raise SystemExit(f"{f}: protocol {proto} differs from {first}")
        seen = {r["seed"] for r in per_seed}
        dup = [r["seed"] for r in d["per_seed"] if r["seed"] in seen]
        if dup:
            raise SystemExit(f"{f}: seeds {dup} already pooled from an earlier file")
        per_seed += d["per_seed"]
        sources.append({"file": Path(f).name, "seeds": d["seeds"], "commit": d["env"].get("commit")})
    summary = summarize(per_seed)
    print_seeds(per_seed, summary)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"convergence-{first['preset']}-pooled{len(per_seed)}"
    png = out / f"{name}-{common.stamp()}.png"
    plot_seeds(per_seed, summary, png, f"{first['preset']}, {first['batch']}x{first['seq']} tokens/step, "
               f"lr {first['lr']}, {len(per_seed)} seeds pooled")
    headline = _headline(summary)
    payload = {"benchmark": "convergence", "combined_from": sources, "args": first, "png": png.name,
               "seeds": [r["seed"] for r in per_seed], "target_rel_gap": TARGET, "headline": headline,
               "summary": summary, "per_seed": per_seed}
    common.write_json(name, payload, out)
    return payload


def main(argv=None):
    args = parse_args(argv)
    if args.combine:
        return combine(args)
    device, _ = common.resolve_device(args.device)
    common.setup_torch(device)
    from xtrain.data import default_dataset, open_dataset

    t0 = time.perf_counter()
    ds = open_dataset(default_dataset(progress=False))
    prep_s = time.perf_counter() - t0
    seeds = list(range(args.seed, args.seed + args.seeds))
    print(f"convergence: {args.preset}, {args.steps} steps of {args.batch} x {args.seq} tokens "
          f"from {ds.path} (vocab {ds.vocab_size}; ready in {prep_s:.1f}s), lr {args.lr}, "
          f"{device}" + (f", seeds {seeds[0]}..{seeds[-1]}" if len(seeds) > 1 else ""), flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def header():  # read after the runs, as the date and commit of the result
        return {"benchmark": "convergence", "env": common.env_info(device),
                "args": {k: v for k, v in vars(args).items() if k != "out"},
                "dataset": str(ds.path), "vocab_size": ds.vocab_size}

    title = f"{args.preset}, {args.batch}x{args.seq} tokens/step, lr {args.lr}"

    if len(seeds) == 1:
        runs = run_seed(args, args.seed, ds, device)
        gaps = run_gaps(runs)
        print()
        common.print_table([{"run": k, **v} for k, v in runs.items()],
                           [("run", "run", ""), ("first_loss", "loss 0", ".4f"),
                            ("final_loss", "final", ".4f"),
                            ("final_loss_avg10", "last-10 mean", ".4f"),
                            ("val_loss", "val", ".4f"), ("seconds", "s", ".1f")])
        for k, g in gaps.items():
            print(f"{k}: last-10 mean {g['final_loss_avg10']:+.4f}, val "
                  f"{'n/a' if g['val_loss'] is None else format(g['val_loss'], '+.4f')}, "
                  f"max |step diff| {g['max_abs_step_diff']:.4f}")
        name = common.result_name(f"convergence-{args.preset}", args.tag)
        png = out / f"{name}-{common.stamp()}.png"
        plot(runs, png, title)
        payload = {**header(), "png": png.name, "seeds": seeds, "runs": runs, "gaps": gaps}
        common.write_json(name, payload, out)
        return payload

    per_seed = []
    t_all = time.perf_counter()
    for i, seed in enumerate(seeds):
        print(f" seed {seed} ({i + 1}/{len(seeds)}):", flush=True)
        runs = run_seed(args, seed, ds, device, label=f"seed {seed} ")
        per_seed.append({"seed": seed, "runs": runs, "gaps": run_gaps(runs)})
    print(f" all seeds in {time.perf_counter() - t_all:.0f}s", flush=True)
    summary = summarize(per_seed)
    print_seeds(per_seed, summary)
    name = common.result_name(f"convergence-{args.preset}-seeds{len(seeds)}", args.tag)
    png = out / f"{name}-{common.stamp()}.png"
    plot_seeds(per_seed, summary, png, f"{title}, {len(seeds)} seeds")
    headline = _headline(summary)
    payload = {**header(), "png": png.name, "seeds": seeds, "target_rel_gap": TARGET,
               "headline": headline, "summary": summary, "per_seed": per_seed}
    common.write_json(name, payload, out)
    return payload


if __name__ == "__main__":
    main()
