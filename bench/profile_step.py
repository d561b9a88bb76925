"""Where an xtrain training step spends its time, kernel by kernel (GPU kernels, or CPU kernels).

    python bench/profile_step.py --preset dim768 --batch 32 --seq 256 --bf16 --vocab 50257
    python bench/profile_step.py --device cpu --preset tiny --steps 2 --warmup 1   # smoke

PyTorch's profiler records through CUPTI every CUDA kernel launched in the process, including
xtrain's own and those of replayed CUDA graphs (it needs no support from the engine). The step is
`xtrain train`'s: replayed graphs on a GPU, or eager with --no-cuda-graphs. After `--warmup` untimed steps it records
`--steps` steps and prints the kernels grouped by name: calls per step, GPU ms per step and share of
the kernel time, plus the step's wall time, so the share of time the GPU sits idle (host-bound
stretches, sync points) shows as wall minus kernel time. On the CPU xtrain's own CPU profile
(xtrain._C.profile, docs/cpu.md) times every CPU kernel, forward and backward apart, and every
backward Node: the kernel table is printed the same way (calls per step, ms per step, share of the
kernel time, plus the phase), the wall minus the kernel time being the step's Python, op and
allocation overhead; the Node table (kernels included) follows. JSON into bench/results/.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import common


def timeline(intervals, steps: int, per_step: int, top: int = 10) -> dict:
    """The GPU's busy and idle stretches from the recorded activities.

    intervals: (start_us, end_us, name) of every GPU activity in the profiled window (kernels,
    memsets, copies), any order; steps: steps in the window; per_step: activities per step (the
    graph's nodes). Idle is the time in the window no activity covers (overlapping activities
    count once), split into the gaps where the GPU went from busy to idle: their count, median,
    90th percentile and total per step, the largest ones with the activities around them, and the
    last whole step's activities in order (name, start from the step's first, duration), which says
    which node precedes which gap (e.g. which GEMM comes with a cuBLAS memset). When the window
    holds exactly steps x per_step activities, each gap also counts towards the step of the
    activity after it (so a step's idle includes the wait before its first node): the median and
    largest step's idle, which tell a steady step from a one-off host stall in the window."""
    iv = sorted((float(a), float(b), str(n)) for a, b, n in intervals)
    if not iv or steps <= 0:
        return {}
    gaps = []  # (length_us, name before, name after)
    by_step = [0.0] * steps if per_step > 0 and len(iv) == steps * per_step else None
    busy = 0.0
    cur_start, cur_end, cur_name = iv[0]
    for i, (a, b, n) in enumerate(iv[1:], start=1):
        if a > cur_end:
            busy += cur_end - cur_start
            gaps.append((a - cur_end, cur_name, n))
            if by_step is not None:
                by_step[i // per_step] += a - cur_end
            cur_start, cur_end, cur_name = a, b, n
        elif b >= cur_end:
            cur_end, cur_name = b, n
    busy += cur_end - cur_start
    lengths = sorted(g[0] for g in gaps)

    def pct(q):
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))] if lengths else 0.0
    seq = []
    if per_step > 0 and len(iv) >= per_step:
        last = iv[(len(iv) // per_step - 1) * per_step:][:per_step]
        t0 = last[0][0]
        seq = [[n[:80], round(a - t0, 2), round(b - a, 2)] for a, b, n in last]
    return {"window_ms": (iv[-1][1] - iv[0][0]) / 1000, "busy_ms_per_step": busy / 1000 / steps,
            "idle_ms_per_step": sum(lengths) / 1000 / steps, "gaps_per_step": len(lengths) / steps,
            "idle_ms_step_median": statistics.median(by_step) / 1000 if by_step else None,
            "idle_ms_step_max": max(by_step) / 1000 if by_step else None,
            "gap_us_median": pct(0.5), "gap_us_p90": pct(0.9),
            "largest_gaps": [{"us": round(g, 2), "after": x[:80], "before": y[:80]}
                             for g, x, y in sorted(gaps, reverse=True)[:top]],
            "step_sequence": seq}


def timed_steps(step, steps: int, device) -> float:
    """Run `steps` steps; the wall time per step in ms (the device synchronised at the end)."""
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    common.xt_sync(device)
    return (time.perf_counter() - t0) * 1000 / steps


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_shape_args(p)
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--fp8", action="store_true", help="the blocks' linears in FP8 (docs/fp8.md; bf16 on Hopper)")
    p.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    p.add_argument("--top", type=int, default=25, help="kernels to print")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="profile the step as `xtrain train` runs it: replayed CUDA graphs on a GPU "
                        "(default); --no-cuda-graphs profiles the eager step")
    common.add_common_args(p, steps=5, warmup=3)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device, _ = common.resolve_device(args.device)
    import xtrain
    from xtrain import graphs
    from xtrain.models import model_class, preset_config
    from xtrain.optim import AdamW

    cfg = preset_config(args.preset, args.vocab, bf16=args.bf16, recompute=args.recompute, fp8=args.fp8)
    model = model_class(cfg)(cfg, device=device, seed=args.seed)
    opt = AdamW(model.named_parameters(), lr=3e-4)
    data = [(xtrain.tensor(x, device=device), xtrain.tensor(y, device=device))
            for x, y in common.random_batches(args.vocab, args.batch, args.seq, 4, args.seed)]
    # train.py's step: clip + AdamW in one pass; on a GPU replayed as CUDA graphs after
    # graphs.WARMUP_STEPS eager steps and the capture, unless --no-cuda-graphs
    blocked = graphs.graph_blockers(device) if args.cuda_graphs else "--no-cuda-graphs"
    sg = graphs.StepGraphs(model, opt, 1, 1.0, blocked=blocked, note=lambda m: print(m, flush=True))

    def step(i):
        x, y = data[i % len(data)]
        if sg.step(x, y) is None:
            loss = graphs.forward_backward(model, x, y, 1)
            opt.clip_and_step(1.0, loss)
            opt.zero_grad(set_to_none=True)
            sg.eager()

    warmup = max(args.warmup, graphs.WARMUP_STEPS + 1) if sg.disabled is None else args.warmup
    for i in range(warmup):
        step(i)
    common.xt_sync(device)
    cuda = common.is_cuda(device)
    if cuda:
        import torch
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            wall_ms = timed_steps(step, args.steps, device)
    else:
        cpu_prof = xtrain._C.profile
        cpu_prof.cpu_reset()
        cpu_prof.cpu_enable(True)
        try:
            wall_ms = timed_steps(step, args.steps, device)
        finally:
            cpu_prof.cpu_enable(False)
        entries = cpu_prof.cpu_read()

    kernels = defaultdict(lambda: [0, 0.0])  # name -> [calls, device microseconds]
    intervals = []  # (start, end, name) in microseconds: timeline()
    nodes = []
    if not cuda:
        for e in entries:
            if e["kind"] == "kernel":
                kernels[f"{e['name']} ({'bwd' if e['phase'] == 'backward' else 'fwd'})"] = [e["calls"], e["seconds"] * 1e6]
            else:
                nodes.append({"node": e["name"], "calls/step": e["calls"] / args.steps,
                              "ms/step": e["seconds"] * 1e3 / args.steps})
        nodes.sort(key=lambda r: -r["ms/step"])
    if cuda:
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                k = kernels[ev.name]
                k[0] += 1
                k[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
                intervals.append((ev.time_range.start, ev.time_range.end, ev.name))
    kernel_ms = sum(us for _, us in kernels.values()) / 1000 / args.steps
    rows = [{"kernel": name[:90], "calls/step": calls / args.steps, "ms/step": us / 1000 / args.steps,
             "share": us / 1000 / args.steps / kernel_ms if kernel_ms else 0.0}
            for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])]
    mode = (f"CUDA graphs ({sg.num_nodes} nodes per step, {sg.memsets_as_kernels} memsets as kernels)"
            if sg.active else f"eager ({sg.disabled})")
    head = (f"profile_step: {args.preset} batch {args.batch} x seq {args.seq}, "
            f"{'bf16' if args.bf16 else 'fp32'}{', fp8' if args.fp8 else ''}{', recompute' if args.recompute else ''}, "
            f"vocab {cfg.vocab_size} (ids below {args.vocab}), "
            f"{device}, {mode}: wall {wall_ms:.2f} ms/step")
    head += (f", CPU kernels {kernel_ms:.2f} ms/step, outside kernels {max(0.0, wall_ms - kernel_ms):.2f} ms/step"
             if not cuda else "")
    if cuda:
        head += (f", kernels {kernel_ms:.2f} ms/step ({sum(r['calls/step'] for r in rows):.0f} launches/step), "
                 f"GPU idle {max(0.0, wall_ms - kernel_ms):.2f} ms/step")
    print(head)
    tl = timeline(intervals, args.steps, round(len(intervals) / args.steps)) if intervals else {}
    if tl:
        big = ", ".join(f"{g['us']:.1f} us after {g['after'][:40]}" for g in tl["largest_gaps"][:3])
        per = (f" (per step: median {tl['idle_ms_step_median']:.3f}, largest {tl['idle_ms_step_max']:.3f} ms)"
               if tl["idle_ms_step_median"] is not None else "")
        print(f"timeline: busy {tl['busy_ms_per_step']:.2f} ms/step, idle {tl['idle_ms_per_step']:.2f} ms/step{per} "
              f"in {tl['gaps_per_step']:.0f} gaps per step (median {tl['gap_us_median']:.2f} us, p90 "
              f"{tl['gap_us_p90']:.2f} us); largest: {big}")
    if rows:
        common.print_table(rows[:args.top], [("kernel", "kernel", "s"), ("calls/step", "calls/step", ".1f"),
                                             ("ms/step", "ms/step", ".3f"), ("share", "share", ".1%")])
    if nodes:
        print("backward Nodes (their kernels included):")
        common.print_table(nodes[:args.top], [("node", "node", "s"), ("calls/step", "calls/step", ".1f"),
                                              ("ms/step", "ms/step", ".3f")])
    common.write_json(common.result_name(f"profile-{args.preset}-b{args.batch}", args.tag),
                      {"benchmark": "profile_step", "env": common.env_info(device), "args": vars(args),
                       "step": mode, "graph_nodes_per_step": sg.num_nodes,
                       "wall_ms_per_step": wall_ms, "kernel_ms_per_step": kernel_ms,
                       "gpu_idle_ms_per_step": max(0.0, wall_ms - kernel_ms) if cuda else None,
                       "kernels": rows, "backward_nodes": nodes, "timeline": tl},
                      args.out)


if __name__ == "__main__":
    main()
