#!/usr/bin/env bash
# The README's test command: set up what the suites need, then run the C++ (GoogleTest via ctest)
# and Python (pytest) suites. Any failure fails the script; pytest finding no test fails it too.
# Extra arguments go to pytest (e.g. --device cuda on a GPU machine, or a test file).
#
# Set-up on a fresh Debian machine with Python (each step is skipped when already done), each step
# announced with the time it took:
#   - Debian packages: a C++ compiler, the Python headers and GoogleTest; installed with apt-get
#     when run as root, otherwise the script prints the one command to run and stops.
#   - PyTorch, the tests' reference: with no torch installed and no GPU visible, the CPU build
#     (XT_TORCH, default torch==2.13.0) goes in first, so the test extras do not pull a
#     multi-GB CUDA build; an installed torch is left alone.
#   - The build tools into the environment itself (the C++ suite's CMake build runs outside pip's
#     isolated build environment), then xtrain with its test extras.
# XT_TEST_EXTRAS (default `test`) names the extras installed with xtrain: CI adds `parquet,hub`,
# whose tests otherwise skip (pyarrow, datasets and pandas are ~300 MB).
# The CUDA backend is compiled when a GPU is visible, or when XT_TEST_CUDA=1 (then the cuBLAS and
# NCCL wheels, ~1.1 GB, go in first): CI sets it to compile the CUDA code on a machine with nvcc
# and no GPU (.ci/run). Without either, the build is CPU-only: about 5 minutes and 1.4 GB in a fresh venv.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
pip_install() { python3 -m pip install -q ${XT_PIP_FLAGS:-} "$@"; }
t0=$SECONDS
t_step=$SECONDS
step() { echo "scripts/test.sh [$((SECONDS - t0))s, previous step $((SECONDS - t_step))s]: $*"; t_step=$SECONDS; }

gpu_visible() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }
cuda=OFF
if [ "${XT_TEST_CUDA:-}" = 1 ] || gpu_visible; then cuda=ON; fi

missing=()
command -v c++ >/dev/null || missing+=(g++)
python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1
  else
    echo "scripts/test.sh: missing ${missing[*]}; install them first: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

if ! python3 -c 'import torch' 2>/dev/null && ! gpu_visible; then
  step "installing PyTorch's CPU build (${XT_TORCH:-torch==2.13.0}), the tests' reference"
  pip_install "${XT_TORCH:-torch==2.13.0}"
fi
if [ "$cuda" = ON ]; then
  # The `cuda` extra's wheels go in before xtrain is built: its CMake build looks for them.
  step "installing the cuBLAS and NCCL wheels (the CUDA backend is compiled)"
  pip_install nvidia-cublas nvidia-nccl-cu13
fi
step "installing the build tools and the test extras"
pip_install cmake ninja pybind11 scikit-build-core scipy-openblas32
step "building and installing xtrain (CUDA backend: $cuda; ~1.5 minutes on 2 cores CPU-only, ~2.5 with CUDA)"
pip_install --no-build-isolation -Ccmake.define.XTRAIN_CUDA=$cuda ".[${XT_TEST_EXTRAS:-test}]"

# C++ suite: a CPU-only CMake build of the core plus tests/cpp (CUDA tests are compiled only in
# CUDA builds; scripts/gpu_session.sh runs those on the GPU machine).
step "building the C++ suite"
cmake -S . -B build/ctest -G Ninja -DXTRAIN_BUILD_TESTS=ON -DXTRAIN_CUDA=OFF \
  -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build/ctest -j "$(nproc)"
step "running the C++ suite (ctest)"
ctest --test-dir build/ctest --output-on-failure
# Python suite, from a directory where `import xtrain` resolves to the installed package.
step "running the Python suite (pytest; about 4 minutes on 2 cores)"
python3 -m pytest -q -rs -p no:cacheprovider tests "$@"
step "done"
