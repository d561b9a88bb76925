"""Generation speed: the KV-cache generator against re-running the whole prefix for every token.

    python bench/generate.py                          # dim768 bf16 on the GPU, batch 1 and 32
    python bench/generate.py --device cpu --preset tiny --batches 1,4 --new-tokens 16   # smoke

All paths generate greedily from the same random prompts (--prompt-len tokens each, seeded) with
the same model (seeded init, --vocab tokens), --new-tokens per row and no stop token, so every row
produces exactly that many tokens:
  cached   model.generate (xtrain.models.generate): one prefill over the prompts, then one token
           per row per step against the KV cache; sampling on the host from (B, V) logits. On CUDA
           the decode step is replayed as a CUDA graph (cuda_graphs=True, the default), kept for
           the next call of the same shape (KeptDecode): `cached` is such a later call, `first`
           the first call of the shape (its eager warm-up step and capture included)
  eager    the same with cuda_graphs=False: every decode step launches its ops one by one from
           Python (on the CPU it is the cached path again)
  rerun    rerun_generate below, the generator before the KV cache (kept here as the baseline):
           every step runs the model on the whole sequence so far (B, S) and brings its
           (B*S, V) logits to the host to take the last row's argmax
Time is one whole call (prefill included) after a short warm-up call of each path, synchronised
at both ends; tokens/s counts new tokens (batch * new tokens / seconds). `speedup` = rerun time /
cached time: the issue-17 gate is >= 10 at 256 new tokens for dim768 on the H200 (`first_speedup`:
rerun time / first time); `graph_gain` =
eager time / cached time; `graph_same` is 1.0 when the graph and eager paths gave the same tokens
(they must: the replay is bitwise the eager step). `same_tokens`
is the fraction of rows whose tokens agree between the two paths (1.0 in float32; bf16 rounds
attention differently in the two paths, so a near tie can flip a token and the rows diverge
after it). A third run samples (temperature 0.8, top-k 50, top-p 0.95) with the cache, to show
what host-side sampling costs next to greedy.

The PyTorch generators of the same model (--peers; known issue 29), in the same call: the model
as transformers builds it from the export's config (xtrain.io.export.hf_config: Qwen3ForCausalLM,
or LlamaForCausalLM without q/k norm) holding xtrain's weights, in the run's dtype:
  hf_static  transformers' generate(do_sample=False, cache_implementation="static"): its static
             KV cache, with the decode step compiled by transformers itself where it does so
             (CUDA; the first call compiles and is not timed)
  compiled   a decode loop over a transformers StaticCache with the model's forward under
             torch.compile(mode="reduce-overhead", fullgraph=True) (CUDA graphs of the compiled
             step), the prefill eager: the recipe transformers documents for fast decoding
Each peer generates --new-tokens greedily from the same prompts (no stop token); `vs_peer` =
cached tok/s over the fastest peer's, `peer_same_tokens` the fraction of rows whose tokens agree
with xtrain's (1.0 in float32; bf16 can flip a near tie). `*_weight_tb_s`: the weights every
decode step reads (`weight_bytes_per_step`) times the steps per second, prefill included: at
batch 1 the GPU's memory bandwidth bounds it for every generator alike.

Results: bench/results/generate-PRESET-DATE.json.
"""

from __future__ import annotations

import argparse
import inspect
import time

import numpy as np

import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto (cuda if present)")
    p.add_argument("--preset", default="dim768")
    p.add_argument("--vocab", type=int, default=common.DEFAULT_VOCAB)
    p.add_argument("--batches", default="1,32", help="comma-separated batch sizes")
    p.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens generated per row")
    p.add_argument("--no-rerun", action="store_true", help="time the cached generator only")
    p.add_argument("--peers", nargs="*", choices=("hf_static", "compiled"), default=["hf_static", "compiled"],
                   help="PyTorch generators of the same model (none: xtrain only, not a comparison)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one cached call (PyTorch's profiler, CUDA only): GPU kernel ms per "
                        "decode step and the kernels that take it (the decode kernels start early, so a "
                        "kernel's time includes its blocks' wait for the one ahead and the sum exceeds the "
                        "step)")
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--bf16", dest="bf16", action="store_true", default=None,
                      help="mixed precision bf16 (default on CUDA)")
    prec.add_argument("--fp32", dest="bf16", action="store_false", help="float32 (default on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(common.RESULTS_DIR), help="directory for the JSON")
    p.add_argument("--tag", default="", help="suffix of the result name (to tell runs apart)")
    return p.parse_args(argv)


def rerun_generate(model, prompts: np.ndarray, max_new_tokens: int) -> np.ndarray:
    """Greedy generation without a cache, as TinyTransformer.generate did before it had one: each
    step re-runs the last max_seq tokens and takes the argmax of the last row's logits."""
    import xtrain

    out = np.array(prompts, dtype=np.int64)
    with xtrain.no_grad():
        for _ in range(max_new_tokens):
            window = out[:, -model.config.max_seq:]
            logits, _ = model(window)
            # Sync point: the logits come to the host to pick the next token.
            last = np.asarray(logits.numpy(), dtype=np.float32)
            last = last.reshape(window.shape[0], window.shape[1], -1)[:, -1, :]
            out = np.concatenate([out, np.argmax(last, axis=1)[:, None]], axis=1)
    return out


def hf_model(model, device: str, bf16: bool):
    """transformers' causal LM of the model's config (the export's config.json) holding its weights."""
    import torch
    import transformers

    from xtrain.io.export import hf_config

    cfg = hf_config(model.config, "bf16" if bf16 else "f32", eot_id=0)
    cfg.pop("architectures")
    cfg.pop("torch_dtype")
    cfg.update(bos_token_id=None, eos_token_id=None, pad_token_id=0)
    dtype = torch.bfloat16 if bf16 else torch.float32
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg), dtype=dtype)
    state = {("" if n == "lm_head.weight" else "model.") + n: torch.from_numpy(p.numpy()) for n, p in
             model.named_parameters()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    tied = ["lm_head.weight"] if model.config.tie_embeddings else []
    if sorted(missing) != tied or unexpected:
        raise RuntimeError(f"transformers' model does not take xtrain's weights: missing {missing}, "
                           f"unexpected {unexpected}")
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return hf.to(device).eval()


def hf_static_generate(hf, prompts: np.ndarray, new_tokens: int, device: str):
    """transformers' generate with its static cache: greedy, exactly new_tokens per row."""
    import torch

    ids = torch.from_numpy(prompts).to(device)

    def run():
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, cache_implementation="static")
        return out.cpu().numpy()  # sync point: the tokens come to the host
    return run


def compiled_static_decode(hf, prompts: np.ndarray, new_tokens: int, device: str):
    """Greedy decoding over a StaticCache: the prefill eager, then one token per step through the
    forward under torch.compile(mode="reduce-overhead", fullgraph=True). Returns the call."""
    import torch
    from transformers import StaticCache

    B, P = prompts.shape
    ids = torch.from_numpy(prompts).to(device)
    try:
        cache = StaticCache(config=hf.config, max_cache_len=P + new_tokens)
    except TypeError:  # transformers before the lazily sized cache
        cache = StaticCache(config=hf.config, max_batch_size=B, max_cache_len=P + new_tokens, device=device,
                            dtype=hf.dtype)
    step = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
    # the cache's keyword: `cache` in transformers that renamed past_key_values
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"

    def run():
        cache.reset()
        with torch.no_grad():
            logits = hf(input_ids=ids, cache_position=torch.arange(P, device=device), use_cache=True,
                        **{key: cache}).logits
            tok = logits[:, -1].argmax(-1, keepdim=True)
            out = [tok]
            for i in range(new_tokens - 1):
                pos = torch.tensor([P + i], device=device)
                logits = step(input_ids=tok, cache_position=pos, use_cache=True, **{key: cache}).logits
                tok = logits[:, -1].argmax(-1, keepdim=True).clone()  # out of the graph's output buffer
                out.append(tok)
        return np.concatenate([prompts, torch.cat(out, 1).cpu().numpy()], axis=1)  # sync point
    return run


def timed(fn, device: str) -> tuple[float, np.ndarray]:
    common.xt_sync(device)
    t0 = time.perf_counter()
    out = fn()
    common.xt_sync(device)
    return time.perf_counter() - t0, out


def decode_gaps(intervals) -> dict:
    """The GPU's idle in the second half of a generate() call's window, by then only replayed
    decode steps (the prefill, the warm-up step and the capture come first): the idle share of
    that half, and its gaps (count, median, 90th percentile, the largest with the activities
    around them; profile_step.timeline). intervals: (start_us, end_us, name)."""
    from profile_step import timeline

    iv = sorted(intervals)
    if not iv:
        return {}
    mid = (iv[0][0] + iv[-1][1]) / 2
    tail = [x for x in iv if x[0] >= mid]
    if len(tail) < 2:
        return {}
    tl = timeline(tail, 1, 0, top=5)
    window_ms = tl["window_ms"]
    return {"tail_window_ms": window_ms, "tail_idle_share": tl["idle_ms_per_step"] / window_ms if window_ms else 0.0,
            "gaps": int(tl["gaps_per_step"]), "gap_us_median": tl["gap_us_median"], "gap_us_p90": tl["gap_us_p90"],
            "largest_gaps": tl["largest_gaps"]}


def profile_cached(generate, steps: int) -> dict:
    """GPU kernel time of one cached generate() call per decode step, the top kernels (the
    profiler sees the kernels of replayed graphs as well) and the idle between them
    (decode_gaps)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        generate()
    per_name = defaultdict(lambda: [0, 0.0])
    intervals = []
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per_name[e.name][0] += 1
            per_name[e.name][1] += e.device_time / 1e3
            intervals.append((e.time_range.start, e.time_range.end, e.name))
    total = sum(ms for _, ms in per_name.values())
    top = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:12]
    return {"gpu_ms_per_step": total / steps, "kernels_per_step": sum(n for n, _ in per_name.values()) / steps,
            "top": [{"kernel": k[:90], "calls_per_step": n / steps, "ms_per_step": ms / steps} for k, (n, ms) in top],
            "idle": decode_gaps(intervals)}


def main(argv=None) -> None:
    args = parse_args(argv)
    import xtrain
    from xtrain.models import TinyTransformer, config_for
    from xtrain.models import generate as gen

    device, tdevice = common.resolve_device(args.device)
    bf16 = common.is_cuda(device) if args.bf16 is None else args.bf16
    config = config_for(args.preset, args.vocab, bf16=bf16)
    if args.prompt_len + args.new_tokens > config.max_seq:
        raise SystemExit(f"--prompt-len + --new-tokens must be <= max_seq {config.max_seq}")
    model = TinyTransformer(config, device=device, seed=args.seed)
    model.eval()
    hf = hf_model(model, tdevice, bf16) if args.peers else None
    rng = np.random.default_rng(args.seed)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{args.preset} ({'bf16' if bf16 else 'fp32'}) on {device}: prompts of {args.prompt_len} tokens, "
          f"{args.new_tokens} new tokens per row, vocab {args.vocab}")

    # What one decode step must read at least: every weight the step multiplies by (the blocks',
    # the final norm's and the head's, whose matrix is the embedding when tied; an untied
    # embedding only gives its B rows), in the run's dtype. At batch 1 a step reads them once
    # whatever the generator, so bytes / step time, the weights' bandwidth, bounds any generator
    # by the GPU's memory bandwidth (the KV cache's reads come on top).
    shapes = config.param_shapes()
    if not config.tie_embeddings:
        shapes.pop("embed_tokens.weight")
    weight_bytes = sum(int(np.prod(s)) for s in shapes.values()) * (2 if bf16 else 4)
    print(f"weights read per decode step: {weight_bytes / 1e9:.3f} GB")

    rows = []
    date = common.stamp()  # one file, rewritten after each batch: a run cut short keeps its finished rows

    def payload() -> dict:
        return {"benchmark": "generate", "env": common.env_info(device),
                "config": {**config.to_dict(), "preset": args.preset},
                "weight_bytes_per_step": weight_bytes, "prompt_len": args.prompt_len,
                "new_tokens": args.new_tokens, "results": rows,
                "gate": "speedup >= 10 at 256 new tokens for dim768 (issue 17)",
                "peers": args.peers, "transformers": _version("transformers"),
                "complete": len(rows) == len(batches)}

    for B in batches:
        prompts = rng.integers(0, args.vocab, size=(B, args.prompt_len), dtype=np.int64)
        row = {"batch": B}
        model.generate(prompts, 4, greedy=True)  # warm-up: kernels, cuBLAS handles, allocator
        common.xt_reset_peak(device)
        gen.release_decode(model)
        t, _ = timed(lambda: model.generate(prompts, args.new_tokens, greedy=True), device)  # captures
        row.update(first_s=t, first_tok_s=B * args.new_tokens / t)
        t, cached = timed(lambda: model.generate(prompts, args.new_tokens, greedy=True), device)  # replays
        row.update(cached_s=t, cached_tok_s=B * args.new_tokens / t,
                   cached_step_ms=1e3 * t / args.new_tokens, cached_peak_gib=common.gib(
                       common.xt_peak(device)["allocated_peak"]))
        made = []

        class Spy(gen.DecodeGraph):
            def __init__(self, *a):
                super().__init__(*a)
                made.append(self)

        gen.DecodeGraph = Spy
        gen.release_decode(model)
        model.generate(prompts, 4, greedy=True)
        gen.DecodeGraph = Spy.__bases__[0]
        row["graph_nodes"] = made[-1].num_nodes if made else 0
        if args.profile and common.is_cuda(device):
            row["profile"] = profile_cached(lambda: model.generate(prompts, args.new_tokens, greedy=True),
                                            args.new_tokens)
            print(f"batch {B}: {row['profile']['gpu_ms_per_step']:.3f} GPU ms per step, "
                  f"{row['profile']['kernels_per_step']:.0f} kernels per step, graph nodes {row['graph_nodes']}")
            for k in row["profile"]["top"]:
                print(f"  {k['ms_per_step']:.4f} ms {k['calls_per_step']:5.1f}x  {k['kernel']}")
            idle = row["profile"]["idle"]
            if idle:
                big = ", ".join(f"{g['us']:.1f} us before {g['before'][:40]}" for g in idle["largest_gaps"][:3])
                print(f"  replayed steps (the call's second half): GPU idle {100 * idle['tail_idle_share']:.1f}%, "
                      f"{idle['gaps']} gaps (median {idle['gap_us_median']:.2f} us, p90 {idle['gap_us_p90']:.2f} us); "
                      f"largest: {big}")
        model.generate(prompts, 4, greedy=True, cuda_graphs=False)
        t, eager = timed(lambda: model.generate(prompts, args.new_tokens, greedy=True, cuda_graphs=False), device)
        row.update(eager_s=t, eager_tok_s=B * args.new_tokens / t, eager_step_ms=1e3 * t / args.new_tokens,
                   graph_gain=t / row["cached_s"], graph_same=float(np.array_equal(eager, cached)))
        t, _ = timed(lambda: model.generate(prompts, args.new_tokens, temperature=0.8, top_k=50, top_p=0.95,
                                            seed=args.seed), device)
        row.update(sampled_s=t, sampled_tok_s=B * args.new_tokens / t)
        if not args.no_rerun:
            rerun_generate(model, prompts, 2)
            t, rerun = timed(lambda: rerun_generate(model, prompts, args.new_tokens), device)
            row.update(rerun_s=t, rerun_tok_s=B * args.new_tokens / t, speedup=t / row["cached_s"],
                       first_speedup=t / row["first_s"], eager_speedup=t / row["eager_s"],
                       same_tokens=float(np.mean([np.array_equal(a, b) for a, b in zip(cached, rerun)])))
        peer_tok_s = {}
        for name in args.peers:
            try:
                make = hf_static_generate if name == "hf_static" else compiled_static_decode
                run = make(hf, prompts, args.new_tokens, tdevice)
                run()  # compiles (hf_static on CUDA, compiled): not timed
                t, toks = timed(run, device)
                peer_tok_s[name] = B * args.new_tokens / t
                row.update({f"{name}_s": t, f"{name}_tok_s": peer_tok_s[name],
                            f"{name}_same_tokens": float(np.mean([np.array_equal(a, b) for a, b in zip(cached, toks)]))})
            except Exception as e:  # a transformers version without the API: the other peer still runs
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"batch {B}: {name} failed: {row[f'{name}_error']}", flush=True)
        for name, tok_s in [("cached", row["cached_tok_s"]), *peer_tok_s.items()]:
            row[f"{name}_weight_tb_s"] = weight_bytes * tok_s / B / 1e12  # steps/s x bytes a step
        if peer_tok_s:
            fastest = max(peer_tok_s, key=peer_tok_s.get)
            row.update(vs_peer=row["cached_tok_s"] / peer_tok_s[fastest], fastest_peer=fastest,
                       peer_same_tokens=row[f"{fastest}_same_tokens"])
        rows.append(row)
        common.write_json(common.result_name(f"generate-{args.preset}", args.tag), payload(), args.out, date=date,
                          quiet=len(rows) < len(batches))
        print(f"batch {B}: cached {row['cached_tok_s']:,.0f} tok/s (first call {row['first_tok_s']:,.0f}), "
              f"eager {row['eager_tok_s']:,.0f} tok/s"
              + (f", rerun {row['rerun_tok_s']:,.0f} tok/s, speedup {row['speedup']:.1f}x "
                 f"(first call {row['first_speedup']:.1f}x)" if "speedup" in row else "")
              + (f"; {row['fastest_peer']} {row[row['fastest_peer'] + '_tok_s']:,.0f} tok/s, xtrain "
                 f"{row['vs_peer']:.2f}x" if "vs_peer" in row else "")
              + f"; weights read at {row['cached_weight_tb_s']:.2f} TB/s"
              + "".join(f", {n} {row[n + '_weight_tb_s']:.2f}" for n in peer_tok_s), flush=True)

    common.print_table(rows, [("batch", "batch", "d"), ("cached_tok_s", "cached tok/s", ",.0f"),
                              ("cached_step_ms", "ms/step", ".2f"), ("first_tok_s", "first tok/s", ",.0f"), ("eager_tok_s", "eager tok/s", ",.0f"),
                              ("eager_step_ms", "eager ms/step", ".2f"), ("graph_gain", "graph gain", ".2f"),
                              ("graph_same", "graph same", ".2f"), ("sampled_tok_s", "sampled tok/s", ",.0f"),
                              ("rerun_tok_s", "rerun tok/s", ",.0f"), ("speedup", "speedup", ".1f"),
                              ("first_speedup", "first speedup", ".1f"),
                              ("eager_speedup", "eager speedup", ".1f"),
                              ("same_tokens", "same tokens", ".2f"), ("cached_peak_gib", "peak GiB", ".2f"),
                              ("cached_weight_tb_s", "weights TB/s", ".2f"),
                              ("hf_static_tok_s", "hf static tok/s", ",.0f"),
                              ("compiled_tok_s", "compiled tok/s", ",.0f"), ("vs_peer", "vs peer", ".2f"),
                              ("peer_same_tokens", "peer same", ".2f")])



def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
