#!/usr/bin/env bash
# A save onto a full disk: a clear error naming the file and the bytes, no temp files left, the
# previous checkpoint loadable. Needs a small tmpfs (root, mount allowed), else skipped.
. "$(dirname "$0")/run_common.sh"
mkdir -p "$T/mnt"
mount -t tmpfs -o size=1m tmpfs "$T/mnt" 2>/dev/null || { echo "skip: cannot mount a tmpfs here"; exit 77; }
trap 'umount "$T/mnt" 2>/dev/null' EXIT
# 1. The writer itself: a 1.4 MB model into 1 MiB.
out=$("$Q" init-model --preset tiny --dtype f32 --out "$T/mnt/m" 2>&1); rc=$?
echo "$out"
[ $rc -eq 1 ] || fail "init-model on a full disk exited $rc"
echo "$out" | grep -q "no space left on device: the file needs [0-9]* bytes" || fail "no clear ENOSPC message"
[ -z "$(ls -A "$T/mnt")" ] || fail "left files behind: $(ls -A "$T/mnt")"
umount "$T/mnt"
# 2. A run whose second checkpoint does not fit: the first stays loadable.
mount -t tmpfs -o size=9m tmpfs "$T/mnt" || exit 77
make_run "  max_steps: 4
  save_every: 2
"
sed -i "s|output_dir: run|output_dir: $T/mnt/run|" "$T/train.yaml"
out=$("$Q" train --config "$T/train.yaml" 2>&1); rc=$?
echo "$out" | tail -3
[ $rc -eq 1 ] || fail "train on a full disk exited $rc"
echo "$out" | grep -q "not enough free disk space for the checkpoint: it needs [0-9]* bytes" || fail "no free-space message"
ls "$T/mnt/run" | grep -q "tmp-" && fail "temp dir left: $(ls "$T/mnt/run")"
"$Q" inspect "$T/mnt/run/checkpoint-2" >/dev/null || fail "checkpoint-2 not loadable"
[ -f "$T/mnt/run/checkpoint-2/.qwentune-complete" ] || fail "checkpoint-2 not complete"
echo "DISK_FULL_OK"
