"""The published shapes people fine-tune (qwen3-0.6b, qwen3-1.7b, llama3.2-1b) at long sequences:
xtrain's training step against the same model in PyTorch at its strongest, same GPU, same call.

    python bench/big_models.py --preset qwen3-0.6b --batch 4 --seq 4096 --parts step
    python bench/big_models.py --preset qwen3-0.6b --seq 4096 --parts search --memory-limit 40GiB
    python bench/big_models.py --device cpu --preset qwen3-0.6b --shrink --batch 2 --seq 64 \\
        --steps 2 --warmup 1 --peers eager compile --parts step search --memory-limit 2GiB   # smoke
    python bench/big_models.py --preset qwen3-1.7b --batch 2 --seq 4096 --fp8 --peers torchao   # FP8

Part `step` (same batch): xtrain's step as `xtrain train` runs it (bench/recompute.py's
XtrainTrainer: forward, the fused head, backward, clip, AdamW, replayed as CUDA graphs), then each
PyTorch peer of --peers from xtrain's very weights, each freeing the GPU before the next:
  liger    the model's body (embedding, blocks, final norm) under torch.compile, the head and
           loss through Liger-Kernel's LigerFusedLinearCrossEntropyLoss (outside the compiled
           graph: its Triton kernels run as an autograd Function that keeps no logits), fused AdamW
  compile  the whole model under torch.compile, the head as F.linear + F.cross_entropy (the
           logits materialised), fused AdamW
  eager    the whole model without compile (a CPU-runnable check of the peer's math)
  torchao  liger's setup with the blocks' linears (q/k/v/o, gate/up/down) converted to torchao's
           float8 training (convert_to_float8_training, the tensorwise recipe: E4M3 input and
           weight, E5M2 grad_output, dynamic per-tensor scales, fast accumulation in the forward
           GEMM only), under the same torch.compile: the FP8 peer of xtrain's --fp8
With --fp8 the step part adds an "xtrain (fp8)" row after xtrain's: the same weights and batches
with the blocks' linears in FP8 (TransformerConfig.fp8, docs/fp8.md), and its ratios to xtrain's
bf16 step and to the torchao peer.
The peers' attention is F.scaled_dot_product_attention restricted to the flash backend, with
enable_gqa when this torch's flash kernel takes grouped-query attention (else k and v are
repeated to the query heads first; the JSON says which). Linears under torch.autocast(bfloat16)
with float32 master weights (xtrain's policy), RMSNorm and RoPE in float32, rounded once. Reported
per row: ms/step, tokens/s, peak allocated memory (reset after warm-up; xtrain's adds its graph
pool, bench/recompute.py; the issue's memory ratio is this one), the peak of what each allocator
held (reserved: live and cached blocks, xtrain's graph pool; torch.cuda.max_memory_reserved),
MFU against the H200's measured 790 TFLOP/s with the model's FLOPs
per token (TransformerConfig.flops_per_token: grouped-query k/v counted at their width, the tied
head once as a GEMM), the first batch's loss (every row should agree: same weights), and xtrain's
ratios to each peer and to the fastest.

Part `search` (largest batch): each framework's allocator capped at --memory-limit
(xtrain.set_memory_limit; torch.cuda.set_per_process_memory_fraction), training steps at growing
batches, 1, 2, 4, ... up to the first that runs out of memory, then a bisection between the
last that fit and it: about 2 log2(B) tries of one warm step and --search-steps timed ones
(bench/recompute.py's measure). xtrain steps eagerly there (a capture per batch would cost
three steps each); the peer is --search-peer (default liger) compiled once with the batch
dimension dynamic (one compile for every try, where a static compile would recompile per batch;
dynamo cannot keep a batch of 1 dynamic, so the peer's gallop starts at 2 and tries 1, with a
compile of its own, only when 2 does not fit).

Time per call on the H200 (estimates before the first run): xtrain's init draws the weights on
the CPU (~20 s for 0.6B, ~60 s for 1.7B), each compiled peer compiles for 1-2 minutes; a step
part with two peers 4-6 minutes, a search part 3-4 minutes. Results:
bench/results/big_models-PRESET-sSEQ-DATE.json.
"""

from __future__ import annotations

import argparse
import time

import common
from recompute import TorchTrainer, XtrainTrainer, describe, measure, set_limit, try_batch

PEERS = ("liger", "compile", "eager", "torchao")
FP8_PEERS = ("torch (torchao)",)  # not candidates for the strongest bf16 peer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_shape_args(p, batch=4, seq=4096, preset="qwen3-0.6b")
    p.add_argument("--parts", nargs="+", choices=("step", "search"), default=["step"])
    p.add_argument("--peers", nargs="+", choices=PEERS, default=["liger", "compile"],
                   help="PyTorch peers of the step part, in this order")
    p.add_argument("--search-peer", choices=PEERS, default="liger", help="the PyTorch peer of the search part")
    p.add_argument("--memory-limit", default="40GiB", help="the allocators' cap in the search part")
    p.add_argument("--max-batch", type=int, default=256, help="the search looks no further")
    p.add_argument("--search-steps", type=int, default=1, help="timed steps per search try")
    p.add_argument("--vocab", type=int, default=None,
                   help="token ids drawn below this (default: the preset's whole vocabulary)")
    p.add_argument("--shrink", action="store_true",
                   help="the preset's heads (head dim, GQA ratio, q/k norm, tied head, theta) at a "
                        "test size: 2 layers, dim 128, vocabulary 1024 (CPU dry runs)")
    p.add_argument("--no-graphs", action="store_true", help="xtrain's step eagerly (not as it trains)")
    p.add_argument("--plain-blocks", action="store_true",
                   help="add xtrain's step with lean_activations off (after its step with the preset's lean ops): "
                        "their memory and speed against the plain blocks'")
    p.add_argument("--fp8", action="store_true",
                   help="add xtrain's step with the blocks' linears in FP8 (after its bf16 step; needs bf16)")
    common.add_common_args(p, steps=10, warmup=3)
    return p.parse_args(argv)


def model_config(args):
    from xtrain.models import TransformerConfig, config_for

    cfg = config_for(args.preset, 1, bf16=args.bf16)
    if args.shrink:
        ratio = cfg.n_heads // cfg.n_kv_heads
        cfg = TransformerConfig(**{**cfg.to_dict(), **dict(vocab_size=1024, dim=128, n_layers=2, n_heads=ratio,
                                                            n_kv_heads=1, ffn_dim=256, max_seq=max(args.seq, 64))})
    if args.seq > cfg.max_seq:
        raise SystemExit(f"--seq {args.seq} exceeds {args.preset}'s max_seq {cfg.max_seq}")
    return cfg


# ---- the PyTorch model: Qwen3 / Llama with grouped-query attention, q/k norm on or off, tied head

def flash_gqa_supported(device) -> bool:
    """Whether this torch's flash SDPA backend takes k/v with fewer heads (enable_gqa)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not common.is_cuda(device):
        return False
    q = torch.randn(1, 4, 128, 64, device=device, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 128, 64, device=device, dtype=torch.bfloat16)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return True
    except RuntimeError:
        return False


def build_peer(cfg, weights, device, seq, gqa_native):
    """The torch module: parameters in xtrain's names and values (float32 masters)."""
    import torch
    import torch.nn.functional as F

    from torch_model import rope
    from torch_reference import rms_norm

    class Peer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = list(weights)
            self.index = {n: i for i, n in enumerate(self.names)}
            self.params = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.tensor(weights[n], device=device)) for n in self.names])  # copies
            D = cfg.head_dim
            inv = 1.0 / cfg.rope_theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=device) / D)
            ang = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
            self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :])  # (1, S, 1, D)
            self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :])
            self.bf16 = torch.bfloat16 if cfg.bf16 else torch.float32
            self.recompute = False  # no activation checkpoints (bench/recompute.py's trainers ask)
            # the blocks' linears as nn.Linear modules over the same parameters (F.linear's math),
            # which torchao's convert_to_float8_training can swap
            self.linears = torch.nn.ModuleDict()
            for n in self.names:
                if n.startswith("layers.") and n.endswith("_proj.weight"):
                    w = self.p(n)
                    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
                    lin.weight = w
                    self.linears[n.replace(".", "_")] = lin

        def p(self, name):
            return self.params[self.index[name]]

        def lin(self, h, name):
            return self.linears[name.replace(".", "_")](h)

        def head_weight(self):
            return self.p("embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight")

        def attention(self, i, h, B, S):
            p = lambda n: self.p(f"layers.{i}.self_attn.{n}")  # noqa: E731
            H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            lin = lambda n: self.lin(h, f"layers.{i}.self_attn.{n}")  # noqa: E731
            q = lin("q_proj.weight").view(B, S, H, D)
            k = lin("k_proj.weight").view(B, S, Hkv, D)
            v = lin("v_proj.weight").view(B, S, Hkv, D)
            if cfg.qk_norm:
                q, k = rms_norm(q, p("q_norm.weight"), cfg.norm_eps), rms_norm(k, p("k_norm.weight"), cfg.norm_eps)
            q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)           # (B, heads, S, D)
            if Hkv != H and not gqa_native:
                k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H and gqa_native)
            return self.lin(a.transpose(1, 2).reshape(B * S, H * D), f"layers.{i}.self_attn.o_proj.weight")

        def body(self, ids):
            """ids (B, S) -> the final norm's output (B*S, dim) in the activation dtype."""
            B, S = ids.shape
            with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                x = F.embedding(ids.reshape(-1), self.p("embed_tokens.weight")).to(self.bf16)
                for i in range(cfg.n_layers):
                    p = lambda n: self.p(f"layers.{i}.{n}")  # noqa: E731
                    x = x + self.attention(i, rms_norm(x, p("input_layernorm.weight"), cfg.norm_eps), B, S)
                    h = rms_norm(x, p("post_attention_layernorm.weight"), cfg.norm_eps)
                    mlp = lambda v, n: self.lin(v, f"layers.{i}.mlp.{n}")  # noqa: E731
                    g = F.silu(mlp(h, "gate_proj.weight")) * mlp(h, "up_proj.weight")
                    x = x + mlp(g, "down_proj.weight")
                return rms_norm(x, self.p("norm.weight"), cfg.norm_eps)

        def forward(self, ids, targets):
            """The plain head: logits (B*S, V) materialised, cross-entropy in float32."""
            h = self.body(ids)
            with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                logits = F.linear(h, self.head_weight())
            return F.cross_entropy(logits.float(), targets.reshape(-1))

    return Peer()


class PeerTrainer(TorchTrainer):
    """One PyTorch peer with bench/recompute.py's trainer interface (its step, measure, the search);
    TorchTrainer's own model (bench/torch_model.py) has neither GQA nor a tied head, so this one
    builds build_peer's."""

    def __init__(self, peer, cfg, weights, device, seq, gqa_native, dynamic_batch=False):  # noqa: super's model unused
        import torch

        import torch_model

        self.torch, self.device, self.framework = torch, device, f"torch ({peer})"
        self.module = build_peer(cfg, weights, device, seq, gqa_native)
        self.dynamic = dynamic_batch
        if peer == "torchao":
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training

            convert_to_float8_training(self.module.linears, config=Float8LinearConfig.from_recipe_name("tensorwise"))
        if peer in ("liger", "torchao"):
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            body = torch.compile(self.module.body, dynamic=None if dynamic_batch else False)
            flce = LigerFusedLinearCrossEntropyLoss()
            dt = torch.bfloat16 if cfg.bf16 else torch.float32

            def loss_fn(ids, targets):
                return flce(self.module.head_weight().to(dt), body(ids), targets.reshape(-1))
            self.loss_fn = loss_fn
        elif peer == "compile":
            self.loss_fn = torch.compile(self.module, dynamic=None if dynamic_batch else False)
        else:
            self.loss_fn = self.module
        self.model = self.forward  # TorchTrainer.step calls model(x, y) -> (logits, loss)
        self.inner = self.module   # TorchTrainer.recompute reads inner.recompute (off: no checkpoints)
        self.params = list(self.module.parameters())
        self.opt = torch_model.adamw(self.module, lr=3e-4)
        self.oom = torch.OutOfMemoryError

    def forward(self, x, y):
        # One compile for every batch of the search. A batch of 1 cannot be marked dynamic (dynamo
        # specializes sizes 0 and 1): it gets a compile of its own, so the search tries it last.
        if self.dynamic and x.shape[0] > 1:
            self.torch._dynamo.mark_dynamic(x, 0)
            self.torch._dynamo.mark_dynamic(y, 0)
        return None, self.loss_fn(x, y)

    def first_loss(self, x, y) -> float:
        with self.torch.no_grad():
            return float(self.module(x, y).item())

    def close(self):
        del self.module, self.loss_fn
        super().close()


# ---- part 1: the step at one batch

def step_part(args, cfg, device, tdevice, gqa_native, rows: list, on_row) -> dict:
    """Appends each framework's row to rows, calling on_row() after each (the file is rewritten, so
    a call cut short by its time limit keeps the rows measured so far); returns xtrain's weights."""
    batches = common.random_batches(args.vocab, args.batch, args.seq, n=2, seed=args.seed)
    xt = XtrainTrainer(cfg, device, args.seed, use_graphs=not args.no_graphs)
    weights = xt.weights()
    rows.append(run_row(args, "xtrain", xt, batches, first_loss=xtrain_first_loss(xt, batches[0])))
    on_row()
    xt.close()
    del xt
    if args.plain_blocks and cfg.lean_activations:  # the same weights and batches, lean_activations off
        from xtrain.models import TransformerConfig

        xt = XtrainTrainer(TransformerConfig(**{**cfg.to_dict(), "lean_activations": False}), device, args.seed,
                           use_graphs=not args.no_graphs)
        xt.model.load_state_dict(weights)
        rows.append(run_row(args, "xtrain (plain blocks)", xt, batches, first_loss=xtrain_first_loss(xt, batches[0])))
        on_row()
        xt.close()
        del xt
    if args.fp8:  # the same weights, the blocks' linears in FP8
        from xtrain.models import TransformerConfig

        xt = XtrainTrainer(TransformerConfig(**{**cfg.to_dict(), "fp8": True}), device, args.seed,
                           use_graphs=not args.no_graphs)
        xt.model.load_state_dict(weights)
        rows.append(run_row(args, "xtrain (fp8)", xt, batches, first_loss=xtrain_first_loss(xt, batches[0])))
        on_row()
        xt.close()
        del xt
    for peer in args.peers:
        t0 = time.perf_counter()
        try:
            tr = PeerTrainer(peer, cfg, weights, tdevice, args.seq, gqa_native)
        except Exception as e:  # e.g. Liger-Kernel missing, no Triton on the CPU: keep the rest
            rows.append({"framework": f"torch ({peer})", "error": describe(e)})
            print(f"torch ({peer}) failed: {rows[-1]['error']}", flush=True)
            on_row()
            continue
        try:
            data = tr.upload(batches[:1])[0]
            rows.append(run_row(args, tr.framework, tr, batches, first_loss=tr.first_loss(*data)))
            rows[-1]["build_and_run_s"] = time.perf_counter() - t0
            on_row()
        finally:
            tr.close()
            del tr
    return weights


def xtrain_first_loss(trainer, batch) -> float:
    x, y = trainer.upload([batch])[0]
    with trainer.xt.no_grad():
        return float(trainer.model(x, y)[1].item())


def run_row(args, framework, trainer, batches, first_loss) -> dict:
    row = {"framework": framework, "batch": args.batch, "seq": args.seq, "loss_first": first_loss}
    t0 = time.perf_counter()
    try:
        row.update(measure(trainer, batches, args.steps, args.warmup))
    except Exception as e:  # an OOM or a compile failure is a result of this row, not of the call
        row["error"] = describe(e)
    row["measure_s"] = time.perf_counter() - t0
    trainer.release()
    print(f"  {framework:16s} " + (row.get("error") or
                                   f"{row['ms_per_step']:.1f} ms/step, {row['tok_s']:,.0f} tok/s, peak "
                                   f"{common.fmt_gib(row['peak_allocated'])}"
                                   + (f" (data {common.fmt_gib(row['requested_peak_warmup'])})"
                                      if row.get("requested_peak_warmup") else "")
                                   + f", loss {first_loss:.4f} -> {row['loss_last']:.4f}"), flush=True)
    return row


# ---- part 2: the largest batch under a memory limit

def search_part(args, cfg, device, tdevice, gqa_native, weights) -> list[dict]:
    """xtrain's search, then the peer's (from xtrain's weights: the step part's, or this init's)."""
    limit = common.parse_bytes(args.memory_limit)
    out = []
    for framework in ("xtrain", f"torch ({args.search_peer})"):
        kind, dev = ("xtrain", device) if framework == "xtrain" else ("torch", tdevice)
        result = {"framework": framework, "limit_bytes": limit, "tries": [], "largest_batch": None}
        if not set_limit(kind, dev, limit):
            result["skipped"] = "torch has no memory cap on the CPU"
            out.append(result)
            print(f"  {framework:16s} skipped: {result['skipped']}", flush=True)
            continue
        trainer = None
        try:
            if kind == "xtrain":
                trainer = XtrainTrainer(cfg, device, args.seed, use_graphs=False)
                if weights is None:
                    weights = trainer.weights()
            else:
                trainer = PeerTrainer(args.search_peer, cfg, weights, tdevice, args.seq, gqa_native,
                                      dynamic_batch=True)
            result.update(largest_batch(args, trainer, start=1 if kind == "xtrain" else 2))
        except Exception as e:  # the model and optimizer alone do not fit, or the peer cannot run
            result["error"] = describe(e)
        finally:
            if trainer is not None:
                trainer.close()
            set_limit(kind, dev, None)
        out.append(result)
        print(f"  {framework:16s} largest batch under {args.memory_limit}: {result['largest_batch']}"
              + (f" ({result['error']})" if "error" in result else ""), flush=True)
    return out


def largest_batch(args, trainer, start: int = 1) -> dict:
    """Gallop start, 2 start, 4 start, ... to the first batch that does not fit (or --max-batch),
    then bisect (down to 1 when start does not fit)."""
    tries = []

    def fits(b) -> bool:
        tries.append(try_batch(args, trainer, b))  # one warm step, --search-steps timed, OOM a result
        return tries[-1]["fits"]

    good, bad, b = 0, None, start
    while b <= args.max_batch:
        if not fits(b):
            bad = b
            break
        good, b = b, 2 * b
    if bad is None:
        bad = args.max_batch + 1
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return {"tries": tries, "largest_batch": good or None, "capped_by_max_batch": good == args.max_batch}


# ---- the call

def summarize(rows, flops_tok) -> dict:
    for r in rows:
        if "tok_s" not in r:
            continue
        r["tflops"] = r["tok_s"] * flops_tok / 1e12
        r["mfu"] = common.mfu(r["tok_s"], flops_tok, common.BF16_PEAK_FLOPS)
    xt = next((r for r in rows if r["framework"] == "xtrain" and "tok_s" in r), None)
    ratios = {}
    peers = [r for r in rows if not r["framework"].startswith("xtrain") and "tok_s" in r]
    if xt is not None:
        for r in peers:
            ratios[r["framework"]] = {"tok_s": common.ratio(xt["tok_s"], r["tok_s"]),
                                      "peak_memory": common.ratio(xt["peak_allocated"], r["peak_allocated"]),
                                      "reserved_memory": common.ratio(xt.get("peak_reserved"),
                                                                      r.get("peak_reserved"))}
        compiled = [r for r in peers if r["framework"] != "torch (eager)" and r["framework"] not in FP8_PEERS]
        if compiled:
            best = max(compiled, key=lambda r: r["tok_s"])
            ratios["strongest peer"] = {**ratios[best["framework"]], "peer": best["framework"]}
    fp8 = next((r for r in rows if r["framework"] == "xtrain (fp8)" and "tok_s" in r), None)
    if fp8 is not None:  # --fp8: its step against xtrain's bf16 step and the FP8 peer
        for r in ([xt] if xt is not None else []) + [r for r in peers if r["framework"] in FP8_PEERS]:
            ratios[f"xtrain (fp8) / {r['framework']}"] = {
                "tok_s": common.ratio(fp8["tok_s"], r["tok_s"]),
                "peak_memory": common.ratio(fp8["peak_allocated"], r["peak_allocated"]),
                "reserved_memory": common.ratio(fp8.get("peak_reserved"), r.get("peak_reserved"))}
    return ratios


def main(argv=None):
    args = parse_args(argv)
    device, tdevice = common.resolve_device(args.device)
    common.setup_torch(device)
    cfg = model_config(args)
    if args.fp8 and not args.bf16:
        raise SystemExit("--fp8 compares against the bf16 step: drop --fp32")
    if args.vocab is None:
        args.vocab = cfg.vocab_size
    if not 1 <= args.vocab <= cfg.vocab_size:
        raise SystemExit(f"--vocab {args.vocab} must be in 1..{cfg.vocab_size} (the model's vocabulary)")
    import torch

    if common.is_cuda(device):  # flash SDPA only: a peer that silently fell back would not be the strongest
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    gqa_native = flash_gqa_supported(tdevice)
    flops_tok = cfg.flops_per_token(args.seq)
    tokens = args.batch * args.seq
    print(f"big_models: {args.preset}{' (shrunk)' if args.shrink else ''}, batch {args.batch} x seq {args.seq} = "
          f"{tokens} tokens, {'bf16' if args.bf16 else 'fp32'}, {device}; {flops_tok / 1e9:.2f} GFLOP/token; "
          f"attention {'flash SDPA, enable_gqa' if gqa_native else 'SDPA, k/v repeated'}", flush=True)
    rows, ratios, search, weights = [], {}, [], None
    result_base = f"big_models-{args.preset}{'-shrunk' if args.shrink else ''}-s{args.seq}"
    date = common.stamp()

    def save(complete: bool = False, quiet: bool = True):
        payload = {"benchmark": "big_models", "env": common.env_info(device),
                   "args": {k: v for k, v in vars(args).items() if k != "out"}, "model": cfg.to_dict(),
                   "flops_per_token": flops_tok, "tokens_per_step": tokens,
                   "mfu_ceiling_flops": common.BF16_PEAK_FLOPS,
                   "attention": "flash SDPA, enable_gqa" if gqa_native else "SDPA, k/v repeated to the query heads",
                   "results": rows, "ratios_xtrain_over": summarize(rows, flops_tok), "largest_batch": search,
                   "complete": complete}
        common.write_json(common.result_name(result_base, args.tag), payload, args.out, date=date, quiet=quiet)
        return payload

    if "step" in args.parts:
        weights = step_part(args, cfg, device, tdevice, gqa_native, rows, save)
        ratios = summarize(rows, flops_tok)
        print()
        common.print_table([r for r in rows if "tok_s" in r],
                           [("framework", "framework", ""), ("ms_per_step", "ms/step", ".1f"),
                            ("tok_s", "tok/s", ",.0f"), ("tflops", "TFLOP/s", ".1f"), ("mfu", "MFU", ".1%"),
                            ("peak_gib", "peak GiB", ".2f"), ("reserved_gib", "reserved GiB", ".2f"),
                            ("loss_first", "loss 0", ".4f"),
                            ("loss_last", "loss end", ".4f")])
        for name, r in ratios.items():
            times = lambda v: "n/a" if v is None else f"{v:.2f}x"  # noqa: E731
            print(f"{name if ' / ' in name else 'xtrain / ' + name}: tok/s {times(r['tok_s'])}, "
                  f"peak memory {times(r['peak_memory'])}, reserved {times(r.get('reserved_memory'))}"
                  + (f" ({r['peer']})" if "peer" in r else ""))
    if "search" in args.parts:
        print(f"largest batch under {args.memory_limit}:", flush=True)
        search = search_part(args, cfg, device, tdevice, gqa_native, weights)
    return save(complete=True, quiet=False)


if __name__ == "__main__":
    main()
