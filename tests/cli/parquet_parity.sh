#!/usr/bin/env bash
# Acceptance of the parquet reader: `qwentune data-stats` gives identical conversations, tokens and
# trained_tokens for the ultrachat fixture as JSONL and as every parquet variant (and the shards).
#   parquet_parity.sh QWENTUNE_BIN FIXTURE_DIR SCRATCH_DIR
set -euo pipefail
qt=$1 dir=$2 tmp=$3
rm -rf "$tmp" && mkdir -p "$tmp"
"$qt" init-model --preset tiny --out "$tmp/tiny" >/dev/null 2>&1
stats() { "$qt" data-stats --tokenizer "$tmp/tiny" --data "$1" 2>/dev/null |
  sed -n 's/^ *"\(conversations\|tokens\|trained_tokens\)": \([0-9]*\),*$/\1=\2/p' | tr '\n' ' '; }
want=$(stats "$dir/ultrachat.jsonl")
[ -n "$want" ] || { echo "no stats for ultrachat.jsonl"; exit 1; }
echo "jsonl: $want"
fail=0
for f in "$dir"/snappy_dict.parquet "$dir"/zstd_v2_rg7.parquet "$dir"/gzip_plain.parquet "$dir"/uncompressed.parquet "$dir"/shards; do
  got=$(stats "$f")
  if [ "$got" = "$want" ]; then echo "ok   $(basename "$f"): $got"; else echo "DIFF $(basename "$f"): $got"; fail=1; fi
done
exit $fail
