#!/usr/bin/env bash
# The GPU check of flash attention and the fused head preparation (issue 14), about 3-4 minutes on
# one H200. Builds nothing: it uses the xtrain that python3 imports after the round's build (an
# installed xtrain, or PYTHONPATH=build-NAME/pkg from scripts/dev.sh).
#   scripts/check_attention_gpu.sh [OUTDIR]        (default /tmp/attention-check)
# (XT_CHECK_DEVICE=cpu runs the same steps on the CPU: a dry run of the script itself.)
# Steps, each under its own timeout, each recorded (a failure does not stop the next step):
#   1. tests/test_flash_attention.py on CUDA, smallest shapes first: one test per quantity (out,
#      lse, dq, dk, dv), head_dim, dtype and shape, so a failure names what and where; then
#      determinism, GQA, recompute, qk_norm_rope bitwise against rms_norm + rope, bad inputs.
#   2. the suites of the kernels that share helpers with the new ones (rope.cu, rmsnorm.cu, through
#      kernels/common.h and cuda/common.cuh): tests/test_ops_model.py -k "rope or rms_norm or sdpa"
#      and tests/test_heads.py.
#   3. the model, which now runs qk_norm_rope + flash_attention: tests/test_model.py (parity with
#      the torch reference at head_dim 16 (fallback kernels) and 32 (tensor cores), recompute on/off
#      bitwise in float32 and bf16, ...) and tests/test_saved_versions.py.
#   4. bench/ops.py --only flash,qk_prep: xtrain vs torch flash SDPA at [32,24,256,32],
#      [8,24,1024,32], [4,12,2048,64] and the head preparation vs rms_norm + rope and torch.
# OUTDIR gets attention.log/.xml, kernels.log, model.log, bench.log, bench.json and summary.txt.
set -u
out=${1:-/tmp/attention-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=$(command -v python3)
dev=${XT_CHECK_DEVICE:-cuda}
export PYTHONUNBUFFERED=1
declare -A status

run() {  # run NAME LIMIT LOG CMD...
  local name=$1 limit=$2 log=$3
  shift 3
  local t0=$(date +%s)
  echo "=== [$name] $*"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  local s=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then status[$name]="pass (${s}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status[$name]="fail: timeout after ${limit}s"
  else status[$name]="fail: exit $rc (${s}s)"; fi
  echo "=== [$name] ${status[$name]}"
}

"$py" -c "import xtrain, torch; print('xtrain', xtrain.__file__, '| cuda available:', xtrain.cuda.is_available(), '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" \
  2>&1 | tee "$out/env.txt"

run attention 420 "$out/attention.log" "$py" -m pytest tests/test_flash_attention.py --device "$dev" -q -rfEs \
  -p no:cacheprovider --junitxml="$out/attention.xml"
run kernels 240 "$out/kernels.log" bash -c "'$py' -m pytest tests/test_heads.py --device $dev -q -rfE -p no:cacheprovider \
  && '$py' -m pytest tests/test_ops_model.py --device $dev -q -rfE -p no:cacheprovider -k 'rope or rms_norm or sdpa'"
run model 300 "$out/model.log" "$py" -m pytest tests/test_model.py tests/test_saved_versions.py --device "$dev" -q -rfE \
  -p no:cacheprovider
touch "$out/.bench_start"
if [ "$dev" = cuda ]; then
  run bench 300 "$out/bench.log" "$py" bench/ops.py --only flash,qk_prep
else  # a smoke run of the bench code at small shapes
  run bench 300 "$out/bench.log" "$py" bench/ops.py --device cpu --preset tiny --batch 2 --seq 32 --only flash,qk_prep \
    --flash-shapes 2x4x64x32 --target-ms 5 --steps 2 --warmup 1 --out "$out"
fi
newest=$(find bench/results -name 'ops-*.json' -newer "$out/.bench_start" 2>/dev/null | sort | tail -1)
[ -n "$newest" ] && cp "$newest" "$out/bench.json"
rm -f "$out/.bench_start"

# ---------------------------------------------------------------- summary
{
  echo "attention check: $(date -u +%FT%TZ), $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-60)"
  for name in attention kernels model bench; do echo "  $name: ${status[$name]:-not run}"; done
  "$py" - "$out/attention.xml" <<'EOF'
import collections, re, sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as e:
    print(f"  (no junit xml: {e})"); sys.exit()
# test_flash_attention_matches_torch[cuda-S7-B2-H4/2-causal-D64-bfloat16-dq] -> table by shape and
# dtype/D, one letter per quantity: . pass, F fail, s skip
table = collections.OrderedDict()
other = []
for case in root.iter("testcase"):
    name = case.get("name")
    res = "F" if case.find("failure") is not None or case.find("error") is not None else \
        "s" if case.find("skipped") is not None else "."
    m = re.match(r"test_flash_attention_matches_torch\[\w+-(S\d+-B\d+-H\d+/\d+-\w+)-(D\d+)-(\w+)-(\w+)\]", name)
    if m:
        shape, D, dtype, what = m.groups()
        short = {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
        table.setdefault(shape, collections.OrderedDict()).setdefault(f"{D} {short}", {})[what] = res
    elif res == "F":
        other.append(name)
print("  parity with torch (out lse dq dk dv: . pass, F fail, s skip):")
for shape, cols in table.items():
    cells = "  ".join(f"{c}: " + "".join(v.get(w, "-") for w in ("out", "lse", "dq", "dk", "dv"))
                      for c, v in cols.items())
    print(f"    {shape:26s} {cells}")
total = sum(1 for _ in root.iter("testcase"))
failed = sum(1 for c in root.iter("testcase") if c.find("failure") is not None or c.find("error") is not None)
print(f"  tests: {total}, failed: {failed}" + ("" if not other else "; other failures: " + ", ".join(other[:12])))
EOF
  grep -E "^(flash_attention|qk_norm_rope)" "$out/bench.log" 2>/dev/null | sed 's/^/  /'
} | tee "$out/summary.txt"
