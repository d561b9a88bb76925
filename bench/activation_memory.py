"""Where a big preset's training step spends its memory, xtrain against bench/big_models.py's
PyTorch peer: the static part, the activations kept for backward per token per layer, and the
head's; counted exactly on the CPU at the preset's dims with few layers and a short sequence, then
extrapolated to the GPU run's shape.

    python bench/activation_memory.py                           # qwen3-1.7b dims, 1 and 2 layers, seq 256
    python bench/activation_memory.py --preset qwen3-0.6b --batch 4 --seq 4096   # another target shape
    python bench/activation_memory.py --layers 1 2 --seq 32 --vocab 512 --no-peer   # smoke (tests)

xtrain (the engine's own accounting): the CPU allocator's requested bytes (xtrain.memory_stats,
exact sizes, no rounding) before the forward, after it (what the tape keeps for backward: every
saved tensor once, views of one storage counted with it) and at the forward's and the backward's
peaks. The per-layer slope is the difference between two layer counts over the tokens; the rest
(the embedding's and the head's) is the intercept. The script writes out, op by op, what each
block keeps (xtrain_block_table: each node's saved tensors, their dtype and bytes per token) and
checks the table's sum against the measured slope, so the table cannot drift from the code.
The static part is the parameter store's flats (float32 master weights, AdamW's float32 m and v,
all of one padded layout; the bf16 compute copies of the linears' weights, which the lean presets
do not keep: their store casts each block's weights as the block runs and backward casts again
what it needs, Note [Casts saved as their source]), checked against the allocator after one
optimizer step at the small size. The gradients are not static: each is
allocated by the backward that makes it (Note [Gradients without a flat buffer], xtrain/store.py);
the head weight's, the first, takes the place of the head's float32 dw accumulator, which its
backward frees once it has rounded it to bf16, so the peak at the start of backward holds none.

PyTorch (bench/big_models.py's build_peer, the same weights, under torch.autocast(bfloat16) as the
bench runs it): the body's forward under torch.autograd.graph.saved_tensors_hooks, every tensor
autograd packs for backward (an eager node's or the compiled graph's), each storage once, grouped
by dtype and shape; the float32 parameters are static and the bf16 copies autocast makes of the
weights are counted apart. Twice: under torch.compile, as the liger peer runs its body (the
partitioner may recompute cheap pointwise ops in backward instead of saving them; it is the same
code on the GPU), and eager, which saves every op's inputs (the norms' and RoPE's float32
products): an upper bound on the compiled body. The peer's head is Liger's fused linear
cross-entropy, which has no CPU path: it is left out (body only).

Extrapolation to --batch x --target-seq (default 4 x 4096) and the preset's layers: static +
layers x tokens x (per token per layer) + the head's (xtrain's by the formula of Note [Row-chunked
head]), for each framework at the start of its backward; printed beside the GPU peaks given by
--gpu-xtrain-gib / --gpu-peer-gib (bench/big_models.py's peak_gib; 0: not shown).

Results: bench/results/activation_memory-PRESET-DATE.json.
"""

from __future__ import annotations

import argparse
import gc
import math

import numpy as np

import common

GIB = 2**30


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen3-1.7b")
    p.add_argument("--layers", type=int, nargs=2, default=[1, 2], metavar=("L1", "L2"),
                   help="the two layer counts measured (the slope is their difference)")
    p.add_argument("--seq", type=int, default=256, help="sequence of the CPU measurement (batch 1)")
    p.add_argument("--vocab", type=int, default=1024,
                   help="vocabulary of the CPU measurement (the head's bytes at the preset's are by formula)")
    p.add_argument("--batch", type=int, default=4, help="the extrapolation's batch")
    p.add_argument("--target-seq", type=int, default=4096, help="the extrapolation's sequence")
    p.add_argument("--no-peer", action="store_true", help="xtrain only")
    p.add_argument("--no-recompute", action="store_true", help="skip the measurement with recompute on")
    p.add_argument("--gpu-xtrain-gib", type=float, default=0.0, help="xtrain's measured GPU peak to compare with")
    p.add_argument("--gpu-peer-gib", type=float, default=0.0, help="the peer's measured GPU peak to compare with")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(common.RESULTS_DIR))
    p.add_argument("--tag", default="")
    return p.parse_args(argv)


def small_config(preset: str, layers: int, vocab: int, seq: int, **overrides):
    """The preset's dims with `layers` layers and a `vocab` vocabulary, bf16."""
    from xtrain.models import TransformerConfig, config_for

    cfg = config_for(preset, 1, bf16=True)
    return TransformerConfig(**{**cfg.to_dict(), "n_layers": layers, "vocab_size": vocab,
                                "max_seq": max(seq, 64), **overrides})


# ---- xtrain: what the code keeps, op by op

def xtrain_block_table(cfg) -> list[dict]:
    """What one block keeps between forward and backward (recompute off, no dropout, not FP8):
    each stored tensor once, with the node(s) that keep it and its bytes per token; the lean ops'
    block with cfg.lean_activations, else the plain one (xtrain_plain_block_table)."""
    if not cfg.lean_activations:
        return xtrain_plain_block_table(cfg)
    # The residual stream's add runs fused into the norm after it and the projections after that,
    # so a block's input is the h its input norm keeps (the first block's: the embedding's output).
    e = 2 if cfg.bf16 else 4
    d, f = cfg.dim, cfg.ffn_dim
    q, kv, H = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_heads
    act = cfg.dtype
    # Both recompute the rotated q and k in backward (Llama's rope_attention, Qwen3's with the q/k norm)
    attention = "QkNormRopeAttentionBackward" if cfg.qk_norm else "RopeAttentionBackward"
    rows = [
        ("block input h (the residual stream)", "RmsNormLinearMultiBackward.h (input_layernorm + q/k/v_proj)",
         act, d * e),
        ("input norm's rstd", "RmsNormLinearMultiBackward.rstd", "float32", 4),
        ("q, k, v projections (one buffer)", f"{attention}.q, .k, .v (views of it)", act, (q + 2 * kv) * e),
    ]
    rows += [
        ("attention output", f"{attention}.out = LinearBackward.x (o_proj)", act, q * e),
        ("attention's log-sum-exp", f"{attention}.lse", "float32", H * 4),
        ("residual after attention h", "RmsNormLinearMultiBackward.h (post_attention_layernorm + gate/up_proj)",
         act, d * e),
        ("post-attention norm's rstd", "RmsNormLinearMultiBackward.rstd", "float32", 4),
        ("gate, up (one buffer)", "SwigluLinearBackward.gate, .up (down_proj)", act, 2 * f * e),
    ]
    return [dict(what=w, kept_by=k, dtype=t, bytes_per_token=b) for w, k, t, b in rows]


def xtrain_plain_block_table(cfg) -> list[dict]:
    """The plain block's kept tensors (lean_activations off): each op keeps its own inputs, so the
    norms' outputs, the normed and rotated q/k and the SwiGLU product are kept besides what the
    lean ops keep."""
    e = 2 if cfg.bf16 else 4
    d, f = cfg.dim, cfg.ffn_dim
    q, kv, H, Hkv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    act = cfg.dtype
    rows = [
        ("block input h (the residual stream)", "add_rms_norm (input_layernorm)", act, d * e),
        ("input norm's rstd", "add_rms_norm", "float32", 4),
        ("input norm's output", "linear_multi (q/k/v_proj)", act, d * e),
        ("q, k, v projections (one buffer)",
         "qk_norm_rope.q, .k and flash_attention.v (views of it)" if cfg.qk_norm
         else "flash_attention.v (a view: the buffer lives on)", act, (q + 2 * kv) * e),
        ("q, k after norm and RoPE" if cfg.qk_norm else "q, k after RoPE", "flash_attention.q, .k", act, (q + kv) * e),
    ]
    if cfg.qk_norm:
        rows.append(("q/k norms' rstd rows", "qk_norm_rope", "float32", (H + Hkv) * 4))
    rows += [
        ("attention output", "flash_attention.out = linear (o_proj).x", act, q * e),
        ("attention's log-sum-exp", "flash_attention.lse", "float32", H * 4),
        ("residual after attention h", "add_rms_norm (post_attention_layernorm)", act, d * e),
        ("post-attention norm's rstd", "add_rms_norm", "float32", 4),
        ("post-attention norm's output", "linear_multi (gate/up_proj)", act, d * e),
        ("gate, up (one buffer)", "swiglu", act, 2 * f * e),
        ("silu(gate) * up", "linear (down_proj).x", act, f * e),
    ]
    return [dict(what=w, kept_by=k, dtype=t, bytes_per_token=b) for w, k, t, b in rows]


def store_layout(cfg) -> dict:
    """The parameter store's flat sizes for cfg without building it (xtrain.store's layout: each
    tensor at a multiple of ALIGN elements, each region padded to ALIGN * SHARD_MULTIPLE; region 0
    the linears' weights, which get bf16 compute copies unless the store casts them on use, as the
    lean presets' does)."""
    from xtrain.store import ALIGN, SHARD_MULTIPLE

    up = lambda n, k: -(-n // k) * k  # noqa: E731
    region = [0, 0]
    for name, shape in cfg.param_shapes().items():
        r = 0 if name.endswith("_proj.weight") or name == "lm_head.weight" else 1
        region[r] += up(math.prod(shape), ALIGN)
    lengths = [up(n, ALIGN * SHARD_MULTIPLE) if n else 0 for n in region]
    numel = sum(lengths)
    params = sum(math.prod(s) for s in cfg.param_shapes().values())
    e = 2 if cfg.bf16 else 4
    parts = {"float32 master weights": 4 * numel, "AdamW m and v (float32)": 8 * numel}
    if cfg.bf16 and not cfg.lean_activations:  # lean: ParamStore(cast_on_use=True), no flat copies
        parts["bf16 compute copies of the linears' weights"] = e * lengths[0]
    return {"params": params, "flat_numel": numel, "region0_numel": lengths[0], "parts": parts,
            "total": sum(parts.values())}


def head_bytes(cfg, tokens: int) -> dict:
    """The head's bytes at `tokens` rows (ops.linear_cross_entropy, Note [Row-chunked head] in
    csrc/ops/cross_entropy.cpp, its chunk rows and logits stride from ops.head_layout) and what
    the final norm keeps. Kept to backward: the final norm's
    h and rstd, and (chunked) the float32 dx and dw accumulators, or (unchunked) the logits buffer
    and the normed x. Transient in the forward: the chunk's logits and a tied head's cast weight."""
    from xtrain._C import ops

    e = 2 if cfg.bf16 else 4
    V, K = cfg.vocab_size, cfg.dim
    rows, ld = ops.head_layout(tokens, V, "bfloat16" if cfg.bf16 else "float32")  # the op's own rule
    chunks = -(-tokens // rows) if rows < tokens else 1
    kept = {"final norm's h and rstd": tokens * (K * e + 4)}
    transient = {}
    if chunks <= 1:
        kept["logits buffer"] = tokens * ld * e
        kept["normed x"] = tokens * K * e
    else:
        kept["dx accumulator (float32)"] = tokens * K * 4
        kept["dw accumulator (float32)"] = V * K * 4
        transient["a chunk's logits"] = rows * ld * e
    if cfg.tie_embeddings and cfg.bf16:
        transient["the tied head's bf16 cast"] = V * K * e
    return {"chunks": chunks, "kept": kept, "transient": transient,
            "kept_total": sum(kept.values()), "transient_total": sum(transient.values())}


def measure_xtrain(cfg, seq: int, seed: int, device: str = "cpu") -> dict:
    """One batch of 1 x seq through a fresh model on `device` (the CPU here; a GPU test runs the
    same count on CUDA), after a warm-up step: requested bytes before the forward (static), kept
    after it, the forward's and the backward's peaks (allocated, above the start), and after one
    optimizer step the static bytes with AdamW's moments."""
    import xtrain
    from xtrain.models import TinyTransformer
    from xtrain.optim import AdamW

    stats = lambda: xtrain.memory_stats(device)  # noqa: E731
    model = TinyTransformer(cfg, device=device, seed=seed)
    opt = AdamW(model.named_parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(seed)
    ids = xtrain.tensor(rng.integers(0, cfg.vocab_size, (1, seq)), device=device)
    targets = xtrain.tensor(rng.integers(0, cfg.vocab_size, (1, seq)), device=device)
    model(ids, targets)[1].backward()  # a warm-up step: what a backend makes once (a GEMM workspace) is made
    opt.zero_grad(set_to_none=True)
    if not model.store.cast_on_use:
        model.store.compute_weights()  # the bf16 copies exist before the forward
    gc.collect()
    common.xt_sync(device)  # sync point: the counts are read between steps
    start_req, start_alloc = stats()["requested_bytes.current"], stats()["allocated_bytes.current"]
    xtrain.reset_peak_memory_stats(device)
    _, loss = model(ids, targets)
    kept = stats()["requested_bytes.current"] - start_req
    fwd_peak = stats()["allocated_bytes.peak"] - start_alloc
    xtrain.reset_peak_memory_stats(device)
    loss.backward()
    bwd_peak = stats()["allocated_bytes.peak"] - start_alloc
    del loss
    opt.clip_and_step(1.0)
    opt.zero_grad(set_to_none=True)
    gc.collect()
    static = stats()["requested_bytes.current"] - ids.numel() * 16  # less ids and targets (int64)
    del model, opt, ids, targets
    gc.collect()
    return {"layers": cfg.n_layers, "tokens": seq, "recompute": cfg.recompute, "kept_bytes": kept,
            "forward_peak_bytes": fwd_peak, "backward_peak_bytes": bwd_peak, "static_bytes": static}


def xtrain_part(args) -> dict:
    L1, L2 = args.layers
    out = {"runs": []}
    for recompute in (False, True) if not args.no_recompute else (False,):
        runs = [measure_xtrain(small_config(args.preset, L, args.vocab, args.seq, recompute=recompute),
                               args.seq, args.seed) for L in (L1, L2)]
        out["runs"] += runs
        slope = (runs[1]["kept_bytes"] - runs[0]["kept_bytes"]) / ((L2 - L1) * args.seq)
        key = "recompute" if recompute else "plain"
        out[key] = {"kept_per_token_per_layer": slope,
                    "kept_rest_bytes": runs[0]["kept_bytes"] - slope * L1 * args.seq,
                    "backward_peak_over_kept_bytes": runs[1]["backward_peak_bytes"] - runs[1]["kept_bytes"]}
    cfg = small_config(args.preset, L1, args.vocab, args.seq)
    table = xtrain_block_table(cfg)
    out["block_table"] = table
    out["block_table_total"] = sum(r["bytes_per_token"] for r in table)
    out["table_matches_measurement"] = out["block_table_total"] == out["plain"]["kept_per_token_per_layer"]
    out["static_formula_at_measured_size"] = store_layout(cfg)["total"]
    out["static_measured"] = out["runs"][0]["static_bytes"]
    return out


# ---- the PyTorch peer (bench/big_models.py's model), eager under autocast

def measure_peer(cfg, seq: int, seed: int, compiled: bool) -> dict:
    """The peer's body (embedding, blocks, final norm) on one batch of 1 x seq, eager or under
    torch.compile (as the liger peer runs it): every tensor autograd packs for backward
    (saved_tensors_hooks: the eager nodes' and the compiled graph's), each storage once, split
    into activations and the bf16 weight copies autocast made."""
    import torch

    import big_models
    from xtrain.models import TinyTransformer

    weights = {n: p.numpy().copy() for n, p in TinyTransformer(cfg, device="cpu", seed=seed).named_parameters()}
    peer = big_models.build_peer(cfg, weights, "cpu", seq, gqa_native=True)
    params = {p.untyped_storage().data_ptr() for p in peer.parameters()}
    weight_shapes = {tuple(sorted(p.shape)) for p in peer.parameters() if p.dim() == 2}
    body = torch.compile(peer.body, dynamic=False) if compiled else peer.body
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, cfg.vocab_size, (1, seq)))
    if compiled:
        body(ids)  # the compile, outside the count
    saved = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in saved:
            weight = t.dtype == torch.bfloat16 and tuple(sorted(t.shape)) in weight_shapes
            saved[key] = {"dtype": str(t.dtype)[6:], "shape": list(t.shape), "bytes": t.untyped_storage().nbytes(),
                          "kind": "weight cast" if weight else "activation"}
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = body(ids)
    rows = list(saved.values())
    del h, body, peer
    gc.collect()
    return {"layers": cfg.n_layers, "tokens": seq, "rows": rows,
            "activation_bytes": sum(r["bytes"] for r in rows if r["kind"] == "activation"),
            "weight_cast_bytes": sum(r["bytes"] for r in rows if r["kind"] == "weight cast")}


def peer_part(args, compiled: bool) -> dict:
    """The peer's slope per token per layer and one block's saved tensors: the (dtype, shape per
    token) groups the larger model holds more of."""
    L1, L2 = args.layers
    runs = [measure_peer(small_config(args.preset, L, args.vocab, args.seq), args.seq, args.seed, compiled)
            for L in (L1, L2)]
    slope = (runs[1]["activation_bytes"] - runs[0]["activation_bytes"]) / ((L2 - L1) * args.seq)
    a, b = (_grouped(run["rows"], args.seq) for run in runs)
    table = []
    for key in sorted(set(a) | set(b), key=lambda k: -(b.get(k, (0, 0))[0] - a.get(k, (0, 0))[0])):
        per_layer = (b.get(key, (0, 0))[0] - a.get(key, (0, 0))[0]) / (L2 - L1)
        count = (b.get(key, (0, 0))[1] - a.get(key, (0, 0))[1]) / (L2 - L1)
        if per_layer:
            dtype, shape = key
            table.append({"dtype": dtype, "shape_per_token": shape, "tensors": count, "bytes_per_token": per_layer})
    return {"compiled": compiled, "runs": [{k: v for k, v in r.items() if k != "rows"} for r in runs],
            "block_table": table, "kept_per_token_per_layer": slope,
            "kept_rest_bytes": runs[0]["activation_bytes"] - slope * L1 * args.seq,
            "weight_cast_bytes_per_layer": (runs[1]["weight_cast_bytes"] - runs[0]["weight_cast_bytes"]) / (L2 - L1)}


def _grouped(rows, tokens) -> dict:
    """(dtype, shape with the token dims written T) -> (bytes per token, tensors)."""
    out = {}
    for r in rows:
        if r["kind"] != "activation":
            continue
        shape = "x".join("T" if n == tokens else str(n) for n in r["shape"] if n != 1)
        key = (r["dtype"], shape)
        b, n = out.get(key, (0, 0))
        out[key] = (b + r["bytes"] / tokens, n + 1)
    return out


# ---- the extrapolation

def extrapolate(args, xt: dict, peers: dict) -> dict:
    from xtrain.models import config_for

    cfg = config_for(args.preset, 1, bf16=True)
    tokens = args.batch * args.target_seq
    layout, head = store_layout(cfg), head_bytes(cfg, tokens)
    out = {"tokens": tokens, "layers": cfg.n_layers, "store": layout, "head": head}
    for key in ("plain", "recompute"):
        if key not in xt:
            continue
        acts = xt[key]["kept_per_token_per_layer"] * tokens * cfg.n_layers
        out[f"xtrain_{key}"] = {"static": layout["total"], "activations": acts, "head_kept": head["kept_total"],
                                "head_transient": head["transient_total"],
                                "estimate": layout["total"] + acts + head["kept_total"] + head["transient_total"]}
    for name, peer in peers.items():
        # torch holds float32 masters and AdamW's m and v throughout; its gradients appear during
        # backward as the activations are freed, and the head (Liger's) is not counted here: this
        # is the peer at the end of its forward
        static = 12 * layout["params"]
        casts = peer["weight_cast_bytes_per_layer"] * cfg.n_layers
        acts = peer["kept_per_token_per_layer"] * tokens * cfg.n_layers
        out[f"peer_{name}"] = {"static": static, "weight_casts": casts, "activations": acts,
                               "estimate": static + casts + acts}
    return out


def main(argv=None):
    args = parse_args(argv)
    common.setup_torch("cpu")
    print(f"activation_memory: {args.preset} dims, layers {args.layers[0]} and {args.layers[1]}, 1 x {args.seq} "
          f"tokens, vocabulary {args.vocab}, bf16, CPU", flush=True)
    xt = xtrain_part(args)
    print("\nxtrain, kept per token per layer (the code's table; the allocator's slope below):")
    for r in xt["block_table"]:
        print(f"  {r['bytes_per_token']:7,d} B  {r['dtype']:8s}  {r['what']:38s}  {r['kept_by']}")
    print(f"  {xt['block_table_total']:7,d} B  table total; measured {xt['plain']['kept_per_token_per_layer']:,.1f} "
          f"({'equal' if xt['table_matches_measurement'] else 'DIFFERENT'})")
    if "recompute" in xt:
        print(f"  recompute on: {xt['recompute']['kept_per_token_per_layer']:,.1f} B per token per layer")
    print(f"  static at {args.layers[0]} layer(s): allocator {xt['static_measured']:,d} B, store layout "
          f"{xt['static_formula_at_measured_size']:,d} B")
    peers = {}
    for name in () if args.no_peer else ("compiled", "eager"):
        peers[name] = peer = peer_part(args, compiled=name == "compiled")
        print(f"\nPyTorch peer's body, {name} under autocast, per token per layer (T: the tokens):")
        for r in peer["block_table"]:
            print(f"  {r['bytes_per_token']:9,.1f} B  {r['dtype']:8s}  {r['tensors']:g} x ({r['shape_per_token']})")
        print(f"  {peer['kept_per_token_per_layer']:9,.1f} B  total; plus {peer['weight_cast_bytes_per_layer']:,.0f} B "
              f"of bf16 weight casts per layer")
    ext = extrapolate(args, xt, peers)
    print(f"\nat batch {args.batch} x seq {args.target_seq} ({ext['tokens']} tokens), {ext['layers']} layers (GiB):")
    for name in ("xtrain_plain", "xtrain_recompute", "peer_compiled", "peer_eager"):
        if name in ext:
            parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in ext[name].items() if k != "estimate")
            print(f"  {name:18s} {ext[name]['estimate'] / GIB:6.2f}  ({parts})")
    if args.gpu_xtrain_gib or args.gpu_peer_gib:
        print(f"  measured on the GPU: xtrain {args.gpu_xtrain_gib:.2f}, peer {args.gpu_peer_gib:.2f}")
    payload = {"benchmark": "activation_memory", "env": common.env_info("cpu"),
               "args": {k: v for k, v in vars(args).items() if k != "out"}, "xtrain": xt, "peer": peers,
               "extrapolation": ext}
    common.write_json(common.result_name(f"activation_memory-{args.preset}", args.tag), payload, args.out)
    return payload


if __name__ == "__main__":
    main()
