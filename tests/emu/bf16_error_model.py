"""The error the bf16 flash kernels are expected to make, without a GPU: causal attention in float64
on bf16 inputs, once exactly and once with the kernels' rounding points (P and dS rounded to bf16 as
the second products' operands, out and the gradients rounded to bf16, delta from the rounded out),
compared with tests/test_flash_attention.py's two measures. The tolerance table there is set from
this (its bf16 bounds are 2.4-6x these errors).

    python tests/emu/bf16_error_model.py 4096 128       # S D
"""
import sys

import numpy as np


def bf16(x):
    """Round to bf16 (nearest even), returned as float64."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def errors(got, want, floor=1e-2):
    d = got - want
    return (np.abs(d).max() / max(np.abs(want).max(), floor),
            np.linalg.norm(d) / max(np.linalg.norm(want), floor * np.sqrt(want.size)))


def main(S, D, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, do = (bf16(rng.standard_normal((S, D))) for _ in range(4))
    scale = 1 / np.sqrt(D)
    s = q @ k.T * scale
    s[np.triu(np.ones((S, S), bool), 1)] = -np.inf
    pu = np.exp(s - s.max(1, keepdims=True))
    l = pu.sum(1, keepdims=True)
    P = pu / l
    out = P @ v
    dP = do @ v.T
    dS = P * (dP - (do * out).sum(1, keepdims=True))
    exact = {"out": out, "dq": dS @ k * scale, "dk": dS.T @ q * scale, "dv": P.T @ do}
    out_k = bf16((bf16(pu) @ v) / l)
    dS_k = bf16(P * (dP - (do * out_k).sum(1, keepdims=True)))
    kernel = {"out": out_k, "dq": bf16(dS_k @ k * scale), "dk": bf16(dS_k.T @ q * scale), "dv": bf16(bf16(P).T @ do)}
    for name in exact:
        print(f"S={S} D={D} {name}: max {errors(kernel[name], exact[name])[0]:.2e}, "
              f"fro {errors(kernel[name], exact[name])[1]:.2e}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, int(sys.argv[2]) if len(sys.argv) > 2 else 64)
