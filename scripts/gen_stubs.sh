#!/usr/bin/env bash
# Regenerate the type stubs of xtrain._C (python/xtrain/_C/*.pyi) from a built extension, so
# editors complete the compiled API. Needs `pip install pybind11-stubgen`.
#   scripts/gen_stubs.sh [PYTHONPATH of a build, e.g. build-lead/pkg]
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
PYTHONPATH=${1:-${PYTHONPATH:-}} pybind11-stubgen xtrain._C -o "$out" --numpy-array-use-type-var
rm -rf python/xtrain/_C
cp -r "$out/xtrain/_C" python/xtrain/_C
rm -rf "$out"
