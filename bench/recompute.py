"""Activation recompute: what it saves in memory and what it costs in speed, xtrain and PyTorch.

    python bench/recompute.py                       # dim768 + dim1024, batch 32, seq 256, bf16
    python bench/recompute.py --device cpu --presets tiny --batch 2 --seq 32 --fp32 --steps 2 \
        --search-preset tiny --batches 1,2,4,8,16 --memory-limit 256MiB    # smoke

Part 1 (same batch): for each preset, recompute off and on, a few training steps (forward,
backward, clip, AdamW) after warm-up: tok/s and peak allocated memory, for xtrain
(config.recompute: per block, the attention half and the MLP up to the down projection under
xtrain.checkpoint, the down projection outside with its input kept), PyTorch eager (the same
split with torch.utils.checkpoint, non-reentrant) and the same PyTorch model compiled whole
(`torch.compile(model)`, --compile MODE; checkpointed blocks under compile when recompute is on).
Reports on/off ratios per framework and xtrain against the compiled peer at each setting (issue
15's gate: >= 1.2x its speed with recompute on, memory <= its memory). xtrain runs `xtrain train`'s
step: forward and backward, clip_and_step, captured in CUDA graphs after the warm-up and replayed
(--cuda-graphs off: the eager step); its peak counts the graph's private pool in full. Each
framework builds its model once
per preset and flips the recompute flag between the two measurements (an init of dim1024 costs
seconds of CPU time); the torch model starts from xtrain's weights.

Part 2 (largest batch): with the allocator capped at --memory-limit (default 32GiB, the seed
results' cards; xtrain.set_memory_limit, and for torch set_per_process_memory_fraction), the
largest batch of --batches that trains for --search-preset (default dim1024), recompute off and
on. Batches are tried in increasing order from an emptied cache; the first OutOfMemoryError ends
the search (memory grows with the batch). Each try is one warm step and two timed ones. The list
goes past the 128 of the seed results so that recompute-on finds its own limit, not the list's.

Results: bench/results/recompute-DATE.json.
"""

from __future__ import annotations

import argparse
import time

import common

DEFAULT_BATCHES = "8,16,24,32,48,64,96,128,192,256"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="dim768,dim1024")
    common.add_shape_args(p, preset=None)
    p.add_argument("--search-preset", default="dim1024")
    p.add_argument("--batches", default=DEFAULT_BATCHES, help="batch sizes for the search")
    p.add_argument("--memory-limit", default="32GiB")
    p.add_argument("--search-steps", type=int, default=2, help="timed steps per search try")
    p.add_argument("--no-search", action="store_true")
    p.add_argument("--no-torch", action="store_true", help="xtrain only (not a result: no peer)")
    p.add_argument("--compile", default="default", metavar="MODE",
                   help="torch.compile mode of the compiled peer (part 1 only: a search would compile "
                        "once per batch size)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled peer")
    p.add_argument("--cuda-graphs", choices=("on", "off"), default="on",
                   help="xtrain's step replayed from CUDA graphs as `xtrain train` runs it (part 1; the "
                        "search steps eagerly: a capture per batch size)")
    p.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    common.add_common_args(p, steps=8, warmup=2)
    return p.parse_args(argv)


# ---- one framework's trainer: built once per preset, recompute toggled, stepped at any batch

class XtrainTrainer:
    framework = "xtrain"

    def __init__(self, cfg, device, seed, use_graphs: bool = False):
        import xtrain
        from xtrain.trainer import batching
        from xtrain import graphs
        from xtrain.models import TinyTransformer
        from xtrain.optim import AdamW

        self.xt, self.graphs, self.batching, self.device = xtrain, graphs, batching, device
        self.model = TinyTransformer(cfg, device=device, seed=seed)
        self.opt = AdamW(self.model.named_parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        self.oom = xtrain.OutOfMemoryError
        self.blocked = graphs.graph_blockers(device) if use_graphs else "--cuda-graphs off"
        self.sg = None  # StepGraphs of the current setting, made at the first step
        self.warm_requested_peak = None  # reset_peak()

    @property
    def warmup(self) -> int:
        """Steps before a timed one: with graphs, the eager warm-up, the capture and one replay."""
        return self.graphs.WARMUP_STEPS + 1 if self.blocked is None else 0

    @property
    def recompute(self) -> bool:
        return self.model.config.recompute

    def set_recompute(self, on: bool) -> None:
        # Every block and the config (batching.set_recompute, as `xtrain train` sets it); flipping
        # it avoids a second init. The captured step holds the old setting: drop it for a new capture.
        self.batching.set_recompute(self.model, on)
        self.sg = None

    def weights(self):
        return {n: p.numpy().copy() for n, p in self.model.named_parameters()}

    def upload(self, batches):
        return [(self.xt.tensor(x, device=self.device), self.xt.tensor(y, device=self.device))
                for x, y in batches]

    def step(self, x, y):
        """train.py's step: replayed graphs once captured, else forward_backward + clip_and_step."""
        if self.sg is None:
            self.sg = self.graphs.StepGraphs(self.model, self.opt, 1, 1.0, blocked=self.blocked,
                                             note=lambda m: print(m, flush=True))
        out = self.sg.step(x, y)
        if out is not None:
            return out[0]
        loss = self.graphs.forward_backward(self.model, x, y, 1)
        self.opt.clip_and_step(1.0, loss)
        self.opt.zero_grad(set_to_none=True)
        self.sg.eager()
        return loss

    def release(self):
        """Drop partial gradients (after an OOM), the graphs and the cached blocks."""
        self.opt.zero_grad(set_to_none=True)
        self.sg = None
        common.free_xtrain(self.device)

    def sync(self):
        common.xt_sync(self.device)

    def reset_peak(self):
        # the data's own peak over the warm-up (the eager steps and the capture), before the reset:
        # what peak() would read if the allocator wasted nothing (its classes, larger blocks reused)
        self.warm_requested_peak = self.xt.memory_stats(self.device)["requested_bytes.peak"]
        common.xt_reset_peak(self.device)

    def peak(self):
        # A replay allocates nothing: the step's activations live in the graph's private pool,
        # counted in full (as bench/train_throughput.py does).
        pool = self.xt.memory_stats(self.device).get("pool_bytes.current", 0) if self.sg and self.sg.active else 0
        return common.xt_peak(self.device)["allocated_peak"] + pool

    def peak_reserved(self):
        # What the allocator held: live and cached blocks and the graph's pool (all reserved).
        return common.xt_peak(self.device)["reserved_peak"]

    def extra(self) -> dict:
        return {"cuda_graphs": bool(self.sg and self.sg.active),
                "requested_peak_warmup": self.warm_requested_peak,
                "graphs_off_because": self.blocked,
                "graph_nodes_per_step": (self.sg.num_nodes or None) if self.sg else None}

    def close(self):
        del self.model, self.opt, self.sg
        common.free_xtrain(self.device)


class TorchTrainer:
    """The PyTorch model (bench/torch_model.py), eager or compiled whole (compile = a mode)."""

    def __init__(self, cfg, device, weights, compile=None):
        import torch

        import torch_model

        self.torch, self.device = torch, device
        self.framework = f"torch.compile ({compile})" if compile else "torch eager"
        self.model = torch_model.build(weights, cfg, device, compile=compile, recompute=cfg.recompute)
        # the module whose flag forward() reads (a compiled model wraps it; flipping the flag makes
        # dynamo recompile on the next call, before the warm-up ends)
        self.inner = getattr(self.model, "_orig_mod", self.model)
        self.params = list(self.model.parameters())
        self.opt = torch_model.adamw(self.model, lr=3e-4)
        self.oom = torch.OutOfMemoryError

    @property
    def recompute(self) -> bool:
        return self.inner.recompute

    def set_recompute(self, on: bool) -> None:
        self.inner.recompute = on

    def upload(self, batches):
        t = self.torch
        return [(t.from_numpy(x).to(self.device), t.from_numpy(y).to(self.device)) for x, y in batches]

    def step(self, x, y):
        _, loss = self.model(x, y)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def release(self):
        self.opt.zero_grad(set_to_none=True)
        common.free_torch(self.device)

    def sync(self):
        common.torch_sync(self.device)

    def reset_peak(self):
        common.torch_reset_peak(self.device)

    def peak(self):
        return common.torch_peak(self.device)["allocated_peak"]

    def peak_reserved(self):
        return common.torch_peak(self.device)["reserved_peak"]

    def close(self):
        del self.model, self.params, self.opt
        common.free_torch(self.device)


def make_trainers(args, preset, device, frameworks, weights_cache, use_graphs=False):
    """(framework, trainer) for each framework, lazily; the torch model gets xtrain's weights."""
    from xtrain.models import config_for

    cfg = config_for(preset, args.vocab, bf16=args.bf16, recompute=False)
    for framework in frameworks:
        if framework == "xtrain":
            trainer = XtrainTrainer(cfg, device, args.seed, use_graphs)
            if preset not in weights_cache and not args.no_torch:
                weights_cache[preset] = trainer.weights()
        else:
            if preset not in weights_cache:  # xtrain did not run this preset: its init, for torch
                weights_cache[preset] = XtrainTrainer(cfg, "cpu", args.seed).weights()
            compile = framework[len("torch.compile ("):-1] if framework.startswith("torch.compile") else None
            trainer = TorchTrainer(cfg, device, weights_cache[preset], compile=compile)
        try:
            yield framework, trainer
        finally:
            trainer.close()


def measure(trainer, batches, steps, warmup) -> dict:
    """Warm-up, reset the peak, timed steps. Raises the framework's OOM error."""
    data = trainer.upload(batches)
    it = {"i": 0, "loss": None}

    def step():
        x, y = data[it["i"] % len(data)]
        it["i"] += 1
        it["loss"] = trainer.step(x, y)
    trainer.reset_peak()  # the warm-up's own peaks (xtrain's requested_peak_warmup)
    for _ in range(max(warmup, getattr(trainer, "warmup", 0))):
        step()
    trainer.sync()
    trainer.reset_peak()
    seconds = common.time_loop(step, trainer.sync, steps, warmup=0)
    tokens = batches[0][0].size * steps
    out = {"tok_s": tokens / seconds, "ms_per_step": 1e3 * seconds / steps,
           "peak_allocated": trainer.peak(), "peak_reserved": trainer.peak_reserved(),
           "loss_last": float(it["loss"].item())}
    out["peak_gib"] = common.gib(out["peak_allocated"])
    out["reserved_gib"] = common.gib(out["peak_reserved"])
    if hasattr(trainer, "extra"):
        out.update(trainer.extra())
    return out


def describe(e) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


# ---- part 1: recompute off vs on at one batch

def same_batch(args, device, frameworks, weights_cache) -> list[dict]:
    rows = []
    batches = common.random_batches(args.vocab, args.batch, args.seq, n=4, seed=args.seed)
    for preset in [p for p in args.presets.split(",") if p]:
        for framework, trainer in make_trainers(args, preset, device, frameworks, weights_cache,
                                                use_graphs=args.cuda_graphs == "on"):
            for recompute in (False, True):
                trainer.set_recompute(recompute)
                row = {"preset": preset, "framework": framework, "recompute": recompute,
                       "batch": args.batch, "seq": args.seq}
                try:
                    row.update(measure(trainer, batches, args.steps, args.warmup))
                except RuntimeError as e:  # OOM (both frameworks' are RuntimeErrors) or a failure
                    row["error"] = describe(e)
                trainer.release()
                rows.append(row)
                print(f"  {preset:8s} {framework:12s} recompute {'on ' if recompute else 'off'}: "
                      + (row.get("error") or f"{row['tok_s']:,.0f} tok/s, "
                                             f"peak {common.fmt_gib(row['peak_allocated'])}"),
                      flush=True)
    for r in rows:  # on/off ratios per (preset, framework)
        if r["recompute"]:
            off = next(o for o in rows if o["preset"] == r["preset"] and
                       o["framework"] == r["framework"] and not o["recompute"])
            r["memory_on_over_off"] = common.ratio(r.get("peak_allocated"), off.get("peak_allocated"))
            r["speed_on_over_off"] = common.ratio(r.get("tok_s"), off.get("tok_s"))
    for r in rows:  # xtrain against the compiled peer at the same preset and recompute setting
        if r["framework"] != "xtrain":
            continue
        peer = next((o for o in rows if o["preset"] == r["preset"] and o["recompute"] == r["recompute"]
                     and o["framework"].startswith("torch.compile")), None)
        if peer is not None:
            r["speed_vs_compile"] = common.ratio(r.get("tok_s"), peer.get("tok_s"))
            r["memory_vs_compile"] = common.ratio(r.get("peak_allocated"), peer.get("peak_allocated"))
    return rows


# ---- part 2: the largest batch under a memory limit

def set_limit(framework, device, limit) -> bool:
    """Cap the framework's allocator at `limit` bytes (None lifts the cap); False if it can't."""
    if framework == "xtrain":
        import xtrain

        xtrain.set_memory_limit(limit, device)
        return True
    import torch

    if not common.is_cuda(device):
        return False  # torch has no CPU allocator cap
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(1.0 if limit is None else min(1.0, limit / total),
                                               device)
    return True


def try_batch(args, trainer, batch) -> dict:
    """One warm step and --search-steps timed ones at `batch`, from an empty cache (so what fits
    does not depend on the blocks the previous try left); an OOM is a result, not an error."""
    batches = common.random_batches(args.vocab, batch, args.seq, n=2, seed=args.seed)
    t0 = time.perf_counter()
    try:
        r = measure(trainer, batches, args.search_steps, warmup=1)
        r.update(batch=batch, fits=True)
    except trainer.oom as e:
        r = {"batch": batch, "fits": False, "error": describe(e)}
    trainer.release()
    r["wall_s"] = time.perf_counter() - t0
    print(f"  {trainer.framework:12s} recompute {'on ' if trainer.recompute else 'off'} batch "
          f"{batch:4d}: " + (f"fits, {r['tok_s']:,.0f} tok/s, peak "
                             f"{common.fmt_gib(r['peak_allocated'])}" if r["fits"] else "OOM"),
          flush=True)
    return r


def largest_batch(args, device, frameworks, weights_cache) -> list[dict]:
    import torch
    import xtrain

    limit = common.parse_bytes(args.memory_limit)
    sizes = sorted(int(b) for b in args.batches.split(",") if b)
    out = []
    for framework in frameworks:
        if not set_limit(framework, device, limit):
            out += [{"framework": framework, "recompute": r, "skipped": "no memory cap on the CPU"}
                    for r in (False, True)]
            continue
        try:
            for _, trainer in make_trainers(args, args.search_preset, device, [framework],
                                            weights_cache):
                for recompute in (False, True):
                    trainer.set_recompute(recompute)
                    result = {"framework": framework, "recompute": recompute,
                              "preset": args.search_preset, "seq": args.seq, "limit_bytes": limit,
                              "tries": [], "largest_batch": None}
                    for batch in sizes:
                        r = try_batch(args, trainer, batch)
                        result["tries"].append(r)
                        if not r["fits"]:
                            break
                        result["largest_batch"] = batch
                    out.append(result)
        except (xtrain.OutOfMemoryError, torch.OutOfMemoryError) as e:  # model + optimizer alone
            out.append({"framework": framework, "error": describe(e)})
        finally:
            set_limit(framework, device, None)
    return out


def main(argv=None):
    args = parse_args(argv)
    device, _ = common.resolve_device(args.device)
    common.setup_torch(device)
    frameworks = ["xtrain"] + ([] if args.no_torch else ["torch eager"])
    compiled = [] if args.no_torch or args.no_compile else [f"torch.compile ({args.compile})"]
    print(f"recompute: presets {args.presets}, batch {args.batch} x seq {args.seq}, "
          f"{'bf16' if args.bf16 else 'fp32'}, {device}", flush=True)
    weights_cache = {}
    rows = same_batch(args, device, frameworks + compiled, weights_cache)
    search = []
    if not args.no_search:
        print(f"largest batch of {args.batches} for {args.search_preset} under "
              f"{args.memory_limit}:", flush=True)
        search = largest_batch(args, device, frameworks, weights_cache)
    del weights_cache

    print()
    common.print_table(rows, [("preset", "preset", ""), ("framework", "framework", ""),
                              ("recompute", "recompute", ""), ("ms_per_step", "ms/step", ".1f"),
                              ("tok_s", "tok/s", ",.0f"), ("peak_gib", "peak GiB", ".2f"),
                              ("memory_on_over_off", "mem on/off", ".2f"),
                              ("speed_on_over_off", "speed on/off", ".2f"),
                              ("speed_vs_compile", "xtrain/compile speed", ".2f"),
                              ("memory_vs_compile", "xtrain/compile mem", ".2f")])
    if search:
        print()
        common.print_table(search, [("framework", "framework", ""), ("recompute", "recompute", ""),
                                    ("largest_batch", f"largest batch under {args.memory_limit}", ""),
                                    ("skipped", "note", "")])
    payload = {"benchmark": "recompute", "env": common.env_info(device),
               "args": {k: v for k, v in vars(args).items() if k != "out"},
               "same_batch": rows, "largest_batch": search}
    common.write_json(common.result_name("recompute", args.tag), payload, args.out)
    return payload


if __name__ == "__main__":
    main()
