"""Data-parallel scaling: global tokens/s on 1 and 2 GPUs, xtrain beside PyTorch DDP, one invocation.

    python bench/scaling.py                     # dim768, bf16, batch 32 per GPU, seq 256, 1 and 2 GPUs
    python bench/scaling.py --gpus 1 2 4 --steps 50
    python bench/scaling.py --launch threads processes --cli    # both modes, and `xtrain train` itself

`--launch`: how xtrain's ranks run on several GPUs: threads (one process, xtrain.launch.distributed.launch)
and/or processes (one per GPU under a torchrun-style environment: xtrain.launch.distributed.run_process,
the rendezvous and a one-rank NCCL communicator each). `--cli` adds rows for the `xtrain train`
command itself (the built-in stories, the same model and batch) on one GPU and on each launch mode:
tok/s from its log (the median step time after `--cli-warmup` steps), peak memory from its log.

Both sides train the same architecture from the same initial weights (xtrain's TinyTransformer;
PyTorch's bench/torch_model.py peer, the one bench/train_throughput.py uses: bf16 autocast,
flash SDPA, fused AdamW) with the same step: forward, backward, gradient average over the GPUs,
clip at 1.0, AdamW, on random token windows uploaded from the host every step. xtrain runs one
process with a thread per GPU (xtrain.launch.distributed.launch) and on several GPUs takes the training
loop's step, xtrain.launch.distributed.DataParallelAdamW sharded with the model's bf16 weight copies
(`--steps-dp` adds rows for the flat all-reduce step and the per-tensor all_reduce_gradients step;
`--overlap` one that averages while backward runs, GradientReducer); PyTorch runs one process per GPU under torchrun with
DistributedDataParallel (bucketed, overlapped; none on one GPU). Each measurement is its own
subprocess. Timing: `--warmup` steps, then `--steps` steps between two device syncs
(every rank synchronised, the slowest rank's time counts); global tok/s = GPUs x batch x seq x
steps / time. MFU uses the measured bf16 ceiling of the H200 (790 TFLOP/s per GPU;
docs/performance.md, "Ceilings").

Prints the table and writes bench/results/scaling-<date>.json (date, GPU, commit, config, rows).
NCCL_NVLS_ENABLE=0 is forced for every run: NVLink multicast stays off on the shared multi-GPU
machines.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PRESET, VOCAB = "dim768", 4096
PEAK_BF16_FLOPS = 790e12  # 8192^3 bf16 GEMM through PyTorch on one H200, measured
LR, WEIGHT_DECAY, CLIP = 3e-4, 0.1, 1.0
RESULT = "RESULT "        # prefix of the one line a worker prints for the parent


def model_config(bf16: bool = True):
    from xtrain.models import config_for

    return config_for(PRESET, VOCAB, bf16=bf16)


def host_batches(rank: int, batch: int, seq: int, n: int = 4) -> list:
    """A few random (inputs, targets) windows per rank, cycled (random ids: never time on zeros)."""
    rng = np.random.default_rng(1000 + rank)
    out = []
    for _ in range(n):
        w = rng.integers(0, VOCAB, size=(batch, seq + 1), dtype=np.int64)
        out.append((np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])))
    return out


def timed(step, sync, warmup: int, steps: int) -> tuple[float, float]:
    """Run `warmup` steps, sync, `steps` steps, sync; return (seconds, last loss). Like the train
    loop, each step reads the previous step's loss, so the host is never more than a step ahead."""
    loss = None
    for i in range(warmup):
        loss = step(i)
    float(loss.item())
    sync()
    t0 = time.perf_counter()
    prev = None
    for i in range(steps):
        loss = step(i)
        if prev is not None:
            prev.item()
        prev = loss
    last = float(loss.item())
    sync()
    return time.perf_counter() - t0, last


# ---- workers (each prints one RESULT line)

def xtrain_worker(args) -> None:
    import xtrain
    from xtrain.launch.distributed import (DataParallelAdamW, GradientReducer, all_reduce_gradients, broadcast_parameters,
                                    launch)
    from xtrain.models import TinyTransformer
    from xtrain.optim import AdamW, clip_grad_norm_

    cfg = model_config()

    def run(ctx, device: str):
        rank = ctx.rank if ctx else 0
        model = TinyTransformer(cfg, device=device, seed=0)
        params = model.parameters()
        if ctx:
            broadcast_parameters(params, ctx)
        reducer = GradientReducer(params, ctx, bucket_mb=args.bucket_mb) if ctx and args.overlap else None
        sharded = bool(ctx and not reducer and args.mode == "train" and args.step == "shard")
        opt = AdamW(model.named_parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                    shard=(ctx.rank, ctx.world_size) if sharded else None)  # ZeRO-1: the rank's moments only
        batches = host_batches(rank, args.batch, args.seq)
        dp = None
        if ctx and not reducer and args.mode == "train" and args.step != "all-reduce":
            dp = DataParallelAdamW(opt, ctx, shard=args.step == "shard")

        def step(i):
            x, y = batches[i % len(batches)]
            _, loss = model(x, y)
            if dp:
                loss.backward()
                loss = loss.detach()
                dp.step(CLIP, extra=[loss])
                return loss
            if reducer:
                reducer.backward(loss, extra=[loss.detach()])
                loss = loss.detach()
            else:
                loss.backward()
                loss = loss.detach()
                if ctx and args.mode != "no-reduce":
                    all_reduce_gradients(params, ctx, extra=[loss])
            clip_grad_norm_(params, CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        def sync():
            xtrain.cuda.synchronize(device)
            if ctx:
                ctx.barrier()

        if args.mode in ("reduce-only", "reduce-flat"):
            # Only the gradient average of one training step, repeated: its cost alone.
            x, y = batches[0]
            model(x, y)[1].backward()
            grads = [p.grad for p in params]
            if args.mode == "reduce-flat":  # the same bytes as one tensor: NCCL's best case
                grads = [xtrain.zeros((sum(g.numel() for g in grads),), dtype="float32", device=device)]
            marker = xtrain.zeros((1,), dtype="float32", device=device)  # the loss's place in the launch

            def step(i):  # noqa: F811
                ctx.all_reduce(grads + [marker])
                return marker

        seconds, loss = timed(step, sync, args.warmup, args.steps)
        overlapped = reducer.launched_during_backward if reducer else 0
        buckets = reducer.num_buckets if reducer else 0
        return seconds, loss, xtrain.memory_stats(device)["allocated_bytes.peak"], overlapped, buckets

    if args.n == 1:
        results = [run(None, "cuda:0")]
    elif args.launch == "processes":  # this process is one rank; rank 0 reports for all
        from xtrain.launch.distributed import run_process

        results = run_process(lambda ctx: ctx.exchange("result", list(run(ctx, ctx.device))))
        if int(os.environ["RANK"]) != 0:
            return
    else:
        results = launch(lambda ctx: run(ctx, ctx.device), devices=list(range(args.n)))
    engine = "xtrain-overlap" if args.n > 1 and args.overlap else "xtrain"
    if args.n > 1 and not args.overlap and args.mode == "train" and args.step != "shard":
        engine += f"-{args.step}"
    if args.mode != "train":
        engine += f"-{args.mode}"
    ctas = os.environ.get("NCCL_MAX_CTAS")
    if ctas and args.n > 1:
        engine += f"-ctas{ctas}" + ("fixed" if os.environ.get("NCCL_MIN_CTAS") else "")
    report(args, engine, [r[:3] for r in results],
           extra={"launch": args.launch if args.n > 1 else "one GPU",
                  "nccl": xtrain._C.dist.nccl_version(), "buckets": results[0][4],
                  "bucket_mb": args.bucket_mb if args.overlap else None, "nccl_max_ctas": ctas,
                  "nccl_min_ctas": os.environ.get("NCCL_MIN_CTAS"),
                  "buckets_launched_during_backward": results[0][3]})


def torch_worker(args) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "bench"))
    import torch_model

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl", device_id=device)
    cfg = model_config()
    weights = xtrain_init(cfg)  # xtrain's own init, so both sides start from the same weights
    model = torch_model.build(weights, cfg, device)
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local]) if world > 1 else model
    opt = torch_model.adamw(model, lr=LR, weight_decay=WEIGHT_DECAY)
    batches = host_batches(rank, args.batch, args.seq)

    def step(i):
        x, y = batches[i % len(batches)]
        _, loss = net(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync():
        torch.cuda.synchronize(device)
        if world > 1:
            dist.barrier()

    seconds, loss = timed(step, sync, args.warmup, args.steps)
    mine = (seconds, loss, torch.cuda.max_memory_allocated(device))
    gathered = [None] * world
    if world > 1:
        dist.all_gather_object(gathered, mine)
        dist.destroy_process_group()
    else:
        gathered = [mine]
    if rank == 0:
        report(args, "pytorch-ddp", gathered, extra={"launch": "torchrun" if world > 1 else "one GPU",
                                                     "torch": torch.__version__,
                                                     "nccl": ".".join(map(str, torch.cuda.nccl.version()))})


def xtrain_init(cfg) -> dict:
    """TinyTransformer's seeded initial weights by Qwen3 name (drawn on the CPU), as numpy."""
    from xtrain.models import TinyTransformer

    model = TinyTransformer(cfg, device="cpu", seed=0)
    return {name: p.numpy() for name, p in model.named_parameters()}


def report(args, engine: str, per_rank: list, extra: dict) -> None:
    seconds = max(r[0] for r in per_rank)  # the slowest rank decides
    n = len(per_rank)
    tokens = n * args.batch * args.seq * args.steps
    cfg = model_config()
    tok_s = tokens / seconds
    row = {"engine": engine, "gpus": n, "tok_s": tok_s, "tok_s_per_gpu": tok_s / n,
           "ms_per_step": 1000 * seconds / args.steps,
           "mfu": tok_s / n * cfg.flops_per_token(args.seq) / PEAK_BF16_FLOPS,
           "final_loss": per_rank[0][1], "peak_mem_gib": max(r[2] for r in per_rank) / 2**30, **extra}
    print(RESULT + json.dumps(row), flush=True)


# ---- the parent: runs every measurement, prints the table, writes the JSON

def run_worker(cmd: list[str], env: dict, timeout: float) -> dict:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith(RESULT)]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def run_group(cmd: list[str], env: dict, n: int, timeout: float) -> list:
    """`cmd` as n processes under a torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT) on this machine; returns each rank's (returncode, stdout, stderr)."""
    port = _free_port()
    procs = []
    for r in range(n):
        env_r = dict(env, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(cmd, env=env_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append((p.returncode, stdout, stderr))
    if any(code != 0 for code, _, _ in out):
        raise RuntimeError(f"{' '.join(cmd)} as {n} processes failed: " +
                           " | ".join(f"rank {r}: {code} {stderr[-1500:]}" for r, (code, _, stderr) in enumerate(out)))
    return out


def run_group_worker(cmd: list[str], env: dict, n: int, timeout: float) -> dict:
    stdout = run_group(cmd, env, n, timeout)[0][1]
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT)]
    return json.loads(lines[-1][len(RESULT):])


def cli_row(args, env: dict, n: int, launch_mode: str, out_dir: Path) -> dict:
    """`xtrain train` on the built-in stories, dim768 bf16 at --batch per GPU: tok/s from the
    median logged step time after --cli-warmup steps, the peak from the log."""
    out = out_dir / f"cli-{n}-{launch_mode}"
    cmd = [sys.executable, "-m", "xtrain", "train", "--preset", PRESET, "--bf16", "--batch", str(args.batch),
           "--seq", str(args.seq), "--steps", str(args.cli_warmup + args.cli_steps), "--eval-every", "0",
           "--save-every", "0", "--sample-tokens", "0", "--no-progress", "--overwrite", "--out", str(out)]
    if launch_mode == "threads":
        run_worker_cli(cmd + ["--devices", str(n)], env)
    elif launch_mode == "processes":
        run_group(cmd, env, n, timeout=900)
    else:
        run_worker_cli(cmd, env)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "ms" in r and r["step"] >= args.cli_warmup]
    ms = float(np.median([r["ms"] for r in steps]))
    cfg = model_config()
    tok_s = n * args.batch * args.seq / (ms / 1000)
    return {"engine": "xtrain-train", "launch": launch_mode, "gpus": n, "tok_s": tok_s, "tok_s_per_gpu": tok_s / n,
            "ms_per_step": ms, "mfu": tok_s / n * cfg.flops_per_token(args.seq) / PEAK_BF16_FLOPS,
            "final_loss": steps[-1]["loss"], "peak_mem_gib": max(r["mem_mb"] for r in steps) / 1024,
            "timed_steps": len(steps)}


def run_worker_cli(cmd: list[str], env: dict) -> None:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts to measure")
    ap.add_argument("--batch", type=int, default=32, help="sequences per GPU per step")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    ap.add_argument("--engines", nargs="+", default=["xtrain", "pytorch-ddp"])
    ap.add_argument("--overlap", action="store_true",
                    help="also measure xtrain averaging gradients while backward runs (GradientReducer)")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="GradientReducer bucket size (--overlap)")
    ap.add_argument("--max-ctas", type=int, nargs="*", default=[],
                    help="also measure xtrain on >1 GPUs with NCCL_MAX_CTAS=N for each N (NCCL's "
                         "kernels then take at most N SMs): the after-backward row, and with "
                         "--overlap the overlapped one")
    ap.add_argument("--fixed-ctas", type=int, nargs="*", default=[],
                    help="also measure, on >1 GPUs, the after-backward average with NCCL on exactly N "
                         "CTAs (NCCL_MIN_CTAS=NCCL_MAX_CTAS=N), for each N (and its reduce-only row "
                         "with --diagnose)")
    ap.add_argument("--diagnose", action="store_true",
                    help="also measure, on >1 GPUs, xtrain's step without the gradient average "
                         "(no-reduce: the ranks' host contention alone) and the average alone "
                         "(reduce-only: the step's gradients, as the loop reduces them; reduce-flat: "
                         "the same bytes as one tensor)")
    ap.add_argument("--steps-dp", nargs="+", choices=["shard", "flat", "all-reduce"], default=["shard"],
                    help="xtrain's data-parallel optimizer steps to measure on >1 GPUs: shard (the training "
                         "loop's: reduce-scatter, AdamW on each GPU's chunk, all-gather; row 'xtrain'), flat "
                         "(one all-reduce of the flat gradient buffer), all-reduce (all_reduce_gradients "
                         "on the per-tensor gradients, the loop before DataParallelAdamW)")
    ap.add_argument("--launch", nargs="+", choices=["threads", "processes"], default=["threads", "processes"],
                    help="xtrain on several GPUs: one process with a thread per GPU, and/or one process per GPU "
                         "(a torchrun-style environment)")
    ap.add_argument("--cli", action="store_true",
                    help="also time the `xtrain train` command (1 GPU, and each --launch mode on the others)")
    ap.add_argument("--cli-steps", type=int, default=40, help="timed steps of each `xtrain train` run (--cli)")
    ap.add_argument("--cli-warmup", type=int, default=10, help="untimed first steps of each --cli run")
    ap.add_argument("--step", choices=["shard", "flat", "all-reduce"], default="shard", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["train", "no-reduce", "reduce-only", "reduce-flat"], default="train",
                    help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["xtrain", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker == "xtrain":  # one worker measures one launch mode (threads unless told)
        args.launch = args.launch[0] if len(args.launch) == 1 else "threads"
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off; inherited by every worker
    if args.worker == "xtrain":
        xtrain_worker(args)
        return 0
    if args.worker == "torch":
        torch_worker(args)
        return 0

    import xtrain

    available = xtrain.cuda.device_count()
    gpus = [n for n in args.gpus if n <= available]
    if not gpus:
        raise SystemExit(f"scaling: needs GPUs; this machine shows {available}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(xtrain.__file__).parent.parent),
                                         *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    common = ["--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--bucket-mb", str(args.bucket_mb)]
    rows = []
    for n in gpus:
        if "xtrain" in args.engines:
            for st in (args.steps_dp if n > 1 else ["shard"]):
                rows.append(run_worker([sys.executable, __file__, "--worker", "xtrain", "--n", str(n),
                                        "--step", st, "--launch", "threads", *common], env, timeout=900))
                print(_fmt_row(rows[-1]), flush=True)
            if n > 1 and "processes" in args.launch:
                rows.append(run_group_worker([sys.executable, __file__, "--worker", "xtrain", "--n", str(n),
                                              "--launch", "processes", *common], env, n, timeout=900))
                print(_fmt_row(rows[-1]), flush=True)
            if args.cli:
                import tempfile

                with tempfile.TemporaryDirectory(prefix="xtrain-scaling-") as tmp:
                    for mode in (args.launch if n > 1 else ["one GPU"]):
                        rows.append(cli_row(args, env, n, mode, Path(tmp)))
                        print(_fmt_row(rows[-1]), flush=True)
            if n > 1:
                for ctas in [None, *args.max_ctas]:
                    env_n = env if ctas is None else dict(env, NCCL_MAX_CTAS=str(ctas))
                    variants = ([[]] if ctas is not None else []) + ([["--overlap"]] if args.overlap else [])
                    if ctas is None and args.diagnose:
                        variants += [["--mode", m] for m in ("no-reduce", "reduce-only", "reduce-flat")]
                    for extra in variants:
                        rows.append(run_worker([sys.executable, __file__, "--worker", "xtrain", "--n", str(n),
                                                *extra, *common], env_n, timeout=900))
                        print(_fmt_row(rows[-1]), flush=True)
                for c in args.fixed_ctas:
                    env_c = dict(env, NCCL_MIN_CTAS=str(c), NCCL_MAX_CTAS=str(c))
                    for extra in [[]] + ([["--mode", "reduce-only"]] if args.diagnose else []):
                        rows.append(run_worker([sys.executable, __file__, "--worker", "xtrain", "--n", str(n),
                                                *extra, *common], env_c, timeout=900))
                        print(_fmt_row(rows[-1]), flush=True)
        if "pytorch-ddp" in args.engines:
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={n}", __file__, "--worker", "torch", *common]
            rows.append(run_worker(torchrun, env, timeout=900))
            print(_fmt_row(rows[-1]), flush=True)

    print_table(rows)
    cfg = model_config()
    record = {"benchmark": "scaling", "date": dt.datetime.now().isoformat(timespec="seconds"),
              "gpu": xtrain.cuda.device_name(0), "gpus_visible": available,
              "commit": args.commit or _commit(),
              "config": {"preset": PRESET, "vocab_size": VOCAB, "bf16": True, "batch_per_gpu": args.batch,
                         "seq": args.seq, "steps": args.steps, "warmup": args.warmup,
                         "params": _num_params(cfg), "flops_per_token": cfg.flops_per_token(args.seq),
                         "peak_bf16_flops": PEAK_BF16_FLOPS},
              "runtime": xtrain.cuda.runtime_info(), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scaling-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


def print_table(rows: list[dict]) -> None:
    base = {r["engine"]: r["tok_s"] for r in rows if r["gpus"] == 1}
    peer = {(r["engine"], r["gpus"]): r["tok_s"] for r in rows}
    print(f"\n{'engine':<24} {'launch':<9} {'GPUs':>4} {'global tok/s':>13} {'tok/s/GPU':>10} {'ms/step':>8} "
          f"{'MFU':>6} {'scaling':>8} {'xtrain/torch':>12} {'peak GiB':>9}")
    for r in rows:
        one = base.get(r["engine"]) or base.get(r["engine"].split("-")[0])
        eff = r["tok_s"] / (one * r["gpus"]) if one else float("nan")
        torch_tok = peer.get(("pytorch-ddp", r["gpus"]))
        ratio = r["tok_s"] / torch_tok if r["engine"].startswith("xtrain") and torch_tok else float("nan")
        print(f"{r['engine']:<24} {r.get('launch', ''):<9} {r['gpus']:>4} {r['tok_s']:>13,.0f} "
              f"{r['tok_s_per_gpu']:>10,.0f} {r['ms_per_step']:>8.1f} {r['mfu']:>6.1%} {eff:>8.1%} {ratio:>12.2f} "
              f"{r['peak_mem_gib']:>9.2f}")
    print("scaling: global tok/s / (GPUs x the same engine's 1-GPU tok/s); xtrain-train: the `xtrain train` "
          "command, timed from its log")


def _fmt_row(r: dict) -> str:
    return (f"  {r['engine']} ({r.get('launch', '')}) on {r['gpus']} GPU(s): {r['tok_s']:,.0f} tok/s, "
            f"{r['ms_per_step']:.1f} ms/step, peak {r['peak_mem_gib']:.2f} GiB")


def _num_params(cfg) -> int:
    return cfg.core_params() + 2 * cfg.vocab_size * cfg.dim + cfg.dim


def _commit() -> str:
    if os.environ.get("XTRAIN_COMMIT"):  # set where the tree's .git may be stale (GPU machine copies)
        return os.environ["XTRAIN_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("XTRAIN_COMMIT", "unknown")


if __name__ == "__main__":
    sys.exit(main())
