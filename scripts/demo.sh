#!/usr/bin/env bash
# The embedded demo: sets up, builds, creates a tiny random Qwen3.5 model and inspects it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out=${QT_DEMO_DIR:-out/demo}
mkdir -p "$out"
build/src/qwentune init-model --preset tiny --out "$out/tiny-init"
build/src/qwentune inspect "$out/tiny-init"
