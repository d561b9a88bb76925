#!/usr/bin/env bash
# Install xtrain with its test extras, then run the C++ (GoogleTest via ctest) and Python
# (pytest) suites. Any failure fails the script; pytest finding no test fails it too.
# Extra arguments go to pytest (e.g. --device cuda on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install ${XT_PIP_FLAGS:-} ".[test]"
# C++ suite: a CPU-only CMake build of the core plus tests/cpp (CUDA tests are compiled only in
# CUDA builds; scripts/gpu_round.sh runs those on the GPU machine).
cmake -S . -B build/ctest -G Ninja -DXTRAIN_BUILD_TESTS=ON -DXTRAIN_CUDA=OFF \
  -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build/ctest -j "$(nproc)"
ctest --test-dir build/ctest --output-on-failure
# Python suite, from a directory where `import xtrain` resolves to the installed package.
python3 -m pytest -q -rs -p no:cacheprovider tests "$@"
