#!/usr/bin/env bash
# Install xtrain (CUDA, sm_90) on the bare GPU machine, for one-off benchmark or profiling calls.
#   source scripts/gpu_install.sh LOG    # exports PYTHONPATH when scipy-openblas32 comes from .whl/
# The GPU machine has no package registry: carry .whl/ (the scipy-openblas32 wheel) with the tree.
# scripts/gpu_round.sh does the same as its first step, plus the test suites.
_log=${1:-/tmp/xtrain-install.log}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
if ! python3 -c "import scipy_openblas32" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/scipy_openblas32-*.whl >>"$_log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# A fixed build directory: a second install in the same session rebuilds only what changed, and
# the GoogleTest binary built beside the extension runs with `ctest --test-dir /tmp/xtrain-build`.
python3 -m pip install --no-build-isolation --no-deps -q --config-settings=build-dir=/tmp/xtrain-build \
  --config-settings=cmake.define.XTRAIN_CUDA=ON --config-settings=cmake.define.XTRAIN_CUDA_ARCHS=90 \
  --config-settings=cmake.define.XTRAIN_BUILD_TESTS=ON . >>"$_log" 2>&1 \
  && python3 -c "import xtrain; print('xtrain', xtrain.cuda.runtime_info())"
