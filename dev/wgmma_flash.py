"""Builds and runs dev/wgmma_flash.cu on the GPU machine and writes its timings and bit checks as
bench/results/wgmma_flash-COMMIT-DATE.json (the commit from $XTRAIN_COMMIT, else git's):

    python3 dev/wgmma_flash.py [--out DIR]      # the gpu_session.sh step `flashcheck`

Exits with the harness's status (2: an output differs from the mma.sync kernels' bits).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = re.compile(r"^(\S+)\s+D=\s*(\d+)\s+(mma\.sync|wgmma|wgmma-overlap) (forward|dq|dk/dv)\S*(?:\s+\(\+delta\))?\s+"
                    r"([\d.]+) ms\s+([\d.]+) TFLOP/s")


def parse(text: str) -> dict:
    """The harness's output as {timings: [...], bit_checks: [...], verdict}."""
    timings, checks = [], []
    for line in text.splitlines():
        m = TIMING.match(line)
        if m:
            timings.append({"shape": m[1], "D": int(m[2]), "form": m[3], "kernel": m[4], "ms": float(m[5]),
                            "tflops_nominal": float(m[6])})
        elif "bitwise equal" in line:
            checks.append(line.strip())
    verdict = next((l.strip() for l in reversed(text.splitlines()) if l.startswith(("every output", "FAILED"))), None)
    return {"timings": timings, "bit_checks": checks, "verdict": verdict}


def commit() -> str:
    import os

    if os.environ.get("XTRAIN_COMMIT"):
        return os.environ["XTRAIN_COMMIT"]
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    import nvidia.cu13

    include = Path(list(nvidia.cu13.__path__)[0]) / "include"
    exe = Path("/tmp/wgmma_flash")
    subprocess.run(["nvcc", "-std=c++17", "-O3", "-gencode", "arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr",
                    "-DXT_CUDA", "-I", str(ROOT / "csrc"), "-I", str(include), str(ROOT / "dev" / "wgmma_flash.cu"),
                    "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    sys.stdout.write(run.stdout + run.stderr)
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()
    now = dt.datetime.now(dt.timezone.utc)
    sha = commit()
    payload = {"benchmark": "wgmma_flash", "tool": "dev/wgmma_flash.cu (nvcc -O3 sm_90a): the wgmma kernels of "
               "csrc/kernels/cuda/flash_wgmma.cuh against the mma.sync kernels of flash_attention.cuh",
               "env": {"gpu": gpu, "commit": sha, "date": now.isoformat(timespec="seconds")},
               "notes": "ms: mean of 20 launches after 3 warm-up ones; TFLOP/s nominal: causal FLOPs without "
                        "documents; dq includes delta in both forms", "returncode": run.returncode, **parse(run.stdout)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"wgmma_flash-{sha[:7]}-{now.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
