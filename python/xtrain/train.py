"""The training loop. Reads top to bottom like nanoGPT's train.py:
config -> data -> model -> optimizer -> one while loop (LR, forward, backward, clip, step, log,
eval, save) -> loss curve and a sample.

Outputs in `out`:
    log.jsonl    one record per step: step, loss, lr, grad_norm, tok_s, ms, mem_mb (+ val_loss
                 records at eval steps)
    ckpt/        the checkpoint (xtrain.state), every save_every steps and at the end
    loss.png     train (and val) loss against step
    sample.txt   a sample from the final model

The loop is train(): setup(), then per step train_step() (with evaluate() and save() when due),
then finish(). One loop serves one device and data-parallel ranks alike: on one device the
context is a distributed.LocalContext (rank 0 of 1), whose collectives do nothing.

Host syncs, and only these: (1) once per step, loss and grad norm are read for the log after the
optimizer step has been queued (forward, backward, clipping and the update are queued without
waiting; the GPU idles only while Python fetches the next batch and launches the next step's first
kernel); (2) one read per evaluation; (3) checkpoint saves; (4) sampling.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import xtrain
from xtrain import distributed, ops
from xtrain import state as ckpt_state
from xtrain.models import TinyTransformer, TransformerConfig, config_for
from xtrain.optim import AdamW, clip_grad_norm_, cosine_lr

CKPT_DIR = "ckpt"
LOG_FILE = "log.jsonl"
SAMPLE_PROMPT = "Once upon a time"
# Peak learning rates that train each preset stably at batch*seq of 2k-16k tokens (smaller models
# take larger steps; dim768 is GPT-2 small's 6e-4).
PRESET_LR = {"tiny": 2e-3, "dim384": 1e-3, "dim768": 6e-4, "dim1024": 5e-4}


# What `xtrain train` runs when a flag is not given, by the kind of device it trains on. CPU: the
# tiny model, a few minutes on two cores. GPU: a model that uses the card, a few minutes on an
# H200 (dim768, 127M parameters in blocks, ~35 ms a step in bf16: 3000 steps ~2 minutes).
# TrainConfig's own defaults are the CPU ones.
MACHINE_DEFAULTS = {
    "cpu": dict(preset="tiny", bf16=False, batch=16, seq=128, steps=800, eval_every=200),
    "cuda": dict(preset="dim768", bf16=True, batch=32, seq=256, steps=3000, eval_every=500),
}


def machine_defaults(device: str) -> dict:
    """MACHINE_DEFAULTS for a device string ("cpu", "cuda:0", ...)."""
    return dict(MACHINE_DEFAULTS["cuda" if device.startswith("cuda") else "cpu"])


@dataclass
class TrainConfig:
    preset: str | None = None          # None: "tiny", or the checkpoint's model when resuming
    data: str | None = None            # prepared dir, raw text/jsonl/parquet source, None: built-in
    out: str = "runs/tiny"
    device: str = "auto"               # auto: cuda if available else cpu
    bf16: bool = False
    recompute: bool = False
    dropout: float = 0.0
    batch: int = 16
    seq: int = 128
    steps: int = 800                   # train until this many steps are done (in total)
    decay_steps: int | None = None     # LR schedule length (None: steps)
    lr: float | None = None            # peak LR; None: the preset's (PRESET_LR), or the resumed run's
    min_lr: float | None = None        # None: lr / 10
    warmup: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_batches: int = 20
    save_every: int = 1000
    resume: str | None = None          # checkpoint directory to continue from
    memory_limit: int | None = None    # bytes the allocator may reserve on the device
    seed: int = 0
    vocab_size: int = 4096             # BPE size when `data` is a raw source
    sample_tokens: int = 200
    sample_prompt: str = SAMPLE_PROMPT
    progress: bool = True
    shard_optimizer: bool = True       # several GPUs: ZeRO-1 step (distributed.DataParallelAdamW)


@dataclass
class Run:
    """Everything one rank's training loop holds, made by setup()."""
    cfg: TrainConfig
    ctx: object                        # distributed.RankContext, or distributed.LocalContext
    out: Path
    device: str
    dataset: object
    train_loader: object
    val_loader: object
    model: TinyTransformer
    optimizer: AdamW
    dp: object                         # distributed.DataParallelAdamW on several GPUs, else None
    max_lr: float
    min_lr: float
    decay_steps: int
    step: int
    tokens_per_step: int
    log: object                        # the open log.jsonl (rank 0), else None
    history: list
    bar: object                        # the progress bar (rank 0), else None
    t_last: float = 0.0
    val_loss: float | None = None


def train(cfg: TrainConfig, ctx=None, prepared=None) -> dict | None:
    """Train as configured; returns a summary (None on ranks other than 0).

    With `ctx` (an xtrain.distributed.RankContext) this is one rank of `xtrain train --devices N`
    (train_data_parallel starts the ranks and passes `prepared` = (dataset, checkpoint or None),
    read once for all of them): the rank takes its slice of every global batch, starts from rank
    0's weights, and the gradients (and the loss) are averaged before clipping and AdamW; only
    rank 0 logs, saves, plots and samples."""
    t_start = time.time()
    run = setup(cfg, ctx, prepared)
    while run.step < cfg.steps:
        run.ctx.check()  # another rank failed: stop here
        if cfg.eval_every > 0 and run.step % cfg.eval_every == 0:
            log_eval(run, evaluate(run))
        train_step(run)
        if cfg.save_every > 0 and run.step % cfg.save_every == 0 and run.step < cfg.steps:
            save(run)
    if cfg.eval_every > 0:
        log_eval(run, evaluate(run))
    save(run)
    return finish(run, t_start)


def setup(cfg: TrainConfig, ctx, prepared) -> Run:
    """Data, model, optimizer, the resumed state and the log: everything before the first step."""
    ranked = ctx is not None  # a rank of a data-parallel launch (even of one rank)
    ctx = ctx if ranked else distributed.LocalContext(resolve_device(cfg.device))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = ctx.device
    if cfg.memory_limit is not None:
        xtrain.set_memory_limit(int(cfg.memory_limit), device)

    # ---- data: each rank takes its disjoint slice of every global batch (xtrain.data.loader)
    if prepared is None:
        ckpt = ckpt_state.load(cfg.resume) if cfg.resume else None
        dataset = open_data(cfg.data, out, cfg.vocab_size, cfg.progress)
        check_tokenizer(ckpt, dataset)
    else:
        dataset, ckpt = prepared
    train_loader = dataset.loader("train", cfg.batch, cfg.seq, cfg.seed, ctx.rank, ctx.world_size)
    val_loader = dataset.loader("val", cfg.batch, cfg.seq, cfg.seed, ctx.rank, ctx.world_size)

    # ---- model: fresh from the preset, or the checkpoint's
    run_flags = dict(bf16=cfg.bf16, recompute=cfg.recompute, dropout=cfg.dropout)
    if ckpt is None:
        if prepared is None:
            xtrain.manual_seed(cfg.seed)  # process-wide; train_data_parallel seeds once for all ranks
        model = TinyTransformer(config_for(cfg.preset or "tiny", dataset.tokenizer.vocab_size, **run_flags),
                                device=device, seed=cfg.seed)
    else:
        if cfg.preset is not None:
            wanted = config_for(cfg.preset, dataset.tokenizer.vocab_size, **run_flags)
            if wanted != TransformerConfig.from_dict({**ckpt.config.to_dict(), **run_flags}):
                raise ckpt_state.CheckpointError(
                    f"--preset {cfg.preset} does not match the checkpoint's model {ckpt.config.to_dict()}")
        model = ckpt.build_model(device, **run_flags)
    dataset.check_vocab(model.config.vocab_size)
    if cfg.seq > model.config.max_seq:
        raise ValueError(f"seq {cfg.seq} exceeds the model's max_seq {model.config.max_seq}")
    ctx.broadcast([model.store.params])  # every rank starts from rank 0's weights
    model.train()

    # ---- optimizer (and the resumed step, loader position and generators)
    max_lr = cfg.lr
    if max_lr is None and ckpt is not None:
        max_lr = (ckpt.meta.get("train_args") or {}).get("lr")
    if max_lr is None:
        max_lr = PRESET_LR[cfg.preset or "tiny"]
    optimizer = AdamW(model.named_parameters(), lr=max_lr, betas=(cfg.beta1, cfg.beta2),
                      weight_decay=cfg.weight_decay)
    step = 0
    if ckpt is not None:
        ckpt.load_optimizer(optimizer)
        if ckpt.loader_state is None:
            raise ckpt_state.CheckpointError(f"{ckpt.path} holds no data-loader state to resume")
        train_loader.load_state_dict(ckpt.loader_state)  # the global stream: the same on every rank
        # each rank its own device generator (its dropout masks); rank 0 also the CPU's
        ckpt.restore_rng(rank=ctx.rank if ranked else None, device=device)
        step = ckpt.step
    # Several GPUs: one collective per step over the flat gradients (and with sharding each rank
    # updates its share of the weights): the same updates as one device.
    dp = distributed.DataParallelAdamW(optimizer, ctx, shard=cfg.shard_optimizer) if ranked else None

    # ---- the log (rank 0)
    run = Run(cfg=cfg, ctx=ctx, out=out, device=device, dataset=dataset, train_loader=train_loader,
              val_loader=val_loader, model=model, optimizer=optimizer, dp=dp, max_lr=max_lr,
              min_lr=cfg.min_lr if cfg.min_lr is not None else max_lr / 10,
              decay_steps=cfg.decay_steps or cfg.steps, step=step,
              tokens_per_step=cfg.batch * cfg.seq * ctx.world_size, log=None, history=[], bar=None)
    if ctx.is_main:
        run.history = _restart_log(out / LOG_FILE, step)
        run.log = open(out / LOG_FILE, "a")
        run.bar = _progress(cfg, step)
        c = model.config
        print(f"xtrain: {model.num_parameters() / 1e6:.2f}M parameters ({c.core_params() / 1e6:.2f}M in blocks), "
              f"{ctx.describe()}, {'bf16' if cfg.bf16 else 'fp32'}{', recompute' if cfg.recompute else ''}, "
              f"{run.tokens_per_step} tokens/step, steps {step} -> {cfg.steps}", flush=True)
    run.t_last = time.time()
    return run


def train_step(run: Run) -> None:
    """One optimizer step: LR, batch, forward, backward, clip + AdamW (+ the gradient average), log."""
    cfg, opt = run.cfg, run.optimizer
    lr = cosine_lr(run.step, run.max_lr, run.min_lr, cfg.warmup, run.decay_steps)
    opt.lr = lr
    x, y = run.train_loader.next_batch()              # int64 (B, S) each, on the host
    _, loss = run.model(x, y)
    loss.backward()
    if run.dp is None:
        grad_norm = clip_grad_norm_(opt.params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    else:
        loss = loss.detach()                          # grads and loss: the global-batch mean
        grad_norm = run.dp.step(cfg.grad_clip, extra=[loss])
    log_step(run, loss, grad_norm, lr)
    run.step += 1


def evaluate(run: Run) -> float:
    """Mean validation loss over cfg.eval_batches global batches. With ranks, each evaluates its
    slice of every global batch and the mean over ranks is the one-device value."""
    cfg, model = run.cfg, run.model
    model.eval()
    total, n = None, 0
    with xtrain.no_grad():
        for x, y in run.val_loader.iter_eval(cfg.batch, cfg.seq, cfg.eval_batches):
            _, loss = model(x, y)
            total = loss if total is None else ops.add(total, loss)
            n += 1
    model.train()
    run.ctx.all_reduce([total], "avg")
    return total.item() / n  # sync point: one read per evaluation


def save(run: Run) -> None:
    """Checkpoint the run at its step (rank 0 writes; every rank takes part: with ranks the
    sharded state is gathered and every rank's generator state is collected first)."""
    states = None
    if run.dp is not None:
        run.dp.gather_state()  # the weights and moments complete before rank 0 saves them
        states = run.ctx.exchange("rank_rng", xtrain.get_rng_state(run.device))
    if run.ctx.is_main:
        ckpt_state.save(run.out / CKPT_DIR, run.model, run.optimizer, run.step,
                        loader_state=run.train_loader.state_dict(), tokenizer=run.dataset.tokenizer,
                        dataset=str(run.dataset.path), train_args={**asdict(run.cfg), "lr": run.max_lr},
                        rank_rng=states)
    run.t_last = time.time()


def log_step(run: Run, loss, grad_norm, lr: float) -> None:
    # Sync point (the only one per step): loss and grad norm come to the host for the log. The
    # read waits for the whole step, so the time since the last read is the step's time. Every
    # rank reads, which keeps the ranks' hosts in step.
    loss_f, norm_f = loss.item(), grad_norm.item()
    if not run.ctx.is_main:
        return
    now = time.time()
    dt, run.t_last = now - run.t_last, now
    mem_mb = memory_mb(run.device)
    _emit(run, {"step": run.step, "loss": loss_f, "lr": lr, "grad_norm": norm_f,
                "tok_s": run.tokens_per_step / dt, "ms": 1000 * dt, "mem_mb": mem_mb})
    run.bar.set_postfix_str(f"loss {loss_f:.4f} | {run.tokens_per_step / dt:,.0f} tok/s | {mem_mb:,.0f} MB",
                            refresh=False)
    run.bar.update(1)


def log_eval(run: Run, val_loss: float) -> None:
    run.val_loss = val_loss
    if run.ctx.is_main:
        _emit(run, {"step": run.step, "val_loss": val_loss})
        run.bar.write(f"step {run.step}: val loss {val_loss:.4f}")
    run.t_last = time.time()


def finish(run: Run, t_start: float) -> dict | None:
    """Rank 0: close the log, plot the curve, write a sample and return the summary."""
    if not run.ctx.is_main:
        return None
    run.bar.close()
    run.log.close()
    plot_losses(run.history, run.out / "loss.png")
    sample = sample_text(run.model, run.dataset.tokenizer, run.cfg.sample_prompt, run.cfg.sample_tokens,
                         seed=run.cfg.seed)
    (run.out / "sample.txt").write_text(sample + "\n")
    train_losses = [r["loss"] for r in run.history if "loss" in r]
    summary = {"steps": run.step, "final_loss": train_losses[-1] if train_losses else None,
               "first_loss": train_losses[0] if train_losses else None, "val_loss": run.val_loss,
               "time_s": time.time() - t_start, "out": str(run.out), "sample": sample}
    if run.dp is not None:
        summary["devices"] = list(run.ctx.devices)
    print(f"done: {run.step} steps in {summary['time_s']:.0f}s, train loss {_fmt(summary['final_loss'])}, "
          f"val loss {_fmt(run.val_loss)}; checkpoint {run.out / CKPT_DIR}")
    print(f"sample:\n{sample}", flush=True)
    return summary


def _emit(run: Run, record: dict) -> None:
    run.log.write(json.dumps(record) + "\n")
    run.log.flush()
    run.history.append(record)


def train_data_parallel(cfg: TrainConfig, devices="all", *, timeout: float = distributed.DEFAULT_TIMEOUT) -> dict:
    """train(cfg) on several GPUs of this machine, one thread each, with the same global-batch
    semantics as one GPU: each rank takes cfg.batch sequences of every global step (global batch =
    batch x GPUs), gradients are averaged before clipping and AdamW, so every rank holds the same
    model. The data are prepared, the checkpoint read and the generators seeded once, on the calling
    thread, before the rank threads start."""
    devs = distributed.resolve_devices(devices)
    if cfg.device not in ("auto", "cuda"):
        raise ValueError(f"--device {cfg.device} picks one device; with --devices the GPUs are "
                         f"cuda:{', cuda:'.join(map(str, devs))}")
    distributed.require_available()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_state.load(cfg.resume) if cfg.resume else None
    dataset = open_data(cfg.data, out, cfg.vocab_size, cfg.progress)
    check_tokenizer(ckpt, dataset)
    if ckpt is None:
        xtrain.manual_seed(cfg.seed)  # process-wide: once, before the rank threads start
    results = distributed.launch(lambda ctx: train(cfg, ctx=ctx, prepared=(dataset, ckpt)), devs, timeout=timeout)
    return results[0]


# ---- helpers

def check_tokenizer(ckpt, dataset) -> None:
    """A resumed run must read data made with the checkpoint's tokenizer."""
    if ckpt is not None and ckpt.tokenizer_meta["fingerprint"] != dataset.tokenizer.fingerprint:
        raise ckpt_state.CheckpointError(
            f"{ckpt.path} was trained with tokenizer {ckpt.tokenizer_meta['name']} "
            f"({ckpt.tokenizer_meta['fingerprint']}); the data in {dataset.path} uses "
            f"{dataset.tokenizer.name} ({dataset.tokenizer.fingerprint})")


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda:0" if xtrain.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not xtrain.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return "cuda:0" if device == "cuda" else device


def open_data(data, out: Path, vocab_size: int, progress: bool):
    """None means the built-in stories as an endless stream (xtrain.data.stream); a stream or
    prepared directory is opened; a raw source is prepared into out/data first."""
    from xtrain.data import is_stream_dir, open_dataset, open_stream, prepare

    if data is None:
        return open_stream(progress=progress)
    path = Path(data)
    if is_stream_dir(path):
        return open_stream(path, progress=progress)
    if path.is_dir() and (path / "meta.json").is_file():
        return open_dataset(path)
    return open_dataset(prepare(path, out / "data", vocab_size=vocab_size, progress=progress))


def memory_mb(device: str) -> float:
    stats = xtrain.memory_stats(device)
    return stats["allocated_bytes.peak"] / 2**20


def sample_text(model, tokenizer, prompt: str, max_new_tokens: int, seed: int = 0,
                temperature: float = 0.8, top_k: int | None = 50, greedy: bool = False) -> str:
    ids = [tokenizer.eot_id] + tokenizer.encode(prompt)  # documents start after an eot
    out = model.generate([ids], max_new_tokens, temperature=temperature, top_k=top_k,
                         greedy=greedy, seed=seed, stop_token=tokenizer.eot_id)
    new = [int(t) for t in out[0, len(ids):]]
    if tokenizer.eot_id in new:
        new = new[:new.index(tokenizer.eot_id)]
    return prompt + tokenizer.decode(new)


def plot_losses(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in history if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in history if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), lw=0.8, alpha=0.5, label="train")
        ax.plot(*zip(*_ema(train)), lw=1.5, label="train (EMA 0.9)")
    if val:
        ax.plot(*zip(*val), "o-", label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ema(points, beta: float = 0.9):
    out, avg = [], None
    for s, v in points:
        avg = v if avg is None else beta * avg + (1 - beta) * v
        out.append((s, avg))
    return out


def _restart_log(path: Path, step: int) -> list[dict]:
    """Keep the records of steps before `step` (those after a crash would be repeated)."""
    if not path.exists():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        if r.get("step", math.inf) < step:
            kept.append(r)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return kept


def _progress(cfg: TrainConfig, step: int):
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=step, desc="train", unit="step", dynamic_ncols=True,
                disable=not cfg.progress)


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4f}"
