#!/usr/bin/env bash
# Configures and builds into build/ (CUDA backend when nvcc + cuBLAS are found). Extra arguments go
# to the configure step, e.g. scripts/build.sh -DQT_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${QT_JOBS:-$(nproc)}
cmake --preset release "$@" >/dev/null
cmake --build build -j "$jobs"
