#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test. GPU tests skip themselves when no GPU
# is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DQT_WERROR=ON
cd build
ctest --output-on-failure -j "${QT_JOBS:-$(nproc)}"
