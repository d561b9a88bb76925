"""The flash forward in 128-query blocks (XT_FLASH_FWD=1) against the default 64, for one tuning call.

Note [Forward tiles of 128 queries] (csrc/kernels/cuda/flash_attention.cuh): both forms must give
the same bits; this script checks that (out, and lse through the backward's gradients) and times
the forward and forward+backward of each, in interleaved rounds.

    python bench/fwd_tune.py [--shapes BxHxSxD,...] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import common

SHAPES = "32x24x256x32,128x24x256x32,8x24x1024x32,4x12x2048x64,2x24x4096x32"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target-ms", type=float, default=40.0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)

    import xtrain as xt

    device, _ = common.resolve_device(args.device)
    rng = np.random.default_rng(0)
    rows = []
    variants = ("0", "1")
    for shape in args.shapes.split(","):
        B, H, S, D = (int(n) for n in shape.split("x"))
        arrays = [rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(4)]
        q, k, v = (xt.tensor(a, dtype="bfloat16", device=device, requires_grad=True) for a in arrays[:3])
        g = xt.tensor(arrays[3], dtype="bfloat16", device=device)

        def fwd_bwd():
            for leaf in (q, k, v):
                leaf.grad = None
            out = xt.ops.flash_attention(q, k, v, causal=True)
            out.backward_seeded(g)
            return out

        def fwd():
            with xt.no_grad():
                return xt.ops.flash_attention(q, k, v, causal=True)

        sync = lambda: common.xt_sync(device)  # noqa: E731
        best = {v_: {"fwd+bwd": float("inf"), "fwd": float("inf")} for v_ in variants}
        bits = {}
        for r in range(args.rounds):
            for v_ in variants:
                os.environ["XT_FLASH_FWD"] = v_
                if r == 0:
                    out = fwd_bwd()
                    sync()
                    bits[v_] = [t.numpy() for t in (out, q.grad, k.grad, v.grad)]
                for mode, fn in (("fwd+bwd", fwd_bwd), ("fwd", fwd)):
                    t = common.time_call(fn, sync, warmup=2, repeats=3, target_s=args.target_ms / 1e3)
                    best[v_][mode] = min(best[v_][mode], t["ms_min"])
        os.environ["XT_FLASH_FWD"] = "0"
        same = all(np.array_equal(a, b) for a, b in zip(bits["0"], bits["1"]))
        for v_ in variants:
            row = {"shape": [B, H, S, D], "variant": v_, "fwd_ms": best[v_]["fwd"], "fwd+bwd_ms": best[v_]["fwd+bwd"],
                   "vs_default_fwd": best["0"]["fwd"] / best[v_]["fwd"], "bitwise_default": same}
            rows.append(row)
            print(f"fwd_tune {shape:>16} {v_}  fwd {row['fwd_ms']:.4f} ms (x{row['vs_default_fwd']:.3f})  "
                  f"fwd+bwd {row['fwd+bwd_ms']:.4f} ms  bits {'same' if same else 'DIFFER'}", flush=True)
        common.free_xtrain(device)
    common.write_json("fwd_tune", {"benchmark": "fwd_tune", "env": common.env_info(device), "args": vars(args),
                                   "rows": rows})


if __name__ == "__main__":
    main()
