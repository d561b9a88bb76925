#!/usr/bin/env bash
# Build the CUDA-kernel emulation test with the host compiler and run it (no GPU needed):
#   tests/emu/run.sh [--quick]      (flash attention and the q/k head preparation; --prep: the latter only;
#                                    --documents: attention within documents only)
#   tests/emu/run.sh rmsnorm        (RMSNorm's one-pass backward, the fused residual add, the few-row forward)
#   tests/emu/run.sh layernorm      (LayerNorm: forward with the fused residual add, the one-pass backward, the two-pass one)
#   tests/emu/run.sh linear_rows    (the decode step's matrix-vector kernel)
#   tests/emu/run.sh cross_entropy  (the one-pass cross-entropy forward, reduce and backward)
#   tests/emu/run.sh optim          (AdamW over ranges in 16-byte packs, the global norm's staged partials)
#   tests/emu/run.sh muon           (Muon's momentum, normalisation and apply against the CPU kernels)
#   tests/emu/run.sh fp8 [--full]   (the FP8 conversion against cuda_fp8.hpp; the amax and cast kernels)
#   tests/emu/run.sh column_sum     (sum_to's column sums: a bias gradient, in the documented order)
# Needs the CPU build (scripts/dev.sh cpu ...: its libxtrain_core.a holds the reference kernels) and
# the CUDA headers (cuda_runtime.h, cuda_bf16.h; cublas_v2.h, which common.cuh includes). About a
# minute to build and a minute to run on one core.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${XT_EMU_BUILD:-$root/build-cpu}
cuda_inc=${CUDA_INC:-/usr/local/cuda/include}
cublas_inc=$(python3 -c "import nvidia.cu13 as m; print(list(m.__path__)[0] + '/include')" 2>/dev/null || true)
test=flash_attention
case "${1:-}" in rmsnorm | layernorm | linear_rows | cross_entropy | optim | muon | fp8 | column_sum) test=$1; shift ;; esac  # tests/emu/run.sh NAME: tests/emu/NAME_emu.cpp
exe=$build/${test}_emu
# The CPU reference kernels call the CPU GEMM (OpenBLAS, the library the CPU build linked).
openblas=$(sed -n 's/^XT_OPENBLAS_LIB:FILEPATH=//p' "$build/CMakeCache.txt")
g++ -std=c++17 -O2 -g -DXT_CUDA_EMULATION -include "$root/tests/emu/cuda_emu.h" -I"$root/csrc" -I"$cuda_inc" \
  ${cublas_inc:+-I"$cublas_inc"} -Wall -Wno-unknown-pragmas -Wno-unused-parameter \
  "$root/tests/emu/${test}_emu.cpp" "$build/libxtrain_core.a" \
  ${openblas:+"$openblas" -Wl,-rpath,"$(dirname "$openblas")"} -lpthread -o "$exe"
"$exe" "$@"
