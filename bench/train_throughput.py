"""Training throughput of xtrain against PyTorch on one config, same GPU, same invocation.

    python bench/train_throughput.py --preset dim768 --batch 32 --seq 256 --bf16
    python bench/train_throughput.py --preset dim768 --batch 8 --seq 1024 --bf16    # issue 14's gates
    python bench/train_throughput.py --preset dim768 --batch 2 --seq 4096 --bf16
    python bench/train_throughput.py --device cpu --preset tiny --steps 3 --no-compile   # smoke

One training step is what train.py runs: forward, cross-entropy, backward, clip_grad_norm_(1.0),
the optimizer, zero_grad (xtrain: AdamW.clip_and_step, the norm, clipping and update in one pass, as
train.py; on a GPU by default as replayed CUDA graphs, xtrain.graphs, after two eager steps;
`--cuda-graphs both` adds an eager xtrain row, and the JSON records the graph's nodes per step:
the kernel launches and copies one replay issues). Both frameworks start from the same weights (xtrain's init, copied into torch),
see the same seeded random token batches (already on the device: the host-to-device copy of the
inputs is not timed), and run `--warmup` untimed steps before `--steps` timed ones. The runs are
sequential in this process: xtrain, then PyTorch eager, then PyTorch with torch.compile (unless
--no-compile), each freeing its memory before the next.

Printed and written to bench/results/train_throughput-PRESET-...-DATE.json: ms/step, tok/s, peak
allocated device memory during the timed steps, MFU (bf16 against 790 TFLOP/s; float32 against a
float32 matmul ceiling measured in this run), the loss before and after (the two frameworks should
agree: same model), and xtrain/PyTorch ratios.

--optimizer muon (default adamw; recorded in the JSON's args and its file name) steps Muon for the
blocks' matrices and AdamW for the rest on both sides: xtrain.optim.Muon as `xtrain train
--optimizer muon` builds it, and torch.optim.Muon + torch.optim.AdamW in PyTorch (the optimizers
uncompiled, as nanoGPT steps its AdamW). The same command with --optimizer adamw times AdamW's
step: the difference is Muon's cost per step.
"""

from __future__ import annotations

import argparse
import functools
import time

import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_shape_args(p)
    p.add_argument("--recompute", action="store_true", help="checkpoint every block (both)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile runs")
    p.add_argument("--compile-modes", nargs="+", default=["default"],
                   help="torch.compile modes of the whole-model peer, each run (e.g. default "
                        "max-autotune-no-cudagraphs); the ratio is taken to the fastest")
    p.add_argument("--compile-repeats", type=int, default=1,
                   help="compile each mode this many times from scratch (torch._dynamo.reset() and a "
                        "fresh Inductor cache between), each its own row: the compiled program's speed "
                        "varies between compiles (docs/known-issues.md #22); the ratio is taken to the "
                        "fastest")
    p.add_argument("--no-torch", action="store_true", help="xtrain only (not a result: no peer)")
    p.add_argument("--cuda-graphs", choices=("on", "off", "both"), default="on",
                   help="xtrain's step as replayed CUDA graphs (on, as xtrain train runs it), eager (off), or "
                        "both rows, graphs first (the ratios are taken to the first row)")
    p.add_argument("--windows", type=int, default=3,
                   help="timed windows of --steps steps per framework; the fastest is reported, all "
                        "are in the JSON (a window slowed by the host shows as an outlier)")
    p.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw",
                   help="adamw, or muon: Muon for the blocks' matrices and AdamW for the rest (both frameworks)")
    p.add_argument("--doc-len", type=int, default=0, metavar="L",
                   help="attention within documents (xtrain only, implies --no-torch): token 0 ends a "
                        "document every L tokens of each row (rows offset from each other), the model's "
                        "doc_sep is 0; compare with the same command without it for the masking's cost")
    common.add_common_args(p, steps=20, warmup=5)
    return p.parse_args(argv)


def run_xtrain(args, cfg, batches, device, use_graphs: bool = False):
    out, weights = _train_xtrain(args, cfg, batches, device, use_graphs)
    common.free_xtrain(device)  # the model, optimizer, graphs and data died with _train_xtrain's frame
    return out, weights


def _train_xtrain(args, cfg, batches, device, use_graphs: bool = False):
    import xtrain
    from xtrain import graphs
    from xtrain.models import TinyTransformer
    from xtrain.optim import AdamW, Muon, block_matrices

    model = TinyTransformer(cfg, device=device, seed=args.seed)
    # The torch runs start from these values. A copy: numpy() shares CPU memory with the parameter.
    weights = {n: p.numpy().copy() for n, p in model.named_parameters()}
    if args.optimizer == "muon":
        opt = Muon(model.named_parameters(), matrices=block_matrices(model.named_parameters()), lr=args.lr,
                   betas=(0.9, 0.95), weight_decay=0.1)
    else:
        opt = AdamW(model.named_parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = [(xtrain.tensor(x, device=device), xtrain.tensor(y, device=device)) for x, y in batches]
    with xtrain.no_grad():
        loss0 = model(*data[0])[1].item()
    state = {"loss": None}
    blocked = graphs.graph_blockers(device) if use_graphs else "the eager row (--cuda-graphs)"
    step, sg, warmup = common.xtrain_step(model, opt, data, blocked, lambda loss: state.update(loss=loss),
                                          args.warmup)

    t0 = time.perf_counter()
    step()
    common.xt_sync(device)
    first_step_s = time.perf_counter() - t0
    sync = functools.partial(common.xt_sync, device)
    for _ in range(max(0, warmup - 1)):  # with graphs: the eager steps, the capture, a replay
        step()
    sync()
    common.xt_reset_peak(device)
    raw0 = xtrain.memory_stats(device)["num_raw_alloc"]
    load = common.host_load()["loadavg"]
    seconds, windows = common.time_windows(step, sync, args.steps, args.windows)
    mem = common.xt_peak(device)
    pool = xtrain.memory_stats(device).get("pool_bytes.current", 0) if sg.active else 0
    # A replay allocates nothing, so the allocator's peak of the timed steps misses the step's
    # activations: they live in the graph's private pool, counted here in full (an upper bound:
    # the few pool blocks Python still holds, the loss and norm, are also in the peak).
    mem["allocated_peak"] += pool
    label = "xtrain" if use_graphs or args.cuda_graphs == "off" else "xtrain (no graphs)"
    out = {"framework": label, "cuda_graphs": sg.active, "graphs_off_because": sg.disabled,
           "graph_nodes_per_step": sg.num_nodes or None, "graph_pool_bytes": pool, "seconds": seconds, "window_seconds": windows,
           "host_loadavg": load, "first_step_s": first_step_s,
           "peak_allocated": mem["allocated_peak"], "peak_reserved": mem["reserved_peak"],
           "raw_allocs_in_timed_steps": mem["num_raw_alloc"] - raw0,
           "loss_first": loss0, "loss_last": state["loss"].item()}
    return out, weights


def run_torch(args, cfg, batches, weights, device, compile=None):
    try:
        return _train_torch(args, cfg, batches, weights, device, compile)
    finally:
        common.free_torch(device)


def _train_torch(args, cfg, batches, weights, device, compile):
    import torch

    import torch_model
    from xtrain.optim import block_matrices

    model = torch_model.build(weights, cfg, device, compile=compile, recompute=cfg.recompute)
    params = list(model.parameters())
    if args.optimizer == "muon":  # the blocks' matrices, by xtrain's names (the peer keeps them)
        names = set(block_matrices(zip(model.names, model.params)))
        opts = torch_model.muon_and_adamw([p for n, p in zip(model.names, model.params) if n in names],
                                          [p for n, p in zip(model.names, model.params) if n not in names], lr=args.lr)
    else:
        opts = [torch_model.adamw(model, lr=args.lr)]
    data = [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
    loss0 = None
    if not compile:  # a no-grad call would compile a second (inference) graph; eager has it
        with torch.no_grad():
            loss0 = model(*data[0])[1].item()
    state = {"i": 0, "loss": None}

    def step():
        x, y = data[state["i"] % len(data)]
        state["i"] += 1
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        state["loss"] = loss.detach()

    t0 = time.perf_counter()
    step()  # with compile: traces and compiles the whole model, forward and backward
    common.torch_sync(device)
    first_step_s = time.perf_counter() - t0
    sync = functools.partial(common.torch_sync, device)
    for _ in range(max(0, args.warmup - 1)):
        step()
    sync()
    common.torch_reset_peak(device)
    load = common.host_load()["loadavg"]
    seconds, windows = common.time_windows(step, sync, args.steps, args.windows)
    mem = common.torch_peak(device)
    out = {"framework": f"torch.compile ({compile})" if compile else "torch eager", "seconds": seconds,
           "window_seconds": windows, "host_loadavg": load,
           "first_step_s": first_step_s, "peak_allocated": mem["allocated_peak"],
           "peak_reserved": mem["reserved_peak"], "loss_first": loss0,
           "loss_last": state["loss"].item()}
    if compile:  # the whole model as one graph (more: graph breaks or recompiles)
        from torch._dynamo.utils import counters

        out["compiled_unique_graphs"] = counters["stats"]["unique_graphs"]
    return out


def fresh_compile_caches() -> None:
    """Each compile starts from nothing: dynamo's caches reset, and Inductor's on-disk cache moved
    to a new directory (otherwise a second compile would reuse the first one's kernels).

    XTRAIN_BENCH_INDUCTOR_CACHE=keep leaves TORCHINDUCTOR_CACHE_DIR where it is, so that the
    autotuning results written there persist: scripts/gpu_session.sh's INDUCTOR_CACHE=1 carries
    them across device calls for a max-autotune peer whose tuning outlasts one call (it turns the
    FX graph and AOT autograd caches off, so each compile is still lowered afresh)."""
    import os
    import tempfile

    import torch

    torch._dynamo.reset()
    if os.environ.get("XTRAIN_BENCH_INDUCTOR_CACHE") == "keep":
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="xtrain-bench-inductor-")
    try:  # the in-process module cache too, so kernels (and their autotuned configs) are new
        from torch._inductor.codecache import PyCodeCache

        PyCodeCache.cache_clear()
    except (ImportError, AttributeError):
        pass


def with_documents(ids, doc_len: int):
    """ids (B, S) with token 0 only as a separator, every doc_len tokens, row b offset by 37 b."""
    import numpy as np

    ids = np.where(ids == 0, 1, ids)
    pos = np.arange(ids.shape[1])
    for b in range(ids.shape[0]):
        ids[b, (pos + 37 * b) % doc_len == doc_len - 1] = 0
    return ids


def main(argv=None):
    args = parse_args(argv)
    device, tdevice = common.resolve_device(args.device)
    common.setup_torch(device)
    from xtrain.models import config_for

    if args.doc_len < 0:
        raise SystemExit("--doc-len must be >= 0")
    if args.doc_len:
        args.no_torch = True  # no PyTorch peer here masks documents
    cfg = config_for(args.preset, args.vocab, bf16=args.bf16, recompute=args.recompute,
                     doc_sep=0 if args.doc_len else None)
    if args.seq > cfg.max_seq:
        raise SystemExit(f"--seq {args.seq} exceeds {args.preset}'s max_seq {cfg.max_seq}")
    tokens = args.batch * args.seq
    flops = common.flops_per_token(cfg, args.seq)
    precision = "bf16" if args.bf16 else "fp32"
    ceiling = measure_ceiling(precision, device)
    print(f"train_throughput: {args.preset} ({flops['matmul_params'] / 1e6:.1f}M GEMM weights), "
          f"batch {args.batch} x seq {args.seq} = {tokens} tokens/step, {precision}, {args.optimizer}"
          f"{', recompute' if args.recompute else ''}, {device}; "
          f"{flops['total'] / 1e9:.3f} GFLOP/token; MFU ceiling "
          f"{'n/a' if ceiling is None else f'{ceiling / 1e12:.0f} TFLOP/s'}", flush=True)

    batches = common.random_batches(args.vocab, args.batch, args.seq, n=4, seed=args.seed)
    if args.doc_len:
        batches = [(with_documents(x, args.doc_len), y) for x, y in batches]
    results = []

    def announce(r):  # each row as soon as it is measured: a run cut off later still leaves it
        if "seconds" in r:
            peak = "n/a" if r["peak_allocated"] is None else f"{common.gib(r['peak_allocated']):.2f} GiB"
            print(f"measured: {r['framework']}: {1e3 * r['seconds'] / args.steps:.2f} ms/step, "
                  f"{tokens * args.steps / r['seconds']:,.0f} tok/s, peak {peak}", flush=True)
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.cuda_graphs]
    xt, weights = run_xtrain(args, cfg, batches, device, use_graphs=modes[0])
    results.append(xt)
    announce(xt)
    for more in modes[1:]:
        results.append(run_xtrain(args, cfg, batches, device, use_graphs=more)[0])
        announce(results[-1])
    if not args.no_torch:
        runs = [(None, 0)] + [(mode, i) for mode in ([] if args.no_compile else args.compile_modes)
                              for i in range(max(1, args.compile_repeats))]
        for compile, i in runs:
            label = f"torch.compile ({compile})" if compile else "torch eager"
            if i > 0:
                label += f" #{i + 1}"
            try:
                if compile:
                    fresh_compile_caches()
                r = run_torch(args, cfg, batches, weights, tdevice, compile=compile)
                r["framework"] = label
                results.append(r)
                announce(r)
            except Exception as e:  # e.g. no compiler toolchain for inductor: keep the rest
                print(f"{label} failed: {type(e).__name__}: {e}", flush=True)
                results.append({"framework": label,
                                "error": f"{type(e).__name__}: {str(e)[:500]}"})
    del weights

    failed = [r for r in results if "error" in r]
    results = [r for r in results if "error" not in r]
    for r in results:
        r["ms_per_step"] = 1e3 * r["seconds"] / args.steps
        r["tok_s"] = tokens * args.steps / r["seconds"]
        r["tflops"] = r["tok_s"] * flops["total"] / 1e12
        r["mfu"] = None if ceiling is None else common.mfu(r["tok_s"], flops["total"], ceiling)
        r["mfu_vs_bf16_peak"] = common.mfu(r["tok_s"], flops["total"], common.BF16_PEAK_FLOPS)
        r["peak_gib"] = common.gib(r["peak_allocated"])
    ratios = {}
    for r in results[1:]:
        ratios[r["framework"]] = {
            "tok_s": common.ratio(xt["tok_s"], r["tok_s"]),
            "peak_memory": common.ratio(xt["peak_allocated"], r["peak_allocated"])}
    compiled = [r for r in results if r["framework"].startswith("torch.compile")]
    if compiled:  # the strongest compile peer: the fastest mode
        best = max(compiled, key=lambda r: r["tok_s"])
        ratios["torch.compile (fastest mode)"] = {**ratios[best["framework"]], "mode": best["framework"]}

    print()
    common.print_table(results, [("framework", "framework", ""), ("ms_per_step", "ms/step", ".2f"),
                                 ("tok_s", "tok/s", ",.0f"), ("tflops", "TFLOP/s", ".1f"),
                                 ("mfu", "MFU", ".1%"), ("peak_gib", "peak GiB", ".2f"),
                                 ("first_step_s", "1st step s", ".2f"),
                                 ("loss_first", "loss 0", ".4f"), ("loss_last", "loss end", ".4f")])
    for name, r in ratios.items():
        tok = "n/a" if r["tok_s"] is None else f"{r['tok_s']:.2f}x"
        mem = "n/a" if r["peak_memory"] is None else f"{r['peak_memory']:.2f}x"
        print(f"xtrain / {name}: tok/s {tok}, peak memory {mem}")
    nodes = next((r["graph_nodes_per_step"] for r in results if r.get("graph_nodes_per_step")), None)
    if nodes:
        print(f"xtrain launches per step: {nodes} kernels and copies (the step's graph nodes); replayed, the "
              f"host issues 2 graph launches and 3 small copies per step")
    for r in results:
        if r["framework"] == "xtrain" and r.get("graphs_off_because") and args.cuda_graphs != "off":
            print(f"{r['framework']}: CUDA graphs off ({r['graphs_off_because']})")
    if xt.get("raw_allocs_in_timed_steps"):
        print(f"note: xtrain made {xt['raw_allocs_in_timed_steps']} raw device allocations during "
              f"the timed steps (steady state should be 0)")

    config = {k: v for k, v in vars(args).items() if k not in ("out",)}
    payload = {"benchmark": "train_throughput", "env": common.env_info(device), "args": config,
               "model": cfg.to_dict(), "tokens_per_step": tokens, "flops_per_token": flops,
               "precision": precision, "mfu_ceiling_flops": ceiling, "results": results,
               "failed": failed, "ratios_xtrain_over": ratios}
    name = f"train_throughput-{args.preset}-b{args.batch}-s{args.seq}-{precision}"
    name += "-recompute" if args.recompute else ""
    name += f"-docs{args.doc_len}" if args.doc_len else ""
    name += "-muon" if args.optimizer == "muon" else ""
    common.write_json(common.result_name(name, args.tag), payload, args.out)
    return payload


def measure_ceiling(precision: str, device: str):
    """bf16: the measured 790 TFLOP/s (common.BF16_PEAK_FLOPS). float32: measured here (true fp32 8192^3 matmul in
    torch, a second or so). CPU: none."""
    if not common.is_cuda(device):
        return None
    if precision == "bf16":
        return common.BF16_PEAK_FLOPS
    return measure_matmul_ceiling(device, "float32")


def measure_matmul_ceiling(device: str, dtype: str, n: int = common.FP32_CEILING_SIZE) -> float:
    flops = _matmul_rate(device, dtype, n)
    common.free_torch(device)
    return flops


def _matmul_rate(device: str, dtype: str, n: int) -> float:
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    dt = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=dt, generator=g)
    b = torch.randn(n, n, device=device, dtype=dt, generator=g)
    t = common.time_call(lambda: torch.matmul(a, b), lambda: common.torch_sync(device),
                         warmup=2, repeats=3, target_s=0.1)
    return 2 * n**3 / (t["ms_min"] / 1e3)


if __name__ == "__main__":
    main()
