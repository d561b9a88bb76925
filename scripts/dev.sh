#!/usr/bin/env bash
# Developer loop without pip: configure + build into build-NAME, then lay out an importable
# package in build-NAME/pkg (links to python/xtrain plus the freshly built _C).
#   scripts/dev.sh NAME [cmake -D options...]    e.g. scripts/dev.sh cpu -DXTRAIN_CUDA=OFF
#   PYTHONPATH=build-NAME/pkg python -m pytest tests/...
# The installed route for users stays `pip install .`.
set -euo pipefail
name=${1:?usage: scripts/dev.sh NAME [cmake options]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
bdir="$root/build-$name"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
if [ ! -f "$bdir/build.ninja" ]; then
  cmake -S "$root" -B "$bdir" -G Ninja -DXTRAIN_BUILD_TESTS=ON -DPython_EXECUTABLE="$(command -v python3)" \
    "${launcher[@]}" "$@" >/dev/null
fi
cmake --build "$bdir" -j "${XT_JOBS:-2}"
pkg="$bdir/pkg/xtrain"
rm -rf "$bdir/pkg"
mkdir -p "$pkg"
for f in "$root"/python/xtrain/*; do ln -s "$f" "$pkg/"; done
ln -s "$(ls "$bdir"/_C*.so | head -1)" "$pkg/"
echo "PYTHONPATH=$bdir/pkg"
