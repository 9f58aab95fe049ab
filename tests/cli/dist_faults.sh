#!/usr/bin/env bash
# Faults in a 2-rank CPU job (mpirun): a killed rank ends the job naming it; a rank that stops
# answering ends the job at dist.timeout_s with an error naming the waiting rank and collective; a
# SIGTERM to one rank makes both save one checkpoint and exit 143, and the run resumes from it.
. "$(dirname "$0")/run_common.sh"
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun"; exit 77; }
MPI="mpirun --oversubscribe --allow-run-as-root -np 2"
make_run "  max_steps: 1000000
  epochs: 100000
  global_batch_tokens: 256
dist:
  timeout_s: 4
"
# The PID of rank $1 of the job writing into output_dir $2.
rank_pid() {
  for p in $(pgrep -f "output_dir=$2"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo $p; return; }
  done
}
start() {  # start NAME: the job in the background, once it has trained a step
  ( cd "$T" && exec $MPI "$Q" train --config train.yaml --set output_dir=$1 ) > "$T/$1.log" 2>&1 &
  job=$!
  for _ in $(seq 600); do [ -s "$T/$1/metrics.jsonl" ] && break; sleep 0.1; done
  [ -s "$T/$1/metrics.jsonl" ] || { cat "$T/$1.log"; fail "$1: no step trained"; }
}
finish() {  # finish NAME SECONDS: waits at most SECONDS for the job; its exit status in rc
  for _ in $(seq $(($2 * 10))); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  kill -0 $job 2>/dev/null && { kill -9 $job; cat "$T/$1.log"; fail "$1: still running after $2 s"; }
  wait $job; rc=$?
}

start killed
kill -9 "$(rank_pid 1 killed)"
finish killed 60
[ $rc -ne 0 ] || fail "killed: exit 0"
grep -Eq "rank 1|\[\[[0-9]+,1\],1\]" "$T/killed.log" || { cat "$T/killed.log"; fail "killed: rank 1 not named"; }

start stopped
p=$(rank_pid 1 stopped)
kill -STOP "$p"
finish stopped 60
kill -9 "$p" 2>/dev/null
[ $rc -ne 0 ] || fail "stopped: exit 0"
grep -q "rank 0: .* did not finish within dist.timeout_s = 4 s" "$T/stopped.log" || { cat "$T/stopped.log"; fail "stopped: no timeout error"; }

start term
kill -TERM "$(rank_pid 1 term)"
finish term 60
[ $rc -ne 0 ] || fail "term: exit 0"
grep -q "saved .*checkpoint-[0-9]* and stopped" "$T/term.log" || { cat "$T/term.log"; fail "term: no checkpoint"; }
ls -d "$T"/term/checkpoint-* >/dev/null 2>&1 || fail "term: no checkpoint directory"
sed -i 's/max_steps: 1000000/max_steps: 3/' "$T/train.yaml"
( cd "$T" && $MPI "$Q" train --config train.yaml --set output_dir=term --set train.resume=auto ) > "$T/resume.log" 2>&1 ||
  { cat "$T/resume.log"; fail "resume after SIGTERM"; }
grep -q "resume: .*checkpoint-" "$T/resume.log" || fail "did not resume"
echo "DIST_FAULTS_OK"
