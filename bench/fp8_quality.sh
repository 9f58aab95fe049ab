#!/usr/bin/env bash
# train.precision fp8 against bf16 on generated chat data (docs/fp8.md): for each preset, one random
# init and one data order, 300 steps of 8192-token rows in each precision; prints what
# tools/compare_loss_curves.py finds (the 20-step smoothed relative loss gap, its last-100-step mean:
# fp8_loss_gap_<preset>, the gradient norms) as one JSON line per preset.
#   fp8_quality.sh QWENTUNE MAKE_SYNTHETIC_ULTRACHAT TOKENIZER_JSON SCRATCH_DIR [PRESET ...]   (default 0.8b 2b)
# Each run saves its final checkpoint (weights and optimizer state: ~25 GB at 2b) into SCRATCH_DIR.
set -eu
qt=$1 synth=$2 tok=$3 out=$4
shift 4
presets=("$@")
[ ${#presets[@]} -eq 0 ] && presets=(0.8b 2b)
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${FP8_QUALITY_STEPS:-300}
rm -rf "$out" && mkdir -p "$out"
# ~1,400 tokens a conversation under Qwen's tokenizer: 4,000 cover 300 rows of 8192 with room.
"$synth" --out "$out/chat" --rows 4000 --shards 1 --test-rows 10 >/dev/null
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
