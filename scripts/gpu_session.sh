#!/usr/bin/env bash
# One device call on the (bare) GPU machine: build, test and benchmark in the steps asked for,
# each under its own timeout, writing logs under OUT (the device tool's $OUT).
#
#   STEPS="install gtest pytest ab" scripts/gpu_session.sh [OUT]
#
# Steps (run in the order given; a failed step is recorded and the call goes on):
#   install   pip install --no-build-isolation (CUDA, sm_90, GoogleTest binary in /tmp/xtrain-build);
#             skipped on a warm machine that installed the same tree (digest of CMakeLists.txt,
#             pyproject.toml, csrc/ and python/) in an earlier call;
#             with .gpu/base.tar present (`git archive BASE -o .gpu/base.tar`, carried), that tree
#             is built at the same time into /tmp/xt-base, for the before/after comparison
#   gtest     ctest of the C++ suite (CUDA tests included)
#   pytest    the Python suite on CUDA ($PYTEST_ARGS added; default: the whole tests/ directory)
#   ab        (the base is .gpu/base.tar's commit; $BASE_COMMIT, if given, must match it) bench/train_throughput.py, xtrain only ($AB_ARGS; default dim768 bf16 batch 32
#             seq 256 vocabulary 50257): base, new, base, new (interleaved, so drift hits both alike); needs the base build
#   throughput  bench/train_throughput.py with its PyTorch peers ($THROUGHPUT_ARGS: configurations
#             separated by ';')
#   ops       bench/ops.py ($OPS_ARGS, e.g. "--only linear --vocab 50257")
#   attention bench/ops.py rows of the fused attention and head preparation against torch's flash SDPA
#   data      bench/data_run.py ($DATA_ARGS)
#   recompute bench/recompute.py ($RECOMPUTE_ARGS; default dim768 b32 V=50257, the gate), xtrain beside
#             PyTorch eager and torch.compile with checkpointed blocks
#   profile   bench/profile_step.py ($PROFILE_ARGS, configurations separated by ';', each optionally led by
#             NAME=VALUE words: that run's environment; default dim768 b32 bf16 V=50257)
#   gemm      bench/lm_head_gemm.py ($GEMM_ARGS): the lm_head GEMM's cuBLAS kernel per API and math mode
#   generate  bench/generate.py ($GENERATE_ARGS): the KV-cache generator against the re-run and PyTorch's generators
#   gpt2peers bench/gpt2_peers.py ($GPT2PEERS_ARGS): GPT-2 against llm.c (built from the carried
#             source, plain and cuDNN) and nanoGPT under torch.compile; carry .gpu/peers/{llm.c,nanoGPT,
#             cudnn-frontend}.tar (`git archive` of each checkout)
#   bigmodels bench/big_models.py ($BIGMODELS_ARGS, configurations separated by ';'): the 0.6B-1.7B shapes
#             against torch.compile + Liger
#   cli       xtrain train on the built-in data ($CLI_ARGS), CUDA graphs on and off: median tok/s
#   scaling   bench/scaling.py, needs 2 GPUs ($SCALING_ARGS; default: threads and processes, the
#             `xtrain train` rows, the shard/flat/all-reduce steps, PyTorch DDP)
#   race      bench/time_to_loss.py on the carried English corpus ($RACE_ARGS; default: dim768, the
#             xtrain and PyTorch arms with AdamW and Muon, one LR, ~7 minutes); carry .gpu/corpus
#             (scripts/race_corpus.py writes it)
#   flashcheck dev/wgmma_flash.py: the wgmma attention kernels against the mma.sync ones, bit for bit
#             and timed (needs no install; bench/results/wgmma_flash-COMMIT-DATE.json)
#   headchunks dev/head_chunks.py ($HEADCHUNKS_ARGS): the row-chunked head's speed and peak per chunk size
#             at llama3.2-1b's and qwen3-1.7b's heads (known issue 38)
#   pooltrace dev/pool_trace.py ($POOLTRACE_ARGS; default llama3.2-1b b4 s4096): every backend allocation
#             of the eager, captured and replayed steps, and the pool's segments (known issue 42)
#   fp8conv   bench/fp8_convergence.py ($FP8CONV_ARGS; default: dim768, 2000 steps, bf16 against --fp8
#             on the carried corpus's prepared data); carry .gpu/corpus
# XTRAIN_COMMIT: the commit under test as a literal hash, written into every result file (the
# device's copy of .git is stale: `git rev-parse HEAD` evaluated there names an old commit).
# OUT receives at most 8 files: summary.txt, install.log, gtest.log, pytest.log (failures.txt: each
# failure's report as it happens, for a pytest step cut off by its timeout), bench.log,
# results.tgz (every bench/results file written during the call), autotune.tgz (INDUCTOR_CACHE),
# and the step logs' tails.
# The GPU machine has no package registry: carry .whl/ (scipy-openblas32, pybind11-stubgen) and .gpu/.
# INDUCTOR_CACHE=1: torch.compile's autotuning results persist across calls, for a compile peer
# whose autotuning outlasts one call (mode="max-autotune-no-cudagraphs", known issue 22). Inductor
# runs with its cache in /tmp/inductor-cache (FX graph and AOT autograd caches off, so every graph
# is lowered afresh and only the autotuning is read back); .inductor/autotune.tgz, when carried, is
# unpacked into it first; after every step the autotuning results (Inductor's local autotune cache,
# cache/, and the Triton kernels' *.best_config files) are packed into OUT/autotune.tgz. Copy that
# file to .inductor/autotune.tgz and carry .inductor in the next call: each call resumes where the
# last one stopped.
set -u
out=${1:-${OUT:-/tmp/gpu-out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OPENBLAS_NUM_THREADS=4
py=$(command -v python3)
steps=${STEPS:-install gtest pytest}
# The base tree's commit, from the pax header `git archive` writes: BASE_COMMIT defaults to it, and
# a BASE_COMMIT that names another commit stops the call before anything is built.
if [ -f .gpu/base.tar ]; then
  tar_commit=$("$py" -c "import sys, tarfile; print(tarfile.open(sys.argv[1]).pax_headers.get('comment', ''))" \
               .gpu/base.tar 2>/dev/null || true)
  if [ -n "${BASE_COMMIT:-}" ] && [ -n "$tar_commit" ] && [ "$BASE_COMMIT" != "$tar_commit" ]; then
    echo "gpu_session: BASE_COMMIT=$BASE_COMMIT but .gpu/base.tar is commit $tar_commit" >&2
    exit 2
  fi
  export BASE_COMMIT=${BASE_COMMIT:-$tar_commit}
fi
t_call=$(date +%s)
touch /tmp/.gpu_session_start
summary="$out/summary.txt"
: >"$summary"

note() { echo "$*" | tee -a "$summary"; }

# autotune.tgz (INDUCTOR_CACHE set): the autotuning results Inductor has written so far.
pack_autotune() {
  [ -n "${INDUCTOR_CACHE:-}" ] || return 0
  (cd "$TORCHINDUCTOR_CACHE_DIR" && find . -path ./cache -prune -o -name '*.best_config' -print \
      | { cat; [ -d cache ] && echo ./cache; } | tar czf "$out/.autotune.tgz" -T - 2>/dev/null) \
    && mv -f "$out/.autotune.tgz" "$out/autotune.tgz"  # whole or not at all
  return 0
}
if [ -n "${INDUCTOR_CACHE:-}" ]; then
  export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
  export XTRAIN_BENCH_INDUCTOR_CACHE=keep  # bench/train_throughput.py keeps this cache dir for its compiles
  mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
  if [ -f .inductor/autotune.tgz ]; then
    tar xzf .inductor/autotune.tgz -C "$TORCHINDUCTOR_CACHE_DIR" \
      && note "inductor cache: $(tar tzf .inductor/autotune.tgz | grep -vc '/$') autotuning files read back"
  fi
  # Packed after every step and also every 20 s in the background: a call cut off by the
  # device's limit ends inside a step.
  export -f pack_autotune
  export out
  bash -c 'while sleep 20; do pack_autotune; done' &
  autotune_packer=$!
  trap 'kill $autotune_packer 2>/dev/null' EXIT
fi

# results.tgz: every bench/results file written since the call began.
pack_results() {
  find bench/results -newer /tmp/.gpu_session_start -type f 2>/dev/null > /tmp/new_results.txt
  [ -s /tmp/new_results.txt ] && tar czf "$out/results.tgz" -T /tmp/new_results.txt
  return 0
}

# run_step NAME LIMIT LOG CMD...: run under a timeout, append to LOG, record status and seconds.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$(date +%s)
  echo "=== [$name] $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  local status=pass
  [ $rc -ne 0 ] && status="FAIL (exit $rc)"
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status="FAIL (timeout ${limit}s)"
  note "$(printf '%-10s %-22s %4ss' "$name" "$status" $(( $(date +%s) - t0 )))"
  return $rc
}

# The wheels the machine lacks (scipy-openblas32 for the build, pybind11-stubgen for tests/test_stubs.py).
if ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site
fi

build_new() {
  CMAKE_BUILD_PARALLEL_LEVEL=${1:-16} "$py" -m pip install --no-build-isolation --no-deps -q \
    --config-settings=build-dir=/tmp/xtrain-build --config-settings=cmake.define.XTRAIN_CUDA=ON \
    --config-settings=cmake.define.XTRAIN_CUDA_ARCHS=90 --config-settings=cmake.define.XTRAIN_BUILD_TESTS=ON . \
    && "$py" -c "import xtrain; print('new build:', xtrain.cuda.runtime_info())"
}
build_base() {
  rm -rf /tmp/base-src && mkdir -p /tmp/base-src && tar -xf .gpu/base.tar -C /tmp/base-src \
    && (cd /tmp/base-src && CMAKE_BUILD_PARALLEL_LEVEL=8 "$py" -m pip install --no-build-isolation --no-deps -q \
        --target /tmp/xt-base --config-settings=build-dir=/tmp/base-build \
        --config-settings=cmake.define.XTRAIN_CUDA=ON --config-settings=cmake.define.XTRAIN_CUDA_ARCHS=90 .) \
    && PYTHONPATH=/tmp/xt-base${PYTHONPATH:+:$PYTHONPATH} "$py" -c "import xtrain; print('base build:', xtrain.__file__)"
}
export -f build_new build_base
export py

throughput() {  # LABEL PYTHONPATH-prefix ARGS... (base runs record $BASE_COMMIT as their commit)
  local label=$1 pp=$2 commit=${XTRAIN_COMMIT:-}
  shift 2
  [ "$label" = base ] && commit=${BASE_COMMIT:-base}
  echo "--- $label"
  XTRAIN_COMMIT=$commit PYTHONPATH=$pp${PYTHONPATH:+:$PYTHONPATH} "$py" bench/train_throughput.py "$@" 2>&1  # whole, so a timed-out run still leaves its rows
}
export -f throughput

for step in $steps; do
  case "$step" in
    install)
      {
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        nvcc --version | tail -1
        "$py" -c "import torch; print('torch', torch.__version__)"
      } >"$out/install.log" 2>&1
      # A warm machine (the device keeps it a short while after a call) that already installed this
      # very tree skips the build: the digest of every file the build reads, kept beside the build.
      tree=$(find CMakeLists.txt pyproject.toml csrc python -type f -not -path '*/__pycache__/*' -not -name '*.so' -print0 \
             | sort -z | xargs -0 sha1sum | sha1sum | cut -c1-40)
      if [ ! -f .gpu/base.tar ] && [ "$(cat /tmp/xtrain-build/.installed-tree 2>/dev/null)" = "$tree" ] \
         && "$py" -c "import xtrain" 2>/dev/null; then
        note "install    skipped: this tree ($tree) is installed already"
      elif [ -f .gpu/base.tar ]; then
        run_step install 420 "$out/install.log" bash -c 'build_new 8 & n=$!; build_base & b=$!; wait $n; rn=$?; wait $b; rb=$?; echo "new rc=$rn base rc=$rb"; [ $rn -eq 0 ] && [ $rb -eq 0 ]' \
          && echo "$tree" > /tmp/xtrain-build/.installed-tree
      else
        run_step install 420 "$out/install.log" bash -c 'build_new 16' && echo "$tree" > /tmp/xtrain-build/.installed-tree
      fi
      ;;
    gtest)
      run_step gtest 240 "$out/gtest.log" bash -c 'cmake --build /tmp/xtrain-build -j 16 --target xtrain_cpp_tests >/dev/null && ctest --test-dir /tmp/xtrain-build --output-on-failure -j 8 --timeout 120'
      grep -E "tests passed|tests failed" "$out/gtest.log" | tail -1 | tee -a "$summary"
      ;;
    pytest)
      xdist=()
      "$py" -c "import xdist" 2>/dev/null && xdist=(-n 6 --dist loadfile)
      run_step pytest "${PYTEST_TIMEOUT:-400}" "$out/pytest.log" "$py" -m pytest ${PYTEST_ARGS:-tests} -q -p no:cacheprovider \
        --device cuda -rs --live-report "$out/failures.txt" -o faulthandler_timeout=120 "${xdist[@]}"
      tail -1 "$out/pytest.log" | tee -a "$summary"
      grep -E "^FAILED|^ERROR" "$out/pytest.log" | head -40 | tee -a "$summary"
      ;;
    ab)
      args="${AB_ARGS:---preset dim768 --batch 32 --seq 256 --bf16 --vocab 50257} --no-torch --steps ${AB_STEPS:-30} --warmup 8"
      run_step ab 300 "$out/bench.log" bash -c "for i in 1 2; do throughput base /tmp/xt-base $args; throughput new '' $args; done"
      grep -E "^--- |xtrain .*tok/s|^xtrain" "$out/bench.log" | tail -20 | tee -a "$summary"
      ;;
    throughput)  # THROUGHPUT_ARGS: configurations separated by ';'
      IFS=';' read -ra configs <<<"${THROUGHPUT_ARGS:---preset dim768 --batch 32 --seq 256 --bf16 --vocab 50257}"
      for c in "${configs[@]}"; do
        # Each fresh compile of the peer (--compile-repeats N) costs about two minutes.
        repeats=$(sed -n 's/.*--compile-repeats[ =]\([0-9]*\).*/\1/p' <<<"$c")
        run_step throughput "${THROUGHPUT_TIMEOUT:-$((120 + 120 * ${repeats:-1}))}" "$out/bench.log" bash -c "throughput new '' $c"
        grep -E "^measured:|^xtrain /|^xtrain launches" "$out/bench.log" | tail -8 | tee -a "$summary"
      done
      ;;
    ops)
      run_step ops 240 "$out/bench.log" "$py" bench/ops.py ${OPS_ARGS:-}
      ;;
    attention)  # the tests run in the pytest step; here the kernels against torch's flash SDPA
      run_step attention 240 "$out/bench.log" "$py" bench/ops.py --only ${ATTENTION_OPS:-flash,qk_prep}
      grep -iE "flash|qk_prep" "$out/bench.log" | tail -20 | tee -a "$summary"
      ;;
    data)
      run_step data 420 "$out/bench.log" "$py" bench/data_run.py ${DATA_ARGS:-}
      ;;
    recompute)  # with the compiled peer (two compiles per preset, ~170 s); default: issue 15's gate config
      run_step recompute 420 "$out/bench.log" "$py" bench/recompute.py \
        ${RECOMPUTE_ARGS:---presets dim768 --batch 32 --seq 256 --bf16 --vocab 50257 --no-search}
      grep -E "recompute (on|off):" "$out/bench.log" | tail -6 | tee -a "$summary"
      ;;
    profile)  # the step's kernels as xtrain train runs it, replayed graphs (bench/profile_step.py); PROFILE_ARGS: configurations separated by ';'
      IFS=';' read -ra configs <<<"${PROFILE_ARGS:---preset dim768 --batch 32 --seq 256 --bf16 --vocab 50257}"
      for c in "${configs[@]}"; do
        envs=() args=()  # leading NAME=VALUE words: the environment of that configuration's run
        for w in $c; do
          if [ ${#args[@]} -eq 0 ] && [[ $w =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w"); else args+=("$w"); fi
        done
        run_step profile 180 "$out/bench.log" env "${envs[@]}" "$py" bench/profile_step.py "${args[@]}"
        grep -E "^profile_step:|^timeline:" "$out/bench.log" | tail -2 | sed "s|^|${envs[*]:+${envs[*]} }|" | tee -a "$summary"
      done
      ;;
    gemm)  # the lm_head GEMM's cuBLAS kernel under each way of calling it (bench/lm_head_gemm.py)
      run_step gemm 180 "$out/bench.log" "$py" bench/lm_head_gemm.py ${GEMM_ARGS:---rows 8192 32768 --vocab 50257}
      ;;
    gpt2peers)  # bench/gpt2_peers.py ($GPT2PEERS_ARGS); peers carried as .gpu/peers/{llm.c,nanoGPT,cudnn-frontend}.tar
      for t in llm.c nanoGPT cudnn-frontend; do
        [ -d /tmp/peers/$t ] || { mkdir -p /tmp/peers/$t && tar xf .gpu/peers/$t.tar -C /tmp/peers/$t; }
      done
      run_step gpt2peers "${GPT2PEERS_TIMEOUT:-560}" "$out/bench.log" env XTRAIN_COMMIT="${XTRAIN_COMMIT:-}" \
        "$py" bench/gpt2_peers.py --llmc /tmp/peers/llm.c --nanogpt /tmp/peers/nanoGPT \
        --cudnn-frontend /tmp/peers/cudnn-frontend --work /tmp/gpt2-peers ${GPT2PEERS_ARGS:-}
      grep -E "^build |^(xtrain|llm\.c|nanoGPT) |^d[0-9]+ b[0-9]+:" "$out/bench.log" | tail -40 | tee -a "$summary"
      ;;
    bigmodels)  # bench/big_models.py ($BIGMODELS_ARGS); liger-kernel and torchao from .whl/
      "$py" -c "import liger_kernel" 2>/dev/null || "$py" -m pip install -q --no-deps --no-build-isolation .whl/liger_kernel-*.whl >/dev/null 2>&1
      "$py" -c "import torchao" 2>/dev/null || "$py" -m pip install -q --no-deps --no-build-isolation .whl/torchao-*.whl >/dev/null 2>&1
      IFS=';' read -ra configs <<<"${BIGMODELS_ARGS:- }"
      for c in "${configs[@]}"; do
        run_step bigmodels "${BIGMODELS_TIMEOUT:-560}" "$out/bench.log" "$py" bench/big_models.py $c
        grep -E "^measured|xtrain|liger|compile|largest" "$out/bench.log" | tail -30 | tee -a "$summary"
      done
      ;;
    generate)
      run_step generate "${GENERATE_TIMEOUT:-240}" "$out/bench.log" "$py" bench/generate.py ${GENERATE_ARGS:-}
      grep -iE "cached|re-run|speed" "$out/bench.log" | tail -12 | tee -a "$summary"
      ;;
    cli)  # xtrain train on the built-in data, graphs on and off: the median tok/s of log.jsonl
      run_step cli 300 "$out/bench.log" bash -c '
        for g in --cuda-graphs --no-cuda-graphs; do
          rm -rf /tmp/cli-run && (cd /tmp && "$py" -m xtrain train ${CLI_ARGS:---preset dim768 --bf16 --batch 32 --steps 300 --eval-every 0} \
            --sample-tokens 0 --save-every 0 --out /tmp/cli-run $g >/dev/null 2>&1) || { echo "cli $g failed"; exit 1; }
          "$py" -c "import json,statistics,sys; r=[json.loads(l) for l in open(\"/tmp/cli-run/log.jsonl\")]; t=[x[\"tok_s\"] for x in r if \"tok_s\" in x][20:]; print(\"cli\", sys.argv[1], \"median tok/s\", round(statistics.median(t)), \"steps\", len(t), \"graph steps\", sum(1 for x in r if x.get(\"graph\")))" "$g"
        done'
      grep -E "^cli " "$out/bench.log" | tail -2 | tee -a "$summary"
      ;;
    scaling)
      run_step scaling 540 "$out/bench.log" "$py" bench/scaling.py \
        ${SCALING_ARGS:---launch threads processes --cli --steps-dp shard flat all-reduce}
      grep -A20 "^engine" "$out/bench.log" | tail -20 | tee -a "$summary"
      ;;
    race)  # bench/time_to_loss.py on .gpu/corpus (docs/training.md, "The race")
      run_step race "${RACE_TIMEOUT:-570}" "$out/bench.log" "$py" bench/time_to_loss.py ${RACE_ARGS:---corpus .gpu/corpus \
        --preset dim768 --batch 32 --seq 512 --steps 600 --warmup 50 --eval-every 50 --eval-batches 8 \
        --targets 6,5,4.5,4,3.5 --lrs 6e-4 --arms xtrain-adamw,xtrain-muon,torch-adamw,torch-muon}
      grep -E "^time_to_loss:|: final val|failed:|^target " "$out/bench.log" | tail -20 | tee -a "$summary"
      ;;
    flashcheck)  # dev/wgmma_flash.py (docs/attention.md, "Hopper: warpgroup products")
      run_step flashcheck 180 "$out/bench.log" env XTRAIN_COMMIT="${XTRAIN_COMMIT:-}" "$py" dev/wgmma_flash.py
      grep -E "^every output|^FAILED|^wrote" "$out/bench.log" | tail -2 | tee -a "$summary"
      ;;
    headchunks)  # dev/head_chunks.py (known issue 38: the head's chunk size, speed against peak)
      run_step headchunks 180 "$out/bench.log" "$py" dev/head_chunks.py ${HEADCHUNKS_ARGS:-}
      grep -E " chunk " "$out/bench.log" | tail -10 | tee -a "$summary"
      ;;
    pooltrace)  # dev/pool_trace.py ($POOLTRACE_ARGS): the captured step's backend allocations (known issue 42)
      run_step pooltrace 240 "$out/bench.log" "$py" dev/pool_trace.py ${POOLTRACE_ARGS:---preset llama3.2-1b --batch 4 --seq 4096}
      grep -E "^step |^segment|^free piece" "$out/bench.log" | tail -12 | tee -a "$summary"
      ;;
    fp8conv)  # bench/fp8_convergence.py on .gpu/corpus/data (docs/fp8.md)
      run_step fp8conv "${FP8CONV_TIMEOUT:-570}" "$out/bench.log" "$py" bench/fp8_convergence.py \
        ${FP8CONV_ARGS:---data .gpu/corpus/data --preset dim768 --steps 2000}
      grep -E "^(bf16|fp8): val|^fp8 vs bf16" "$out/bench.log" | tail -5 | tee -a "$summary"
      ;;
    *)
      note "unknown step $step"
      ;;
  esac
  pack_results  # after every step, so a call cut short by the device's limit still returns them
  pack_autotune
done

pack_results
pack_autotune
note "call took $(( $(date +%s) - t_call ))s; new result files: $(wc -l < /tmp/new_results.txt)"
