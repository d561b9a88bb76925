"""The CPU before/after comparison: a base commit's training step against this tree's, interleaved.

    python bench/cpu_ab.py --base 4c4f721                    # (base, new, PyTorch) x 2
    python bench/cpu_ab.py --base HEAD~1 --rounds 3 --threads 1

The CPU counterpart of scripts/gpu_session.sh's `ab` step, for every change that touches a CPU
kernel or the step. The base commit's tree (git archive) is built once, CPU only, with CMake into
--cache/COMMIT (kept: a later run of the same base reuses it) and laid out as an importable package;
the new side is the xtrain this interpreter imports (a dev build on PYTHONPATH, or the installed
package), handed to its runs as an absolute PYTHONPATH (recorded in the JSON as new_package). Each
side runs its own tree's bench/train_throughput.py as a separate process (the tiny preset, batch 16,
seq 128, vocab 4096, fp32 by default: --bench-args), xtrain only, in the order base, new, then the
new tree's bench with its PyTorch CPU eager peer, round after round (--rounds), so a load change on
a shared machine hits every side alike. The medians over the rounds, the ratios new/base, new/torch
and base/torch, and the median xtrain/PyTorch ratio within the peer's own runs (the two measured in
the same minute) go to bench/results/cpu_ab-BASE-DATE.json, with every run's tok/s and the host
load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common

ROOT = Path(__file__).resolve().parent.parent
# Arguments both sides' benches know (4c4f721's has no --windows): one timed window per run.
DEFAULT_BENCH = "--preset tiny --batch 16 --seq 128 --vocab 4096 --fp32 --steps 15 --warmup 3"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xtrain-cpu-ab"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the base commit (any name git rev-parse knows)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of base, new and the PyTorch row, interleaved")
    p.add_argument("--bench-args", default=DEFAULT_BENCH,
                   help="arguments of bench/train_throughput.py for every run (--device cpu and --no-torch are added)")
    p.add_argument("--threads", type=int, default=None,
                   help="OPENBLAS_NUM_THREADS (xtrain) and OMP_NUM_THREADS (the PyTorch peer) of every run "
                        "(default: the environment's, else every core)")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch CPU eager rows")
    p.add_argument("--cache", default=str(DEFAULT_CACHE), help="where base builds are kept, one per commit")
    p.add_argument("--jobs", type=int, default=2, help="build jobs for the base")
    p.add_argument("--out", default=str(common.RESULTS_DIR), help="directory for the JSON")
    p.add_argument("--tag", default="", help="suffix of the result name")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    return args


def git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *argv], check=True, capture_output=True, text=True).stdout.strip()


def build_base(commit: str, cache: Path, jobs: int) -> Path:
    """The base commit's package directory (PYTHONPATH) and tree, built once per commit."""
    home = cache / commit
    pkg, src = home / "pkg", home / "src"
    if list((pkg / "xtrain").glob("_C*.so")):
        print(f"cpu_ab: base {commit[:12]} already built in {home}", flush=True)
        return home
    print(f"cpu_ab: building base {commit[:12]} (CPU only) in {home}", flush=True)
    shutil.rmtree(home, ignore_errors=True)
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    build = home / "build"
    configure = ["cmake", "-S", str(src), "-B", str(build), "-DXTRAIN_CUDA=OFF", "-DXTRAIN_BUILD_TESTS=OFF",
                 f"-DPython_EXECUTABLE={sys.executable}"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    if shutil.which("ccache"):
        configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "-j", str(jobs)], check=True, stdout=subprocess.DEVNULL)
    shutil.copytree(src / "python" / "xtrain", pkg / "xtrain")
    for so in build.glob("_C*.so"):
        shutil.copy2(so, pkg / "xtrain")
    if not list((pkg / "xtrain").glob("_C*.so")):
        raise SystemExit(f"cpu_ab: the base build in {build} made no _C extension")
    return home


def run_bench(label: str, tree: Path, pkg: Path | None, bench_args: list[str], threads: int | None,
              torch: bool) -> dict:
    """One process of `tree`'s bench/train_throughput.py; its xtrain (and torch) tok/s."""
    env = dict(os.environ)
    if pkg is not None:
        env["PYTHONPATH"] = str(pkg)
    if threads is not None:  # xtrain's threads (OpenBLAS's count) and the PyTorch peer's (OpenMP's)
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = str(threads)
    load = common.host_load()["loadavg"]  # before the run: the older bench does not record it
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, str(tree / "bench" / "train_throughput.py"), "--device", "cpu", *bench_args,
               "--out", out] + ([] if torch else ["--no-torch"])
        if torch and "--no-compile" not in cmd:
            cmd.append("--no-compile")
        proc = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True)
        files = list(Path(out).glob("*.json"))
        if proc.returncode != 0 or not files:
            raise SystemExit(f"cpu_ab: the {label} run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-3000:]}")
        result = json.loads(files[0].read_text())
    rows = {r["framework"]: r for r in result["results"]}
    xt = next(r for name, r in rows.items() if name.startswith("xtrain"))
    row = {"side": label, "tok_s": xt["tok_s"], "ms_per_step": xt["ms_per_step"],
           "host_loadavg": load,
           "loss_first": xt.get("loss_first"), "loss_last": xt.get("loss_last")}
    peer = rows.get("torch eager") or next((r for n, r in rows.items() if n.startswith("torch")), None)
    if torch and peer is not None:
        row["torch_tok_s"] = peer["tok_s"]
        row["torch_ms_per_step"] = peer["ms_per_step"]
    print(f"cpu_ab: {label:5s} xtrain {row['tok_s']:,.0f} tok/s ({row['ms_per_step']:.1f} ms/step)"
          + (f", torch eager {row['torch_tok_s']:,.0f} tok/s" if "torch_tok_s" in row else "")
          + f", load {row['host_loadavg']}", flush=True)
    return row


def new_side_pkg() -> Path:
    """The folder holding the xtrain this interpreter imports, as an absolute path (symbolic links
    kept: a dev build's package is links into python/xtrain beside its own _C). The new side's runs
    get it as their PYTHONPATH: they run in another working directory, where a relative PYTHONPATH
    (`PYTHONPATH=build-cpu/pkg`) would find nothing and the runs would silently import the
    installed xtrain instead."""
    spec = importlib.util.find_spec("xtrain")
    if spec is None or spec.origin is None:
        raise SystemExit("cpu_ab: no xtrain to import for the new side (a dev build on PYTHONPATH, or installed)")
    return Path(os.path.abspath(spec.origin)).parent.parent


def main(argv=None):
    args = parse_args(argv)
    base = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    home = build_base(base, Path(args.cache), args.jobs)
    new_pkg = new_side_pkg()
    print(f"cpu_ab: new side: {new_pkg / 'xtrain'}", flush=True)
    bench_args = args.bench_args.split()
    runs = []
    for _ in range(args.rounds):
        runs.append(run_bench("base", home / "src", home / "pkg", bench_args, args.threads, torch=False))
        runs.append(run_bench("new", ROOT, new_pkg, bench_args, args.threads, torch=False))
        if not args.no_torch:
            runs.append(run_bench("torch", ROOT, new_pkg, bench_args, args.threads, torch=True))

    def median(side, key="tok_s"):
        vals = [r[key] for r in runs if r["side"] == side and key in r]
        return statistics.median(vals) if vals else None
    summary = {"base_tok_s": median("base"), "new_tok_s": median("new"),
               "torch_eager_tok_s": median("torch", "torch_tok_s")}
    summary["new_over_base"] = common.ratio(summary["new_tok_s"], summary["base_tok_s"])
    summary["new_over_torch"] = common.ratio(summary["new_tok_s"], summary["torch_eager_tok_s"])
    summary["base_over_torch"] = common.ratio(summary["base_tok_s"], summary["torch_eager_tok_s"])
    # The peer's own runs: xtrain and PyTorch one after the other in one process (the same minute).
    peers = [common.ratio(r["tok_s"], r["torch_tok_s"]) for r in runs if r["side"] == "torch" and "torch_tok_s" in r]
    summary["same_run_xtrain_over_torch"] = statistics.median(peers) if peers else None
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    print(f"cpu_ab: median tok/s base {fmt(summary['base_tok_s'], ',.0f')}, new {fmt(summary['new_tok_s'], ',.0f')}"
          f", torch eager {fmt(summary['torch_eager_tok_s'], ',.0f')}; new/base "
          f"{fmt(summary['new_over_base'], '.3f')}, new/torch {fmt(summary['new_over_torch'], '.3f')} "
          f"(in the peer's own run {fmt(summary['same_run_xtrain_over_torch'], '.3f')})")
    common.write_json(common.result_name(f"cpu_ab-{base[:7]}", args.tag),
                      {"benchmark": "cpu_ab", "env": common.env_info("cpu"), "args": vars(args),
                       "base_commit": base, "new_package": str(new_pkg / "xtrain"), "openblas_threads": args.threads or os.environ.get("OPENBLAS_NUM_THREADS"),
                       "summary": summary, "runs": runs}, args.out)


if __name__ == "__main__":
    main()
