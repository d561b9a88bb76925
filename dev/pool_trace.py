"""Why a captured training step's private pool holds more than its data (known issue 42): the
big preset's step as bench/big_models.py runs it (bench/recompute.py's XtrainTrainer: eager
warm-up steps, the capture, replays), with the allocator recording every backend allocation
(xtrain.record_memory_history) step by step.

    python dev/pool_trace.py --preset llama3.2-1b --batch 4 --seq 4096     # on the GPU
    python dev/pool_trace.py --device cpu --shrink --batch 1 --seq 64      # smoke (eager only)
    python dev/pool_trace.py --device cpu --bf16 --layers 3 --batch 1 --seq 4096   # the CPU's stand-in

On the CPU (no capture) the stand-in for the capture is an eager step after the cache was emptied
(--empty-before, default the second step), as the capture empties it: every block that step takes
from the backend is what the capture's pool would take, with the same allocator policy.

Per step: its phase (eager, capture, replay), the data's peak (requested bytes), the blocks' peak
(allocated), the pool's bytes after it, and the backend allocations it made: how many, how many
bytes, and those made while the cache or pool they served had at least as many bytes free as
asked for (in pieces too small: fragmentation), each with its size, the free bytes and the
largest free block at that moment. After the capture, the pool's segments: sizes and the free
pieces in them. Prints only; what it finds goes to docs/known-issues.md.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import common  # noqa: E402
from recompute import XtrainTrainer  # noqa: E402

MIB = 2**20
GIB = 2**30


def mib(n: int) -> str:
    return f"{n / MIB:,.1f} MiB"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="llama3.2-1b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--steps", type=int, default=0, help="steps in all (0: the warm-up, the capture and 2 replays)")
    p.add_argument("--device", default="auto")
    p.add_argument("--shrink", action="store_true", help="2 layers, dim 128, vocabulary 1024 (a smoke test)")
    p.add_argument("--layers", type=int, default=0, help="layers (0: the preset's)")
    p.add_argument("--bf16", action="store_true", help="bf16 on the CPU too (always on CUDA)")
    p.add_argument("--empty-before", type=int, default=1,
                   help="on the CPU, empty the cache before this step (the capture's stand-in; -1: never)")
    a = p.parse_args()

    import xtrain
    from xtrain.models import TransformerConfig, config_for

    device, _ = common.resolve_device(a.device)
    cfg = config_for(a.preset, 1, bf16=common.is_cuda(device) or a.bf16)
    if a.layers:
        cfg = TransformerConfig(**{**cfg.to_dict(), "n_layers": a.layers})
    if a.shrink:
        cfg = TransformerConfig(**{**cfg.to_dict(), **dict(vocab_size=1024, dim=128, n_layers=2, n_heads=4,
                                                            n_kv_heads=1, ffn_dim=256, max_seq=max(a.seq, 64))})
    tr = XtrainTrainer(cfg, device, 0, use_graphs=common.is_cuda(device))
    data = tr.upload(common.random_batches(min(cfg.vocab_size, 4096), a.batch, a.seq, n=2, seed=0))
    steps = a.steps or tr.warmup + 2
    print(f"{a.preset}{' (shrunk)' if a.shrink else ''}, batch {a.batch} x seq {a.seq}, {device}: {steps} steps")
    for i in range(steps):
        was_active = bool(tr.sg and tr.sg.active)
        if not common.is_cuda(device) and i == a.empty_before:
            xtrain.empty_cache(device)
        xtrain.record_memory_history(True, device)
        xtrain.reset_peak_memory_stats(device)
        s0 = xtrain.memory_stats(device)
        x, y = data[i % len(data)]
        tr.step(x, y)
        tr.sync()
        s = xtrain.memory_stats(device)
        events = xtrain.memory_history(device)
        xtrain.record_memory_history(False, device)
        phase = "replay" if was_active else ("capture" if tr.sg and tr.sg.active else "eager")
        frag = [e for e in events if e["owner_free_bytes"] >= e["requested"]]
        print(f"step {i} ({phase}): data peak {s['requested_bytes.peak'] / GIB:.2f} GiB, blocks peak "
              f"{s['allocated_bytes.peak'] / GIB:.2f} GiB, reserved {s['reserved_bytes.current'] / GIB:.2f} GiB "
              f"(pool {s['pool_bytes.current'] / GIB:.2f} GiB); backend allocations {len(events)}, "
              f"{sum(e['size'] for e in events) / GIB:.2f} GiB; with enough free bytes beside them "
              f"{len(frag)}, {sum(e['size'] for e in frag) / GIB:.2f} GiB")
        grew = s["requested_bytes.peak"] - s0["requested_bytes.current"]
        held = s["reserved_bytes.peak"] - s0["reserved_bytes.current"]
        print(f"    above the step's start: data peak +{grew / GIB:.3f} GiB, reserved +{held / GIB:.3f} GiB")
        for e in sorted(frag, key=lambda e: -e["size"])[:12]:
            print(f"    {mib(e['size'])} ({'pool' if e['pool'] else 'cache'}) while {mib(e['owner_free_bytes'])} "
                  f"free in {e['owner_free_blocks']} blocks, the largest {mib(e['owner_largest_free'])}; data then "
                  f"{e['requested_bytes'] / GIB:.2f} GiB")
        if phase == "capture":
            big = sorted(events, key=lambda e: -e["size"])[:8]
            print("    largest allocations of the capture: " + ", ".join(mib(e["size"]) for e in big))
    segs = xtrain.memory_segments(device)
    pooled = [sg for sg in segs if any(pc["pool"] for pc in sg["pieces"])]
    free_pieces = [pc for sg in segs for pc in sg["pieces"] if pc["free"]]
    print(f"segments: {len(segs)}, {sum(sg['size'] for sg in segs) / GIB:.2f} GiB; with free pool pieces "
          f"{len(pooled)}; free pieces {len(free_pieces)}, {sum(pc['size'] for pc in free_pieces) / GIB:.2f} GiB "
          f"(pool-owned {sum(pc['size'] for pc in free_pieces if pc['pool']) / GIB:.2f} GiB)")
    sizes = Counter(round(sg["size"] / MIB) for sg in segs)
    top = sorted(sizes.items(), reverse=True)[:30]
    print("segment sizes (MiB x count): " + ", ".join(f"{k:,}x{v}" for k, v in top))
    frees = Counter(round(pc["size"] / MIB) for pc in free_pieces)
    top = sorted(frees.items(), reverse=True)[:30]
    print("free piece sizes (MiB x count): " + ", ".join(f"{k:,}x{v}" for k, v in top))


if __name__ == "__main__":
    main()
