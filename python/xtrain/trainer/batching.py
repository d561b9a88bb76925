"""The batch plan: sequences per micro-batch, micro-batches per optimizer step (gradient
accumulation), recompute, and the search for the largest micro-batch that fits (`--batch auto`).

    global batch = micro_batch x accum x GPUs sequences of `seq` tokens = batch_tokens tokens

- Explicit: `--batch B` with `--grad-accum N` (default 1), or with `--batch-tokens T`, from which
  N = T / (B x seq x GPUs) follows; T must be a multiple of that (ConfigError naming the nearest
  multiples), and a --grad-accum given beside it must agree.
- `--batch auto`: the largest micro-batch whose training step (forward and backward, on the real
  model with its optimizer state allocated) fits. With `--batch-tokens T` the candidates are the
  divisors of the sequences each GPU takes per step, T / (seq x GPUs), so accumulation reaches T
  exactly; else every size up to AUTO_MAX_BATCH with --grad-accum as given. The search gallops
  (1, 2, 4, ...) to the first size that does not fit, then bisects: about 2 log2(B) probes.
  Fitting is monotone in the micro-batch, which is what makes the bisection right.
- The memory: under --memory-limit the probes run with AUTO_HEADROOM of the limit held back;
  without one, on a GPU, against the device's memory itself (the caching allocator's OOM from the
  driver is recoverable); on the CPU there is no memory worth searching and `--batch auto` needs
  --memory-limit (xtrain.set_memory_limit caps the CPU allocator too).
- `--recompute auto`: recompute costs about a third more compute per token, while accumulation
  costs nothing once a micro-batch fills the GPU, so recompute goes on only where a micro-batch
  does not fit without it: with an explicit --batch when that batch does not fit; with --batch
  auto when not even the smallest candidate fits.
- A probe changes nothing the run depends on: gradients are cleared (set to None, so the first
  real backward writes the slots), the device generator (dropout) is restored, the cache emptied.

An OOM later, during training, becomes explain_oom's error naming the flags to change.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

import xtrain
from xtrain.trainer.runconfig import ConfigError

# Share of --memory-limit the search leaves free: evaluation, the optimizer step's temporaries,
# collectives and allocator fragmentation over a long run need some room beside the step itself.
AUTO_HEADROOM = 0.10
# Without --batch-tokens the search looks no further than this many sequences per micro-batch.
AUTO_MAX_BATCH = 1024


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int      # sequences per forward/backward on one device
    accum: int            # micro-batches per optimizer step
    world_size: int       # data-parallel ranks
    seq: int
    recompute: bool
    why: str = ""         # how it was chosen, for the start-of-run message

    @property
    def rank_batch(self) -> int:
        """Sequences one rank takes per optimizer step."""
        return self.micro_batch * self.accum

    @property
    def global_batch(self) -> int:
        return self.rank_batch * self.world_size

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq

    def describe(self) -> str:
        gpus = f" x {self.world_size} GPUs" if self.world_size > 1 else ""
        return (f"micro-batch {self.micro_batch} x {self.accum} accumulation step{'s' * (self.accum > 1)}{gpus} "
                f"= {self.global_batch} sequence{'s' * (self.global_batch != 1)} of {self.seq} "
                f"= {self.tokens:,} tokens per step")


def plan(batch, grad_accum, batch_tokens, seq: int, world_size: int, recompute, fits=None,
         memory: str = "") -> BatchPlan:
    """The plan for the requested `batch` (int or "auto"), `grad_accum` (None: 1 or derived),
    `batch_tokens` (None or the global batch in tokens) and `recompute` (bool or "auto").
    fits(micro_batch, recompute) -> bool runs a probe; None where nothing can be probed (the CPU
    without a memory limit). `memory` says what the probes ran under, for the messages."""
    per_rank = None  # sequences each rank takes per optimizer step
    if batch_tokens is not None:
        micro = "" if batch == "auto" else f"--batch {batch} x "
        unit = (1 if batch == "auto" else batch) * seq * world_size
        if batch_tokens % unit:
            raise ConfigError(f"--batch-tokens {batch_tokens} is not a multiple of {micro}--seq {seq} x "
                              f"{_gpus(world_size)} = {unit} tokens (nearest: {_nearest(batch_tokens, unit)})")
        per_rank = batch_tokens // (seq * world_size)
    if batch != "auto":
        accum = _accum_for(batch, grad_accum, batch_tokens, per_rank, seq, world_size)
        if recompute != "auto":
            return BatchPlan(batch, accum, world_size, seq, bool(recompute), "as given")
        if fits is None:
            raise ConfigError("--recompute auto needs a GPU or --memory-limit to try the batch against")
        if fits(batch, False):
            return BatchPlan(batch, accum, world_size, seq, False, f"recompute off: micro-batch {batch} fits without it{memory}")
        if fits(batch, True):
            return BatchPlan(batch, accum, world_size, seq, True, f"recompute on: micro-batch {batch} does not fit without it{memory}")
        raise ConfigError(f"micro-batch {batch} does not fit even with recompute{memory}: lower --batch "
                          f"(--grad-accum or --batch-tokens keep the global batch) or use --batch auto")

    if fits is None:
        raise ConfigError("--batch auto needs a GPU or --memory-limit to search under (on the CPU there is "
                          "no device memory to fill); give --batch N, or --memory-limit SIZE")
    if per_rank is not None:
        candidates = [b for b in range(1, per_rank + 1) if per_rank % b == 0]
        if grad_accum is not None:
            if per_rank % grad_accum:
                raise ConfigError(f"--grad-accum {grad_accum} does not divide the {per_rank} "
                                  f"sequence{'s' * (per_rank != 1)} per GPU "
                                  f"and step that --batch-tokens {batch_tokens} gives")
            candidates = [per_rank // grad_accum]
    else:
        candidates = list(range(1, AUTO_MAX_BATCH + 1))
    modes = [bool(recompute)] if recompute != "auto" else [False, True]
    for rc in modes:
        tried = {}
        best = largest_fitting(candidates, lambda b: tried.setdefault(b, fits(b, rc)))
        if best is None:
            continue
        accum = per_rank // best if per_rank is not None else (grad_accum or 1)
        failed = sorted(b for b, ok in tried.items() if not ok)
        why = (f"--batch auto: micro-batch {best} is the largest {'divisor of ' + str(per_rank) + ' ' if per_rank else ''}"
               f"that fits{memory} ({'micro-batch ' + str(failed[0]) + ' did not' if failed else 'the largest candidate'}; "
               f"{len(tried)} tr{'ies' if len(tried) != 1 else 'y'})")
        if recompute == "auto":
            why += ("; recompute on: not even micro-batch 1 fits without it" if rc
                    else "; recompute off: not needed to fit")
        return BatchPlan(best, accum, world_size, seq, rc, why)
    raise ConfigError(f"--batch auto: not even micro-batch {candidates[0]} fits{memory}"
                      f"{'' if recompute else ' (try --recompute or --recompute auto)'}; lower --seq, pick a smaller "
                      f"--preset, or raise --memory-limit")


def largest_fitting(candidates: list, fits) -> int | None:
    """The largest of the ascending `candidates` for which fits(c) holds, assuming it holds up to
    some point and not after; None when not even the first fits. Gallops, then bisects."""
    if not candidates or not fits(candidates[0]):
        return None
    lo, hi, step = 0, len(candidates), 1  # candidates[lo] fits; candidates[hi] does not (or the end)
    while True:
        j = min(lo + step, len(candidates) - 1)
        if j == lo:
            break
        if fits(candidates[j]):
            lo, step = j, step * 2
        else:
            hi = j
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            lo = mid
        else:
            hi = mid
    return candidates[lo]


def probe(model, seq: int, device: str):
    """fits(micro_batch, recompute) for `model`: one forward and backward of a batch of zeros
    (memory does not depend on the token values); an OutOfMemoryError means it does not fit.
    Leaves the model with recompute as last probed (set_recompute) and no gradients."""
    def fits(batch: int, recompute: bool) -> bool:
        set_recompute(model, recompute)
        rng = xtrain.get_rng_state(device)
        ids = np.zeros((batch, seq), dtype=np.int64)
        loss = None
        try:
            _, loss = model(ids, ids)
            loss.backward()
            return True
        except xtrain.OutOfMemoryError:
            return False
        finally:
            loss = None
            model.store.zero_grad(set_to_none=True)
            xtrain.set_rng_state(rng, device)
            xtrain.empty_cache(device)
    return fits


@contextmanager
def search_limit(device: str, limit: int | None):
    """The memory cap the probes run under: `limit` less AUTO_HEADROOM (None: the device's own);
    `limit` itself again afterwards."""
    if limit is not None:
        xtrain.set_memory_limit(int(limit * (1 - AUTO_HEADROOM)), device)
    try:
        yield
    finally:
        if limit is not None:
            xtrain.set_memory_limit(int(limit), device)


def set_recompute(model, on: bool) -> None:
    """Activation recompute on or off for every block of `model` (and its config, which the
    checkpoint records)."""
    model.config.recompute = bool(on)
    for block in model.layers:
        block.recompute = bool(on)


def memory_note(limit: int | None) -> str:
    if limit is None:
        return " in the device's memory"
    return f" under {_gib(limit * (1 - AUTO_HEADROOM))} ({100 - 100 * AUTO_HEADROOM:.0f}% of --memory-limit {_gib(limit)})"


@contextmanager
def explain_oom(run):
    """An OutOfMemoryError inside the block (the training loop) is raised again with what ran out
    and the flags that change it; `run` has .plan, .step and .cfg."""
    try:
        yield
    except xtrain.OutOfMemoryError as e:
        p = run.plan
        first = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        raise xtrain.OutOfMemoryError(
            f"{first}. This was at step {run.step} with micro-batch {p.micro_batch} x seq {p.seq}, recompute "
            f"{'on' if p.recompute else 'off'}. Lower --batch (--grad-accum or --batch-tokens keep the global "
            f"batch), add --recompute, or let --batch auto --recompute auto choose"
            f"{'' if run.cfg.memory_limit is None else ', or raise --memory-limit'}.") from None


def _accum_for(batch: int, grad_accum, batch_tokens, per_rank, seq: int, world_size: int) -> int:
    if per_rank is None:
        return grad_accum or 1
    accum = per_rank // batch
    if grad_accum is not None and grad_accum != accum:
        raise ConfigError(f"--grad-accum {grad_accum} disagrees with --batch-tokens {batch_tokens}, which gives "
                          f"{accum} accumulation steps of --batch {batch} x --seq {seq} x {_gpus(world_size)}; "
                          f"give one of the two")
    return accum


def _nearest(value: int, unit: int) -> str:
    below = value // unit * unit
    return f"{below} or {below + unit}" if below else f"{unit}"


def _gpus(n: int) -> str:
    return f"{n} device{'s' * (n > 1)}"


def _gib(n) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
