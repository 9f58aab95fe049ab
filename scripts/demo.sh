#!/usr/bin/env bash
# The embedded demo: sets up, builds, creates a tiny random Qwen3.5, measures its accuracy on
# single-digit addition (0%), fine-tunes it on generated chat dialogues, and measures again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
qt=$PWD/build/src/qwentune
out=${QT_DEMO_DIR:-out/demo}
rm -rf "$out"
mkdir -p "$out"
examples/demo/make_data.sh "$out" 24 1
cp examples/demo/demo.yaml "$out/demo.yaml"
"$qt" init-model --preset tiny --out "$out/init" --dtype f32 --seed 0
"$qt" inspect "$out/init"
echo "== accuracy before training"
"$qt" generate --model "$out/init" --eval "$out/eval.jsonl" --max-new-tokens 4
echo "== training (qwentune train --config $out/demo.yaml)"
start=$(date +%s)
"$qt" train --config "$out/demo.yaml"
echo "== training took $(( $(date +%s) - start )) s; accuracy after training"
"$qt" generate --model "$out/run/final" --eval "$out/eval.jsonl" --max-new-tokens 4
"$qt" generate --model "$out/run/final" --prompt "What is 7+8?" --max-new-tokens 4
