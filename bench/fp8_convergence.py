"""FP8 against bf16: does `--fp8` learn what bf16 learns, over a horizon long enough to see it?

    python bench/fp8_convergence.py --data .gpu/corpus/data   # the H200 run: dim768, 2000 steps of 16 x 512
    python bench/fp8_convergence.py --device cpu --preset tiny --no-bf16 --batch 2 --seq 32 \
        --steps 4 --eval-every 2 --eval-batches 1 --out /tmp/smoke     # smoke test on a CPU

The same `xtrain train` run twice (xtrain.trainer.train.train: one seed, so the same initial
weights and the same batches; the preset's learning rate and schedule), once in bf16 and once with
`--fp8` (the blocks' seven linears through ops.linear_fp8, docs/fp8.md), on prepared data: the race
corpus (scripts/race_corpus.py, English prose no one here wrote, GPT-2's tokenizer) for the
result: 2000 steps of 16 x 512 tokens read its 9.7M training tokens 1.7 times. Per run: the validation curve, the final validation loss, the last-100-step mean train
loss, the median tok/s of the steps and the wall time. The verdict issue 38 asks for: the final
validation loss of --fp8 within 1% of bf16's (relative gap |fp8 - bf16| / bf16 < 0.01).

Output: bench/results/fp8_convergence-PRESET-DATE.json (or --out), every logged loss included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import common

TARGET = 0.01  # the final validation loss of --fp8 within 1% of bf16's
TRAIN_WINDOW = 100  # steps averaged for the final train loss


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="a prepared dataset directory (default: the built-in stories)")
    p.add_argument("--preset", default="dim768")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--no-bf16", dest="bf16", action="store_false",
                   help="float32 compute for both runs (the CPU smoke test; FP8's operands stay FP8)")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(common.RESULTS_DIR))
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def train_run(args, fp8: bool, out: Path) -> dict:
    from xtrain.trainer.train import TrainConfig, train

    cfg = TrainConfig(preset=args.preset, data=args.data, out=str(out), device=args.device, bf16=args.bf16,
                      fp8=fp8, batch=args.batch, seq=args.seq, steps=args.steps, eval_every=args.eval_every,
                      eval_batches=args.eval_batches, save_every=0, save_minutes=0.0, sample_tokens=0,
                      seed=args.seed, progress=False)
    t0 = time.perf_counter()
    summary = train(cfg)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    vals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    return {"fp8": fp8, "wall_s": wall, "median_tok_s": summary.get("median_tok_s"),
            "median_mfu": summary.get("median_mfu"), "val_loss": vals[-1][1] if vals else None,
            "train_loss_end": statistics.fmean(r["loss"] for r in steps[-TRAIN_WINDOW:]),
            "skipped_steps": summary["skipped_steps"], "val": vals,
            "losses": [r["loss"] for r in steps]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xtrain-fp8-") as tmp:
        runs = {name: train_run(args, name == "fp8", Path(tmp) / name) for name in ("bf16", "fp8")}
    bf16, fp8 = runs["bf16"]["val_loss"], runs["fp8"]["val_loss"]
    gap = None if bf16 is None or fp8 is None else (fp8 - bf16) / bf16
    result = {"args": vars(args), "commit": common.git_commit(), "env": common.env_info(args.device),
              "runs": runs, "val_gap": gap, "target": TARGET,
              "verdict": None if gap is None else ("met" if abs(gap) < TARGET else "missed"),
              "speedup_fp8": common.ratio(runs["fp8"]["median_tok_s"], runs["bf16"]["median_tok_s"])}
    for name, r in runs.items():
        print(f"{name}: val loss {r['val_loss']}, train loss (last {TRAIN_WINDOW}) {r['train_loss_end']:.4f}, "
              f"{r['median_tok_s'] or 0:,.0f} tok/s, {r['wall_s']:.0f} s")
    print(f"fp8 vs bf16: validation gap {gap if gap is None else f'{100 * gap:+.2f}%'} "
          f"(target within {100 * TARGET:.0f}%: {result['verdict']}), speed {result['speedup_fp8']}")
    common.write_json(common.result_name(f"fp8_convergence-{args.preset}", args.tag), result, args.out)
    return result


if __name__ == "__main__":
    main()
