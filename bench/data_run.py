"""The data pipeline on the GPU: does the built-in stream keep up, and is it a yardstick?

    python bench/data_run.py                        # the H200 run, ~6 minutes (two 3000-step runs)
    python bench/data_run.py --steps 1000           # shorter
    python bench/data_run.py --device cpu --preset tiny --no-bf16 --batch 4 --seq 64 --steps 30 \
        --eval-every 10 --workers 0,1 --out /tmp/smoke  # smoke test on a CPU

Three parts, one JSON (bench/results/data_run-PRESET-bB-sS-DATE.json, or --out) and one PNG:

1. The stream's throughput on this machine's cores, no GPU involved: one process making lane-
   blocks (generation and tokenization timed apart, in CPU seconds: tokens per second per core),
   then the StreamLoader itself with N worker processes for each N in --workers, fed as fast as it
   can deliver --batch x --seq batches (tokens per second it sustains).
2. The same training run twice, as `xtrain train --preset P --bf16 --batch B --seq S --steps N
   --eval-every E` runs it (xtrain.trainer.train.train, same seed and initial weights): on the stream,
   then on a prepared copy of the stream's stories written to shards first (write_stream_copy,
   --copy-factor times the tokens the run reads, so random windows rarely meet twice; the same
   tokenizer and held-out set). Per run: median and mean tokens/s of the training steps (each
   step's time includes fetching its batch), the train and validation loss curves, and the final
   gap (validation loss against the mean training loss of the last 100 steps).
3. The verdict the issue asks for: stream median tok/s within 5% of the shards run's, validation
   loss never rising by more than noise on the stream, final gap under 5%.

The stream and its copy live in $XTRAIN_CACHE (default ~/.cache/xtrain/default); the runs write
their logs, checkpoints and samples under a temporary directory. The generator's entropy per token
(an upper bound on the loss floor, stories.Tale.nats) is recorded beside the losses.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common

REPO = Path(__file__).resolve().parents[1]
# Stories whose choice entropy and token count give the entropy bound (a second or two).
ENTROPY_STORIES = 3000
# Lanes timed in one process for the per-core rate.
CORE_LANES = 8
GAP_WINDOW = 100  # training steps averaged for the final train loss
TARGET_SPEED = 0.05  # stream median tok/s within 5% of the shards run
TARGET_GAP = 0.05


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="dim768")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", default="1,2,4,auto",
                   help="worker counts whose loader throughput is measured (comma-separated)")
    p.add_argument("--train-workers", default="auto", help="worker processes of the stream run")
    p.add_argument("--copy-factor", type=float, default=2.0,
                   help="tokens in the shards copy, as a multiple of the tokens the run reads")
    p.add_argument("--skip-runs", action="store_true", help="only the throughput measurement")
    p.add_argument("--out", default=str(common.RESULTS_DIR))
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _workers(text: str) -> int | str:
    return "auto" if text == "auto" else int(text)


# ---- 1. stream throughput

def per_core_rate(stream, seq: int) -> dict:
    """Tokens per CPU second of one process: generating, tokenizing, and both (a lane-block)."""
    from xtrain.data import stream as S
    from xtrain.data.stories import tell

    tok, _, _ = S._stream_state(str(stream.path))
    block_tokens = S.BLOCK_STEPS * seq + 1
    keys = [f"bench:{g}" for g in range(CORE_LANES)]
    t0 = time.process_time()
    for key in keys:
        S.lane_block(str(stream.path), key, block_tokens)
    both = time.process_time() - t0
    # The same stories again, the two halves timed apart (a block's stories: until it is full).
    texts, n_tokens = [], 0
    while n_tokens < CORE_LANES * block_tokens:
        texts.append(f"bench:0:{len(texts)}")
        n_tokens += 1 + len(tok.encode(tell(texts[-1]).text()))
    t0 = time.process_time()
    stories = [tell(k).text() for k in texts]
    gen = time.process_time() - t0
    t0 = time.process_time()
    for text in stories:
        tok.encode(text)
    enc = time.process_time() - t0
    total = CORE_LANES * block_tokens
    return {"tokens": total, "generate_tok_s": n_tokens / gen, "tokenize_tok_s": n_tokens / enc,
            "lane_block_tok_s": total / both, "tokens_per_story": n_tokens / len(texts)}


def loader_rate(stream, workers, batch: int, seq: int, blocks: int = 6) -> dict:
    """Tokens per second the StreamLoader sustains with `workers`, pulled as fast as it can.

    The first blocks are computed while the first is awaited (prefetch), so the rate is taken in
    steady state: the time between the first batches of block 2 and of the last block, for the
    tokens of the blocks in between."""
    from xtrain.data import StreamLoader
    from xtrain.data import stream as S

    loader = StreamLoader(stream, batch, seq, seed=12345, workers=workers)
    starts = []
    try:
        t0 = time.perf_counter()
        for step in range(blocks * S.BLOCK_STEPS):
            loader.next_batch()
            if step % S.BLOCK_STEPS == 0:
                starts.append(time.perf_counter())
    finally:
        loader.close()
    block_tokens = batch * S.BLOCK_STEPS * seq
    return {"workers": loader.workers.n, "requested": workers, "first_batch_s": starts[0] - t0,
            "tok_s": (blocks - 3) * block_tokens / (starts[-1] - starts[2])}


def entropy_bound(stream) -> dict:
    from xtrain.data.stories import tell

    nats = tokens = 0
    for i in range(ENTROPY_STORIES):
        tale = tell(f"bench-entropy:{i}")
        nats += tale.nats
        tokens += 1 + len(stream.tokenizer.encode(tale.text()))  # eot counted, as trained
    return {"stories": ENTROPY_STORIES, "nats_per_token": nats / tokens,
            "tokens_per_story": tokens / ENTROPY_STORIES}


# ---- 2. the two training runs

def train_run(args, data: str, out: Path, workers) -> dict:
    from xtrain.trainer.train import TrainConfig, train

    cfg = TrainConfig(preset=args.preset, data=data, out=str(out), device=args.device,
                      bf16=args.bf16, batch=args.batch, seq=args.seq, steps=args.steps,
                      eval_every=args.eval_every, eval_batches=args.eval_batches,
                      save_every=0, seed=args.seed, progress=False)
    if workers != "auto":  # the stream's worker count: what `workers="auto"` resolves to
        os.environ["XTRAIN_DATA_WORKERS"] = str(workers)
    t0 = time.perf_counter()
    try:
        summary = train(cfg)
    finally:
        os.environ.pop("XTRAIN_DATA_WORKERS", None)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    vals = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    past = steps[10:] or steps  # past warm-up
    timed = [r["tok_s"] for r in past]
    last = [r["loss"] for r in steps[-GAP_WINDOW:]]
    train_end = statistics.fmean(last)
    val_end = vals[-1][1] if vals else None
    return {
        "data": data or "stream", "wall_s": wall, "time_s": summary["time_s"],
        "median_tok_s": statistics.median(timed), "mean_tok_s": statistics.fmean(timed),
        "p10_tok_s": sorted(timed)[len(timed) // 10],
        "slowest_step_ms": max(r["ms"] for r in past),
        "train_loss": [(r["step"], r["loss"]) for r in steps], "val_loss": vals,
        "final_train_loss_mean": train_end, "final_val_loss": val_end,
        "gap": None if val_end is None else (val_end - train_end) / train_end,
        "val_rises": [(a, b, vb - va) for (a, va), (b, vb) in zip(vals, vals[1:]) if vb > va],
        "sample": summary["sample"],
    }


def plot(runs: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (name, run), color in zip(runs.items(), ("C0", "C1")):
        steps, losses = zip(*run["train_loss"])
        ax.plot(steps, losses, color=color, lw=0.5, alpha=0.25)
        ax.plot(steps, _ema(losses), color=color, lw=1.2, label=f"{name}: train (EMA 0.98)")
        if run["val_loss"]:
            ax.plot(*zip(*run["val_loss"]), "o--", color=color, label=f"{name}: validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def _ema(values, beta=0.98):
    """Bias-corrected exponential moving average (no lag towards the first value)."""
    out, avg = [], 0.0
    for t, v in enumerate(values, 1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** t))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import xtrain
    from xtrain.data import open_stream, write_stream_copy
    from xtrain.data.stream import resolve_workers
    from xtrain.trainer.train import resolve_device

    args.device = resolve_device(args.device)
    t_all = time.perf_counter()
    info = common.env_info(args.device)
    info["cores"] = cores()
    print(f"{info.get('gpu') or info.get('cpu')}, {info['cores']} cores, commit {info['commit']}",
          flush=True)

    t0 = time.perf_counter()
    stream = open_stream(progress=False)
    setup_s = time.perf_counter() - t0
    core = per_core_rate(stream, args.seq)
    print(f"one core: generate {core['generate_tok_s']:,.0f} tok/s, tokenize "
          f"{core['tokenize_tok_s']:,.0f}, both (lane-blocks) {core['lane_block_tok_s']:,.0f}",
          flush=True)
    loaders = []
    for w in args.workers.split(","):
        r = loader_rate(stream, _workers(w.strip()), args.batch, args.seq)
        loaders.append(r)
        print(f"loader, {r['workers']} workers ({r['requested']}): {r['tok_s']:,.0f} tok/s "
              f"(first batch after {r['first_batch_s']:.1f} s)", flush=True)
    entropy = entropy_bound(stream)
    print(f"generator entropy: {entropy['nats_per_token']:.3f} nats/token (an upper bound on "
          f"the loss floor), {entropy['tokens_per_story']:.0f} tokens a story", flush=True)

    result = {"env": info, "args": vars(args), "stream_setup_s": setup_s,
              "stream_meta": stream.meta, "per_core": core, "loader": loaders,
              "entropy": entropy, "auto_workers": resolve_workers("auto")}
    runs = {}
    if not args.skip_runs:
        tokens = args.steps * args.batch * args.seq
        t0 = time.perf_counter()
        copy_dir = Path(stream.path).parent / f"copy-{int(tokens * args.copy_factor)}"
        write_stream_copy(stream, copy_dir, int(tokens * args.copy_factor),
                          workers=max(1, cores() - 1), progress=False)
        result["copy"] = {"path": str(copy_dir), "tokens": int(tokens * args.copy_factor),
                          "write_s": time.perf_counter() - t0}
        print(f"shards copy: {result['copy']['tokens']:,} tokens in "
              f"{result['copy']['write_s']:.0f} s", flush=True)
        with tempfile.TemporaryDirectory(prefix="data_run-") as tmp:
            for name, data, workers in (("stream", None, _workers(args.train_workers)),
                                        ("shards", str(copy_dir), 0)):
                print(f"--- {name} run", flush=True)
                runs[name] = train_run(args, data, Path(tmp) / name, workers)
                xtrain.empty_cache(args.device)
        result["runs"] = runs
        s, c = runs["stream"], runs["shards"]
        result["verdict"] = {
            "stream_over_shards_median_tok_s": s["median_tok_s"] / c["median_tok_s"],
            "stream_keeps_up": s["median_tok_s"] >= (1 - TARGET_SPEED) * c["median_tok_s"],
            "stream_final_gap": s["gap"],
            "gap_under_5pct": s["gap"] is not None and abs(s["gap"]) < TARGET_GAP,
            "stream_val_rises": s["val_rises"],
        }
        for name, run in runs.items():
            print(f"{name}: median {run['median_tok_s']:,.0f} tok/s (mean "
                  f"{run['mean_tok_s']:,.0f}), val {run['final_val_loss']:.4f}, train (last "
                  f"{GAP_WINDOW}) {run['final_train_loss_mean']:.4f}, gap "
                  f"{100 * run['gap']:+.2f}%, {run['time_s']:.0f} s", flush=True)
        print(f"verdict: {json.dumps(result['verdict'])}", flush=True)
    result["wall_s"] = time.perf_counter() - t_all
    bf = "bf16" if args.bf16 else "fp32"
    name = common.result_name(f"data_run-{args.preset}-b{args.batch}-s{args.seq}-{bf}", args.tag)
    path = common.write_json(name, result, args.out)
    if runs:
        commit = (info["commit"] or "")[:7]
        plot(runs, path.with_suffix(".png"),
             f"{args.preset} {bf}, batch {args.batch} x seq {args.seq}: the built-in stream vs a "
             f"shards copy ({info.get('gpu') or 'cpu'}, {commit})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
