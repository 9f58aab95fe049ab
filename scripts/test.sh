#!/usr/bin/env bash
# Sets up, builds (warnings are errors) and runs every test. GPU tests skip themselves when no GPU
# is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DQT_WERROR=ON
# Fixtures too big for git (.cache/testdata); tests fail without them unless QT_ALLOW_MISSING_TESTDATA=1.
if ! scripts/fetch_test_data.sh; then
  [ "${QT_ALLOW_MISSING_TESTDATA:-0}" = 1 ] || { echo "test: scripts/fetch_test_data.sh failed" >&2; exit 1; }
fi
cd build
ctest --output-on-failure -j "${QT_JOBS:-$(nproc)}"
