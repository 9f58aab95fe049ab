# Shared by the CLI test scripts: $Q (the qwentune binary), $T (a fresh scratch dir), and a tiny
# model + addition data set + config in $T. Exit 77 = skipped (ctest SKIP_RETURN_CODE).
set -u
Q=$1
T=$2
rm -rf "$T" && mkdir -p "$T"
fail() { echo "FAIL: $*" >&2; exit 1; }
make_run() {  # make_run EXTRA_TRAIN_KEYS
  "$Q" init-model --preset tiny --dtype f32 --out "$T/init" >/dev/null 2>&1 || fail "init-model"
  : > "$T/train.jsonl"
  for a in 0 1 2 3 4 5 6 7 8 9; do for b in 0 1 2 3 4 5; do
    printf '{"messages": [{"role": "user", "content": "What is %d+%d?"}, {"role": "assistant", "content": "%d"}]}\n' \
      $a $b $((a + b)) >> "$T/train.jsonl"
  done; done
  printf 'model: init\noutput_dir: run\ndata:\n  path: train.jsonl\n  thinking: off\n  tokens_per_batch: 128\ntrain:\n  lr: 3.0e-3\n  log_every: 0\n%s' "$1" > "$T/train.yaml"
}
