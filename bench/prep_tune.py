"""Head-preparation (ops.qk_norm_rope) kernel variants at the training shapes, for one tuning call.

The CUDA launcher picks a variant of the register kernels (head dim 32, bf16 rows, float32 norm
weights: the presets' case) from XT_PREP_TUNE="fmb" (csrc/kernels/cuda/flash_attention.cu):
f the forward's rows in flight per group and blocks per SM (__launch_bounds__), m its tokens per
block (x1, x2, x4), b the one-pass backward's rows in flight and blocks per SM; 000 = the
defaults. Every variant must give the default's bits; this script checks that (q and k outputs,
dq, dk, and the q/k norm weight gradients) and times forward and forward+backward of each (both
outputs seeded, as in the model), in interleaved rounds, reporting the fastest round per variant.

    python bench/prep_tune.py [--variants 000,100,...] [--shapes BxSxHxD,...] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import common

SHAPES = "32x256x24x32,128x256x24x32"
VARIANTS = ("000,100,200,300,400,010,020,110,210,310,410,120,220,"
            "001,002,003,004,005,201,202,211,212")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--variants", default=VARIANTS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-ms", type=float, default=40.0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)

    import xtrain as xt

    device, _ = common.resolve_device(args.device)
    variants = args.variants.split(",")
    rng = np.random.default_rng(0)
    rows = []
    eps, theta = 1e-6, 10000.0
    for shape in args.shapes.split(","):
        B, S, H, D = (int(n) for n in shape.split("x"))
        arrays = [rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(4)]
        q, k = (xt.tensor(a, dtype="bfloat16", device=device, requires_grad=True) for a in arrays[:2])
        gq, gk = (xt.tensor(a, dtype="bfloat16", device=device) for a in arrays[2:])
        w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        wq, wk = (xt.tensor(w, dtype="float32", device=device, requires_grad=True) for _ in range(2))
        leaves = (q, k, wq, wk)

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            outs = xt.ops.qk_norm_rope(q, k, wq, wk, eps, theta)
            xt._C.backward_many(list(outs), [gq, gk])
            return outs

        def fwd():
            with xt.no_grad():
                return xt.ops.qk_norm_rope(q, k, wq, wk, eps, theta)

        sync = lambda: common.xt_sync(device)  # noqa: E731
        ref_bits = None
        best = {v: {"fwd+bwd": float("inf"), "fwd": float("inf")} for v in variants}
        same = {}
        for r in range(args.rounds):
            for v in variants:
                os.environ["XT_PREP_TUNE"] = v
                if r == 0:  # the bits of every output against the default's
                    outs = fwd_bwd()
                    sync()
                    bits = [t.numpy() for t in (*outs, q.grad, k.grad, wq.grad, wk.grad)]
                    if ref_bits is None:
                        ref_bits = bits
                    same[v] = all(np.array_equal(a, b) for a, b in zip(bits, ref_bits))
                for mode, fn in (("fwd+bwd", fwd_bwd), ("fwd", fwd)):
                    t = common.time_call(fn, sync, warmup=2, repeats=3, target_s=args.target_ms / 1e3)
                    best[v][mode] = min(best[v][mode], t["ms_min"])
        os.environ["XT_PREP_TUNE"] = "000"
        base = best["000"]
        for v in variants:
            row = {"shape": [B, S, H, D], "variant": v, "fwd+bwd_ms": best[v]["fwd+bwd"], "fwd_ms": best[v]["fwd"],
                   "vs_default_fwd": base["fwd"] / best[v]["fwd"],
                   "vs_default_fwd+bwd": base["fwd+bwd"] / best[v]["fwd+bwd"], "bitwise_default": same[v]}
            rows.append(row)
            print(f"prep_tune {shape:>15} {v}  fwd {row['fwd_ms']:.4f} ms (x{row['vs_default_fwd']:.3f})  "
                  f"fwd+bwd {row['fwd+bwd_ms']:.4f} ms (x{row['vs_default_fwd+bwd']:.3f})  "
                  f"bits {'same' if same[v] else 'DIFFER'}", flush=True)
        common.free_xtrain(device)
    common.write_json("prep_tune", {"benchmark": "prep_tune", "env": common.env_info(device), "args": vars(args),
                                    "rows": rows})


if __name__ == "__main__":
    main()
