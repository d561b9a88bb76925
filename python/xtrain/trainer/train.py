"""The training loop. Reads top to bottom like nanoGPT's train.py:
config -> data -> model -> optimizer -> one while loop (LR, forward, backward, clip, step, log,
eval, save) -> loss curve and a sample.

Outputs in `out`:
    log.jsonl    one record per step: step, loss, lr, grad_norm, tok_s, ms, mem_mb (+ mfu on a
                 GPU); val_loss and val_ppl records at eval steps
    config.toml  the resolved configuration (xtrain.trainer.runconfig): what `--resume` continues with
    ckpt/        the latest checkpoint (xtrain.io.state): after every evaluation (or every
                 save_every steps), every save_minutes, on SIGINT/SIGTERM and at the end
    best/        the saved checkpoint of lowest validation loss
    loss.png     train (and val) loss against step
    sample.txt   a sample from the final model
    tensorboard/, wandb/   with --tracker (xtrain.trainer.trackers): the log's scalars

A step is one optimizer step over the global batch: micro_batch x accum x ranks sequences
(xtrain.trainer.batching.BatchPlan). Each rank's share of it comes from one loader draw and runs as
`accum` forward/backward passes whose gradients sum in the leaves' .grad
(accumulate_gradients); then one clip and one AdamW step (with ranks: one collective).

The loop is train(): setup(), then per step train_step() (with evaluate() and save() when due),
then finish(). One loop serves one device and data-parallel ranks alike: on one device the
context is a distributed.LocalContext (rank 0 of 1), whose collectives do nothing.

Host syncs, and only these: (1) once per step, loss and grad norm are read for the log after the
optimizer step has been queued (forward, backward, clipping and the update are queued without
waiting; the GPU idles only while Python fetches the next batch and launches the next step's first
kernel); (2) one read per evaluation; (3) checkpoint saves; (4) sampling; (5) once per run, the
CUDA graph capture empties the allocator's cache.

CUDA graphs (TrainConfig.cuda_graphs, on by default on CUDA): after two eager steps the step is
captured as two graphs (forward + backward; clip + AdamW, with the gradient average's NCCL
collectives under data parallelism) and replayed, with the batch copied into static buffers and
the step's LR and AdamW constants written to device memory before each replay, bitwise equal to
the eager step (xtrain.graphs, docs/training.md), dropout included. The graphs are dropped on the
training thread when the steps end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path


import xtrain
from xtrain.trainer import batching, progress, runconfig, stopping, trackers
from xtrain.launch import distributed
from xtrain import graphs, ops
from xtrain.models import hf_import
from xtrain.models.generate import release_decode
from xtrain.io import llmc, rundir
from xtrain.io import state as ckpt_state
from xtrain.io.rundir import DirLock, writing
from xtrain.models import ALL_PRESETS, TinyTransformer, TransformerConfig, config_classes, model_class, preset_config
from xtrain.optim import AdamW, Muon, block_matrices
from xtrain.trainer.runconfig import ConfigError, TrainConfig
from xtrain.trainer.schedule import DEFAULT_DECAY_FRAC, Schedule

CKPT_DIR = "ckpt"
LOG_FILE = "log.jsonl"
SAMPLE_PROMPT = "Once upon a time"
# Own data: the sample prompt is the first PROMPT_WORDS words of the first validation document,
# found within its first PROMPT_SCAN_TOKENS tokens.
PROMPT_WORDS = 4
PROMPT_SCAN_TOKENS = 256
# Peak learning rates that train each preset stably at batch*seq of 2k-16k tokens (smaller models
# take larger steps; dim768 is GPT-2 small's 6e-4; the 0.6B-1.7B published shapes the 3e-4 and
# 2e-4 of models of their size trained from scratch). The GPT-2 presets take the GPT-3 paper's rates
# for those sizes, as llm.c does (6e-4 for 124M).
PRESET_LR = {"tiny": 2e-3, "dim384": 1e-3, "dim768": 6e-4, "dim1024": 5e-4,
             "qwen3-0.6b": 3e-4, "llama3.2-1b": 3e-4, "qwen3-1.7b": 2e-4,
             "gpt2-124m": 6e-4, "gpt2-350m": 3e-4, "gpt2-774m": 2.5e-4, "gpt2-1.5b": 2e-4}
# Peak learning rate from pretrained weights (--init-from): continued pre-training / fine-tuning
# takes smaller steps than training from scratch, which would undo much of what the weights know.
INIT_FROM_LR = 1e-4
# Peak bf16 throughput of the H200, measured there: an 8192^3 bf16 matmul through PyTorch, 790
# TFLOP/s (docs/performance.md). MFU = model FLOPs per token (TransformerConfig.flops_per_token) x
# tokens/s over this peak x GPUs; fp32 runs are measured against it too (as nanoGPT does).
H200_BF16_PEAK_FLOPS = 790e12
# Validation windows shorter than this say too little about the model: below it, an error.
MIN_EVAL_SEQ = 16
# With ranks, how often (in steps) they agree whether to stop (a signal) or save (--save-minutes):
# an exchange waits for every rank, so not at every step.
CONTROL_EVERY = 10
# The run warns when it has read its training split more than this many times while the
# validation loss rose at the last two evaluations.
REPEAT_EPOCHS = 4
BEST_DIR = "best"
# Note [Diverged checkpoints]: a save must not replace OUT/ckpt with weights that diverged while
# still finite (a too-large step; NaN/Inf ones state.save refuses anyway). A save is suspect when
# its largest |weight| is more than DIVERGED_WEIGHT_FACTOR times that of the weights the run
# started from or last saved (at least 1: RMSNorm weights start there), or when the mean
# training loss of its last LOSS_WINDOW logged steps is above the lowest such mean of this
# invocation's earlier saves by more than max(DIVERGED_LOSS_NATS, DIVERGED_LOSS_FRACTION x it), or
# when none of those steps had a finite loss. A suspect save goes to OUT/ckpt.suspect, OUT/ckpt
# keeps the last good one, and the run stops naming both (DivergedRunError). Normal training
# moves max |w| by a few times over a run and its windowed loss by well under a nat between
# saves; a run that blew up moves them by orders of magnitude.
DIVERGED_WEIGHT_FACTOR = 100.0
LOSS_WINDOW = 10
DIVERGED_LOSS_NATS = 2.0
DIVERGED_LOSS_FRACTION = 0.5


@dataclass(frozen=True)
class EvalPlan:
    """Validation batches: `batches` global batches of `batch` windows of `seq` tokens per rank."""
    batch: int
    seq: int
    batches: int
    note: str | None = None            # how it differs from --eval-batches x --batch x --seq


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
    optimizer: AdamW | Muon
    dp: object                         # distributed.DataParallelAdamW/Muon on several GPUs, else None
    plan: batching.BatchPlan           # micro-batch, accumulation, recompute
    eval: EvalPlan | None              # None: no evaluation (eval_every 0)
    schedule: Schedule
    step: int
    record: dict                       # the resolved configuration (config.toml, train_args)
    sample_prompt: str
    peak_flops: float | None           # for MFU: on GPUs, H200_BF16_PEAK_FLOPS x ranks
    log: object = None                 # the open log.jsonl (rank 0), else None
    history: list = None
    bar: object = None                 # the progress bar (rank 0), else None
    trackers: list = ()                # open xtrain.trainer.trackers sinks (rank 0)
    stop: object = None                # the stopping.StopRequest its signals set
    step_events: list = None           # CUDA: two (start, end) xtrain.cuda.Event pairs, used in turn
    step_s: list = None                # seconds of each step of this invocation (logged, rank 0)
    t_saved: float = 0.0               # monotonic time of the last save (or of the start)
    saved_step: int | None = None      # the step of the last checkpoint saved by this invocation
    val_loss: float | None = None
    val_step: int | None = None        # the step val_loss was measured at
    val_losses: list = None            # this run's validation losses, in order (resumed: the log's too)
    best: tuple | None = None          # (val loss, step) of OUT/best
    repeat_warned: bool = False
    pending: tuple | None = None       # (step, lr, PendingValues of its loss and norm, replayed, timing)
    graphs: object = None              # xtrain.graphs.StepGraphs on a GPU, else None
    bad_steps: int = 0                 # non-finite steps in a row (their updates skipped)
    skipped_steps: int = 0             # all of them
    start_step: int = 0                # the step this invocation started at
    good_max_w: float | None = None    # max |w| at the start or the last good save (rank 0)
    good_loss: float | None = None     # the lowest windowed loss at this invocation's saves


def train(cfg: TrainConfig, ctx=None, prepared=None, stop=None) -> dict | None:
    """Train as configured; returns a summary (None on ranks other than 0).

    With `ctx` (an xtrain.launch.distributed.RankContext) this is one rank of `xtrain train --devices N`
    (train_data_parallel starts the ranks and passes `prepared` = (dataset, start): start is the
    checkpoint to resume, the hf_import.Pretrained of --init-from, or None; read once for all of
    them): the rank takes its slice of every global batch, starts from rank
    0's weights, and the gradients (and the loss) are averaged before clipping and AdamW; only
    rank 0 logs, saves, plots and samples.

    Checkpoints: OUT/ckpt after every evaluation (or every --save-every steps), every
    --save-minutes and at the end; OUT/best the saved one of lowest validation loss. SIGINT or
    SIGTERM (`stop`: the launcher's stopping.StopRequest, shared by its rank threads) ends the run
    after the step under way with a checkpoint, and raises stopping.StopRequested. A resumed run
    that has nothing left to do (--steps not above its step) says so and returns None."""
    t_start = time.time()
    stop = stop if stop is not None else stopping.StopRequest()
    run = setup(cfg, ctx, prepared)
    if run is None:
        return None
    run.stop = stop
    stopped = False
    with stop.installed():
        try:
            with batching.explain_oom(run):  # an OOM names the flags that change it
                if eval_due(run):
                    log_eval(run, evaluate(run))
                while run.step < cfg.steps:
                    run.ctx.check()  # another rank failed: stop here
                    train_step(run)
                    stopped, timed = controls(run)
                    evaluated = run.step < cfg.steps and eval_due(run)
                    if evaluated:
                        log_eval(run, evaluate(run))
                    if stopped or timed or (run.step < cfg.steps and save_due(run, evaluated)):
                        save(run)
                    if stopped:
                        break
                settle(run)
        finally:
            if run.graphs is not None:  # on this (rank) thread, before its communicator goes
                run.graphs.close()  # (xtrain.launch.distributed, Note [Objects of a rank thread])
        if stopped:
            return interrupted(run)
        with batching.explain_oom(run):
            if eval_due(run):
                log_eval(run, evaluate(run))
        if run.saved_step != run.step:
            save(run)
    return finish(run, t_start)


def eval_due(run: Run) -> bool:
    """An evaluation at this step: every --eval-every steps and at the end, once per step (a
    resumed run does not repeat the evaluation its log already holds at its first step)."""
    cfg = run.cfg
    if cfg.eval_every <= 0 or run.val_step == run.step:
        return False
    return run.step % cfg.eval_every == 0 or run.step >= cfg.steps


def save_due(run: Run, evaluated: bool) -> bool:
    """A checkpoint at this step: after every evaluation, or every --save-every steps when given."""
    every = run.cfg.save_every
    if every is None:
        return evaluated
    return every > 0 and run.step % every == 0


def controls(run: Run) -> tuple[bool, bool]:
    """(stop, save) after a step: a signal asked the run to stop; --save-minutes have passed since
    the last save. With ranks, every CONTROL_EVERY steps all ranks agree (any rank's stop request,
    rank 0's clock), so all stop or save at the same step; one device decides at every step."""
    minutes = run.cfg.save_minutes
    timed = minutes > 0 and time.monotonic() - run.t_saved >= 60 * minutes
    stop = run.stop.is_set()
    if run.ctx.world_size == 1:
        return stop, timed
    if run.step % CONTROL_EVERY != 0:
        return False, False
    votes = run.ctx.exchange("controls", [bool(stop), bool(timed)])
    return any(v[0] for v in votes), bool(votes[0][1])


def setup(cfg: TrainConfig, ctx, prepared) -> Run:
    """Data, model, optimizer, batch plan, the resumed state and the log: everything before the
    first step."""
    runconfig.validate(cfg)
    ranked = ctx is not None  # a rank of a data-parallel launch (even of one rank)
    ctx = ctx if ranked else distributed.LocalContext(resolve_device(cfg.device))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = ctx.device
    if cfg.memory_limit is not None:
        xtrain.set_memory_limit(int(cfg.memory_limit), device)
    if cfg.threads is not None:
        xtrain.set_num_threads(int(cfg.threads))
    if ctx.is_main:
        trackers.check_available(cfg.trackers)

    # ---- data (each rank takes its disjoint slice of every global batch: xtrain.data.loader)
    dataset, start = prepared if prepared is not None else open_inputs(cfg, cfg.progress)
    ckpt = start if isinstance(start, ckpt_state.Checkpoint) else None
    init = start if isinstance(start, hf_import.Pretrained) else None
    recorded = recorded_args(ckpt) if ckpt is not None else {}
    if ckpt is not None and ckpt.step >= cfg.steps:
        if ctx.is_main:  # a finished run: nothing is trained, evaluated, sampled or written
            print(f"xtrain: nothing to do: {ckpt.path} is at step {ckpt.step} and --steps is {cfg.steps}; "
                  f"pass a larger --steps to train further", flush=True)
        return None

    # ---- model: fresh from the preset, pretrained weights (--init-from), or the checkpoint's
    run_flags = dict(bf16=cfg.bf16, recompute=cfg.recompute is True, dropout=cfg.dropout,
                     doc_sep=dataset.tokenizer.eot_id if cfg.doc_mask else None)
    # Options of the Qwen3/Llama block only (TransformerConfig fields); GPT-2's config has neither.
    # (A --preset is held to this by runconfig.validate; here the model of a checkpoint or --init-from.)
    source = init.config if init is not None else ckpt.config if ckpt is not None else None
    qwen3 = ALL_PRESETS[cfg.preset or "tiny"] == "qwen3" if source is None else isinstance(source, TransformerConfig)
    for flag, on, what in (("--doc-rope", cfg.doc_rope, "RoPE (GPT-2's positions are learned)"),
                           ("--fp8", cfg.fp8, "linears")):
        if on and not qwen3:
            raise ConfigError(f"{flag} applies to the Qwen3/Llama block's {what}; this model is "
                              f"{type(source).__name__}")
    if cfg.doc_rope:
        run_flags["doc_rope"] = True
    if qwen3:
        run_flags["fp8"] = cfg.fp8  # a run option, as recompute: a resume may switch it
    if ckpt is None:
        if prepared is None:
            xtrain.manual_seed(cfg.seed)  # process-wide; train_data_parallel seeds once for all ranks
        if init is not None:
            model = init.build(model_class(init.config), device, **run_flags)
        else:
            config = preset_config(cfg.preset or "tiny", dataset.tokenizer.vocab_size, **run_flags)
            model = model_class(config)(config, device=device, seed=cfg.seed)
    else:
        if cfg.preset is not None:
            wanted = preset_config(cfg.preset, dataset.tokenizer.vocab_size, **run_flags)
            # max_seq sizes no weight of the Qwen3-style model: the preset's holds, so a checkpoint
            # saved under a preset's earlier, lower max_seq resumes at the longer --seq it allows now
            if isinstance(wanted, TransformerConfig):
                run_flags["max_seq"] = wanted.max_seq
            if wanted != type(ckpt.config).from_dict({**ckpt.config.to_dict(), **run_flags}):
                raise ckpt_state.CheckpointError(
                    f"--preset {cfg.preset} does not match the checkpoint's model {ckpt.config.to_dict()}")
        model = ckpt.build_model(device, **run_flags)
    dataset.check_vocab(model.config.vocab_size)
    if cfg.seq > model.config.max_seq:
        raise ConfigError(f"--seq {cfg.seq} exceeds the model's max_seq {model.config.max_seq}")
    ctx.broadcast([model.store.params])  # every rank starts from rank 0's weights
    model.train()

    # ---- optimizer and LR schedule
    schedule = make_schedule(cfg, recorded)
    sharded = ranked and cfg.shard_optimizer  # ZeRO-1: this rank's moments only, from the start
    optimizer = make_optimizer(cfg, model, schedule.max_lr, shard=(ctx.rank, ctx.world_size) if sharded else None,
                               ranks=(ctx.rank, ctx.world_size) if ranked else None)

    # ---- batch plan (may probe micro-batches on the model), then the loaders: one draw of the
    # training loader is this rank's share of a global batch, all its micro-batches
    plan = plan_batch(cfg, ctx, model)
    train_loader = dataset.loader("train", plan.rank_batch, cfg.seq, cfg.seed, ctx.rank, ctx.world_size)
    ev = None
    if cfg.eval_every > 0:
        ev = plan_eval(dataset.split("val").header.n_tokens, plan.micro_batch, cfg.seq,
                       cfg.eval_batches, ctx.world_size, dataset.path)
    val_loader = None if ev is None else dataset.loader("val", ev.batch, ev.seq, cfg.seed, ctx.rank, ctx.world_size)

    # Several GPUs: one collective per step over the flat gradients (and with sharding each rank
    # updates its share of the weights, and keeps the moments of that share only): the same
    # updates as one device.
    dp = None
    if ranked:
        dp = distributed.DataParallelMuon(optimizer, ctx) if isinstance(optimizer, Muon) else \
            distributed.DataParallelAdamW(optimizer, ctx, shard=cfg.shard_optimizer)

    # ---- the resumed step, loader position and generators (sharded moments: this rank's chunks)
    step = 0
    if ckpt is not None:
        ckpt.load_optimizer(optimizer)
        if ckpt.loader_state is None:
            raise ckpt_state.CheckpointError(f"{ckpt.path} holds no data-loader state to resume")
        train_loader.load_state_dict(ckpt.loader_state)  # the global stream: the same on every rank
        # each rank its own device generator (its dropout masks); rank 0 also the CPU's
        ckpt.restore_rng(rank=ctx.rank if ranked else None, device=device,
                         cpu=ctx.rank == 0 or getattr(ctx, "owns_process", False))
        step = ckpt.step

    # ---- the record of the run, the log, the trackers (rank 0)
    prompt = cfg.sample_prompt if cfg.sample_prompt is not None else default_prompt(cfg.data, dataset)
    record = runconfig.record_of(
        cfg, preset=cfg.preset or recorded.get("preset") or (None if ckpt or init else "tiny"),
        data=None if cfg.data is None else str(Path(cfg.data).resolve()), out=str(out),
        init_from=None if cfg.init_from is None else str(Path(cfg.init_from).resolve()),
        lr=schedule.max_lr, min_lr=schedule.min_lr, decay_steps=schedule.decay_steps,
        batch=plan.micro_batch, grad_accum=None, batch_tokens=plan.tokens, recompute=plan.recompute,
        memory_limit=cfg.memory_limit, sample_prompt=prompt, devices=ctx.world_size)
    run = Run(cfg=cfg, ctx=ctx, out=out, device=device, dataset=dataset, train_loader=train_loader,
              val_loader=val_loader, model=model, optimizer=optimizer, dp=dp, plan=plan, eval=ev,
              schedule=schedule, step=step, record=record, sample_prompt=prompt,
              peak_flops=H200_BF16_PEAK_FLOPS * ctx.world_size if device.startswith("cuda") else None)
    graphs_note = None
    if device.startswith("cuda"):  # on the CPU the switch is a no-op: every step is eager
        blocked = None if cfg.cuda_graphs else "switched off (--no-cuda-graphs)"
        blocked = blocked or graphs.graph_blockers(device)
        run.graphs = graphs.StepGraphs(model, optimizer, plan.accum, cfg.grad_clip, blocked=blocked,
                                       note=lambda msg: _note(run, msg), dp=dp)
        graphs_note = (f"CUDA graphs: the step is captured after {run.graphs.warmup} eager steps and replayed"
                       if blocked is None else f"CUDA graphs off: {blocked}; every step runs eagerly")
    if ctx.is_main:
        runconfig.write_record(out / runconfig.CONFIG_FILE, record,
                               [f"grad-accum = {plan.accum} follows from batch-tokens / (batch x seq x devices)"]
                               + ([plan.why] if plan.why != "as given" else []))
        run.history = _restart_log(out / LOG_FILE, step)
        run.log = open(out / LOG_FILE, "a")
        run.trackers = trackers.open_trackers(cfg.trackers, out, record, step)
        c = model.config
        print(f"xtrain: {model.num_parameters() / 1e6:.2f}M parameters ({c.core_params() / 1e6:.2f}M in blocks), "
              f"{ctx.describe()}, {'bf16' if cfg.bf16 else 'fp32'}{', recompute' if plan.recompute else ''}, "
              f"steps {step} -> {cfg.steps}", flush=True)
        notes = [f"from pretrained {init.architecture} weights in {init.path} (step 0, new optimizer)"] if init else []
        notes += [plan.describe()] + ([plan.why] if plan.why != "as given" else [])
        notes += [schedule.describe()] + schedule.notes(step, cfg.steps, recorded_schedule(recorded, schedule))
        notes += [ev.note] if ev is not None and ev.note else []
        notes += [graphs_note] if graphs_note else []
        notes += [f"outputs in {out}: {_outputs(run)}"]
        for n in notes:
            print(f"xtrain: {n}", flush=True)
        run.bar = progress.open_progress(cfg.steps, step, cfg.log_every, cfg.progress)  # below the header
    _resume_results(run)
    run.start_step = step
    if ctx.is_main:  # sync point, once: the reference of Note [Diverged checkpoints]
        run.good_max_w = ckpt_state.max_abs(model.store.state_arrays())
    run.step_s = []
    run.t_saved = time.monotonic()
    if run.device.startswith("cuda"):
        index = int(run.device.partition(":")[2] or 0)
        run.step_events = [(xtrain.cuda.Event(index), xtrain.cuda.Event(index)) for _ in range(2)]
    return run


def make_optimizer(cfg: TrainConfig, model, lr: float, shard=None, ranks=None):
    """--optimizer adamw: AdamW over every parameter (its moments this rank's share only with
    shard=(rank, world_size)). muon: Muon for the blocks' 2-D weights (q/k/v/o, gate/up/down: the
    matrices under "layers."), AdamW for the embedding, the head and the norms; one learning rate
    and weight decay for both (Muon's match_rms_adamw scaling, docs/training.md). With data
    parallelism (ranks=(rank, world_size)) Muon allocates only this rank's share of the momentum
    and of AdamW's moments (DataParallelMuon keeps no more), whatever --shard-optimizer says."""
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "adamw":
        return AdamW(model.named_parameters(), lr=lr, betas=betas, weight_decay=cfg.weight_decay, shard=shard)
    matrices = block_matrices(model.named_parameters())
    return Muon(model.named_parameters(), matrices=matrices, lr=lr, betas=betas, weight_decay=cfg.weight_decay,
                shard=ranks)


def _resume_results(run: Run) -> None:
    """What a resumed run takes over from its log: the validation losses, the evaluation at its
    step (not repeated: with ranks, rank 0's log decides for all, which evaluate together), and
    OUT/best's loss and step."""
    vals = [(r["step"], r["val_loss"]) for r in run.history if "val_loss" in r] if run.ctx.is_main else []
    if run.ctx.world_size > 1:
        vals = run.ctx.exchange("val_history", vals)[0]
    run.val_losses = [v for _, v in vals]
    if vals and vals[-1][0] == run.step:
        run.val_step, run.val_loss = vals[-1]
    best_step = ckpt_state.step_of(run.out / BEST_DIR)
    at_best = [v for s, v in vals if s == best_step]
    run.best = (at_best[-1], best_step) if at_best else None


def recorded_args(ckpt) -> dict:
    """The checkpoint's record of its run's options (state.json train_args), each value held to
    its option's rule as a flag's would be: an edited or damaged record is one ConfigError. Keys
    that name no option (one an older xtrain recorded) are left out."""
    args = {k: v for k, v in (ckpt.meta.get("train_args") or {}).items() if k in runconfig.OPTIONS}
    return runconfig.values_of(args, f"{ckpt.path / ckpt_state.STATE_FILE} train_args", record=True)


def make_schedule(cfg: TrainConfig, recorded: dict) -> Schedule:
    """The LR schedule: peak LR from --lr, else the resumed run's, else the preset's; min LR and
    the schedule's length likewise from the flags, else the resumed run's record, else lr / 10 and
    --steps. A resumed run thus keeps its schedule when --steps grows (see xtrain.trainer.schedule)."""
    max_lr = cfg.lr if cfg.lr is not None else recorded.get("lr")
    if max_lr is None:
        max_lr = INIT_FROM_LR if cfg.init_from is not None else PRESET_LR[cfg.preset or "tiny"]
    min_lr = cfg.min_lr
    if min_lr is None:
        min_lr = recorded.get("min_lr") if cfg.lr is None and recorded.get("min_lr") is not None else max_lr / 10
    if min_lr > max_lr:
        raise ConfigError(f"--min-lr {min_lr:g} must be <= the peak lr {max_lr:g}")
    decay_steps = cfg.decay_steps or recorded.get("decay_steps") or cfg.steps
    return Schedule(cfg.schedule, max_lr, min_lr, cfg.warmup, decay_steps, cfg.decay_frac)


def recorded_schedule(recorded: dict, current: Schedule) -> Schedule | None:
    """The schedule a resumed run was trained with, from its record (None for a fresh run)."""
    if not recorded or recorded.get("lr") is None:
        return None
    return Schedule(recorded.get("schedule", "cosine"), recorded["lr"], recorded.get("min_lr", current.min_lr),
                    recorded.get("warmup", current.warmup), recorded.get("decay_steps") or current.decay_steps,
                    recorded.get("decay_frac", DEFAULT_DECAY_FRAC))


def plan_batch(cfg: TrainConfig, ctx, model) -> batching.BatchPlan:
    """The batch plan (xtrain.trainer.batching). `--batch auto` and `--recompute auto` probe micro-batches
    on the model under --memory-limit (or the GPU's memory); with ranks, every rank probes and the
    smallest micro-batch wins. Sets the model's recompute as planned."""
    searching = cfg.batch == "auto" or cfg.recompute == "auto"
    fits, memory = None, ""
    if searching and (cfg.memory_limit is not None or ctx.device.startswith("cuda")):
        fits, memory = batching.probe(model, cfg.seq, ctx.device), batching.memory_note(cfg.memory_limit)
    with batching.search_limit(ctx.device, cfg.memory_limit if fits else None):
        plan = batching.plan(cfg.batch, cfg.grad_accum, cfg.batch_tokens, cfg.seq, ctx.world_size,
                             cfg.recompute, fits, memory)
    if searching:  # exchanged as JSON (processes exchange through their rendezvous connection)
        plans = [batching.BatchPlan(**p) for p in ctx.exchange("batch_plan", dataclasses.asdict(plan))]
        plan = min(plans, key=lambda p: (not p.recompute, p.micro_batch))
    batching.set_recompute(model, plan.recompute)
    return plan


def plan_eval(n: int, batch: int, seq: int, eval_batches: int, world_size: int, data="the data") -> EvalPlan:
    """Validation batches that the validation split can fill: --eval-batches batches of the
    micro-batch at --seq where it can; fewer batches, fewer windows or (last) shorter windows
    where it is small, with a note saying so; a ConfigError naming the flags when it is too small
    for even one window of MIN_EVAL_SEQ tokens per rank. `n`: tokens in the validation split."""
    per_rank = (n - 1) // seq // world_size  # windows of seq + 1 tokens at stride seq, per rank
    asked = f"--eval-batches {eval_batches} x {batch} windows of {seq} tokens"
    if per_rank >= batch:
        got = min(eval_batches, per_rank // batch)
        note = None if got == eval_batches else \
            f"the validation split has {n:,} tokens: evaluating {got} batch{'es' * (got != 1)} instead of {asked}"
        return EvalPlan(batch, seq, got, note)
    if per_rank >= 1:
        return EvalPlan(per_rank, seq, 1, f"the validation split has {n:,} tokens: evaluating one batch of "
                                          f"{per_rank} window{'s' * (per_rank != 1)} of {seq} tokens instead of "
                                          f"{asked}")
    short = (n - 1) // world_size
    if short < MIN_EVAL_SEQ:
        raise ConfigError(f"the validation split of {data} has {n} tokens, too few to evaluate "
                          f"(at least {MIN_EVAL_SEQ * world_size + 1}): prepare the data with a larger "
                          f"--val-fraction, or train with --eval-every 0")
    return EvalPlan(1, short, 1, f"the validation split has {n:,} tokens: evaluating one window of {short} "
                                 f"tokens per rank, shorter than --seq {seq}")


def accumulate_gradients(model, x, y, accum: int, seed=None):
    """Forward and backward over `accum` equal micro-batches of the rows of x, y (int64
    (accum x B, S)); the gradients sum in the leaves' .grad (the store's slots with data
    parallelism): the first backward writes them (they are None after the last step's zero_grad),
    the next ones add. Each backward is seeded with 1/accum, so the gradients end holding the
    gradient of the mean loss over all the rows (every row has S targets, so the mean of the
    micro-batch means is the batch mean): one batch of accum x B rows gives the same up to float
    rounding (the 1/accum scaling itself is exact for powers of two). Returns the mean loss,
    detached, on the device (no host sync). x, y may also be device tensors (a CUDA graph's static
    inputs: the micro-batches are views), and `seed` the 1/accum upstream gradient made beforehand
    (a capture cannot upload it)."""
    return graphs.forward_backward(model, x, y, accum, seed)


def train_step(run: Run) -> None:
    """One optimizer step: LR, this rank's share of the global batch, forward + backward per
    micro-batch (gradients accumulating), clip + AdamW (+ the gradient average: one collective per
    step, not per micro-batch), log."""
    # The step's time starts with its batch (Note [Step time]): on CUDA an event before its first
    # launch, on the CPU the host's clock.
    timing = run.step_events[run.step % 2] if run.step_events is not None else time.perf_counter()
    if run.step_events is not None:
        timing[0].record()
    cfg, opt = run.cfg, run.optimizer
    lr = run.schedule(run.step)
    opt.lr = lr
    x, y = run.train_loader.next_batch()              # int64 (accum x B, S) each, on the host
    # CUDA graphs (after warm-up): the batch into the static buffers, the forward+backward graph,
    # settle(), this step's LR and count into device memory, the clip+AdamW graph. The same
    # kernels with the same values as below, in the same order (xtrain.graphs).
    out = run.graphs.step(x, y, settle=lambda: settle(run)) if run.graphs is not None else None
    if out is not None:
        loss, grad_norm = out
    else:
        loss = accumulate_gradients(run.model, x, y, run.plan.accum)
        # The previous step's loss and norm reach the host now, while this step's forward and backward
        # keep the GPU busy; a NaN/Inf there was already skipped on the device and is counted here,
        # before this step's update.
        settle(run)
        # A NaN/Inf loss or gradient norm skips the update on the device (AdamW's guard).
        if run.dp is None:
            grad_norm = opt.clip_and_step(cfg.grad_clip, loss)   # norm, clipping and AdamW in one pass
            opt.zero_grad(set_to_none=True)
        else:                                             # grads and loss: the global-batch mean
            grad_norm = run.dp.step(cfg.grad_clip, extra=[loss], guard=loss)
        if run.graphs is not None:
            run.graphs.eager()
    # The replayed graphs' outputs sit at fixed addresses: this copy is queued before the next
    # replay overwrites them.
    if run.step_events is not None:
        timing[1].record()  # after the update's last launch
    else:
        timing = (timing, time.perf_counter())
    values = xtrain.cuda.read_async([loss, grad_norm])
    run.pending = (run.step, lr, values, out is not None, timing)
    run.step += 1


def settle(run: Run) -> None:
    """Log the step whose loss and norm are on their way to the host (train_step queued their copy)."""
    if run.pending is None:
        return
    step, lr, values, replayed, timing = run.pending
    run.pending = None
    log_step(run, step, values, lr, replayed, timing)


def evaluate(run: Run) -> float:
    """Mean validation loss over the eval plan's global batches (--eval-batches of the micro-batch
    where the split is large enough: plan_eval). With ranks, each evaluates its slice of every
    global batch and the mean over ranks is the one-device value."""
    settle(run)
    model, ev = run.model, run.eval
    model.eval()
    total, n = None, 0
    with xtrain.no_grad():
        for x, y in run.val_loader.iter_eval(ev.batch, ev.seq, ev.batches):
            _, loss = model(x, y)
            total = loss if total is None else ops.add(total, loss)
            n += 1
    model.train()
    run.ctx.all_reduce([total], "avg")
    return total.item() / n  # sync point: one read per evaluation


def save(run: Run) -> None:
    """Checkpoint the run at its step into OUT/ckpt, and into OUT/best too when the evaluation at
    this step has the lowest validation loss so far (rank 0 writes; every rank takes part: with
    ranks the sharded state is gathered and every rank's generator state is collected first)."""
    settle(run)  # the log holds every step the checkpoint holds, before it is saved
    states = None
    if run.dp is not None:
        run.dp.gather_state(root=0)  # the weights complete, a full copy of the moments on rank 0
        states = run.ctx.exchange("rank_rng", xtrain.get_rng_state(run.device))
    if run.ctx.is_main:
        loss = window_loss(run)
        previous = ckpt_state.step_of(run.out / CKPT_DIR) if run.cfg.keep > 1 else None
        try:
            ckpt_state.save(run.out / CKPT_DIR, run.model, run.optimizer, run.step,
                            loader_state=run.train_loader.state_dict(), tokenizer=run.dataset.tokenizer,
                            dataset=str(run.dataset.path), train_args=run.record,
                            rank_rng=states, suspect=lambda params: diverged(run, params, loss),
                            keep_previous=None if previous in (None, run.step) else
                            run.out / rundir.history_name(previous))
        except ckpt_state.DivergedError as e:
            raise DivergedRunError(f"{e}. To go on, {resume_hint(run)} (with a lower --lr or --grad-clip); inspect "
                                   f"the suspect one with xtrain sample --ckpt {e.aside}") from None
        prune_history(run)
        if loss is not None and math.isfinite(loss):
            run.good_loss = loss if run.good_loss is None else min(run.good_loss, loss)
    run.saved_step, run.t_saved = run.step, time.monotonic()
    if run.val_step == run.step and (run.best is None or run.val_loss < run.best[0]):
        run.best = (run.val_loss, run.step)
        if run.ctx.is_main:  # the files of OUT/ckpt, linked (no second write)
            ckpt_state.copy(run.out / CKPT_DIR, run.out / BEST_DIR)


def resume_hint(run: Run) -> str:
    """How to go on after the run stopped on divergence: the command resuming its last good
    checkpoint (and the older ones of its --keep history), or starting again when it has none."""
    if not ckpt_state.exists(run.out / CKPT_DIR):
        return f"start again: xtrain train --out {run.out} --overwrite"
    hint = (f"resume from the good one ({run.out / CKPT_DIR}, step {ckpt_state.step_of(run.out / CKPT_DIR)}): "
            f"xtrain train --out {run.out} --resume")
    older = [str(p) for p in reversed(rundir.checkpoint_history(run.out))]
    if older:
        hint += f" (older ones: {', '.join(older[:3])}{', ...' if len(older) > 3 else ''})"
    return hint


def prune_history(run: Run) -> None:
    """Keep the newest run.cfg.keep - 1 of the run's older checkpoints (OUT/ckpt-STEP, oldest save
    removed first): with OUT/ckpt, the last --keep saves. OUT/best is no part of the history."""
    history = rundir.checkpoint_history(run.out)
    for path in history[:max(0, len(history) - (run.cfg.keep - 1))]:
        ckpt_state.remove(path)


class DivergedRunError(RuntimeError):
    """Training stopped: a checkpoint's weights or loss diverged (Note [Diverged checkpoints]);
    it was saved aside and the last good checkpoint kept."""


def window_loss(run: Run) -> float | None:
    """The mean training loss of the last LOSS_WINDOW logged steps (NaN when none of them is
    finite; None before any step of this invocation)."""
    losses = [r["loss"] for r in run.history[-4 * LOSS_WINDOW:]
              if "loss" in r and r["step"] >= run.start_step][-LOSS_WINDOW:]
    if not losses:
        return None
    finite = [v for v in losses if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def diverged(run: Run, params: dict, loss: float | None) -> str | None:
    """Why the weights `params` (name -> host array) and the windowed training `loss` must not
    replace the last good checkpoint, or None (Note [Diverged checkpoints])."""
    top = ckpt_state.max_abs(params)
    ref = max(run.good_max_w or 0.0, 1.0)
    if top > DIVERGED_WEIGHT_FACTOR * ref:
        return (f"the weights diverged (largest |w| {top:.3g}, {top / ref:.3g} times the {ref:.3g} of the last good "
                f"weights)")
    if loss is not None and math.isnan(loss):
        return f"the loss of the last {LOSS_WINDOW} steps was not finite"
    if loss is not None and run.good_loss is not None:
        margin = max(DIVERGED_LOSS_NATS, DIVERGED_LOSS_FRACTION * run.good_loss)
        if loss > run.good_loss + margin:
            return (f"the loss diverged (mean {loss:.4g} over the last {LOSS_WINDOW} steps; it was {run.good_loss:.4g} "
                    f"at an earlier save)")
    run.good_max_w = top
    return None


def log_step(run: Run, step: int, values, lr: float, replayed: bool, timing: tuple) -> None:
    """Log `step` once its loss and norm are on the host. `timing`: the step's (start, end) pair,
    CUDA events around its launches or the host's perf_counter around it (Note [Step time])."""
    # Sync point (the only one per step, one step late): the loss and grad norm of `step` come to
    # the host for the log; waiting for them waits for that step only, not for the one queued
    # since. Every rank reads, which keeps the ranks' hosts in step.
    loss_f, norm_f = values.wait()
    skipped = not (math.isfinite(loss_f) and math.isfinite(norm_f))
    if run.ctx.is_main:
        _log_step_record(run, step, loss_f, norm_f, lr, skipped, replayed, step_seconds(*timing))
    if skipped:
        note_skipped_step(run, step, loss_f, norm_f)
    else:
        run.bad_steps = 0


def step_seconds(start, end) -> float:
    """The time of one step alone, evaluations, saves and samples between steps left out.

    Note [Step time]: on the CPU the ops run as they are called, so a step's time is the host
    time of train_step itself, from its batch to the end of its update (two perf_counter floats).
    On a GPU train_step only queues the work, so the host's clock cannot see when it ran: the step
    is bracketed by two CUDA events on its stream, one recorded before its first launch (the batch's
    upload) and one after its last (the update), and its time is the device time between them
    (read one step late, after the step's loss has landed, so the wait costs nothing). The start
    event fires when the device reaches it: when the work queued before it (the previous step, an
    evaluation, a save's copies) has finished, so nothing of that counts, and a device left idle
    while the host prepares the step counts as the step's own time. Each step's time is its own,
    whenever the host reads it: a late read shifts no time between steps."""
    if isinstance(start, float):
        return end - start
    return end.elapsed_ms_since(start) / 1000.0


def _log_step_record(run: Run, step: int, loss_f: float, norm_f: float, lr: float, skipped: bool,
                     replayed: bool, dt: float) -> None:
    dt = max(dt, 1e-9)  # a clock's resolution: never a division by zero
    run.step_s.append(dt)
    mem_mb, tok_s = memory_mb(run.device), run.plan.tokens / dt
    record = {"step": step, "loss": loss_f, "lr": lr, "grad_norm": norm_f, "tok_s": tok_s,
              "ms": 1000 * dt, "mem_mb": mem_mb}
    if skipped:
        record["skipped"] = True
    if replayed:
        record["graph"] = True  # the step ran as replayed CUDA graphs
    if run.peak_flops:
        record["mfu"] = run.model.config.flops_per_token(run.plan.seq) * tok_s / run.peak_flops
    _emit(run, record)
    # Warm-up longer than the run: say on every step that the LR never reaches its peak.
    peak = "" if run.schedule.reaches_peak(run.cfg.steps) else f"(warm-up: peak {run.schedule.max_lr:.2g} not reached)"
    run.bar.step(progress.StepLine(step, run.cfg.steps, loss_f, lr, 1000 * dt, tok_s, mem_mb,
                                   record.get("mfu"), peak))


class NonFiniteStepsError(RuntimeError):
    """Training stopped: too many steps in a row had a NaN/Inf loss or gradient norm."""


def note_skipped_step(run: Run, step: int, loss_f: float, norm_f: float) -> None:
    """The step's update was skipped on the device: undo its count in the optimizer (the bias
    correction stays that of the steps taken), count it, and stop after cfg.nonfinite_limit in a
    row. Every rank sees the same (averaged) values, so every rank stops alike."""
    run.optimizer.step_count -= 1
    run.bad_steps += 1
    run.skipped_steps += 1
    if run.ctx.is_main:
        run.bar.write(f"step {step}: loss {loss_f}, gradient norm {norm_f}: not finite, update skipped "
                      f"({run.bad_steps} in a row)")
    if run.bad_steps >= run.cfg.nonfinite_limit:
        raise NonFiniteStepsError(
            f"step {step}: {run.bad_steps} steps in a row had a non-finite loss or gradient norm "
            f"(loss {loss_f}, norm {norm_f}); training stopped, nothing of them saved. To go on, "
            f"{resume_hint(run) if run.ctx.is_main else 'resume the last checkpoint'} with a lower --lr or "
            f"--grad-clip or a longer --warmup, or check the data (--nonfinite-limit sets how many such steps "
            f"in a row are tolerated)")


def log_eval(run: Run, val_loss: float) -> None:
    run.val_loss, run.val_step = val_loss, run.step
    run.val_losses.append(val_loss)
    if run.ctx.is_main:
        ppl = math.exp(min(val_loss, 700.0))  # perplexity; exp overflows a float past ~709
        _emit(run, {"step": run.step, "val_loss": val_loss, "val_ppl": ppl})
        best = len(run.val_losses) > 1 and val_loss < min(run.val_losses[:-1])
        run.bar.write(f"step {run.step}: val loss {val_loss:.4f}, perplexity {ppl:.2f}{', the best so far' * best}")
        warn_repeats(run)


def warn_repeats(run: Run) -> None:
    """One warning when the run has read its training split more than REPEAT_EPOCHS times while
    the validation loss rose at the last two evaluations (it is memorising the corpus)."""
    v = run.val_losses
    if run.repeat_warned or len(v) < 3 or not (v[-3] < v[-2] < v[-1]):
        return
    epochs = epochs_read(run)
    if epochs is None or epochs <= REPEAT_EPOCHS:
        return
    run.repeat_warned = True
    kept = (f"{run.out / BEST_DIR} holds the checkpoint of lowest validation loss (step {run.best[1]}); "
            if run.best is not None else "")
    run.bar.write(f"xtrain: warning: the run has read its training data {epochs:.1f} times and the validation "
                  f"loss rose at the last two evaluations: it is overfitting a small corpus. {kept}More data "
                  f"or fewer --steps would do better")


def epochs_read(run: Run) -> float | None:
    """How many times the run has read its training split (None: an endless stream)."""
    from xtrain.data.errors import DataError

    try:
        n = run.dataset.split("train").header.n_tokens
    except DataError:  # the built-in stream has no train split: it is endless
        return None
    return run.step * run.plan.tokens / n if n else None


def interrupted(run: Run):
    """After a signal stopped the loop (and the checkpoint was saved): close the outputs, say
    where the run is and how to resume it, and raise stopping.StopRequested."""
    if run.ctx.is_main:
        run.bar.close()
        run.log.close()
        for t in run.trackers:
            t.close()
        plot_losses(run.history, run.out / "loss.png")
        print(f"xtrain: stopped by {run.stop.signal_name} after step {run.step} of {run.cfg.steps}; "
              f"checkpoint {run.out / CKPT_DIR} (step {run.step}){_best_note(run)}", flush=True)
        print(f"xtrain: to continue: xtrain train --out {run.out} --resume", flush=True)
    run.ctx.exchange("stopped", run.step)  # with ranks: all raise once rank 0 has written and said so
    raise stopping.StopRequested(f"stopped by {run.stop.signal_name} at step {run.step}, checkpoint saved")


def _best_note(run: Run) -> str:
    if run.best is None:
        return ""
    return f"; best {run.out / BEST_DIR} (step {run.best[1]}, val loss {run.best[0]:.4f})"


def finish(run: Run, t_start: float) -> dict | None:
    """Rank 0: close the log, plot the curve, write a sample and return the summary."""
    if not run.ctx.is_main:
        return None
    run.bar.close()
    run.log.close()
    for t in run.trackers:
        t.close()
    plot_losses(run.history, run.out / "loss.png")
    sample = sample_text(run.model, run.dataset.tokenizer, run.sample_prompt, run.cfg.sample_tokens,
                         seed=run.cfg.seed)
    # The decode step generate() kept on the model: on a GPU a CUDA graph captured on this thread,
    # which must go on it, not with the model in a later garbage collection on another thread
    # (xtrain.launch.distributed, Note [Objects of a rank thread]).
    release_decode(run.model)
    (run.out / "sample.txt").write_text(sample + "\n")
    train_losses = [r["loss"] for r in run.history if "loss" in r]
    summary = {"steps": run.step, "final_loss": train_losses[-1] if train_losses else None,
               "first_loss": train_losses[0] if train_losses else None, "val_loss": run.val_loss,
               "time_s": time.time() - t_start, "out": str(run.out), "sample": sample,
               "skipped_steps": run.skipped_steps}
    if run.dp is not None:
        summary["devices"] = list(run.ctx.devices)
    speed = ""
    if run.step_s:  # the median step of this invocation: evaluations and saves are no step's
        median = statistics.median(run.step_s)
        summary.update(median_ms=1000 * median, median_tok_s=run.plan.tokens / median)
        speed = f" (median step {1000 * median:,.0f} ms, {summary['median_tok_s']:,.0f} tok/s"
        if run.peak_flops:
            summary["median_mfu"] = run.model.config.flops_per_token(run.plan.seq) * summary["median_tok_s"] \
                / run.peak_flops
            speed += f", MFU {100 * summary['median_mfu']:.1f}%"
        speed += ")"
    print(f"done: {run.step} steps in {summary['time_s']:.0f}s{speed}, train loss {_fmt(summary['final_loss'])}, "
          f"val loss {_fmt(run.val_loss)}")
    older = [p.name for p in reversed(rundir.checkpoint_history(run.out))]
    history = f"; older {', '.join(older)} (--keep {run.cfg.keep})" if older else ""
    print(f"checkpoints: {run.out / CKPT_DIR} (step {run.step}){history}{_best_note(run)}")
    print(f"outputs in {run.out}: {_outputs(run)}")
    print(f"sample:\n{sample}", flush=True)
    return summary


def _note(run: Run, message: str) -> None:
    """A one-line message of rank 0 (above the progress bar once it exists)."""
    if not run.ctx.is_main:
        return
    if run.bar is not None:
        run.bar.write(message)
    else:
        print(message, flush=True)


def _emit(run: Run, record: dict) -> None:
    with writing(run.out / LOG_FILE):
        run.log.write(json.dumps(record) + "\n")
        run.log.flush()
    run.history.append(record)
    for t in run.trackers:
        t.log(record)


def _outputs(run: Run) -> str:
    """Where the run's files are, for the messages at the start and the end."""
    paths = {"log": LOG_FILE, "plot": "loss.png", "checkpoint": CKPT_DIR, "sample": "sample.txt",
             "config": runconfig.CONFIG_FILE}
    paths.update({name: getattr(trackers, f"{name.upper()}_DIR") for name in run.cfg.trackers})
    return ", ".join(f"{k} {v}{'/' if k in ('checkpoint', *trackers.TRACKERS) else ''}" for k, v in paths.items())


def train_data_parallel(cfg: TrainConfig, devices="all", *, timeout: float = distributed.DEFAULT_TIMEOUT) -> dict:
    """train(cfg) on several GPUs of this machine, one thread each, with the same global-batch
    semantics as one GPU: each rank takes its share of every global batch (micro-batch x accum
    sequences; global batch = that x GPUs), gradients are averaged before clipping and AdamW, so
    every rank holds the same model. The data are prepared, the checkpoint read and the generators
    seeded once, on the calling thread, before the rank threads start."""
    runconfig.validate(cfg)
    trackers.check_available(cfg.trackers)
    devs = distributed.resolve_devices(devices)
    if cfg.device not in ("auto", "cuda"):
        raise ValueError(f"--device {cfg.device} picks one device; with --devices the GPUs are "
                         f"cuda:{', cuda:'.join(map(str, devs))}")
    distributed.require_available()
    dataset, start = open_inputs(cfg, cfg.progress)
    if not isinstance(start, ckpt_state.Checkpoint):
        xtrain.manual_seed(cfg.seed)  # process-wide: once, before the rank threads start
    # The ranks are threads: this (main) thread takes SIGINT/SIGTERM for all of them.
    stop = stopping.StopRequest()
    with stop.installed():
        results = distributed.launch(lambda ctx: train(cfg, ctx=ctx, prepared=(dataset, start), stop=stop), devs,
                                     timeout=timeout)
    return results[0]


def train_processes(cfg: TrainConfig, env, *, rendezvous: str | None = None, claim=None,
                    timeout: float = distributed.DEFAULT_TIMEOUT, **stand_ins) -> dict | None:
    """train(cfg) as this process's rank of a process group started by torchrun, srun or mpirun
    (`env`: xtrain.launch.env.LaunchEnv), one GPU per process; the same loop, global batch and
    checkpoints as train_data_parallel's threads. `rendezvous`: how the ranks meet (tcp,
    tcp:HOST:PORT, file:PATH, mpi; default: the launcher's). `claim`: a context manager factory
    rank 0 holds around the run (the CLI's lock on --out). Rank 0 opens (or prepares) the data
    first, then the others open it. Returns the summary on rank 0, None elsewhere. `stand_ins`:
    run_process's device, communicator and unique_id, for tests without GPUs."""
    runconfig.validate(cfg)
    if cfg.device not in ("auto", "cuda"):
        raise ConfigError(f"--device {cfg.device} picks one device; under {env.launcher} each process drives the "
                          f"GPU of its local rank")
    if not stand_ins:
        distributed.require_available("xtrain.trainer.train.train_processes")

    def rank_main(ctx):
        with claim() if claim is not None and ctx.is_main else contextlib.nullcontext():
            if ctx.is_main:
                trackers.check_available(cfg.trackers)
                prepared = open_inputs(cfg, cfg.progress)
            # Rank 0 has prepared the data (if it had to: maybe for long; its heartbeat says it is alive).
            ctx.exchange("inputs_ready", True, timeout=math.inf)
            if not ctx.is_main:
                prepared = open_inputs(cfg, False, lock=False)  # rank 0 prepared it, holding the lock
            if not isinstance(prepared[1], ckpt_state.Checkpoint):
                xtrain.manual_seed(cfg.seed)  # as the threads' launch: every rank's generators alike
            return train(cfg, ctx=ctx, prepared=prepared)

    return distributed.run_process(rank_main, env, rendezvous_method=rendezvous, timeout=timeout, **stand_ins)


def open_inputs(cfg: TrainConfig, progress: bool, lock: bool = True):
    """(dataset, start): the run's data, opened (or prepared into OUT/data, with the pretrained
    model's tokenizer under --init-from), and what the run starts from (the checkpoint it resumes,
    the hf_import.Pretrained of --init-from, or None), checked against each other."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    given = None  # the tokenizer a raw --data source is prepared with (else a BPE trained on it)
    if cfg.resume:
        start = ckpt_state.load(cfg.resume, pin=True)  # its weights and moments are read after the data
        if (start.meta.get("train_args") or {}).get("init_from"):
            given = start.tokenizer()  # the pretrained model's, as the run began: OUT/data holds that
    elif cfg.init_from is not None:
        start = read_init_from(cfg.init_from)
        given = start.tokenizer
    else:
        start = None
    dataset = open_data(cfg.data, out, cfg.vocab_size, progress, tokenizer=given, lock=lock)
    check_tokenizer(start, dataset)
    return dataset, start


# ---- helpers

def read_init_from(path) -> "hf_import.Pretrained":
    """The --init-from directory, read and checked; it must bring its tokenizer (the data must be
    tokenized the way the model was trained)."""
    if Path(path).is_file():  # llm.c's GPT-2 model file (gpt2_124M.bin, _bf16.bin)
        return llmc.read_pretrained(path)
    init = hf_import.read_pretrained(path, config_classes())
    if init.tokenizer is None:
        raise hf_import.PretrainedError(
            f"--init-from {path}: no tokenizer.json or tokenizer.model beside the weights; the run needs the "
            f"model's own tokenizer to read the data the way the model was trained")
    return init


def check_tokenizer(start, dataset) -> None:
    """A resumed run must read data made with the checkpoint's tokenizer, a run from pretrained
    weights data made with the model's tokenizer."""
    if isinstance(start, hf_import.Pretrained):
        tok = start.tokenizer
        if tok.fingerprint != dataset.tokenizer.fingerprint:
            raise hf_import.PretrainedError(
                f"--init-from {start.path}: the model's tokenizer is {tok.name} ({tok.fingerprint}); the data in "
                f"{dataset.path} uses {dataset.tokenizer.name} ({dataset.tokenizer.fingerprint}). Prepare the "
                f"data with it: xtrain prepare SOURCE --tokenizer {start.path}, or pass a raw text source as "
                f"--data")
        return
    ckpt = start
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


def open_data(data, out: Path, vocab_size: int, progress: bool, tokenizer=None, lock: bool = True):
    """None means the built-in stories as an endless stream (xtrain.data.stream); a stream,
    prepared directory or nanoGPT/llm.c token directory is opened (the token files are read in
    place); a raw source is prepared into out/data first, with `tokenizer` when given (else a BPE
    of vocab_size trained on it; under the lock of out/data unless `lock` is off)."""
    from xtrain.data import is_dataset_dir, is_stream_dir, open_dataset, open_stream, prepare

    if data is None:
        return open_stream(progress=progress)
    path = Path(data)
    if is_stream_dir(path):
        return open_stream(path, progress=progress)
    if is_dataset_dir(path):
        return open_dataset(path)
    # The run's own data directory is locked while it is prepared, like any prepare's --out: an
    # `xtrain prepare --out OUT/data` at the same time refuses rather than writing beside it.
    with DirLock(out / "data", "xtrain train") if lock else contextlib.nullcontext():
        prepared = prepare(path, out / "data", vocab_size=vocab_size, tokenizer=tokenizer, progress=progress)
    return open_dataset(prepared)


def default_prompt(data, dataset) -> str:
    """The sample prompt when none is given: SAMPLE_PROMPT for the built-in stories, else the first
    words of the first validation document (a prompt in the data's own language and style)."""
    if data is None:
        return SAMPLE_PROMPT
    tokens = dataset.split("val").tokens
    ids = [int(t) for t in tokens[:PROMPT_SCAN_TOKENS]]
    eot = dataset.tokenizer.eot_id
    start = ids.index(eot) + 1 if eot in ids else 0
    end = ids.index(eot, start) if eot in ids[start:] else len(ids)
    words = dataset.tokenizer.decode(ids[start:end]).split()[:PROMPT_WORDS]
    return " ".join(words) or SAMPLE_PROMPT


def memory_mb(device: str) -> float:
    stats = xtrain.memory_stats(device)
    return stats["allocated_bytes.peak"] / 2**20


def sample_text(model, tokenizer, prompt: str, max_new_tokens: int, seed: int = 0,
                temperature: float = 0.8, top_k: int | None = 50, greedy: bool = False,
                top_p: float | None = None) -> str:
    return sample_texts(model, tokenizer, [prompt], max_new_tokens, seed=seed, temperature=temperature,
                        top_k=top_k, greedy=greedy, top_p=top_p)[0]


def sample_texts(model, tokenizer, prompts: list[str], max_new_tokens: int, seed: int = 0,
                 temperature: float = 0.8, top_k: int | None = 50, greedy: bool = False,
                 top_p: float | None = None, cuda_graphs: bool = True) -> list[str]:
    """Each prompt continued (one batched generate call), up to its end-of-text token."""
    rows = [[tokenizer.eot_id] + tokenizer.encode(p) for p in prompts]  # documents start after an eot
    out = model.generate(rows, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         greedy=greedy, seed=seed, stop_token=tokenizer.eot_id, cuda_graphs=cuda_graphs)
    texts = []
    for ids, row in zip(rows, out):
        new = [int(t) for t in row[len(ids):]]
        if tokenizer.eot_id in new:
            new = new[:new.index(tokenizer.eot_id)]
        # Decoded with the prompt's ids: a SentencePiece continuation's leading space is part of its
        # first piece, which decodes without it on its own.
        texts.append(tokenizer.decode(ids[1:] + new))
    return texts


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


def _read_log(path: Path, step: int) -> list[dict]:
    """The records of the run up to checkpoint step `step`: its steps before `step` and its
    evaluations up to `step` (the evaluation at `step` measured the checkpoint's weights; later
    records, of steps after a crash, would be repeated)."""
    if not path.exists():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        at = r.get("step", math.inf)
        if at < step or (at == step and "val_loss" in r):
            kept.append(r)
    return kept


def _restart_log(path: Path, step: int) -> list[dict]:
    """Rewrite the log with the records _read_log keeps, and return them."""
    if not path.exists():
        return []
    kept = _read_log(path, step)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
    return kept


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4f}"
