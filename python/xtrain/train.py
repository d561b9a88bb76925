"""The training loop. Reads top to bottom like nanoGPT's train.py:
config -> data -> model -> optimizer -> one while loop (LR, forward, backward, clip, step, log,
eval, save) -> loss curve and a sample.

Outputs in `out`:
    log.jsonl    one record per step: step, loss, lr, grad_norm, tok_s, ms, mem_mb (+ val_loss
                 records at eval steps)
    ckpt/        the checkpoint (xtrain.state), every save_every steps and at the end
    loss.png     train (and val) loss against step
    sample.txt   a sample from the final model

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


def train(cfg: TrainConfig, ctx=None, prepared=None) -> dict | None:
    """Train as configured; returns a summary. With `ctx` (an xtrain.distributed.RankContext),
    this is one rank of `xtrain train --devices N` (started by distributed.train_data_parallel,
    which passes `prepared` = (dataset, checkpoint or None) read once for all ranks): the rank
    takes its slice of every global batch, starts from rank 0's weights, averages gradients (and
    the loss) before clipping and AdamW, and only rank 0 logs, saves, plots and samples. Other
    ranks return None."""
    t_start = time.time()
    main = ctx is None or ctx.is_main
    rank, world = (0, 1) if ctx is None else (ctx.rank, ctx.world_size)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg.device) if ctx is None else ctx.device
    if cfg.memory_limit is not None:
        xtrain.set_memory_limit(int(cfg.memory_limit), device)

    # ---- data
    if prepared is None:
        ckpt = ckpt_state.load(cfg.resume) if cfg.resume else None
        dataset = open_data(cfg.data, out, cfg.vocab_size, cfg.progress)
        check_tokenizer(ckpt, dataset)
    else:
        dataset, ckpt = prepared
    tokenizer = dataset.tokenizer
    # Each rank takes its disjoint slice of every global batch (see xtrain.data.loader).
    train_loader = dataset.loader("train", cfg.batch, cfg.seq, cfg.seed, rank, world)
    val_loader = dataset.loader("val", cfg.batch, cfg.seq, cfg.seed, rank, world)

    # ---- model
    run_flags = dict(bf16=cfg.bf16, recompute=cfg.recompute, dropout=cfg.dropout)
    if ckpt is None:
        if ctx is None:  # process-wide; the launcher seeds once before its rank threads start
            xtrain.manual_seed(cfg.seed)
        model_cfg = config_for(cfg.preset or "tiny", tokenizer.vocab_size, **run_flags)
        model = TinyTransformer(model_cfg, device=device, seed=cfg.seed)
    else:
        if cfg.preset is not None:
            wanted = config_for(cfg.preset, tokenizer.vocab_size, **run_flags)
            if wanted != TransformerConfig.from_dict({**ckpt.config.to_dict(), **run_flags}):
                raise ckpt_state.CheckpointError(
                    f"--preset {cfg.preset} does not match the checkpoint's model "
                    f"{ckpt.config.to_dict()}")
        model = ckpt.build_model(device, **run_flags)
        model_cfg = model.config
    dataset.check_vocab(model_cfg.vocab_size)
    if cfg.seq > model_cfg.max_seq:
        raise ValueError(f"seq {cfg.seq} exceeds the model's max_seq {model_cfg.max_seq}")
    params = model.parameters()
    if ctx is not None:
        distributed.broadcast_parameters(params, ctx)  # every rank starts from rank 0's weights
    model.train()

    # ---- optimizer
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
        train_loader.load_state_dict(ckpt.loader_state)  # the global stream: same on every rank
        if ctx is None:
            ckpt.restore_rng()
        else:  # each rank its own device generator (its dropout masks), rank 0 also the CPU's
            ckpt.restore_rng(rank=ctx.rank, device=device)
        step = ckpt.step
    # Several GPUs: gradients in one flat buffer, one collective per step (and with sharding,
    # each rank updates its share of the weights); the same updates as one device.
    dp = None if ctx is None else distributed.DataParallelAdamW(optimizer, ctx, shard=cfg.shard_optimizer,
                                                                       model=model)
    decay_steps = cfg.decay_steps or cfg.steps
    min_lr = cfg.min_lr if cfg.min_lr is not None else max_lr / 10

    # ---- logging (rank 0 only)
    tokens_per_step = cfg.batch * cfg.seq * world
    log_path = out / LOG_FILE
    history = _restart_log(log_path, step) if main else []
    log_file = open(log_path, "a") if main else None
    bar = _progress(cfg, step) if main else None
    if main:
        where = device if ctx is None else f"{world} GPUs ({', '.join(f'cuda:{d}' for d in ctx.devices)})"
        print(f"xtrain: {model.num_parameters() / 1e6:.2f}M parameters "
              f"({model_cfg.core_params() / 1e6:.2f}M in blocks), {where}, "
              f"{'bf16' if cfg.bf16 else 'fp32'}{', recompute' if cfg.recompute else ''}, "
              f"{tokens_per_step} tokens/step, steps {step} -> {cfg.steps}", flush=True)

    def emit(record: dict) -> None:
        log_file.write(json.dumps(record) + "\n")
        log_file.flush()
        history.append(record)

    def log_step(step: int, loss, grad_norm, lr: float) -> None:
        nonlocal t_last
        # Sync point (the only one per step): loss and grad norm come to the host for the log.
        # The read waits for the whole step, so the time since the last read is the step's time.
        # Every rank reads, which keeps the ranks' hosts in step.
        loss_f, norm_f = loss.item(), grad_norm.item()
        if not main:
            return
        now = time.time()
        dt, t_last = now - t_last, now
        mem_mb = memory_mb(device)
        emit({"step": step, "loss": loss_f, "lr": lr, "grad_norm": norm_f,
              "tok_s": tokens_per_step / dt, "ms": 1000 * dt, "mem_mb": mem_mb})
        bar.set_postfix_str(f"loss {loss_f:.4f} | {tokens_per_step / dt:,.0f} tok/s | "
                            f"{mem_mb:,.0f} MB", refresh=False)
        bar.update(1)

    def evaluate() -> float:
        # With ranks, each evaluates its slice of every global eval batch and the mean over
        # ranks is the one-device value of the same global batch.
        model.eval()
        total, n = None, 0
        with xtrain.no_grad():
            for x, y in val_loader.iter_eval(cfg.batch, cfg.seq, cfg.eval_batches):
                _, loss = model(x, y)
                total = loss if total is None else ops.add(total, loss)
                n += 1
        model.train()
        if ctx is not None:
            ctx.all_reduce([total], "avg")
        return total.item() / n  # sync point: one read per evaluation

    def rank_rng():
        """Every rank's device generator at this step boundary (called on every rank; rank 0
        saves them). None on one device."""
        if ctx is None:
            return None
        dp.gather_state()  # the moments complete on rank 0 before it saves them
        return ctx.exchange("rank_rng", xtrain.get_rng_state(device))

    def save(states) -> None:
        ckpt_state.save(out / CKPT_DIR, model, optimizer, step,
                        loader_state=train_loader.state_dict(), tokenizer=tokenizer,
                        dataset=str(dataset.path), train_args={**asdict(cfg), "lr": max_lr},
                        rank_rng=states)

    # ---- the loop
    t_last = time.time()
    val_loss = None
    while step < cfg.steps:
        if ctx is not None:
            ctx.check()  # another rank failed: stop here
        if cfg.eval_every > 0 and step % cfg.eval_every == 0:
            val_loss = evaluate()
            if main:
                emit({"step": step, "val_loss": val_loss})
                bar.write(f"step {step}: val loss {val_loss:.4f}")
            t_last = time.time()

        lr = cosine_lr(step, max_lr, min_lr, cfg.warmup, decay_steps)
        optimizer.lr = lr
        x, y = train_loader.next_batch()              # int64 (B, S) each, on the host
        _, loss = model(x, y)
        loss.backward()
        if dp is None:
            grad_norm = clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            loss = loss.detach()                      # grads and loss: the global-batch mean
            grad_norm = dp.step(cfg.grad_clip, extra=[loss])
        log_step(step, loss, grad_norm, lr)
        step += 1

        if cfg.save_every > 0 and step % cfg.save_every == 0 and step < cfg.steps:
            states = rank_rng()
            if main:
                save(states)
            t_last = time.time()

    # ---- wrap up: final eval on every rank; checkpoint, curve and sample on rank 0
    if cfg.eval_every > 0:
        val_loss = evaluate()
        if main:
            emit({"step": step, "val_loss": val_loss})
    states = rank_rng()
    if not main:
        return None
    bar.close()
    save(states)
    log_file.close()
    plot_losses(history, out / "loss.png")
    sample = sample_text(model, tokenizer, cfg.sample_prompt, cfg.sample_tokens, seed=cfg.seed)
    (out / "sample.txt").write_text(sample + "\n")
    train_losses = [r["loss"] for r in history if "loss" in r]
    summary = {"steps": step, "final_loss": train_losses[-1] if train_losses else None,
               "first_loss": train_losses[0] if train_losses else None, "val_loss": val_loss,
               "time_s": time.time() - t_start, "out": str(out), "sample": sample}
    if ctx is not None:
        summary["devices"] = list(ctx.devices)
    print(f"done: {step} steps in {summary['time_s']:.0f}s, train loss "
          f"{_fmt(summary['final_loss'])}, val loss {_fmt(val_loss)}; checkpoint {out / CKPT_DIR}")
    print(f"sample:\n{sample}", flush=True)
    return summary


# ---- helpers

def check_tokenizer(ckpt, dataset) -> None:
    """A resumed run must read data made with the checkpoint's tokenizer."""
    if ckpt is not None and ckpt.meta["tokenizer"]["fingerprint"] != dataset.tokenizer.fingerprint:
        raise ckpt_state.CheckpointError(
            f"{ckpt.path} was trained with tokenizer {ckpt.meta['tokenizer']['name']} "
            f"({ckpt.meta['tokenizer']['fingerprint']}); the data in {dataset.path} uses "
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
