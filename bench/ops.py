"""The main kernels of a training step, xtrain against PyTorch, at the model's shapes.

    python bench/ops.py                                   # dim768, batch 32, seq 256, bf16
    python bench/ops.py --device cpu --preset tiny --batch 2 --seq 32 --gemm-size 256   # smoke

Each op runs forward alone (no grad) and forward + backward (the tape / autograd), on the same
seeded random inputs in both frameworks; time per call is the median over 5 windows of repeated
calls, each window synchronised at both ends. GEMM-like ops report achieved TFLOP/s, memory-bound
ops GB/s (the minimum bytes the op must move, below), with the measured ceilings beside them:
~790 TFLOP/s bf16 (8192^3 matmul) and ~4.3 TB/s copy. The float32 matmul ceiling is measured
here (8192^3, true fp32 in both frameworks: no TF32).

Ops (N = batch * seq tokens, dim, ffn, H heads of D, vocab V from the preset):
  matmul     [n, n] @ [n, n] bf16 and float32 (--gemm-size, default 8192): the ceilings
  linear     x [N, in] @ W^T for q/k/v/o, gate/up, down, lm_head. FLOPs 2*N*in*out forward,
             6*N*in*out forward + backward (dX and dW)
  flash      flash_attention (causal, bf16, q/k/v in [B, S, H, D]) against torch's flash SDPA
             (tensors in [B, H, S, D] as it wants them) at the issue-14 shapes [B, H, S, D] =
             [32, 24, 256, 32], [8, 24, 1024, 32], [4, 12, 2048, 64] (--flash-shapes; not the
             preset's). FLOPs: 2*B*H*S^2*D forward (the causal half of QK^T and PV), x3 with
             backward (the model-FLOPs convention; the backward's recomputation of P is not counted)
  qk_prep    qk_norm_rope (q/k RMSNorm + RoPE in one kernel) against xtrain's rms_norm + rope and
             torch eager on q, k [B, S, H, D]; backward from q's output only; bytes 4 (fwd: q, k
             read and written), 7 (fwd+bwd) x size of q
  rms_norm   [N, dim] and the per-head q/k norm [B, S, H, D]; bytes 2 (fwd), 5 (fwd+bwd) x size
  rope       [B, S, H, D]; bytes 2 / 4 x size
  swiglu     silu(gate) * up on [N, ffn]; bytes 3 / 8 x size
  fusions    the step's fusions against their unfused forms and torch eager: linear_multi for
             q/k/v [N, dim] -> 3 x [N, inner] and gate/up -> 2 x [N, ffn] (FLOPs as linear, all
             outputs' gradients in one backward walk; torch: one F.linear on the concatenated
             weight, split); add_rms_norm [N, dim] (h = x + r, rms_norm(h)): bytes 4 (fwd: x, r
             read, h, y written), 8 (fwd+bwd: + h, dy, dh read, dx written) x size
  cross_entropy  logits [N, V] in the activation dtype, float32 inside; bytes 1 / 3 x size
  embedding  W [V, dim] float32, ids [N]; bytes: gather 2*N*dim*4, backward adds N*dim*4 read
             and V*dim*4 written
  adamw      one step over the preset's block parameters (127M for dim768), float32;
             28 bytes per parameter (p, g, m, v read; p, m, v written)
  clip       global grad norm + scale over the same tensors; 12 bytes per parameter

Results: bench/results/ops-PRESET-DATE.json; the table prints xtrain's time against each peer
("speedup" = peer ms / xtrain ms, above 1 means xtrain is faster).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import common

BF16_BYTES = 2
FLASH_SHAPES = "32x24x256x32,8x24x1024x32,4x12x2048x64"  # B x H x S x D, the issue-14 gates


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="dim768")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    p.add_argument("--fp32", action="store_true", help="activations in float32 instead of bf16")
    p.add_argument("--gemm-size", type=int, default=8192, help="n of the n^3 matmul ceilings")
    p.add_argument("--only", default="", help="comma-separated op names (default: all)")
    p.add_argument("--flash-shapes", default=FLASH_SHAPES, help="BxHxSxD,... of the flash case")
    p.add_argument("--target-ms", type=float, default=50.0, help="length of one timing window")
    common.add_common_args(p, steps=5, warmup=3)
    return p.parse_args(argv)


class Bench:
    """Inputs in both frameworks from one numpy array, and the timing of both."""

    def __init__(self, args, device):
        import torch
        import xtrain

        self.xt, self.torch, self.device = xtrain, torch, device
        self.args = args
        self.rng = np.random.default_rng(args.seed)
        self.act = "float32" if args.fp32 else "bfloat16"
        self.rows = []

    # inputs
    def pair(self, shape, dtype=None, grad=False, scale=1.0, array=None):
        """(xtrain tensor, torch tensor) holding the same values."""
        dtype = dtype or self.act
        arr = array if array is not None else \
            (scale * self.rng.standard_normal(shape)).astype(np.float32)
        x = self.xt.tensor(arr, dtype=dtype, device=self.device)
        t = self.torch.from_numpy(np.ascontiguousarray(arr)).to(self.device, getattr(self.torch, dtype))
        if grad:
            x.requires_grad = True
            t.requires_grad_(True)
        return x, t

    def ids(self, n, high):
        arr = self.rng.integers(0, high, size=(n,), dtype=np.int64)
        return (self.xt.tensor(arr, device=self.device),
                self.torch.from_numpy(arr).to(self.device))

    # timing
    def time_xt(self, fn):
        return common.time_call(fn, lambda: common.xt_sync(self.device), warmup=self.args.warmup,
                                repeats=self.args.steps, target_s=self.args.target_ms / 1e3)

    def time_torch(self, fn):
        return common.time_call(fn, lambda: common.torch_sync(self.device), warmup=self.args.warmup,
                                repeats=self.args.steps, target_s=self.args.target_ms / 1e3)

    def xt_modes(self, f, leaves, seed=None):
        """{'fwd': no-grad call, 'fwd+bwd': call + backward} for an xtrain op f()."""
        xt = self.xt

        def fwd():
            with xt.no_grad():
                f()

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            y = f()
            if seed is None:
                y.backward()
            else:
                y.backward_seeded(seed)
        return {"fwd": fwd, "fwd+bwd": fwd_bwd}

    def xt_modes_multi(self, f, leaves, seeds):
        """As xt_modes for an op with several outputs: one backward walk from all of them."""
        xt = self.xt

        def fwd():
            with xt.no_grad():
                f()

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            xt._C.backward_many(list(f()), seeds)
        return {"fwd": fwd, "fwd+bwd": fwd_bwd}

    def torch_modes_multi(self, f, leaves, seeds):
        torch = self.torch

        def fwd():
            with torch.no_grad():
                f()

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            torch.autograd.backward(list(f()), seeds)
        return {"fwd": fwd, "fwd+bwd": fwd_bwd}

    def torch_modes(self, f, leaves, seed=None):
        torch = self.torch

        def fwd():
            with torch.no_grad():
                f()

        def fwd_bwd():
            for leaf in leaves:
                leaf.grad = None
            y = f()
            y.backward(seed)
        return {"fwd": fwd, "fwd+bwd": fwd_bwd}

    def record(self, op, shape, framework, modes, work, unit, ctx=None):
        """Time each mode; work: mode -> FLOPs or bytes per call; unit 'TFLOP/s' or 'GB/s'."""
        row = {"op": op, "shape": shape, "framework": framework, "unit": unit}
        for mode, fn in modes.items():
            try:
                if ctx is not None:
                    with ctx():
                        t = self.time_xt(fn) if framework.startswith("xtrain") else self.time_torch(fn)
                else:
                    t = self.time_xt(fn) if framework.startswith("xtrain") else self.time_torch(fn)
            except Exception as e:  # an op missing on this device/backend is reported, not fatal
                row[f"{mode}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                print(f"  {op} {framework} {mode}: {row[f'{mode}_error']}")
                continue
            row[f"{mode}_ms"] = t["ms"]
            row[f"{mode}_ms_min"] = t["ms_min"]
            rate = work[mode] / (t["ms"] / 1e3)
            row[f"{mode}_rate"] = rate / (1e12 if unit == "TFLOP/s" else 1e9)
            row[f"{mode}_work"] = work[mode]
        self.rows.append(row)
        return row


# ---- the cases

def case_matmul(b: Bench, n: int):
    xt, torch = b.xt, b.torch

    def one(dtype):
        xa, ta = b.pair((n, n), dtype)
        xb, tb = b.pair((n, n), dtype)
        work = {"fwd": 2.0 * n**3}

        def xfwd():
            with xt.no_grad():
                xt.ops.matmul(xa, xb)

        def tfwd():
            with torch.no_grad():
                torch.matmul(ta, tb)
        b.record(f"matmul {dtype}", [n, n, n], "xtrain", {"fwd": xfwd}, work, "TFLOP/s")
        b.record(f"matmul {dtype}", [n, n, n], "torch", {"fwd": tfwd}, work, "TFLOP/s")
    for dtype in ("bfloat16", "float32"):
        one(dtype)


def case_linear(b: Bench, cfg, N: int):
    xt, F = b.xt, b.torch.nn.functional
    inner = cfg.n_heads * cfg.head_dim

    def one(name, k, n):
        x, tx = b.pair((N, k), grad=True)
        w, tw = b.pair((n, k), grad=True, scale=1 / math.sqrt(k))
        gy, tgy = b.pair((N, n))
        work = {"fwd": 2.0 * N * k * n, "fwd+bwd": 6.0 * N * k * n}
        op, shape = f"linear {name}", [N, k, n]
        b.record(op, shape, "xtrain", b.xt_modes(lambda: xt.ops.linear(x, w), [x, w], gy), work,
                 "TFLOP/s")
        b.record(op, shape, "torch", b.torch_modes(lambda: F.linear(tx, tw), [tx, tw], tgy), work,
                 "TFLOP/s")
    one("q/k/v", cfg.dim, inner)
    if inner != cfg.dim:  # otherwise o_proj has the shapes of q/k/v
        one("o_proj", inner, cfg.dim)
    one("gate/up", cfg.dim, cfg.ffn_dim)
    one("down", cfg.ffn_dim, cfg.dim)
    one("lm_head", cfg.dim, cfg.vocab_size)


def case_flash(b: Bench):
    """xtrain flash_attention on (B, S, H, D) against torch's flash SDPA on (B, H, S, D), same values."""
    xt, torch = b.xt, b.torch
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for B, H, S, D in ([int(n) for n in shape.split("x")] for shape in b.args.flash_shapes.split(",")):
        arrays = [b.rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(4)]
        xq, xk, xv = (b.xt.tensor(a, dtype="bfloat16", device=b.device, requires_grad=True) for a in arrays[:3])
        xg = b.xt.tensor(arrays[3], dtype="bfloat16", device=b.device)
        tq, tk, tv, tg = (torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1, 3))).to(b.device, torch.bfloat16)
                          for a in arrays)
        for t in (tq, tk, tv):
            t.requires_grad_(True)
        fwd = 2.0 * B * H * S * S * D
        work = {"fwd": fwd, "fwd+bwd": 3 * fwd}
        shape = [B, H, S, D]
        b.record("flash_attention causal", shape, "xtrain",
                 b.xt_modes(lambda: xt.ops.flash_attention(xq, xk, xv, causal=True), [xq, xk, xv], xg),
                 work, "TFLOP/s")
        b.record("flash_attention causal", shape, "torch flash",
                 b.torch_modes(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True),
                               [tq, tk, tv], tg),
                 work, "TFLOP/s", ctx=lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION))
        del xq, xk, xv, xg, tq, tk, tv, tg
        common.free_xtrain(b.device)
        common.free_torch(b.device)


def case_qk_prep(b: Bench, cfg, B: int, S: int):
    """The fused q/k head preparation against its unfused composition and torch eager. Forward
    prepares q and k; forward + backward then seeds q's output only (one root, no extra loss ops:
    the k side has no gradient in any of the three)."""
    import torch_model
    import torch_reference

    xt, torch = b.xt, b.torch
    es = 4 if b.args.fp32 else BF16_BYTES
    H, D, eps, theta = cfg.n_heads, cfg.head_dim, cfg.norm_eps, cfg.rope_theta
    shape = [B, S, H, D]
    q, tq = b.pair(shape, grad=True)
    k, tk = b.pair(shape, grad=True)
    g, tg = b.pair(shape)
    w_arr = (1 + 0.1 * b.rng.standard_normal(D)).astype(np.float32)
    wq, twq = b.pair((D,), dtype="float32", grad=True, array=w_arr)
    wk, twk = b.pair((D,), dtype="float32", grad=True, array=w_arr)
    cos, sin = rope_tables(torch, theta, S, D, b.device)
    size = math.prod(shape) * es  # one of q, k
    work = {"fwd": 4.0 * size, "fwd+bwd": 7.0 * size}  # fwd: q, k read + written; bwd: q, dy read, dq written
    xt_leaves, t_leaves = [q, k, wq, wk], [tq, tk, twq, twk]

    def xt_fused():
        return xt.ops.qk_norm_rope(q, k, wq, wk, eps, theta)

    def xt_unfused():
        return (xt.ops.rope(xt.ops.rms_norm(q, wq, eps), theta=theta),
                xt.ops.rope(xt.ops.rms_norm(k, wk, eps), theta=theta))

    def torch_eager():
        return (torch_model.rope(torch_reference.rms_norm(tq, twq, eps), cos, sin),
                torch_model.rope(torch_reference.rms_norm(tk, twk, eps), cos, sin))

    # fwd: both outputs; fwd+bwd: both forward, backward seeded at q's output
    b.record("qk_norm_rope", shape, "xtrain", b.xt_modes(lambda: xt_fused()[0], xt_leaves, g), work, "GB/s")
    b.record("qk_norm_rope", shape, "xtrain rms_norm + rope", b.xt_modes(lambda: xt_unfused()[0], xt_leaves, g),
             work, "GB/s")
    b.record("qk_norm_rope", shape, "torch eager", b.torch_modes(lambda: torch_eager()[0], t_leaves, tg), work,
             "GB/s")


def case_rms_norm(b: Bench, cfg, B: int, S: int):
    import torch_reference

    xt, F = b.xt, b.torch.nn.functional
    es = 4 if b.args.fp32 else BF16_BYTES
    eps = cfg.norm_eps

    def one(name, shape):
        d = shape[-1]
        x, tx = b.pair(shape, grad=True)
        w, tw = b.pair((d,), dtype="float32", grad=True,
                       array=(1 + 0.1 * b.rng.standard_normal(d)).astype(np.float32))
        g, tg = b.pair(shape)
        size = math.prod(shape) * es
        work = {"fwd": 2.0 * size, "fwd+bwd": 5.0 * size}
        b.record(name, shape, "xtrain", b.xt_modes(lambda: xt.ops.rms_norm(x, w, eps), [x, w], g),
                 work, "GB/s")
        b.record(name, shape, "torch eager (reference formula)",
                 b.torch_modes(lambda: torch_reference.rms_norm(tx, tw, eps), [tx, tw], tg),
                 work, "GB/s")
        b.record(name, shape, "torch F.rms_norm",
                 b.torch_modes(lambda: F.rms_norm(tx, (d,), tw.to(tx.dtype), eps), [tx, tw], tg),
                 work, "GB/s")
    one("rms_norm", [B * S, cfg.dim])
    one("rms_norm q/k", [B, S, cfg.n_heads, cfg.head_dim])


def rope_tables(torch, theta, S, D, device):
    """cos, sin (1, S, 1, D) of positions 0..S-1 for torch_model.rope."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D))
    ang = torch.outer(torch.arange(S, dtype=torch.float32, device=device), inv_freq)
    return (torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :],
            torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :])


def case_rope(b: Bench, cfg, B: int, S: int):
    import torch_model

    xt, torch = b.xt, b.torch
    es = 4 if b.args.fp32 else BF16_BYTES
    H, D = cfg.n_heads, cfg.head_dim
    shape = [B, S, H, D]
    x, tx = b.pair(shape, grad=True)
    g, tg = b.pair(shape)
    cos, sin = rope_tables(torch, cfg.rope_theta, S, D, b.device)
    size = math.prod(shape) * es
    work = {"fwd": 2.0 * size, "fwd+bwd": 4.0 * size}
    b.record("rope", shape, "xtrain",
             b.xt_modes(lambda: xt.ops.rope(x, theta=cfg.rope_theta), [x], g), work, "GB/s")
    b.record("rope", shape, "torch eager",
             b.torch_modes(lambda: torch_model.rope(tx, cos, sin), [tx], tg), work, "GB/s")


def case_swiglu(b: Bench, cfg, N: int):
    xt, F = b.xt, b.torch.nn.functional
    es = 4 if b.args.fp32 else BF16_BYTES
    shape = [N, cfg.ffn_dim]
    gt, tgt = b.pair(shape, grad=True)
    up, tup = b.pair(shape, grad=True)
    g, tg = b.pair(shape)
    size = math.prod(shape) * es
    work = {"fwd": 3.0 * size, "fwd+bwd": 8.0 * size}
    b.record("swiglu", shape, "xtrain", b.xt_modes(lambda: xt.ops.swiglu(gt, up), [gt, up], g),
             work, "GB/s")
    b.record("swiglu", shape, "torch eager",
             b.torch_modes(lambda: F.silu(tgt) * tup, [tgt, tup], tg), work, "GB/s")


def case_cross_entropy(b: Bench, cfg, N: int):
    xt, F = b.xt, b.torch.nn.functional
    es = 4 if b.args.fp32 else BF16_BYTES
    V = cfg.vocab_size
    shape = [N, V]
    logits, tlogits = b.pair(shape, grad=True, scale=2.0)
    t, tt = b.ids(N, V)
    size = N * V * es
    work = {"fwd": 1.0 * size, "fwd+bwd": 3.0 * size}
    b.record("cross_entropy", shape, "xtrain",
             b.xt_modes(lambda: xt.ops.cross_entropy(logits, t), [logits]), work, "GB/s")
    b.record("cross_entropy", shape, "torch (logits.float())",
             b.torch_modes(lambda: F.cross_entropy(tlogits.float(), tt), [tlogits]), work, "GB/s")
    b.record("cross_entropy", shape, "torch (direct)",
             b.torch_modes(lambda: F.cross_entropy(tlogits, tt), [tlogits]), work, "GB/s")


def case_embedding(b: Bench, cfg, N: int):
    xt, F = b.xt, b.torch.nn.functional
    V, d = cfg.vocab_size, cfg.dim
    w, tw = b.pair((V, d), dtype="float32", grad=True, scale=0.02)
    ids, tids = b.ids(N, V)
    g, tg = b.pair((N, d), dtype="float32")
    fwd = 2.0 * N * d * 4
    work = {"fwd": fwd, "fwd+bwd": fwd + N * d * 4 + V * d * 4}
    b.record("embedding", [V, d, N], "xtrain",
             b.xt_modes(lambda: xt.ops.embedding(w, ids), [w], g), work, "GB/s")
    b.record("embedding", [V, d, N], "torch",
             b.torch_modes(lambda: F.embedding(tids, tw), [tw], tg), work, "GB/s")


def block_shapes(cfg):
    inner = cfg.n_heads * cfg.head_dim
    one = [(cfg.dim,), (inner, cfg.dim), (inner, cfg.dim), (inner, cfg.dim), (cfg.dim, inner),
           (cfg.head_dim,), (cfg.head_dim,), (cfg.dim,), (cfg.ffn_dim, cfg.dim),
           (cfg.ffn_dim, cfg.dim), (cfg.dim, cfg.ffn_dim)]
    return one * cfg.n_layers


def case_optim(b: Bench, cfg):
    xt, torch = b.xt, b.torch
    shapes = block_shapes(cfg)
    n_params = sum(math.prod(s) for s in shapes)
    xp, tp = [], []
    for s in shapes:  # random values, created on the device (the host copy would be slow)
        tp.append(torch.nn.Parameter(0.02 * torch.randn(s, device=b.device)))
        tp[-1].grad = 1e-3 * torch.randn(s, device=b.device)
        xp.append(xt.tensor(tp[-1].detach().cpu().numpy(), device=b.device))
    xg = [xt.tensor(p.grad.cpu().numpy(), device=b.device) for p in tp]
    xm = [xt.zeros(tuple(s), dtype="float32", device=b.device) for s in shapes]
    xv = [xt.zeros(tuple(s), dtype="float32", device=b.device) for s in shapes]
    state = {"step": 0}

    def xt_adamw():
        state["step"] += 1
        xt._C.optim.adamw_step(xp, xg, xm, xv, 3e-4, 0.9, 0.95, 1e-8, 0.1, state["step"])
    shape = [n_params, len(shapes)]
    work = {"step": 28.0 * n_params}
    b.record("adamw", shape, "xtrain", {"step": xt_adamw}, work, "GB/s")
    for name, kw in (("torch fused", {"fused": True}), ("torch foreach", {"foreach": True})):
        if kw.get("fused") and not common.is_cuda(b.device):
            kw = {"foreach": False}
            name = "torch for-loop"
        opt = torch.optim.AdamW(tp, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kw)
        b.record("adamw", shape, name, {"step": opt.step}, work, "GB/s")
        del opt

    work = {"step": 12.0 * n_params}

    def xt_clip():
        norm = xt._C.optim.global_norm(xg)
        xt._C.optim.clip_by_norm_(xg, norm, 1e6)  # a large max_norm: the values stay put
    b.record("clip_grad_norm", shape, "xtrain", {"step": xt_clip}, work, "GB/s")
    b.record("clip_grad_norm", shape, "torch foreach",
             {"step": lambda: torch.nn.utils.clip_grad_norm_(tp, 1e6, foreach=True)}, work, "GB/s")
    return n_params


def case_fusions(b: Bench, cfg, N: int):
    xt, torch, F = b.xt, b.torch, b.torch.nn.functional
    inner = cfg.n_heads * cfg.head_dim

    def merged(name, k, ns):
        x, tx = b.pair((N, k), grad=True)
        # the weights at uniform distances in one buffer, as the parameter store holds them
        flat, tflat = b.pair((sum(ns), k), grad=False, scale=1 / math.sqrt(k))
        ws, tws, off = [], [], 0
        for n in ns:
            w = flat._storage_view(off * k, (n, k)).detach()
            w.requires_grad = True
            ws.append(w)
            tws.append(tflat[off:off + n].detach().clone().requires_grad_(True))
            off += n
        gys = [b.pair((N, n)) for n in ns]
        seeds, tseeds = [g[0] for g in gys], [g[1] for g in gys]
        flops = 2.0 * N * k * sum(ns)
        work = {"fwd": flops, "fwd+bwd": 3 * flops}
        op, shape = f"linear {name}", [N, k, sum(ns)]
        b.record(op + " merged", shape, "xtrain",
                 b.xt_modes_multi(lambda: xt.ops.linear_multi(x, ws), [x, *ws], seeds), work, "TFLOP/s")
        b.record(op + " merged", shape, "xtrain separate linears",
                 b.xt_modes_multi(lambda: [xt.ops.linear(x, w) for w in ws], [x, *ws], seeds), work, "TFLOP/s")
        b.record(op + " merged", shape, "torch one F.linear, split",
                 b.torch_modes_multi(lambda: F.linear(tx, torch.cat(tws)).split(ns, dim=-1), [tx, *tws],
                                     tseeds), work, "TFLOP/s")

    merged("q/k/v", cfg.dim, [inner] * 3)
    merged("gate/up", cfg.dim, [cfg.ffn_dim] * 2)

    import torch_reference
    es = 4 if b.args.fp32 else BF16_BYTES
    eps, shape = cfg.norm_eps, [N, cfg.dim]
    x, tx = b.pair(shape, grad=True)
    r, tr = b.pair(shape, grad=True)
    w, tw = b.pair((cfg.dim,), dtype="float32", grad=True,
                   array=(1 + 0.1 * b.rng.standard_normal(cfg.dim)).astype(np.float32))
    (gh, tgh), (gy, tgy) = b.pair(shape), b.pair(shape)
    size = math.prod(shape) * es
    work = {"fwd": 4.0 * size, "fwd+bwd": 8.0 * size}

    def unfused():
        h = xt.ops.add(x, r)
        return h, xt.ops.rms_norm(h, w, eps)

    def t_eager():
        h = tx + tr
        return h, torch_reference.rms_norm(h, tw, eps)
    b.record("add_rms_norm", shape, "xtrain",
             b.xt_modes_multi(lambda: xt.ops.add_rms_norm(x, r, w, eps), [x, r, w], [gh, gy]), work, "GB/s")
    b.record("add_rms_norm", shape, "xtrain add + rms_norm",
             b.xt_modes_multi(unfused, [x, r, w], [gh, gy]), work, "GB/s")
    b.record("add_rms_norm", shape, "torch eager (reference formula)",
             b.torch_modes_multi(t_eager, [tx, tr, tw], [tgh, tgy]), work, "GB/s")


CASES = ("matmul", "linear", "flash", "qk_prep", "rms_norm", "rope", "swiglu", "cross_entropy",
         "embedding", "optim", "fusions")


def main(argv=None):
    args = parse_args(argv)
    device, _ = common.resolve_device(args.device)
    common.setup_torch(device)
    from xtrain.models import config_for

    cfg = config_for(args.preset, args.vocab)
    B, S, N = args.batch, args.seq, args.batch * args.seq
    only = [c for c in args.only.split(",") if c] or list(CASES)
    unknown = sorted(set(only) - set(CASES))
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; choose from {', '.join(CASES)}")
    print(f"ops: {args.preset} shapes, B={B} S={S} N={N}, dim={cfg.dim} ffn={cfg.ffn_dim} "
          f"H={cfg.n_heads} D={cfg.head_dim} V={cfg.vocab_size}, "
          f"{'float32' if args.fp32 else 'bf16'} activations, {device}", flush=True)
    b = Bench(args, device)
    extra = {}
    for name in only:
        print(f"- {name}", flush=True)
        if name == "matmul":
            case_matmul(b, args.gemm_size)
        elif name == "linear":
            case_linear(b, cfg, N)
        elif name == "flash":
            case_flash(b)
        elif name == "qk_prep":
            case_qk_prep(b, cfg, B, S)
        elif name == "rms_norm":
            case_rms_norm(b, cfg, B, S)
        elif name == "rope":
            case_rope(b, cfg, B, S)
        elif name == "swiglu":
            case_swiglu(b, cfg, N)
        elif name == "cross_entropy":
            case_cross_entropy(b, cfg, N)
        elif name == "embedding":
            case_embedding(b, cfg, N)
        elif name == "fusions":
            case_fusions(b, cfg, N)
        elif name == "optim":
            extra["optim_params"] = case_optim(b, cfg)
        common.free_xtrain(device)
        common.free_torch(device)

    ceilings = summarize(b.rows, device, args.fp32)
    payload = {"benchmark": "ops", "env": common.env_info(device),
               "args": {k: v for k, v in vars(args).items() if k != "out"},
               "model": cfg.to_dict(), "ceilings": ceilings, **extra, "rows": b.rows}
    common.write_json(common.result_name(f"ops-{args.preset}", args.tag), payload, args.out)
    return payload


def summarize(rows, device, fp32: bool) -> dict:
    """Print one line per (op, framework) with the speed-up against xtrain; return the measured
    matmul ceilings. "of ceiling": GB/s over 4.3 TB/s, bf16 TFLOP/s over 790 (float32 GEMMs have
    their own ceiling: the measured float32 matmul)."""
    cuda = common.is_cuda(device)
    table = []
    xt_rows = {(r["op"], str(r["shape"])): r for r in rows if r["framework"] == "xtrain"}
    for r in rows:
        xr = xt_rows.get((r["op"], str(r["shape"])))
        for mode in ("fwd", "fwd+bwd", "step"):
            if f"{mode}_ms" not in r and f"{mode}_error" not in r:
                continue
            line = {"op": r["op"], "mode": mode, "framework": r["framework"],
                    "shape": "x".join(map(str, r["shape"])), "ms": r.get(f"{mode}_ms"),
                    "rate": r.get(f"{mode}_rate"), "unit": r["unit"]}
            ceiling = (common.BF16_PEAK_FLOPS / 1e12 if r["unit"] == "TFLOP/s"
                       else common.COPY_BANDWIDTH / 1e9)
            bf16_flops = r["unit"] == "TFLOP/s" and not fp32 and "float32" not in r["op"]
            if cuda and line["rate"] is not None and (r["unit"] == "GB/s" or bf16_flops):
                line["of_ceiling"] = line["rate"] / ceiling
            if r is not xr and xr is not None and xr.get(f"{mode}_ms") and line["ms"]:
                r[f"{mode}_xtrain_speedup"] = line["speedup"] = line["ms"] / xr[f"{mode}_ms"]
            if line["ms"] is None:
                line["framework"] += " (" + r[f"{mode}_error"][:40] + ")"
            table.append(line)
    print()
    common.print_table(table, [("op", "op", ""), ("shape", "shape", ""), ("mode", "mode", ""),
                               ("framework", "framework", ""), ("ms", "ms", ".4f"),
                               ("rate", "rate", ".1f"), ("unit", "unit", ""),
                               ("of_ceiling", "of ceiling", ".0%"),
                               ("speedup", "xtrain speedup", ".2f")])
    ceilings = {"bf16_flops_measured": common.BF16_PEAK_FLOPS, "copy_bytes_s_measured": common.COPY_BANDWIDTH}
    for r in rows:
        if r["op"].startswith("matmul") and r.get("fwd_rate"):
            key = f"{r['op'].split()[1]}_matmul_{r['framework']}_tflops"
            ceilings[key] = r["fwd_rate"]
    if ceilings.get("bfloat16_matmul_torch_tflops"):
        n = next(r["shape"][0] for r in rows if r["op"].startswith("matmul"))
        print(f"\nbf16 matmul {n}^3: torch "
              f"{ceilings['bfloat16_matmul_torch_tflops']:.0f}, xtrain "
              f"{ceilings.get('bfloat16_matmul_xtrain_tflops') or 0:.0f} TFLOP/s "
              f"(measured ceiling {common.BF16_PEAK_FLOPS / 1e12:.0f}); float32: torch "
              f"{ceilings.get('float32_matmul_torch_tflops') or 0:.1f}, xtrain "
              f"{ceilings.get('float32_matmul_xtrain_tflops') or 0:.1f} TFLOP/s")
    return ceilings


if __name__ == "__main__":
    main()
