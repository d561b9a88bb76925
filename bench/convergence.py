"""bf16 mixed precision against float32: do they learn the same? xtrain and PyTorch side by side.

    python bench/convergence.py                        # dim768, 150 steps, batch 16 x seq 256
    python bench/convergence.py --device cpu --preset tiny --steps 3 --batch 2 --seq 32   # smoke

Four runs from the same initial weights (xtrain's init for --seed, copied into torch) on the same
batches of the built-in story corpus (xtrain.data.default_dataset(), prepared on first use), with
the same schedule (linear warm-up, cosine decay to lr/10), AdamW (0.9, 0.95, weight decay 0.1) and
clipping at 1.0: xtrain bf16, xtrain float32, PyTorch eager bf16 (autocast), PyTorch eager float32
(--no-torch drops the last two). Each run's loss is read once at the end (no per-step sync).

Outputs in bench/results/: convergence-PRESET-DATE.png (the loss curves, and bf16 - float32 and
xtrain - torch differences, smoothed) and convergence-PRESET-DATE.json (every loss, the final
train loss (mean of the last 10 steps), a validation loss over --eval-batches batches, and the
gaps between the runs).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="dim768")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=10)
    p.add_argument("--no-torch", action="store_true", help="xtrain only (not a result: no peer)")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(common.RESULTS_DIR))
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def lr_at(args, step):
    from xtrain.optim import cosine_lr

    return cosine_lr(step, args.lr, args.lr / 10, args.lr_warmup, args.steps)


def run_xtrain(args, cfg, batches, evals, device):
    import xtrain
    from xtrain.models import TinyTransformer
    from xtrain.optim import AdamW, clip_grad_norm_

    model = TinyTransformer(cfg, device=device, seed=args.seed)
    weights = {n: p.numpy().copy() for n, p in model.named_parameters()}
    params = model.parameters()
    opt = AdamW(model.named_parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches):
        opt.lr = lr_at(args, step)
        _, loss = model(x, y)
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
    del model, params, opt
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
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr_at(args, step)
        _, loss = model(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
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
    del model, params, opt
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


def main(argv=None):
    args = parse_args(argv)
    device, _ = common.resolve_device(args.device)
    common.setup_torch(device)
    from xtrain.data import default_dataset, open_dataset
    from xtrain.models import config_for

    t0 = time.perf_counter()
    ds = open_dataset(default_dataset(progress=False))
    prep_s = time.perf_counter() - t0
    loader = ds.loader("train", args.batch, args.seq, args.seed)
    batches = [loader.next_batch() for _ in range(args.steps)]
    evals = list(ds.loader("val", args.batch, args.seq, args.seed)
                 .iter_eval(args.batch, args.seq, args.eval_batches))
    print(f"convergence: {args.preset}, {args.steps} steps of {args.batch} x {args.seq} tokens "
          f"from {ds.path} (vocab {ds.vocab_size}; ready in {prep_s:.1f}s), lr {args.lr}, "
          f"{device}", flush=True)

    runs, weights = {}, None
    for bf16 in (True, False):
        cfg = config_for(args.preset, ds.vocab_size, bf16=bf16)
        name = f"xtrain {'bf16' if bf16 else 'fp32'}"
        runs[name], w = run_xtrain(args, cfg, batches, evals, device)
        weights = weights or w
        print(f"  {name}: final {runs[name]['losses'][-1]:.4f}, val {runs[name]['val_loss']}, "
              f"{runs[name]['seconds']:.1f}s", flush=True)
    if not args.no_torch:
        for bf16 in (True, False):
            cfg = config_for(args.preset, ds.vocab_size, bf16=bf16)
            name = f"torch {'bf16' if bf16 else 'fp32'}"
            try:
                runs[name] = run_torch(args, cfg, batches, evals, weights, device)
            except Exception as e:  # keep xtrain's curves if the peer cannot run
                print(f"  {name} failed: {type(e).__name__}: {e}", flush=True)
                common.free_torch(device)
                continue
            print(f"  {name}: final {runs[name]['losses'][-1]:.4f}, val {runs[name]['val_loss']}, "
                  f"{runs[name]['seconds']:.1f}s", flush=True)
    del weights

    for r in runs.values():
        r["final_loss"] = r["losses"][-1]
        r["final_loss_avg10"] = float(np.mean(r["losses"][-10:]))
        r["first_loss"] = r["losses"][0]
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
    print()
    common.print_table([{"run": k, **v} for k, v in runs.items()],
                       [("run", "run", ""), ("first_loss", "loss 0", ".4f"),
                        ("final_loss", "final", ".4f"), ("final_loss_avg10", "last-10 mean", ".4f"),
                        ("val_loss", "val", ".4f"), ("seconds", "s", ".1f")])
    for k, g in gaps.items():
        print(f"{k}: last-10 mean {g['final_loss_avg10']:+.4f}, val "
              f"{'n/a' if g['val_loss'] is None else format(g['val_loss'], '+.4f')}, "
              f"max |step diff| {g['max_abs_step_diff']:.4f}")

    name = common.result_name(f"convergence-{args.preset}", args.tag)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{name}-{common.stamp()}.png"
    plot(runs, png, f"{args.preset}, {args.batch}x{args.seq} tokens/step, lr {args.lr}")
    payload = {"benchmark": "convergence", "env": common.env_info(device),
               "args": {k: v for k, v in vars(args).items() if k != "out"},
               "dataset": str(ds.path), "vocab_size": ds.vocab_size, "png": png.name,
               "runs": runs, "gaps": gaps}
    common.write_json(name, payload, out)
    return payload


if __name__ == "__main__":
    main()
