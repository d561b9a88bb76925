"""Kernel variants selected by an environment knob, timed and checked bitwise, for one tuning call.

    python bench/kernel_tune.py prep [--variants 000,100,...] [--shapes BxSxHxD,...]
    python bench/kernel_tune.py fwd  [--shapes BxHxSxD,...]

prep: the head preparation's register kernels (ops.qk_norm_rope at head dim 32, bf16 rows, float32
      norm weights: the presets' case), XT_PREP_TUNE="fmb" (csrc/kernels/cuda/flash_attention.cu):
      f the forward's rows in flight per group and blocks per SM, m its tokens per block (x1, x2,
      x4), b the one-pass backward's rows in flight and blocks per SM; 000 = the defaults. Both
      outputs are seeded, as in the model.
fwd:  the flash forward in 128-query blocks (XT_FLASH_FWD=1) against the default 64 (Note [Forward
      tiles of 128 queries]).
Every variant must give the default's bits: the script compares every output and gradient with the
default's, and times forward and forward+backward of each in interleaved rounds (fastest round).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import common

KNOBS = {
    "prep": ("XT_PREP_TUNE", "32x256x24x32,128x256x24x32",
             "000,100,200,300,400,010,020,110,210,310,410,120,220,001,002,003,004,005,201,202,211,212"),
    "fwd": ("XT_FLASH_FWD", "32x24x256x32,128x24x256x32,8x24x1024x32,4x12x2048x64,2x24x4096x32", "0,1"),
}


def prep_case(xt, device, rng, shape):
    """(fwd, fwd_bwd, results) for ops.qk_norm_rope at [B, S, H, D] (H = H_kv)."""
    B, S, H, D = shape
    eps, theta = 1e-6, 10000.0
    arrays = [rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(4)]
    q, k = (xt.tensor(a, dtype="bfloat16", device=device, requires_grad=True) for a in arrays[:2])
    gq, gk = (xt.tensor(a, dtype="bfloat16", device=device) for a in arrays[2:])
    w = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    wq, wk = (xt.tensor(w, dtype="float32", device=device, requires_grad=True) for _ in range(2))

    def fwd():
        with xt.no_grad():
            return xt.ops.qk_norm_rope(q, k, wq, wk, eps, theta)

    def fwd_bwd():
        for leaf in (q, k, wq, wk):
            leaf.grad = None
        outs = xt.ops.qk_norm_rope(q, k, wq, wk, eps, theta)
        xt._C.backward_many(list(outs), [gq, gk])
        return [*outs, q.grad, k.grad, wq.grad, wk.grad]
    return fwd, fwd_bwd


def fwd_case(xt, device, rng, shape):
    """(fwd, fwd_bwd) for causal ops.flash_attention at [B, H, S, D] (tensors in [B, S, H, D])."""
    B, H, S, D = shape
    arrays = [rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(4)]
    q, k, v = (xt.tensor(a, dtype="bfloat16", device=device, requires_grad=True) for a in arrays[:3])
    g = xt.tensor(arrays[3], dtype="bfloat16", device=device)

    def fwd():
        with xt.no_grad():
            return xt.ops.flash_attention(q, k, v, causal=True)

    def fwd_bwd():
        for leaf in (q, k, v):
            leaf.grad = None
        out = xt.ops.flash_attention(q, k, v, causal=True)
        out.backward_seeded(g)
        return [out, q.grad, k.grad, v.grad]
    return fwd, fwd_bwd


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=sorted(KNOBS))
    p.add_argument("--shapes", default=None, help="default: the training shapes of the case")
    p.add_argument("--variants", default=None, help="knob values, the default's first")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-ms", type=float, default=40.0)
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)

    import xtrain as xt

    knob, shapes, variants = KNOBS[args.what]
    shapes = (args.shapes or shapes).split(",")
    variants = (args.variants or variants).split(",")
    device, _ = common.resolve_device(args.device)
    make = prep_case if args.what == "prep" else fwd_case
    sync = lambda: common.xt_sync(device)  # noqa: E731
    rng = np.random.default_rng(0)
    rows = []
    for shape_text in shapes:
        shape = [int(n) for n in shape_text.split("x")]
        fwd, fwd_bwd = make(xt, device, rng, shape)
        best = {v: {"fwd": float("inf"), "fwd+bwd": float("inf")} for v in variants}
        same, ref = {}, None
        for r in range(args.rounds):
            for v in variants:
                os.environ[knob] = v
                if r == 0:  # every output and gradient against the default's
                    bits = [t.numpy() for t in fwd_bwd()]
                    ref = bits if ref is None else ref
                    same[v] = all(np.array_equal(a, b) for a, b in zip(bits, ref))
                for mode, fn in (("fwd+bwd", fwd_bwd), ("fwd", fwd)):
                    t = common.time_call(fn, sync, warmup=2, repeats=3, target_s=args.target_ms / 1e3)
                    best[v][mode] = min(best[v][mode], t["ms_min"])
        os.environ.pop(knob, None)
        base = best[variants[0]]
        for v in variants:
            row = {"shape": shape, "knob": knob, "variant": v, "fwd_ms": best[v]["fwd"],
                   "fwd+bwd_ms": best[v]["fwd+bwd"], "vs_default_fwd": base["fwd"] / best[v]["fwd"],
                   "vs_default_fwd+bwd": base["fwd+bwd"] / best[v]["fwd+bwd"], "bitwise_default": same[v]}
            rows.append(row)
            print(f"kernel_tune {args.what} {shape_text:>15} {v:>4}  fwd {row['fwd_ms']:.4f} ms "
                  f"(x{row['vs_default_fwd']:.3f})  fwd+bwd {row['fwd+bwd_ms']:.4f} ms "
                  f"(x{row['vs_default_fwd+bwd']:.3f})  bits {'same' if same[v] else 'DIFFER'}", flush=True)
        common.free_xtrain(device)
    common.write_json(f"kernel_tune-{args.what}", {"benchmark": "kernel_tune", "what": args.what,
                                                   "env": common.env_info(device), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
