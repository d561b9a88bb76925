#!/usr/bin/env bash
# One GPU round on the (bare) GPU machine: install, C++ suite, Python suite on CUDA, benchmarks.
#   scripts/gpu_round.sh OUTDIR
# Steps (each one's failure is recorded and the round goes on):
#   env      what the machine is (nvidia-smi, nvcc, python, torch, cuBLAS/NCCL wheels)
#   install  pip install --no-build-isolation -v . (scipy-openblas32 from .whl/ when missing)
#   gtest    CMake build of the GoogleTest binary (-DXTRAIN_BUILD_TESTS=ON), then ctest
#   pytest   python -m pytest tests -q --device all (JUnit XML beside the log)
#   bench    bench/ops.py, when it exists (its results JSON copied to OUTDIR/bench.json)
# OUTDIR gets at most 8 files (what the device tool brings back): summary.json, env.log,
# install.log, gtest.log, pytest.log, pytest.xml, bench.log, bench.json. summary.json holds
# pass/fail, seconds and counts per step; the last lines printed are the same summary.
# The GPU machine has no package registry: carry .whl/ (the scipy-openblas32 wheel) with the tree.
# Budget: about 8 minutes in all; every step runs under its own timeout, and the optional
# bench step is skipped when the round is already late.
set -u
out=${1:?usage: scripts/gpu_round.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
jobs=$(nproc 2>/dev/null || echo 8)
export CMAKE_BUILD_PARALLEL_LEVEL=$jobs
py=$(command -v python3)
t_round=$(date +%s)
declare -A status secs

# step NAME TIMEOUT LOG CMD...: run CMD under a timeout, log stdout+stderr, record status/time.
step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$(date +%s)
  echo "=== [$name] $*" | tee -a "$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  secs[$name]=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then status[$name]=pass
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status[$name]="fail (timeout after ${limit}s)"
  else status[$name]="fail (exit $rc)"; fi
  echo "=== [$name] ${status[$name]} in ${secs[$name]}s" | tee -a "$log"
}

# ---------------------------------------------------------------- env
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  cmake --version 2>&1 | head -1
  "$py" --version
  "$py" -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count()); print('numpy', numpy.__version__)" 2>&1
  "$py" -m pip list 2>/dev/null | grep -i -E "^(nvidia-cublas|nvidia-nccl|pybind11|scikit-build-core|pytest|scipy-openblas)" 
  git -C "$root" log -1 --oneline 2>/dev/null
  git -C "$root" status --short 2>/dev/null | head -50
} >"$out/env.log" 2>&1
status[env]=pass
secs[env]=0

# ---------------------------------------------------------------- install
# The GPU machine has no registry: scipy-openblas32 travels as a wheel in .whl/.
if ! "$py" -c "import scipy_openblas32" 2>/dev/null; then
  if ls .whl/scipy_openblas32-*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --target /tmp/site .whl/scipy_openblas32-*.whl >>"$out/install.log" 2>&1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "scipy-openblas32 is not installed and .whl/ holds no wheel for it: the build will fail" >>"$out/install.log"
  fi
fi
step install 300 "$out/install.log" "$py" -m pip install --no-build-isolation --no-deps -v \
  --config-settings=cmake.define.XTRAIN_CUDA=ON --config-settings=cmake.define.XTRAIN_CUDA_ARCHS=90 .
"$py" -c "import xtrain; print('import ok; cuda available:', xtrain.cuda.is_available(), '|', xtrain.cuda.runtime_info())" \
  >>"$out/install.log" 2>&1 || status[install]="fail (import)"

# ---------------------------------------------------------------- gtest
export root py jobs gbuild="$root/build-gpu-round"
gtest_run() {
  cmake -S "$root" -B "$gbuild" -G Ninja -DXTRAIN_BUILD_TESTS=ON -DXTRAIN_CUDA=ON -DXTRAIN_CUDA_ARCHS=90 \
    -DPython_EXECUTABLE="$py" || return 1
  cmake --build "$gbuild" -j "$jobs" --target xtrain_cpp_tests || return 1
  ctest --test-dir "$gbuild" --output-on-failure -j 8 --timeout 120
}
export -f gtest_run
step gtest 360 "$out/gtest.log" bash -c gtest_run

# ---------------------------------------------------------------- pytest (outside the repo root's
# python/ dir so the installed xtrain is the one imported)
xdist=()
"$py" -c "import xdist" 2>/dev/null && xdist=(-n 4 --dist loadfile)
step pytest 420 "$out/pytest.log" "$py" -m pytest tests -q --device all -p no:cacheprovider -rs \
  --junitxml="$out/pytest.xml" "${xdist[@]}"

# ---------------------------------------------------------------- bench
if [ -f bench/ops.py ]; then
  if [ $(( $(date +%s) - t_round )) -lt 420 ]; then
    touch "$out/.bench_start"
    step bench 120 "$out/bench.log" "$py" bench/ops.py
    # bench/ops.py writes bench/results/ops-PRESET-DATE.json: bring the new one back as bench.json.
    newest=$(find bench/results -name 'ops-*.json' -newer "$out/.bench_start" 2>/dev/null | sort | tail -1)
    [ -n "$newest" ] && cp "$newest" "$out/bench.json"
    rm -f "$out/.bench_start"
  else
    status[bench]="skipped (round over 7 minutes already)"
    secs[bench]=0
  fi
else
  status[bench]="skipped (bench/ops.py does not exist)"
  secs[bench]=0
fi

# ---------------------------------------------------------------- summary
total=$(( $(date +%s) - t_round ))
steps_json="{"
for name in env install gtest pytest bench; do
  steps_json+="\"$name\": {\"status\": \"${status[$name]:-not run}\", \"seconds\": ${secs[$name]:-0}},"
done
steps_json="${steps_json%,}}"
"$py" - "$out" "$total" "$steps_json" <<'EOF' || echo "$steps_json" >"$out/summary.json"
import json, re, sys, xml.etree.ElementTree as ET
out, total = sys.argv[1], int(sys.argv[2])
steps = json.loads(sys.argv[3])
counts = {}
try:
    root = ET.parse(f"{out}/pytest.xml").getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    c = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    c["passed"] = c["tests"] - c["failures"] - c["errors"] - c["skipped"]
    failed = []
    for s in suites:
        for case in s.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(case.get('classname') + '::' + case.get('name'))
    c["failed_tests"] = failed[:200]
    counts["pytest"] = c
except Exception as e:
    counts["pytest"] = {"error": f"no junit xml: {e}"}
try:
    log = open(f"{out}/gtest.log").read()
    # ctest: "100% tests passed out of 33" or "97% tests passed, 1 tests failed out of 33"
    m = re.findall(r"(\d+)% tests passed(?:, (\d+) tests failed)? out of (\d+)", log)
    if m:
        pct, failed, n = m[-1]
        counts["gtest"] = {"tests": int(n), "failed": int(failed or 0),
                           "failed_tests": re.findall(r"\d+ - (\S+) \((?:Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)", log)}
except Exception as e:
    counts["gtest"] = {"error": str(e)}
summary = {"total_seconds": total, "steps": steps, "counts": counts}
try:
    summary["env"] = open(f"{out}/env.log").read().splitlines()[:40]
except Exception:
    pass
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
EOF

echo "==================== GPU round summary (${total}s) ===================="
for name in env install gtest pytest bench; do
  printf '%-8s %-45s %4ss\n' "$name" "${status[$name]:-not run}" "${secs[$name]:-0}"
done
"$py" - "$out" <<'EOF' 2>/dev/null
import json, sys
c = json.load(open(f"{sys.argv[1]}/summary.json")).get("counts", {})
p, g = c.get("pytest", {}), c.get("gtest", {})
if "tests" in p:
    print(f"pytest: {p['passed']} passed, {p['failures'] + p['errors']} failed, {p['skipped']} skipped")
    for t in p["failed_tests"][:40]:
        print("  FAILED", t)
if "tests" in g:
    print(f"gtest:  {g['tests'] - g['failed']} passed, {g['failed']} failed")
    for t in g["failed_tests"][:40]:
        print("  FAILED", t)
EOF
echo "logs and summary.json in $out"
