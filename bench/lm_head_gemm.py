"""Which cuBLAS kernel runs each lm_head GEMM, and how fast, under each way of calling it.

    python bench/lm_head_gemm.py --rows 8192 32768 --vocab 50257

The language-model head's GEMMs (forward logits [rows, V] = x [rows, K] @ w[V, K]^T; backward
dx = dlogits @ w and dw = dlogits^T @ x) are the largest of a step. cuBLAS picks each kernel by
heuristics from the call: the API (cublasGemmEx or the strided-batched entry with batch 1), the
math mode (reduced-precision reductions allowed or not), and the extent and leading dimension of
the vocabulary side. This bench times the forward through PyTorch (whose `mm` is cublasGemmEx with
the reduced-precision reduction allowed by default, and whose `bmm` is the strided-batched entry)
with each of those changed (`--no-variants` skips them), the backward GEMMs over the padded
vocabulary in several spellings, and xtrain's own fused head (`ops.linear_cross_entropy`) forward
and forward + backward kernel by kernel, naming the kernel each ran (PyTorch's profiler sees every
CUDA kernel in the process). Prints a table; JSON into bench/results/.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[8192, 32768], help="tokens per step (batch x seq)")
    p.add_argument("--no-variants", action="store_true", help="skip the torch forward variants (V, API, math mode)")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=common.RESULTS_DIR)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    device, _ = common.resolve_device(args.device)
    if not common.is_cuda(device):
        raise SystemExit("lm_head_gemm: needs a CUDA device (cuBLAS kernel names)")
    import torch
    from torch.profiler import ProfilerActivity, profile

    import xtrain
    from xtrain import ops as xops

    common.setup_torch(device)
    matmul = torch.backends.cuda.matmul
    padded = (args.vocab + 63) // 64 * 64
    rows_out = []

    def measure(label, rows, fn, flops=None, every=False):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        common.xt_sync(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.repeats):
                fn()
            torch.cuda.synchronize()
            common.xt_sync(device)
        kernels = defaultdict(lambda: [0, 0.0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                k = kernels[ev.name]
                k[0] += 1
                k[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        if every:  # each kernel of the call, by time
            for kname, (kcalls, kus) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:8]:
                row = {"rows": rows, "call": label, "kernel": kname[:72], "us": kus / args.repeats,
                       "calls": kcalls / args.repeats}
                rows_out.append(row)
                print(f"{rows:6d}  {label:44s} {row['us']:9.1f} us  x{row['calls']:.0f}  {kname[:72]}", flush=True)
            return
        name, (calls, us) = max(kernels.items(), key=lambda kv: kv[1][1])
        us_call = us / max(calls, 1)
        row = {"rows": rows, "call": label, "kernel": name[:72], "us": us_call,
               "tflops": flops / (us_call * 1e-6) / 1e12}
        rows_out.append(row)
        print(f"{rows:6d}  {label:44s} {us_call:9.1f} us {row['tflops']:6.0f} TFLOP/s  {name[:72]}", flush=True)

    def one_size(rows):  # its tensors are freed when it returns
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, args.dim, device="cuda", generator=gen).bfloat16()
        for v in () if args.no_variants else (args.vocab, (args.vocab + 7) // 8 * 8, padded):
            w = torch.randn(v, args.dim, device="cuda", generator=gen).bfloat16() * 0.02
            flops = 2.0 * rows * args.dim * v
            for allow in (True, False):
                matmul.allow_bf16_reduced_precision_reduction = allow
                measure(f"torch mm V={v} reduced-reduction={'on' if allow else 'off'}", rows,
                        lambda: torch.mm(x, w.t()), flops)
                measure(f"torch bmm(batch 1) V={v} reduced-reduction={'on' if allow else 'off'}", rows,
                        lambda: torch.bmm(x[None], w.t()[None]), flops)
            matmul.allow_bf16_reduced_precision_reduction = True
        rng = np.random.default_rng(1)
        xx = xtrain.tensor(x.float().cpu().numpy(), dtype="bfloat16", device=device)
        ww = xtrain.tensor((rng.standard_normal((args.vocab, args.dim)) * 0.02).astype(np.float32),
                           dtype="bfloat16", device=device)
        tt = xtrain.tensor(rng.integers(0, args.vocab, rows).astype(np.int32), device=device)
        measure(f"xtrain linear_cross_entropy (GEMM over V={padded})", rows,
                lambda: xops.linear_cross_entropy(xx, ww, tt), 2.0 * rows * args.dim * padded)
        # The backward's two GEMMs over the padded vocabulary: dx = g @ w, dw = g^T @ x, and
        # other spellings of dw (its transpose, the reduction split into chunks as a batch).
        g = torch.randn(rows, padded, device="cuda", generator=gen).bfloat16() * 1e-3
        wp = torch.randn(padded, args.dim, device="cuda", generator=gen).bfloat16() * 0.02
        flops = 2.0 * rows * args.dim * padded
        measure(f"dx = g @ w (V={padded})", rows, lambda: torch.mm(g, wp), flops)
        measure(f"dw = g^T @ x (V={padded})", rows, lambda: torch.mm(g.t(), x), flops)
        measure(f"dw^T = x^T @ g (V={padded})", rows, lambda: torch.mm(x.t(), g), flops)
        for chunks in (2, 4):
            n = rows // chunks
            measure(f"dw as {chunks} chunks: bmm(g^T, x) (V={padded})", rows,
                    lambda: torch.bmm(g.view(chunks, n, padded).transpose(1, 2), x.view(chunks, n, args.dim)),
                    flops)
        xw = xtrain.tensor(x.float().cpu().numpy(), dtype="bfloat16", device=device, requires_grad=True)
        wg = xtrain.tensor((rng.standard_normal((args.vocab, args.dim)) * 0.02).astype(np.float32),
                           dtype="bfloat16", device=device, requires_grad=True)

        def fwd_bwd():
            loss, _ = xops.linear_cross_entropy(xw, wg, tt)
            loss.backward()
            xw.grad = None
            wg.grad = None

        measure("xtrain linear_cross_entropy forward + backward", rows, fwd_bwd, every=True)

    for rows in args.rows:
        one_size(rows)
        common.free_torch(device)
        common.free_xtrain(device)
    common.write_json(common.result_name("lm_head_gemm", args.tag),
                      {"benchmark": "lm_head_gemm", "env": common.env_info(device), "args": vars(args),
                       "rows": rows_out}, args.out)


if __name__ == "__main__":
    main()
