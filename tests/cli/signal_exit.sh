#!/usr/bin/env bash
# SIGTERM / SIGINT: the run saves a checkpoint and exits 128 + the signal (143 / 130), and resume
# continues from it.
. "$(dirname "$0")/run_common.sh"
make_run "  max_steps: 1000000
  epochs: 100000
"
for sig in TERM INT; do
  rm -rf "$T/run"
  ( cd "$T" && exec "$Q" train --config train.yaml ) > "$T/log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do [ -s "$T/run/metrics.jsonl" ] && break; sleep 0.1; done
  kill -$sig $pid
  wait $pid; rc=$?
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  [ $rc -eq $want ] || { cat "$T/log"; fail "SIG$sig: exit $rc, expected $want"; }
  grep -q "saved .*checkpoint-[0-9]* and stopped" "$T/log" || fail "SIG$sig: no save message"
done
sed -i 's/max_steps: 1000000/max_steps: 3/' "$T/train.yaml"
"$Q" train --config "$T/train.yaml" --set train.resume=auto > "$T/log2" 2>&1 || { cat "$T/log2"; fail "resume after SIGINT"; }
grep -q "resume: .*checkpoint-" "$T/log2" || fail "did not resume"
echo "SIGNAL_EXIT_OK"
