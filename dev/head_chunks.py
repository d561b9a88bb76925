"""The row-chunked head's chunk size against its speed and memory: ops.linear_cross_entropy forward
and backward at the published shapes' heads (batch 4 x seq 4096 of bf16 rows, a tied float32
embedding cast to bf16 as the model's head does) in row chunks of each size given, for known
issue 38 (Note [Row-chunked head], csrc/ops/cross_entropy.cpp).

Smaller chunks hold a smaller [rows, V] logits buffer at the step's peak (the head's forward) but
re-read and re-write the float32 dw accumulator [V, K] once more per chunk (its GEMM with
beta = 1). Expected on the H200 at llama3.2-1b (V 128256, K 2048, 16384 rows): each halving of
the chunk -0.49 GiB of peak and, for each chunk added, ~0.5 ms (2.1 GB of dw traffic) unless the
GEMM hides it under its math.

    python3 dev/head_chunks.py                                  # both heads, chunks auto/2048/1024/512
    python3 dev/head_chunks.py --device cpu --rows 512 --vocab 4096 --dim 256 --chunks 0 256 128 --reps 1

Prints one line per (head, chunk): ms per forward + backward (median of --reps after a warm-up),
the peak allocated above the start, and whether loss and gradients are those of the default
chunking to rounding (relative L2 below 1e-2: dx is rounded to bf16 once from float32 when chunked,
from bf16 dlogits when not). Writes nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import common  # noqa: E402
import xtrain  # noqa: E402
from xtrain import ops  # noqa: E402

HEADS = {"llama3.2-1b": (128256, 2048), "qwen3-1.7b": (151936, 2048), "qwen3-0.6b": (151936, 1024)}


def one(x_np, w_np, t_np, chunk: int, device: str, reps: int):
    x = xtrain.tensor(x_np, dtype="bfloat16", device=device, requires_grad=True)
    w = xtrain.tensor(w_np, dtype="float32", device=device, requires_grad=True)
    t = xtrain.tensor(t_np, device=device)
    times, peak = [], 0
    for rep in range(reps + 1):  # the first is the warm-up
        x.grad = None
        w.grad = None
        common.xt_sync(device)
        start = xtrain.memory_stats(device)["allocated_bytes.current"]
        xtrain.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        loss, _ = ops.linear_cross_entropy(x, ops.cast(w, "bfloat16"), t, chunk_rows=chunk)
        loss.backward()
        common.xt_sync(device)
        if rep:
            times.append(time.perf_counter() - t0)
        peak = xtrain.memory_stats(device)["allocated_bytes.peak"] - start
    return statistics.median(times) * 1e3, peak, loss.item(), x.grad.to(dtype="float32").numpy(), w.grad.numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--heads", nargs="+", default=["llama3.2-1b", "qwen3-1.7b"], choices=sorted(HEADS))
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--vocab", type=int, default=0, help="instead of the heads' (with --dim)")
    p.add_argument("--dim", type=int, default=0)
    p.add_argument("--chunks", type=int, nargs="+", default=[0, 2048, 1024, 512], help="0: the op's own rule")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    heads = {"custom": (a.vocab, a.dim)} if a.vocab else {h: HEADS[h] for h in a.heads}
    rng = np.random.default_rng(0)
    for name, (V, K) in heads.items():
        x_np = rng.standard_normal((a.rows, K), dtype=np.float32)
        w_np = (0.02 * rng.standard_normal((V, K), dtype=np.float32))
        t_np = rng.integers(0, V, a.rows)
        ref = None
        for chunk in a.chunks:
            ms, peak, loss, dx, dw = one(x_np, w_np, t_np, chunk, a.device, a.reps)
            if ref is None:
                ref = (loss, dx, dw)
            rel = lambda a, b: np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)  # noqa: E731
            close = abs(loss - ref[0]) <= 1e-5 * abs(ref[0]) and rel(dx, ref[1]) < 1e-2 and rel(dw, ref[2]) < 1e-2
            print(f"{name} V {V} K {K} rows {a.rows} chunk {chunk or 'auto'}: {ms:8.2f} ms fwd+bwd, "
                  f"peak +{peak / 2**30:.3f} GiB, {'same' if close else 'DIFFERENT'} to rounding", flush=True)


if __name__ == "__main__":
    main()
