"""How much the caching allocator holds above the data in a training step: a big preset's dims
with few layers on the CPU (the allocator's policy is the same code on every device), two steps
(forward, backward, clip + AdamW), then the peaks of what was asked for (requested), of the blocks
handed out (allocated: the classes' rounding and larger cached blocks reused, Note [Reusing a
larger block]) and of what the cache took from the backend (reserved). For known issue 42.

    python dev/allocator_waste.py --preset qwen3-1.7b --layers 3 --seq 4096

Prints one line per step; writes nothing.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import xtrain  # noqa: E402
from activation_memory import small_config  # noqa: E402
from xtrain.models import TinyTransformer  # noqa: E402
from xtrain.optim import AdamW  # noqa: E402

MIB = 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3-1.7b")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args()
    model = TinyTransformer(small_config(a.preset, a.layers, a.vocab, a.seq), device="cpu", seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    ids, targets = (xtrain.tensor(rng.integers(0, a.vocab, (1, a.seq))) for _ in range(2))
    for step in range(a.steps):
        gc.collect()
        start = xtrain.memory_stats("cpu")
        xtrain.reset_peak_memory_stats("cpu")
        t0 = time.perf_counter()
        _, loss = model(ids, targets)
        loss.backward()
        opt.clip_and_step(1.0)
        opt.zero_grad()
        del loss
        s = xtrain.memory_stats("cpu")
        print(f"step {step} ({time.perf_counter() - t0:.0f} s), MiB above the step's start: requested peak "
              f"{(s['requested_bytes.peak'] - start['requested_bytes.current']) / MIB:,.0f}, allocated peak "
              f"{(s['allocated_bytes.peak'] - start['allocated_bytes.current']) / MIB:,.0f}; whole process: "
              f"requested peak {s['requested_bytes.peak'] / MIB:,.0f}, reserved {s['reserved_bytes.peak'] / MIB:,.0f}",
              flush=True)


if __name__ == "__main__":
    main()
