"""GPT-2 training throughput of xtrain against its peers on their own ground, in one call: llm.c's
train_gpt2cu built from source (plain, and with cuDNN attention), nanoGPT's model.py under
whole-model torch.compile, and xtrain's GPT-2 presets, on the same synthetic shards in llm.c's
format, at seq 1024 and the same micro-batches, no gradient accumulation.

    python bench/gpt2_peers.py --llmc SRC/llm.c --nanogpt SRC/nanoGPT --cudnn-frontend SRC/cudnn-frontend \\
        [--batches 32 64] [--depths 12 24 36] [--only xtrain llmc llmc-cudnn nanogpt] [--steps 20]
    python bench/gpt2_peers.py ... --build-only      # the two llm.c builds alone (a few minutes), kept in --work
    python bench/gpt2_peers.py --smoke --nanogpt SRC/nanoGPT --only xtrain nanogpt   # CPU: the code paths

At d12 with the builds in --work, the default call (xtrain recompute off/on, llm.c plain and
cuDNN at -r 0/1, nanoGPT, micro-batch 32 and 64) takes about 6-7 minutes on the H200, most of it
nanoGPT's two compiles.

What runs (each configuration in a process of its own, so every peer starts on a clean GPU and
its peak device memory is that process's, read from nvidia-smi every 0.1 s):
- data: WORK/data/gpt2peers_{train,val}_000000.bin, uniform random GPT-2 ids (vocabulary 50257)
  in llm.c's shard format (a 256-int32 header: 20240520, version 1, the token count; then
  uint16 tokens). Every framework reads the train shard's consecutive (B, T + 1) windows.
- llm.c: the carried checkout is copied to WORK/llmc and compiled with nvcc as its Makefile does
  (-O3 --use_fast_math, sm_90, bf16, no MPI/NCCL), twice: plain, and with -DENABLE_CUDNN (its
  llmc/cudnn_att.cpp against CUDNN_FRONTEND's headers and the cuDNN of the nvidia-cudnn-cu13 wheel,
  the versioned libcudnn.so.9 linked by path, and -lnvrtc). CUDA 13 takes a cudaMemLocation where
  12 took a device id in cudaMemAdvise: llmc/cuda_utils.cuh is patched (sed, in the copy) when nvcc
  is 13 or newer; a build already in WORK is used again (--rebuild). Run: `-e dD` (a fresh GPT-2 of
  depth D), -b B -t 1024 -d B*1024, -r 0 and 1 (its recompute of GELU, its default; 2 adds
  LayerNorm: --llmc-recompute 0 1 2), -x STEPS, validation only at the first and last
  step (-v > STEPS, -m 1), no sampling, no HellaSwag, no checkpoints. ms/step: the median of the
  step times it prints (cudaEvent around the step), its first step left out.
- nanoGPT: model.py imported from the carried checkout (not copied), GPTConfig(vocab 50304, bias,
  dropout 0), configure_optimizers' fused AdamW (weight decay 0.1, betas 0.9/0.95), the whole
  model under torch.compile, bf16 autocast, TF32 on (its train.py's settings), the flash SDPA
  backend forced, clip 1.0.
- xtrain: GPT2 of the preset gpt2-124m/350m/774m (depth 12/24/36), bf16, AdamW (same
  hyper-parameters), clip 1.0, the step as replayed CUDA graphs (xtrain.graphs, as `xtrain train`
  runs it), recompute off and on.
- The in-process rows (xtrain, nanoGPT) cycle 8 batches already on the device and time each step
  between device syncs (as llm.c times its steps); ms/step is the median over --steps steps after
  --warmup. MFU: GPT2Config.flops_per_token(1024) (6N + attention, the real vocabulary) against
  the H200's 790 TFLOP/s bf16, the same count for every framework (llm.c's own MFU, from its
  formula and peak, is kept beside it).

Written to OUT/gpt2_peers-DATE.json (--out; default bench/results): every row (framework, build,
depth, batch, recompute, ms/step, tok/s, MFU, peak device memory by nvidia-smi and, in-process,
by the framework's allocator, first and last loss, or the error), the builds' logs' tails, and
per (depth, batch) the ratios of xtrain's best row to each peer's best row, in tok/s and memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

SEQ = 1024
VOCAB = 50257
DEPTH_PRESETS = {12: "gpt2-124m", 24: "gpt2-350m", 36: "gpt2-774m", 48: "gpt2-1.5b"}
FRAMEWORKS = ("xtrain", "llmc", "llmc-cudnn", "nanogpt")
LLMC_MAGIC, LLMC_VERSION, HEADER_INTS = 20240520, 1, 256
LR, BETAS, WEIGHT_DECAY = 6e-4, (0.9, 0.95), 0.1
IN_PROCESS_BATCHES = 8
# llm.c's recompute levels: 0 none, 1 GELU, 2 GELU and LayerNorm.
LLMC_RECOMPUTE = (0, 1, 2)
RESULT_PREFIX = "GPT2PEERS "
SMI_PERIOD_S = 0.1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llmc", type=Path, help="llm.c checkout (its train_gpt2.cu, llmc/)")
    p.add_argument("--nanogpt", type=Path, help="nanoGPT checkout (its model.py)")
    p.add_argument("--cudnn-frontend", type=Path, help="cudnn-frontend checkout (its include/)")
    p.add_argument("--work", type=Path, default=Path("/tmp/gpt2-peers"), help="builds and shards")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    p.add_argument("--depths", type=int, nargs="+", default=[12], choices=sorted(DEPTH_PRESETS))
    p.add_argument("--only", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    p.add_argument("--xtrain-recompute", type=int, nargs="+", default=[0, 1], choices=(0, 1))
    p.add_argument("--llmc-recompute", type=int, nargs="+", default=[0, 1], choices=LLMC_RECOMPUTE,
                   help="llm.c's -r levels (its default is 1)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (in-process rows)")
    p.add_argument("--timeout", type=int, default=420, help="seconds per configuration")
    p.add_argument("--build-only", action="store_true", help="build llm.c and write the shards, run nothing")
    p.add_argument("--rebuild", action="store_true", help="build llm.c again even where WORK holds a build")
    p.add_argument("--smoke", action="store_true",
                   help="CPU check of the code paths: a 2-layer, 64-wide GPT-2 at seq 64, 2 steps, no compile")
    p.add_argument("--out", default=str(common.RESULTS_DIR))
    p.add_argument("--tag", default="")
    # one configuration in this process (the driver starts these)
    p.add_argument("--worker", choices=("xtrain", "nanogpt"), help=argparse.SUPPRESS)
    p.add_argument("--depth", type=int, default=12, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    p.add_argument("--recompute", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--train-shard", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- data: llm.c's shard format

def write_shards(data_dir: Path, n_train: int, n_val: int, seed: int = 0) -> dict:
    """Random GPT-2 ids as llm.c shards; kept when already there with these sizes."""
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = {}
    for split, n in (("train", n_train), ("val", n_val)):
        path = data_dir / f"gpt2peers_{split}_000000.bin"
        if not (path.exists() and path.stat().st_size == HEADER_INTS * 4 + 2 * n):
            header = np.zeros(HEADER_INTS, dtype="<i4")
            header[:3] = [LLMC_MAGIC, LLMC_VERSION, n]
            tokens = rng.integers(0, VOCAB, n, dtype=np.int64).astype("<u2")
            path.write_bytes(header.tobytes() + tokens.tobytes())
        paths[split] = path
    return paths


def read_windows(path: Path, batch: int, seq: int, n: int) -> list:
    """n consecutive (ids, targets) pairs, int64 (batch, seq), from an llm.c shard."""
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    assert header[0] == LLMC_MAGIC and header[1] == LLMC_VERSION, f"{path}: not an llm.c shard"
    tokens = np.fromfile(path, dtype="<u2", offset=HEADER_INTS * 4).astype(np.int64)
    out = []
    for i in range(n):
        w = tokens[i * batch * seq: (i + 1) * batch * seq + 1]
        out.append((w[:-1].reshape(batch, seq), w[1:].reshape(batch, seq)))
    return out


# ---- llm.c builds

def _run_cmd(cmd, cwd=None, env=None, timeout=900) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def nvcc_major() -> int:
    rc, out = _run_cmd(["nvcc", "--version"])
    m = re.search(r"release (\d+)\.", out)
    return int(m.group(1)) if rc == 0 and m else 0


def toolkit_root() -> Path | None:
    """The CUDA toolkit nvcc belongs to (nvcc may be a wrapper script: its dry run names the real one)."""
    rc, out = _run_cmd(["nvcc", "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
    m = re.search(r"#\$ TOP=(\S+)", out)
    if m:
        return Path(m.group(1)).resolve()
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parents[1] if nvcc else None


def cuda_roots() -> list[Path]:
    """Where CUDA's headers and libraries may be: the toolkit, then every nvidia-* wheel (PyTorch's
    environment: nvidia/cu13, nvidia/cudnn, ...), each with include/ and lib/."""
    roots = [r for r in [toolkit_root()] if r is not None]
    try:
        import nvidia
        for base in nvidia.__path__:
            roots += sorted(p for p in Path(base).iterdir() if p.is_dir())
    except ImportError:
        pass
    return roots


def find_lib(name: str, roots: list[Path]) -> Path | None:
    """lib{name}.so, else the newest lib{name}.so.N (the wheels ship only versioned names)."""
    for root in roots:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "lib64/stubs", "lib/stubs"):
            d = root / sub
            if (d / f"lib{name}.so").exists():
                return d / f"lib{name}.so"
            versioned = sorted(d.glob(f"lib{name}.so.*"))
            if versioned:
                return versioned[-1]
    return None


def llmc_commands(src: Path, cudnn: bool, frontend: Path | None, patch_memadvise: bool) -> dict:
    """The commands that build one train_gpt2cu in src (a copy of the checkout), as its Makefile
    would on an H200: the patch, the cuDNN object when asked, the link (libraries by path where only
    versioned names exist). Returns {"patch", "steps" (argv lists), "env" (LD_LIBRARY_PATH), "binary"}."""
    roots = cuda_roots()
    toolkit = roots[0] if roots else None
    includes = ["-I" + str(r / "include") for r in roots[1:] if (r / "include").is_dir()]
    flags = ["--threads=0", "-t=0", "--use_fast_math", "-std=c++17", "-O3",
             "--generate-code", "arch=compute_90,code=[compute_90,sm_90]", "-DENABLE_BF16", *includes]
    libs = ["cublas", "cublasLt"]
    # llmc/mfu.h uses NVML when nvml.h is on the include path (the driver's library, or the toolkit's stub)
    if any((r / "include" / "nvml.h").exists() for r in roots):
        libs.append("nvidia-ml")
    patch = None
    if patch_memadvise:  # CUDA 13: cudaMemAdvise takes a cudaMemLocation, not a device id
        patch = ["sed", "-i", "s/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/"
                 "cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/",
                 str(src / "llmc" / "cuda_utils.cuh")]
    steps = []
    out = "train_gpt2cu_cudnn" if cudnn else "train_gpt2cu"
    inputs = ["train_gpt2.cu"]
    if cudnn:
        if frontend is None or not (frontend / "include").is_dir():
            raise RuntimeError(f"the cuDNN build needs --cudnn-frontend (a checkout with include/), got {frontend}")
        if not any((r / "include" / "cudnn.h").exists() for r in roots):
            raise RuntimeError("the cuDNN build needs cuDNN's headers: pip's nvidia-cudnn-cu13 (PyTorch's) was not found")
        flags = [*flags, "-DENABLE_CUDNN", "-I" + str(frontend / "include")]
        steps.append(["nvcc", "-c", *flags, "llmc/cudnn_att.cpp", "-o", "cudnn_att.o"])
        inputs.append("cudnn_att.o")
        libs += ["cudnn", "nvrtc"]
    link, lib_dirs = [], []
    for name in libs:
        found = find_lib(name, roots + [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64")])
        if found is None:
            link.append(f"-l{name}")
            continue
        link += ["-Xlinker", str(found)]  # by path: nvcc takes no versioned .so.N as an input file
        if "stubs" not in found.parts and str(found.parent) not in lib_dirs and found.parent != toolkit:
            lib_dirs.append(str(found.parent))
    steps.append(["nvcc", *flags, *inputs, *link, "-o", out])
    env = {"LD_LIBRARY_PATH": os.pathsep.join(lib_dirs + [os.environ.get("LD_LIBRARY_PATH", "")])}
    return {"patch": patch, "steps": steps, "env": env, "binary": src / out}


def build_llmc(args, cudnn: bool) -> dict:
    """Copy the checkout to WORK/llmc[-cudnn], patch and build; {"binary", "env", "log", "ok"}. A
    binary an earlier call built there is used again (--rebuild: build afresh)."""
    name = "llmc-cudnn" if cudnn else "llmc"
    src = args.work / name
    try:
        plan = llmc_commands(src, cudnn, args.cudnn_frontend, nvcc_major() >= 13)
    except RuntimeError as e:
        return {"ok": False, "log": str(e)}
    if plan["binary"].exists() and not args.rebuild:
        return {"ok": True, "binary": plan["binary"], "env": plan["env"], "log": f"reused {plan['binary']}"}
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(args.llmc, src, ignore=shutil.ignore_patterns(".git"))
    log = []
    if plan["patch"]:
        rc, out = _run_cmd(plan["patch"])
        log.append(" ".join(plan["patch"]) + f"\n{out}")
    env = {**os.environ, **plan["env"]}
    for cmd in plan["steps"]:
        t0 = time.time()
        rc, out = _run_cmd(cmd, cwd=src, env=env)
        log.append(f"$ {' '.join(cmd)}  ({time.time() - t0:.0f} s, exit {rc})\n{out[-3000:]}")
        if rc != 0:
            return {"ok": False, "log": "\n".join(log)}
    return {"ok": True, "binary": plan["binary"], "env": plan["env"], "log": "\n".join(log)[-6000:]}


def build_all(args) -> dict:
    """The two llm.c builds at once (each nvcc takes a minute or more)."""
    wanted = [b for b in ("llmc", "llmc-cudnn") if b in args.only]
    builds = {}
    threads = [threading.Thread(target=lambda b=b: builds.__setitem__(b, build_llmc(args, b == "llmc-cudnn")))
               for b in wanted]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for b in wanted:
        print(f"build {b}: {'ok' if builds[b]['ok'] else 'FAILED'}", flush=True)
        if not builds[b]["ok"]:
            print(builds[b]["log"][-3000:], flush=True)
    return builds


# ---- device memory of a process, from nvidia-smi

class SmiPeak:
    """The largest used_memory (MiB) nvidia-smi reports for pid, polled in a thread."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, None, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                     timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                return
            for line in out.splitlines():
                parts = [s.strip() for s in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                    self.peak = max(self.peak or 0, int(parts[1]))
            self._stop.wait(SMI_PERIOD_S)

    def stop(self) -> int | None:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_process(cmd, env=None, timeout=600, cwd=None) -> tuple[int, str, int | None]:
    """(exit code, output, peak device MiB) of a process run to its end (or killed at timeout)."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    smi = SmiPeak(proc.pid) if shutil.which("nvidia-smi") else None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        out += f"\n(killed after {timeout} s)"
    return proc.returncode, out, smi.stop() if smi else None


# ---- rows

# llm.c prints an MFU of -100.0% for a GPU its table lacks (the H200 among them)
STEP_LINE = re.compile(r"step\s+(\d+)/\d+ \| loss ([\d.naif+-]+) .*?\| ([\d.]+) ms \| (-?[\d.]+)% bf16 MFU")


def parse_llmc(out: str) -> dict:
    steps = [(int(s), float(loss), float(ms), float(mfu)) for s, loss, ms, mfu in STEP_LINE.findall(out)]
    if len(steps) < 2:
        return {"error": "no step lines in llm.c's output", "tail": out[-2000:]}
    timed = steps[1:]  # its first step includes cuBLAS/cuDNN initialisation
    mem = re.findall(r"device memory usage: (\d+) MiB", out)
    llmc_mfu = statistics.median(m for *_, m in timed) / 100
    return {"ms_step": statistics.median(ms for _, _, ms, _ in timed), "llmc_mfu": llmc_mfu if llmc_mfu >= 0 else None,
            "loss_first": steps[0][1], "loss_last": steps[-1][1], "steps_timed": len(timed),
            "llmc_reported_mib": int(mem[-1]) if mem else None}


def flops_per_token(depth: int) -> float:
    from xtrain.models import gpt2
    return gpt2.config_for(DEPTH_PRESETS[depth], VOCAB).flops_per_token(SEQ)


def finish_row(row: dict, depth: int, batch: int, seq: int = SEQ) -> dict:
    if row.get("ms_step"):
        row["tok_s"] = batch * seq / (row["ms_step"] / 1000)
        row["mfu"] = common.mfu(row["tok_s"], flops_per_token(depth), common.BF16_PEAK_FLOPS) if seq == SEQ else None
    return row


def run_llmc(args, build: dict, name: str, depth: int, batch: int, recompute: int, shards: dict) -> dict:
    row = {"framework": "llm.c", "build": name, "depth": depth, "batch": batch, "seq": SEQ, "recompute": recompute}
    if not build.get("ok"):
        return {**row, "error": "build failed (see builds)"}
    cmd = [str(build["binary"]), "-i", str(shards["train"]), "-j", str(shards["val"]), "-e", f"d{depth}",
           "-b", str(batch), "-t", str(SEQ), "-d", str(batch * SEQ), "-r", str(recompute), "-x", str(args.steps + 1),
           "-v", str(args.steps + 100), "-m", "1", "-s", "0", "-h", "0", "-n", "0", "-l", str(LR),
           "-c", str(WEIGHT_DECAY), "-u", "0"]
    env = {**os.environ, **build.get("env", {})}
    rc, out, peak = run_process(cmd, env=env, timeout=args.timeout, cwd=build["binary"].parent)
    row.update(command=" ".join(cmd), exit=rc, peak_smi_mib=peak)
    row.update(parse_llmc(out) if rc == 0 else {"error": f"exit {rc}", "tail": out[-2000:]})
    return finish_row(row, depth, batch)


def run_worker_process(args, worker: str, depth: int, batch: int, recompute: int, shards: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--depth", str(depth),
           "--batch", str(batch), "--recompute", str(recompute), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--train-shard", str(shards["train"])]
    if args.nanogpt:
        cmd += ["--nanogpt", str(args.nanogpt)]
    if args.smoke:
        cmd.append("--smoke")
    rc, out, peak = run_process(cmd, timeout=args.timeout)
    lines = [ln[len(RESULT_PREFIX):] for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
    row = json.loads(lines[-1]) if lines else {"framework": worker, "depth": depth, "batch": batch,
                                               "recompute": recompute, "error": f"exit {rc}", "tail": out[-3000:]}
    row["peak_smi_mib"] = peak
    return row


# ---- the in-process workers

def _timed(step, sync, steps: int, warmup: int, reset_peak) -> list[float]:
    """Per-step seconds of `steps` steps after `warmup` untimed ones; reset_peak() runs between, so
    an allocator's peak is the timed steps' (as bench/train_throughput.py measures it)."""
    for _ in range(warmup):
        step()
    sync()
    reset_peak()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def _worker_shape(args) -> tuple[int, int, int]:
    return (2, 64, 2) if args.smoke else (args.batch, SEQ, args.steps)


def worker_xtrain(args) -> dict:
    import xtrain
    from xtrain import graphs
    from xtrain.models import GPT2, GPT2Config, gpt2
    from xtrain.optim import AdamW

    device = "cpu" if args.smoke else "cuda:0"
    batch, seq, steps = _worker_shape(args)
    if args.smoke:
        config = GPT2Config(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=2, max_seq=seq, recompute=bool(args.recompute))
    else:
        config = gpt2.config_for(DEPTH_PRESETS[args.depth], VOCAB, bf16=True, recompute=bool(args.recompute))
    model = GPT2(config, device=device, seed=0)
    opt = AdamW(model.named_parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    data = [(xtrain.tensor(x, device=device), xtrain.tensor(y, device=device))
            for x, y in read_windows(args.train_shard, batch, seq, IN_PROCESS_BATCHES)]
    losses = []
    step, sg, warmup = common.xtrain_step(model, opt, data, graphs.graph_blockers(device), losses.append,
                                          args.warmup)
    times = _timed(step, lambda: common.xt_sync(device), steps, 1 if args.smoke else warmup,
                   lambda: common.xt_reset_peak(device))
    peak = None
    if device != "cpu":
        # a replay allocates nothing: the step's activations live in the graphs' private pool,
        # counted in full (as bench/train_throughput.py)
        pool = xtrain.memory_stats(device).get("pool_bytes.current", 0) if sg.active else 0
        peak = common.xt_peak(device)["allocated_peak"] + pool
    return {"framework": "xtrain", "build": "graphs" if sg.active else "eager", "depth": args.depth,
            "batch": batch, "seq": seq, "recompute": args.recompute, "ms_step": 1000 * statistics.median(times),
            "peak_allocated": peak, "loss_first": losses[0].item(), "loss_last": losses[-1].item(),
            "steps_timed": len(times), "graphs_off_because": sg.disabled}


def worker_nanogpt(args) -> dict:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if args.nanogpt is None:
        raise SystemExit("--nanogpt DIR is required")
    sys.path.insert(0, str(args.nanogpt.resolve()))
    from model import GPT, GPTConfig  # nanoGPT's model.py, from the carried checkout

    device = "cpu" if args.smoke else "cuda:0"
    batch, seq, steps = _worker_shape(args)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT's train.py
    torch.backends.cudnn.allow_tf32 = True
    if args.smoke:
        conf = GPTConfig(block_size=seq, vocab_size=50304, n_layer=2, n_head=2, n_embd=64, dropout=0.0, bias=True)
    else:
        heads = {12: 12, 24: 16, 36: 20, 48: 25}[args.depth]
        dims = {12: 768, 24: 1024, 36: 1280, 48: 1600}[args.depth]
        conf = GPTConfig(block_size=SEQ, vocab_size=50304, n_layer=args.depth, n_head=heads, n_embd=dims,
                         dropout=0.0, bias=True)
    model = GPT(conf).to(device)
    device_type = "cpu" if args.smoke else "cuda"
    opt = model.configure_optimizers(WEIGHT_DECAY, LR, BETAS, device_type)  # fused AdamW on CUDA
    cmodel = model if args.smoke else torch.compile(model)
    data = [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
            for x, y in read_windows(args.train_shard, batch, seq, IN_PROCESS_BATCHES)]
    ctx = torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    backend = [SDPBackend.MATH] if args.smoke else [SDPBackend.FLASH_ATTENTION]
    state = {"i": 0, "losses": []}

    def step():
        x, y = data[state["i"] % len(data)]
        state["i"] += 1
        with ctx, sdpa_kernel(backend):
            _, loss = cmodel(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["losses"].append(loss.detach())

    times = _timed(step, lambda: common.torch_sync(device), steps, 1 if args.smoke else args.warmup,
                   lambda: common.torch_reset_peak(device))
    losses = state["losses"]
    return {"framework": "nanoGPT", "build": "torch.compile" if not args.smoke else "eager",
            "depth": args.depth, "batch": batch, "seq": seq, "recompute": 0, "ms_step": 1000 * statistics.median(times),
            "peak_allocated": common.torch_peak(device)["allocated_peak"],
            "loss_first": losses[0].item(), "loss_last": losses[-1].item(),
            "steps_timed": len(times), "fused_adamw": "fused" in opt.defaults and bool(opt.defaults["fused"]),
            "torch": torch.__version__}


def shard_sizes(args) -> tuple[int, int]:
    """Tokens in the train and val shards: enough consecutive windows for the largest batch's
    run (llm.c reads steps + 1 of them) and the in-process rows' 8."""
    batch, seq = (2, 64) if args.smoke else (max(args.batches + [args.batch]), SEQ)
    windows = max(args.steps + 2, IN_PROCESS_BATCHES)
    return windows * batch * seq + 1, 2 * batch * seq + 1


# ---- the driver

def ratios(rows: list) -> list:
    """Per (depth, batch): xtrain's best row against each peer's best row."""
    out = []
    keys = sorted({(r["depth"], r["batch"]) for r in rows if r.get("tok_s")})
    for depth, batch in keys:
        best = {}
        for r in rows:
            if (r["depth"], r["batch"]) == (depth, batch) and r.get("tok_s"):
                name = r["framework"] if r["framework"] != "llm.c" else f"llm.c ({r['build']})"
                if name not in best or r["tok_s"] > best[name]["tok_s"]:
                    best[name] = r
        xt = best.pop("xtrain", None)
        if xt is None:
            continue
        for name, r in best.items():
            out.append({"depth": depth, "batch": batch, "peer": name, "xtrain_over_peer_tok_s": xt["tok_s"] / r["tok_s"],
                        "xtrain_recompute": xt["recompute"], "peer_recompute": r["recompute"],
                        "xtrain_peak_smi_mib": xt.get("peak_smi_mib"), "peer_peak_smi_mib": r.get("peak_smi_mib")})
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        row = (worker_xtrain if args.worker == "xtrain" else worker_nanogpt)(args)
        print(RESULT_PREFIX + json.dumps(finish_row(row, args.depth, row["batch"], row["seq"])), flush=True)
        return
    if args.smoke:
        args.only = [f for f in args.only if f in ("xtrain", "nanogpt")]
        args.batches, args.depths, args.steps = [2], [12], 2
    args.work.mkdir(parents=True, exist_ok=True)
    if any(f.startswith("llmc") for f in args.only) and args.llmc is None:
        raise SystemExit("--llmc DIR is required for the llm.c rows (or leave them out with --only)")
    if "nanogpt" in args.only and args.nanogpt is None:
        raise SystemExit("--nanogpt DIR is required for the nanoGPT rows (or leave them out with --only)")
    shards = write_shards(args.work / "data", *shard_sizes(args))
    builds = build_all(args) if any(f.startswith("llmc") for f in args.only) else {}
    if args.build_only:
        return
    rows = []
    device = "cpu" if args.smoke else "cuda"
    date = common.stamp()

    def save(quiet: bool = True):  # after every row: a call cut short keeps what it measured
        payload = {"env": common.env_info(device), "seq": SEQ if not args.smoke else 64, "steps": args.steps,
                   "warmup": args.warmup, "smoke": args.smoke, "rows": rows, "ratios": ratios(rows),
                   "builds": {k: {"ok": v["ok"], "log_tail": v["log"][-4000:]} for k, v in builds.items()}}
        common.write_json(common.result_name("gpt2_peers", args.tag), payload, args.out, date=date, quiet=quiet)

    def record(row):
        rows.append(row)
        save()
        shown = (f"{row.get('ms_step', float('nan')):8.2f} ms  {row.get('tok_s', 0):10,.0f} tok/s  "
                 f"MFU {100 * (row.get('mfu') or 0):5.1f}%  peak {row.get('peak_smi_mib')} MiB") \
            if row.get("ms_step") else f"ERROR {row.get('error')}"
        print(f"{row['framework']:8s} {row.get('build', ''):14s} d{row['depth']} b{row['batch']} "
              f"r{row['recompute']}: {shown}", flush=True)

    for depth in args.depths:
        for batch in args.batches:
            if "xtrain" in args.only:
                for r in args.xtrain_recompute:
                    record(run_worker_process(args, "xtrain", depth, batch, r, shards))
            for name in ("llmc", "llmc-cudnn"):
                if name in args.only:
                    for r in args.llmc_recompute:
                        record(run_llmc(args, builds[name], name, depth, batch, r, shards))
            if "nanogpt" in args.only:
                record(run_worker_process(args, "nanogpt", depth, batch, 0, shards))
    for s in ratios(rows):
        print(f"d{s['depth']} b{s['batch']}: xtrain / {s['peer']} = {s['xtrain_over_peer_tok_s']:.3f}x tok/s "
              f"(peak {s['xtrain_peak_smi_mib']} vs {s['peer_peak_smi_mib']} MiB)", flush=True)
    save(quiet=False)


if __name__ == "__main__":
    main()
