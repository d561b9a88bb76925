#!/usr/bin/env bash
# One device call of a GPU session, in stages that fit the 10-minute limit; each writes its logs
# under OUT (the device tool's $OUT) and prints a short summary.
#   scripts/gpu_call.sh a   install; tests/test_distributed.py; profiles; throughput; scaling
#   scripts/gpu_call.sh b   install if needed; gtest; the whole pytest suite; profiles; throughput
#   scripts/gpu_call.sh c   install if needed; scaling, recompute, convergence, batch 128, kernels
#   scripts/gpu_call.sh d   install if needed; the data-parallel tests; scaling with every
#                           data-parallel step (shard, flat, all-reduce) and NCCL protocol variants
# Run from the repository root on the GPU machine (carry .whl). Stage a first on a 2-GPU machine.
set -u
stage=${1:?usage: scripts/gpu_call.sh a|b}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" /tmp/b
if ! python3 -c "import xtrain, sys; sys.exit(0 if xtrain.cuda.is_available() else 1)" 2>/dev/null \
   || [ "${REINSTALL:-0}" = 1 ]; then
  source scripts/gpu_install.sh "$out/install.log" || { tail -40 "$out/install.log"; exit 1; }
fi
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
case "$stage" in
  a)  # the 2-GPU suite and the headline numbers
    timeout 200 python3 -m pytest tests/test_distributed.py -q -p no:cacheprovider -rs \
      > "$out/pytest_dist.log" 2>&1
    tail -4 "$out/pytest_dist.log"
    BENCH_ONLY="profile profile-4096 profile-recompute throughput-dim768-bf16 scaling" BENCH_TIMEOUT=280 \
      bench/run_all.sh /tmp/b/a > "$out/bench_a.log" 2>&1
    ;;
  b)  # every test (C++ and Python, CUDA and 2 GPUs), the profiles, the headline throughput
    timeout 120 ctest --test-dir /tmp/xtrain-build --output-on-failure -j 8 --timeout 100 > "$out/gtest.log" 2>&1
    grep -E "tests passed|tests failed" "$out/gtest.log"
    xdist=(); python3 -c "import xdist" 2>/dev/null && xdist=(-n 4 --dist loadfile)
    timeout 330 python3 -m pytest tests -q -p no:cacheprovider --device all -rs "${xdist[@]}" \
      --junitxml="$out/pytest.xml" > "$out/pytest_all.log" 2>&1
    tail -4 "$out/pytest_all.log"
    mkdir -p /tmp/b/b  # host time per step: batch 1, where the GPU work is small
    python3 bench/profile_step.py --preset dim768 --batch 1 --seq 256 --vocab 4096 --top 5 \
      > /tmp/b/b/profile-b1.log 2>&1
    BENCH_ONLY="${BENCH_B:-profile profile-4096 profile-recompute throughput-dim768-bf16}" BENCH_TIMEOUT=200 \
      bench/run_all.sh /tmp/b/b > "$out/bench_b.log" 2>&1
    ;;
  c)  # the remaining benchmarks
    BENCH_ONLY="${BENCH_C:-scaling recompute convergence throughput-dim768-bf16-b128 ops}" BENCH_TIMEOUT=200 \
      bench/run_all.sh /tmp/b/c > "$out/bench_c.log" 2>&1
    ;;
  d)  # data parallelism: tests, then the scaling table with each optimizer step
    timeout 180 python3 -m pytest tests/test_distributed.py tests/test_flat_step.py tests/test_train.py -q \
      -p no:cacheprovider -rs --device cuda > "$out/pytest_dist.log" 2>&1
    tail -4 "$out/pytest_dist.log"
    mkdir -p /tmp/b/d
    timeout 300 python3 bench/scaling.py --steps-dp shard flat all-reduce --out /tmp/b/d \
      > "$out/scaling.log" 2>&1
    tail -16 "$out/scaling.log"
    for v in ${SCALING_ENV:-}; do  # e.g. NCCL_PROTO=Simple: the sharded step under other NCCL settings
      env "$v" timeout 90 python3 bench/scaling.py --engines xtrain --gpus 2 --out /tmp/b/d \
        > "$out/scaling-$v.log" 2>&1
      echo "$v: $(grep -E '^xtrain +2 ' "$out/scaling-$v.log")"
    done
    cp /tmp/b/d/*.json "$out/" 2>/dev/null
    ;;
esac
grep -h "^===.*exit\|^profile_step" "$out"/bench_*.log /tmp/b/*/profile*.log 2>/dev/null
tar czf "$out/bench_$stage.tgz" -C /tmp/b .
