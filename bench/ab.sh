#!/usr/bin/env bash
# Same-call A/B of qwentune builds or settings, end to end (machine starts differ by up to ~2 %, so
# only runs alternated within one device call compare). Each variant is "label|ENV=V ...|binary";
# every round runs them all in the given order and prints one line per run.
#   bench/ab.sh PRESET ROUNDS 'base||.device/bin/qwentune' 'new||.device/new/qwentune'
set -u
preset=$1 rounds=$2
shift 2
log=${OUT:-/tmp}/ab_bench.log
for ((r = 1; r <= rounds; ++r)); do
  for v in "$@"; do
    IFS='|' read -r label envs bin <<<"$v"
    # shellcheck disable=SC2086
    env $envs timeout 150 "$bin" bench --preset "$preset" --steps 5 --warmup 2 >"$log" 2>&1
    tail -1 "$log" | python3 -c "
import json, sys
try:
    d = json.loads(sys.stdin.read())
except ValueError:
    print('$preset $label round $r: no result (see $log)'); sys.exit(0)
print('$preset %-12s round $r: %6.0f tok/s  median step %.4f s  mfu %.4f  mem %.1f GiB  kernels %d' % (
    '$label', d['tokens_per_s'], d['median_step_s'], d['mfu_6nd'], d.get('device_mem_used_gib', 0.0),
    d['kernels_per_step']))"
  done
done
