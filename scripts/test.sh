#!/usr/bin/env bash
# The README's test command: set up what the suites need, then run the C++ (GoogleTest via ctest)
# and Python (pytest) suites. Any failure fails the script; pytest finding no test fails it too.
# Extra arguments go to pytest (e.g. --device cuda on a GPU machine). CI runs exactly this.
#
# Set-up on a fresh Debian machine with Python (each step is skipped when already done):
#   - Debian packages: a C++ compiler, the Python headers and GoogleTest; installed with apt-get
#     when run as root, otherwise the script prints the one command to run and stops.
#   - PyTorch, the tests' reference: with no torch installed and no GPU visible, the CPU build
#     (XT_TORCH, default torch==2.13.0) goes in first, so the test extras do not pull a
#     multi-GB CUDA build; an installed torch is left alone.
#   - With nvcc on PATH, the cuBLAS/NCCL wheels (extra `cuda`) first, so the CUDA backend is
#     compiled too (CI has nvcc but no GPU: the CPU suite runs).
#   - The build tools into the environment itself (the C++ suite's CMake build runs outside pip's
#     isolated build environment), then xtrain with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
pip_install() { python3 -m pip install -q ${XT_PIP_FLAGS:-} "$@"; }

missing=()
command -v c++ >/dev/null || missing+=(g++)
python3 -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  || missing+=(python3-dev)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "scripts/test.sh: missing ${missing[*]}; install them first: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

if ! python3 -c 'import torch' 2>/dev/null && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  pip_install "${XT_TORCH:-torch==2.13.0}"
fi
# The `cuda` extra's wheels go in before xtrain is built: its CMake build looks for them.
command -v nvcc >/dev/null && pip_install nvidia-cublas nvidia-nccl-cu13
pip_install cmake ninja pybind11 scikit-build-core scipy-openblas32
pip_install --no-build-isolation ".[test]"

# C++ suite: a CPU-only CMake build of the core plus tests/cpp (CUDA tests are compiled only in
# CUDA builds; scripts/gpu_session.sh runs those on the GPU machine).
cmake -S . -B build/ctest -G Ninja -DXTRAIN_BUILD_TESTS=ON -DXTRAIN_CUDA=OFF \
  -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build/ctest -j "$(nproc)"
ctest --test-dir build/ctest --output-on-failure
# Python suite, from a directory where `import xtrain` resolves to the installed package.
python3 -m pytest -q -rs -p no:cacheprovider tests "$@"
