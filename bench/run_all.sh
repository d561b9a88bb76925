#!/usr/bin/env bash
# Run every benchmark in sequence with settings that fit the GPU budget (about 5 minutes on one
# H200, each script well under 3), logging each and copying its JSON/PNG into OUTDIR too.
#   bench/run_all.sh OUTDIR            the H200 run (xtrain built with CUDA on PYTHONPATH)
#   bench/run_all.sh OUTDIR --smoke    the same scripts on the CPU with the tiny preset (results
#                                      in OUTDIR only)
# A script that fails or runs past $BENCH_TIMEOUT seconds (default 240) is reported in
# OUTDIR/summary.txt and the others still run; the exit status is the number of failures.
# BENCH_ONLY="ops recompute" runs only the named ones (names: ops, profile, profile-4096,
# profile-recompute, throughput-dim768-bf16, throughput-dim768-bf16-b128, throughput-dim768-fp32,
# throughput-dim1024-bf16, recompute, convergence, scaling), to split the run. scaling needs
# two GPUs (it measures what the machine has).
set -uo pipefail
out=${1:?usage: bench/run_all.sh OUTDIR [--smoke]}
mode=${2:-gpu}
case "$mode" in gpu|--smoke) ;; *) echo "unknown mode $mode (use --smoke or nothing)" >&2; exit 2;; esac
export PYTHONUNBUFFERED=1
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
limit=${BENCH_TIMEOUT:-240}
mkdir -p "$out" "$root/bench/results"
out=$(cd "$out" && pwd)
cd "$root"
marker=$(mktemp)
trap 'rm -f "$marker"' EXIT
failures=0
: > "$out/summary.txt"

run() {  # run NAME SCRIPT ARGS...   ($BENCH_ONLY, if set, lists the NAMEs to run)
  local name=$1; shift
  if [ -n "${BENCH_ONLY:-}" ] && [[ " $BENCH_ONLY " != *" $name "* ]]; then return; fi
  local start=$SECONDS
  echo "=== $name: $py $*" | tee -a "$out/summary.txt"
  timeout --kill-after=10 "$limit" "$py" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - start))s" | tee -a "$out/summary.txt"
  [ "$rc" -eq 0 ] || failures=$((failures + 1))
}

if [ "$mode" = "--smoke" ]; then
  cpu=(--device cpu --out "$out")  # smoke results stay out of bench/results
  run ops bench/ops.py "${cpu[@]}" --preset tiny --batch 2 --seq 32 --gemm-size 256 --steps 2 \
    --warmup 1 --target-ms 5
  run throughput-tiny-fp32 bench/train_throughput.py "${cpu[@]}" --preset tiny --batch 4 --seq 32 \
    --fp32 --steps 3 --warmup 1 --no-compile
  run throughput-tiny-bf16 bench/train_throughput.py "${cpu[@]}" --preset tiny --batch 2 --seq 16 \
    --bf16 --steps 3 --warmup 1 --no-compile
  run recompute bench/recompute.py "${cpu[@]}" --presets tiny --batch 2 --seq 32 --fp32 --steps 2 \
    --warmup 1 --search-preset tiny --batches 1,2,4,8,16 --memory-limit 256MiB --no-compile
  run convergence bench/convergence.py "${cpu[@]}" --preset tiny --steps 3 --batch 2 --seq 32 \
    --eval-batches 2
else
  # ~30-60 s: every kernel against its PyTorch peer at dim768, B=32, S=256, and the 8192^3 ceilings
  run ops bench/ops.py --preset dim768 --batch 32 --seq 256
  # ~20 s each: kernel-by-kernel GPU time of one xtrain step (GPT-2-sized vocabulary; 4096 with
  # recompute off and on, the recompute table's setting)
  run profile bench/profile_step.py --preset dim768 --batch 32 --seq 256 --bf16 --vocab 50257
  run profile-4096 bench/profile_step.py --preset dim768 --batch 32 --seq 256 --bf16 --vocab 4096
  run profile-recompute bench/profile_step.py --preset dim768 --batch 32 --seq 256 --bf16 --vocab 4096 \
    --recompute
  # ~60-90 s (torch.compile dominates): the headline comparison, GPT-2's vocabulary
  run throughput-dim768-bf16 bench/train_throughput.py --preset dim768 --batch 32 --seq 256 --bf16 \
    --vocab 50257 --steps 20 --warmup 5
  # ~40 s: the large-batch target (eager peer)
  run throughput-dim768-bf16-b128 bench/train_throughput.py --preset dim768 --batch 128 --seq 256 --bf16 \
    --vocab 50257 --steps 8 --warmup 3 --no-compile
  # ~15 s each: float32, and the larger model (eager peer only, to stay in budget)
  run throughput-dim768-fp32 bench/train_throughput.py --preset dim768 --batch 32 --seq 256 --fp32 \
    --steps 10 --warmup 3 --no-compile
  run throughput-dim1024-bf16 bench/train_throughput.py --preset dim1024 --batch 32 --seq 256 --bf16 \
    --steps 20 --warmup 5 --no-compile
  # ~3-4 min: recompute off/on at B=32 for dim768/dim1024 beside PyTorch eager and the compiled
  # model with checkpointed blocks (two compiles per preset), largest dim1024 batch under 32 GiB
  run recompute bench/recompute.py --presets dim768,dim1024 --batch 32 --seq 256 --bf16 \
    --search-preset dim1024 --memory-limit 32GiB
  # ~200 s: 150 steps bf16 vs float32 on the built-in corpus (the preset's LR), both frameworks, 4 seeds
  run convergence bench/convergence.py --preset dim768 --steps 150 --batch 16 --seq 256 --seeds 4
  # ~3 min on two GPUs: 1 and 2 GPUs, xtrain (reduce after backward, overlapped, and the --diagnose
  # rows: no average / the average alone) beside PyTorch DDP
  run scaling bench/scaling.py --overlap --diagnose
fi

find "$root/bench/results" -maxdepth 1 -type f \( -name '*.json' -o -name '*.png' \) \
  -newer "$marker" -exec cp {} "$out/" \;
echo "failures: $failures; results copied to $out" | tee -a "$out/summary.txt"
exit "$failures"
