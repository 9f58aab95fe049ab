#!/usr/bin/env bash
# Writes the demo's chat data set: single-digit addition dialogues in the ultrachat schema.
#   make_data.sh OUT_DIR [REPEATS] [SEED]
# OUT_DIR/train.jsonl: every a+b (a, b in 0..9) REPEATS times in a seeded random order, phrased a
#   few ways; OUT_DIR/eval.jsonl: the 100 questions with their answers ({prompt, answer}).
set -euo pipefail
out=${1:?usage: make_data.sh OUT_DIR [REPEATS] [SEED]}
repeats=${2:-24}
seed=${3:-1}
mkdir -p "$out"
awk -v repeats="$repeats" -v seed="$seed" -v out="$out" 'BEGIN {
  srand(seed);
  split("What is %d+%d?|Compute %d+%d.|%d+%d=?|Add %d and %d.", phr, "|");
  n = 0;
  for (r = 0; r < repeats; r++)
    for (a = 0; a <= 9; a++)
      for (b = 0; b <= 9; b++) {
        q = sprintf(phr[1 + int(rand() * 4)], a, b);
        line[n] = sprintf("{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": \"%d\"}]}", q, a + b);
        key[n] = rand(); n++;
      }
  # Shuffle by sorting on random keys (insertion into a permutation).
  for (i = 0; i < n; i++) perm[i] = i;
  for (i = n - 1; i > 0; i--) { j = int(rand() * (i + 1)); t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
  for (i = 0; i < n; i++) print line[perm[i]] > (out "/train.jsonl");
  for (a = 0; a <= 9; a++)
    for (b = 0; b <= 9; b++)
      printf("{\"prompt\": \"What is %d+%d?\", \"answer\": \"%d\"}\n", a, b, a + b) > (out "/eval.jsonl");
}'
echo "wrote $out/train.jsonl ($(wc -l < "$out/train.jsonl") dialogues) and $out/eval.jsonl (100 questions)"
