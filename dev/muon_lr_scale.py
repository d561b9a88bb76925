"""Muon's learning rate against AdamW's on the built-in stream: does a larger Muon update reach the
targets in fewer tokens? A development experiment (not a product switch): each Muon run scales
the per-shape LR ratio (xtrain.optim.muon_lr_ratio) by S by patching it for that run, so the
matrices step at S x the match_rms_adamw rate while AdamW's part keeps --lr.

    python dev/muon_lr_scale.py --preset tiny --batch 16 --seq 128 --steps 300 --scales 1,3,10 --lrs 1e-3,2e-3

Prints, per run, the validation curve and the tokens to each target; writes nothing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import xtrain.optim  # noqa: E402
from time_to_loss import reached, run_xtrain  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--lrs", default="1e-3")
    p.add_argument("--scales", default="1,3,10")
    p.add_argument("--targets", default="3,2.5,2,1.75,1.5,1.25,1.0")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    from xtrain.data import open_stream

    data = str(open_stream(progress=False).path)
    targets = [float(t) for t in args.targets.split(",")]
    run_args = SimpleNamespace(preset=args.preset, batch=args.batch, seq=args.seq, steps=args.steps,
                               warmup=args.warmup, eval_every=args.eval_every, eval_batches=args.eval_batches,
                               seed=0, fp32=True)
    base = xtrain.optim.muon_lr_ratio
    runs = [("xtrain-adamw-nodoc", float(lr), None) for lr in args.lrs.split(",")]
    runs += [("xtrain-muon-nodoc", float(lr), float(s)) for lr in args.lrs.split(",") for s in args.scales.split(",")]
    for arm, lr, scale in runs:
        if scale is not None:
            xtrain.optim.muon_lr_ratio = lambda fn, shape, s=scale: s * base(fn, shape)
        try:
            curve = run_xtrain(run_args, arm, lr, data, args.device)
        finally:
            xtrain.optim.muon_lr_ratio = base
        hits = reached(curve, targets)
        label = f"{arm} lr {lr:g}" + (f" scale {scale:g}" if scale is not None else "")
        print(label, "final", round(curve[-1]["val_loss"], 4) if curve else None,
              "| tokens to", {t: (h["tokens"] if h else None) for t, h in hits.items()}, flush=True)
        print("   curve", [round(c["val_loss"], 3) for c in curve], flush=True)


if __name__ == "__main__":
    main()
