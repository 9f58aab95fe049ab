#!/usr/bin/env bash
# report.html renders its plots from the run's data in a real headless browser (Debian's chromium).
. "$(dirname "$0")/run_common.sh"
browser=$(command -v chromium || command -v chromium-browser) || { echo "skip: no chromium"; exit 77; }
make_run "  max_steps: 6
  eval_fraction: 0.2
  eval_every: 2
"
"$Q" train --config "$T/train.yaml" > "$T/log" 2>&1 || { cat "$T/log"; fail "train"; }
dom=$(timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --user-data-dir="$T/profile" \
      --dump-dom "file://$T/run/report.html" 2>/dev/null)
echo "$dom" | grep -q 'data-rendered="true"' || fail "the page script did not run: $(echo "$dom" | head -c 400)"
# One point per step for the loss, lr, gradient norm and throughput; the eval points separately.
for metric in lr grad_norm tok_s; do
  echo "$dom" | grep -q "data-metric=\"$metric\"[^>]*data-points=\"6\"" || fail "$metric plot has no 6 points"
done
echo "$dom" | grep -q 'data-series="loss"[^>]*data-points="6"' || fail "loss series"
echo "$dom" | grep -q 'data-series="eval_loss"[^>]*data-points="3"' || fail "eval loss series"
echo "$dom" | grep -q '<polyline' || fail "no polyline drawn"
echo "REPORT_OK"
