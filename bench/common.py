"""Shared helpers of the benchmarks: FLOP counting and MFU, devices and synchronisation, timing,
peak-memory readings, the run's provenance, and writing results.

Rules every benchmark follows (docs/performance.md, "How it is measured"):
- xtrain and PyTorch run the same config on the same GPU in the same process, one after the
  other, each freeing its memory before the other starts (free_xtrain / free_torch).
- Timing: warm-up calls first, then an explicit synchronize, the timed calls, and a synchronize
  again before the clock is read. Inputs are seeded random data, never zeros.
- Peak memory is read from each framework's own allocator (xtrain.memory_stats,
  torch.cuda.max_memory_allocated), with the peak reset right before the timed calls.
- MFU is model FLOPs (flops_per_token) per second over a measured ceiling of the GPU
  (docs/performance.md, "Ceilings"), not a datasheet number.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
TESTS_DIR = REPO / "tests"

# The H200's bf16 ceiling, measured: an 8192^3 bf16 matmul through PyTorch, random data
# (docs/performance.md, "Ceilings"). MFU in bf16 uses this.
BF16_PEAK_FLOPS = 790e12
# The H200's measured device-to-device copy, bytes read + written. Bandwidth-bound kernels are
# compared to it.
COPY_BANDWIDTH = 4.3e12
# The float32 ceiling is measured in each run (measure_matmul_ceiling, true fp32: no TF32); ops.py
# reports it too. The H200's datasheet says ~67 TFLOP/s FP32.
FP32_CEILING_SIZE = 8192

# Vocabulary of the built-in corpus (xtrain.data.stories.DEFAULT_VOCAB_SIZE): the throughput
# benchmarks use it on random tokens so they need no prepared dataset.
DEFAULT_VOCAB = 4096


# ---- FLOPs

def flops_per_token(config, seq: int) -> dict:
    """Training FLOPs per token of TinyTransformer, counted explicitly.

    dense:     6 * N, N = weights that take part in a GEMM (q, k, v, o, gate, up, down of every
               block, and lm_head; the embedding is a lookup, norms are not GEMMs). 2 FLOPs per
               weight forward, 4 backward (input and weight gradients).
    attention: per block forward, scores Q K^T and P V are 2 * S * inner FLOPs each per token
               (inner = n_heads * head_dim), so 4 * S * inner forward, x3 with backward:
               12 * L * S * inner. The causal mask is counted in full (nanoGPT / PaLM convention),
               recompute is not counted (model FLOPs, not hardware FLOPs).
    """
    inner = config.n_heads * config.head_dim
    per_block = 4 * config.dim * inner + 3 * config.dim * config.ffn_dim
    n_matmul = config.n_layers * per_block + config.dim * config.vocab_size
    dense = 6.0 * n_matmul
    attention = 12.0 * config.n_layers * seq * inner
    total = dense + attention
    out = {"matmul_params": n_matmul, "dense": dense, "attention": attention, "total": total}
    # The model states the same formula; two spellings that disagree are a bug in one of them
    # (reported, not fatal: a GPU run is too dear to lose over it).
    if hasattr(config, "flops_per_token"):
        out["model_formula"] = config.flops_per_token(seq)
        if not math.isclose(out["model_formula"], total, rel_tol=1e-9):
            print(f"WARNING: TransformerConfig.flops_per_token gives {out['model_formula']:.6g}, "
                  f"bench/common.py counts {total:.6g} FLOPs per token", flush=True)
    return out


def mfu(tokens_per_s: float, flops_tok: float, peak_flops: float) -> float:
    return tokens_per_s * flops_tok / peak_flops


# ---- devices and synchronisation

def add_common_args(p: argparse.ArgumentParser, steps: int = 20, warmup: int = 5) -> None:
    p.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto (cuda if present)")
    p.add_argument("--steps", type=int, default=steps, help="timed steps / calls")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed steps / calls first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS_DIR), help="directory for the JSON (and PNG)")
    p.add_argument("--tag", default="", help="suffix of the result name (to tell runs apart)")


def add_shape_args(p: argparse.ArgumentParser, batch: int = 32, seq: int = 256, preset: str | None = "dim768") -> None:
    """--preset (unless None: the script names its own), --batch, --seq and --bf16 (default) /
    --fp32, as every training benchmark spells them."""
    if preset is not None:
        p.add_argument("--preset", default=preset)
    p.add_argument("--batch", type=int, default=batch)
    p.add_argument("--seq", type=int, default=seq)
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--bf16", dest="bf16", action="store_true", default=True,
                      help="mixed precision bf16 (default)")
    prec.add_argument("--fp32", dest="bf16", action="store_false", help="float32 throughout")


def resolve_device(device: str) -> tuple[str, str]:
    """(xtrain device, torch device) for --device."""
    import xtrain

    if device == "auto":
        device = "cuda" if xtrain.cuda.is_available() else "cpu"
    if device == "cuda":
        device = "cuda:0"
    if device.startswith("cuda") and not xtrain.cuda.is_available():
        raise SystemExit(f"--device {device}: this xtrain has no usable CUDA "
                         f"(built with CUDA: {xtrain.cuda.is_built()})")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"--device {device}: torch sees no GPU")
        torch.cuda.set_device(device)
        xtrain.cuda.set_device(int(device.split(":")[1]))
    return device, device


def is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def xt_sync(device: str) -> None:
    import xtrain

    if is_cuda(device):
        xtrain.cuda.synchronize(device)  # sync point: the timer reads the clock after this


def torch_sync(device: str) -> None:
    import torch

    if is_cuda(device):
        torch.cuda.synchronize(device)  # sync point: the timer reads the clock after this


def setup_torch(device: str) -> None:
    """True float32 matmuls (no TF32: xtrain's float32 GEMMs are true fp32 too), and the tests dir
    on sys.path so `import torch_reference` finds helper D's reference model."""
    import torch
    import xtrain

    if hasattr(xtrain.cuda, "set_allow_tf32"):
        xtrain.cuda.set_allow_tf32(False)  # the default; said here so a changed default shows
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))


# ---- memory

def xt_reset_peak(device: str) -> None:
    import xtrain

    xtrain.reset_peak_memory_stats(device)


def xt_peak(device: str) -> dict:
    import xtrain

    s = xtrain.memory_stats(device)
    return {"allocated_peak": s["allocated_bytes.peak"], "reserved_peak": s["reserved_bytes.peak"],
            "num_raw_alloc": s["num_raw_alloc"]}


def torch_reset_peak(device: str) -> None:
    import torch

    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def torch_peak(device: str) -> dict:
    """torch tracks no CPU allocations: None there."""
    import torch

    if not is_cuda(device):
        return {"allocated_peak": None, "reserved_peak": None}
    return {"allocated_peak": torch.cuda.max_memory_allocated(device),
            "reserved_peak": torch.cuda.max_memory_reserved(device)}


def free_xtrain(device: str) -> None:
    """Drop xtrain's cached blocks (the caller has deleted its tensors) so torch gets the card."""
    import xtrain

    gc.collect()
    xt_sync(device)
    xtrain.empty_cache(device)


def free_torch(device: str) -> None:
    import torch

    gc.collect()
    if is_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def gib(nbytes) -> float | None:
    return None if nbytes is None else nbytes / 2**30


def fmt_gib(nbytes) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def parse_bytes(text: str) -> int:
    """'32GiB', '32GB', '512MiB', '1000000' -> bytes (GB/MB are read as GiB/MiB, like nvidia-smi)."""
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in (("gib", 2**30), ("gb", 2**30), ("g", 2**30), ("mib", 2**20), ("mb", 2**20),
                         ("m", 2**20), ("kib", 2**10), ("kb", 2**10), ("b", 1)):
        if t.endswith(suffix):
            return int(float(t[:-len(suffix)]) * mult)
    return int(t)


# ---- timing

def xtrain_step(model, opt, data: list, blocked, record, warmup: int):
    """train.py's training step over `data` ((x, y) device batches, taken in turn, clipping at 1.0):
    captured as CUDA graphs after graphs.WARMUP_STEPS eager steps and replayed (the batch copied
    into the graph's static inputs first), unless `blocked` says why not; record(loss) receives
    each step's loss tensor. Returns (step, the StepGraphs, the warm-up steps the timing needs:
    `warmup`, raised with graphs to reach the capture and a replay)."""
    from xtrain import graphs

    sg = graphs.StepGraphs(model, opt, 1, 1.0, blocked=blocked, note=lambda m: print(m, flush=True))
    position = [0]

    def step():
        x, y = data[position[0] % len(data)]
        position[0] += 1
        out = sg.step(x, y)
        if out is None:
            loss = graphs.forward_backward(model, x, y, 1)
            opt.clip_and_step(1.0, loss)
            opt.zero_grad(set_to_none=True)
            sg.eager()
        else:
            loss = out[0]
        record(loss)

    return step, sg, max(warmup, graphs.WARMUP_STEPS + 1) if sg.disabled is None else warmup


def time_loop(step, sync, steps: int, warmup: int) -> float:
    """Seconds for `steps` calls of step() after `warmup` untimed ones, synchronised at both ends
    (one window: per-step syncs would add bubbles the training loop does not have)."""
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return time.perf_counter() - t0


def time_windows(step, sync, steps: int, windows: int) -> tuple[float, list[float]]:
    """time_loop in `windows` back-to-back windows of `steps` steps: (the fastest window's
    seconds, every window's). A window slowed by something outside the framework (host load,
    another process) shows as an outlier instead of moving the result."""
    secs = [time_loop(step, sync, steps, warmup=0) for _ in range(max(1, windows))]
    return min(secs), secs


def host_load() -> dict:
    """The host's 1/5/15-minute load averages and its core count (None where unknown)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"loadavg": load, "cores": os.cpu_count()}


def time_call(fn, sync, warmup: int = 3, repeats: int = 5, target_s: float = 0.05,
              max_iters: int = 200) -> dict:
    """Per-call time of fn(): warm-up, then `repeats` windows of n calls (n chosen so a window
    lasts about target_s), each synchronised at both ends. Reports median and min per call."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    n = int(min(max_iters, max(1, target_s / one)))
    per_call = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        per_call.append((time.perf_counter() - t0) / n)
    return {"ms": 1e3 * float(np.median(per_call)), "ms_min": 1e3 * min(per_call), "iters": n,
            "repeats": repeats}


# ---- data

def random_batches(vocab: int, batch: int, seq: int, n: int, seed: int) -> list:
    """n (inputs, targets) pairs of uniform random token ids, int64 (batch, seq), seeded."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, size=(batch, seq), dtype=np.int64),
             rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)) for _ in range(n)]


# ---- provenance and results

def git_commit() -> dict:
    """The commit measured: $XTRAIN_COMMIT when set (a copied tree whose .git may be stale, as on
    the GPU machine), else git's HEAD and whether tracked files differ from it."""
    if os.environ.get("XTRAIN_COMMIT"):
        return {"commit": os.environ["XTRAIN_COMMIT"], "dirty": None}

    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=20).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD") or None
        dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit or os.environ.get("XTRAIN_COMMIT"), "dirty": dirty}


_ENV_PREFIXES = ("XT_", "XTRAIN_", "NCCL_", "TORCHINDUCTOR_", "CUBLAS_", "CUDA_")


def env_info(device: str) -> dict:
    import xtrain

    info = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "host_cpu": _cpu_model(), "python": platform.python_version(),
            "xtrain": xtrain.__version__, "device": device, **git_commit(), **host_load()}
    # settings that change what ran (knobs of a tuning call, NCCL, Inductor's cache), as set
    settings = {k: v for k, v in sorted(os.environ.items())
                if k.startswith(_ENV_PREFIXES) and k != "XTRAIN_COMMIT"}
    if settings:
        info["env_vars"] = settings
    try:
        import torch

        info["torch"] = torch.__version__
        if is_cuda(device):
            info["torch_gpu"] = torch.cuda.get_device_name(device)
    except ImportError:
        info["torch"] = None
    if is_cuda(device):
        idx = int(device.split(":")[1]) if ":" in device else 0  # "cuda" is device 0, as resolve_device has it
        info["gpu"] = xtrain.cuda.device_name(idx)
        info["cuda_runtime"] = xtrain.cuda.runtime_info()
        if hasattr(xtrain.cuda, "allow_tf32"):  # float32 results mean true fp32 only when off
            info["xtrain_allow_tf32"] = xtrain.cuda.allow_tf32()
    else:
        info["gpu"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info


def _cpu_model() -> str | None:
    """The host CPU's model name (Linux /proc/cpuinfo), else platform's guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def result_name(base: str, tag: str = "") -> str:
    return f"{base}-{tag}" if tag else base


def stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def write_json(name: str, payload: dict, out_dir: str | os.PathLike = RESULTS_DIR, date: str | None = None,
               quiet: bool = False) -> Path:
    """bench/results/NAME-DATE.json (DATE is UTC to the second, so runs never overwrite; a script that
    rewrites its file as rows arrive passes the DATE it took at its start)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{date or stamp()}.json"
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    if not quiet:
        print(f"wrote {path}")
    return path


def _json_default(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return str(v)  # Paths, version objects: a result file must never fail to be written


# ---- printing

def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """columns: (key, header, format spec); None prints as '-'."""
    def cell(row, key, fmt):
        v = row.get(key)
        if v is None:
            return "-"
        return format(v, fmt) if fmt else str(v)
    cells = [[h for _, h, _ in columns]] + [[cell(r, k, f) for k, _, f in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    for j, line in enumerate(cells):
        padded = (c.rjust(w) if i else c.ljust(w)
                  for i, (c, w) in enumerate(zip(line, widths, strict=True)))
        print("  ".join(padded))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b
