#!/usr/bin/env bash
# train.precision fp8 against bf16 on generated chat data (docs/fp8.md): for each preset, one random
# init and one data order, N (300) steps of 8192-token rows in each precision; prints what
# tools/compare_loss_curves.py finds (the 20-step smoothed relative loss gap, its last-100-step mean:
# fp8_loss_gap_<preset>, the gradient norms) as one JSON line per preset.
#   fp8_quality.sh [--steps N] QWENTUNE MAKE_SYNTHETIC_ULTRACHAT TOKENIZER_JSON SCRATCH_DIR [PRESET ...]
#   (default 300 steps, presets 0.8b 2b)
# Each run saves its final checkpoint (weights and optimizer state: ~25 GB at 2b) into SCRATCH_DIR,
# which must be new, empty, or one this script made (it is cleared: nothing else is ever deleted).
set -eu
steps=300
if [ "${1:-}" = --steps ]; then
  steps=${2:-}
  shift 2 || true
fi
case $steps in '' | *[!0-9]* | 0*) echo "fp8_quality.sh: --steps needs a positive integer, got '$steps'" >&2; exit 2 ;; esac
[ $# -ge 4 ] || { echo "usage: fp8_quality.sh [--steps N] QWENTUNE MAKE_SYNTHETIC_ULTRACHAT TOKENIZER_JSON SCRATCH_DIR [PRESET ...]" >&2; exit 2; }
qt=$1 synth=$2 tok=$3 out=$4
shift 4
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(0.8b 2b)
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ] && [ ! -f "$out/.fp8_quality" ]; then
  echo "fp8_quality.sh: $out is not empty and was not made by this script; give a new directory" >&2
  exit 2
fi
rm -rf "$out" && mkdir -p "$out" && touch "$out/.fp8_quality"
# ~1,400 tokens a conversation under Qwen's tokenizer: 4,000 cover 300 rows of 8192 with room.
"$synth" --out "$out/chat" --rows $((steps > 300 ? steps * 14 : 4000)) --shards 1 --test-rows 10 >/dev/null
for p in "${presets[@]}"; do
  "$qt" init-model --preset "$p" --out "$out/init_$p" --tokenizer "$tok" --seed 11 >/dev/null
  for prec in bf16 fp8; do
    t0=$SECONDS
    "$qt" train --config "$root/examples/demo/demo.yaml" --set model="$out/init_$p" --set data.path="$out/chat" \
      --set data.split=train_sft --set data.cache_dir="$out/cache" --set data.tokens_per_batch=8192 \
      --set train.global_batch_tokens=8192 --set train.max_steps="$steps" --set train.epochs=1 --set train.lr=3e-4 \
      --set train.warmup_steps=20 --set train.backend=cuda --set train.log_every=50 --set train.save_every=0 \
      --set train.precision=$prec --set output_dir="$out/${p}_$prec" >"$out/${p}_$prec.log" 2>&1 ||
      { echo "{\"run\": \"${p}_$prec\", \"failed\": true}"; tail -5 "$out/${p}_$prec.log"; continue; }
    echo "{\"run\": \"${p}_$prec\", \"wall_s\": $((SECONDS - t0))}"
  done
  python3 "$root/tools/compare_loss_curves.py" --name "$p" "$out/${p}_bf16/metrics.jsonl" "$out/${p}_fp8/metrics.jsonl"
done
