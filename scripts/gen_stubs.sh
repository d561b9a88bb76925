#!/usr/bin/env bash
# Type stubs of xtrain._C (python/xtrain/_C/*.pyi), so editors complete the compiled API:
# pybind11-stubgen on a built extension, with the xtrain package imported (Tensor's operators and
# methods installed from Python appear too). The committed stubs describe a CUDA build with NCCL
# (what CI builds); tests/test_stubs.py fails when they no longer match the module.
#   scripts/gen_stubs.sh [PYTHONPATH]              regenerate python/xtrain/_C/*.pyi from the xtrain
#                                                  importable there, e.g. build-cuda/pkg (scripts/dev.sh)
#   scripts/gen_stubs.sh --into DIR [PYTHONPATH]   write DIR/*.pyi instead (tests/test_stubs.py)
#   scripts/gen_stubs.sh --into DIR --module FILE  the stubs of the extension FILE, imported as
#                                                  xtrain._C beside this checkout's python/xtrain
#                                                  (the build's step, CMakeLists.txt)
# Needs pybind11-stubgen (the `test` extra) and numpy in $PYTHON (default python3). A C++ type
# left in a signature (a type bound after its first use) is an error: no stubs are written.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
into="" module=""
while [ $# -gt 0 ]; do
  case "$1" in
    --into) into=${2:?--into needs a directory}; shift 2 ;;
    --module) module=${2:?--module needs the extension file}; shift 2 ;;
    *) break ;;
  esac
done
path=${1:-${PYTHONPATH:-}}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "$module" ]; then
  mkdir -p "$work/pkg/xtrain"
  for f in "$root"/python/xtrain/*; do
    [ "$(basename "$f")" = _C ] || ln -s "$f" "$work/pkg/xtrain/"
  done
  ln -s "$(realpath "$module")" "$work/pkg/xtrain/"
  path="$work/pkg"
fi
PYTHONPATH=$path${PYTHONPATH:+:$PYTHONPATH} "$python" -m pybind11_stubgen xtrain._C -o "$work/out" --numpy-array-use-type-var --exit-code
if [ -n "$into" ]; then
  mkdir -p "$into"
  cp "$work/out/xtrain/_C/"*.pyi "$into/"
else
  rm -rf "$root/python/xtrain/_C"
  cp -r "$work/out/xtrain/_C" "$root/python/xtrain/_C"
fi
