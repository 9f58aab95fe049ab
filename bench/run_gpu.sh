#!/usr/bin/env bash
# One GPU-machine session: the CUDA op harness, the kernel benchmarks, the end-to-end bench and
# the transformers/cuDNN baselines, each logged to $OUT, a short summary last.
#   BIN=dir-with-binaries LIB=dir-with-extra-.so bench/run_gpu.sh [quick]
# Binaries are built elsewhere (the GPU machine lacks some -dev packages); LIB holds the shared
# libraries they need that the machine lacks.
set -u
BIN=${BIN:-build-cuda}
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=${LIB:-}:${LD_LIBRARY_PATH:-}
export QWENTUNE_THREADS=${QWENTUNE_THREADS:-16}
log() { echo "== $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
log "op harness (Cuda*, OpsTest*)"
timeout 240 "$BIN/qwentune_tests" --gtest_filter='OpsTest.*:CudaGdn.*:CudaAttention.*' >"$OUT/harness.log" 2>&1
echo "harness exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$OUT/harness.log" | head -40
log "kernel benchmarks"
timeout 120 "$BIN/bench_cuda_ops" ${1:+--quick} >"$OUT/bench_ops.log" 2>&1; tail -14 "$OUT/bench_ops.log"
timeout 60 "$BIN/bench_gdn" 10 >"$OUT/bench_gdn.log" 2>&1; tail -10 "$OUT/bench_gdn.log"
timeout 60 "$BIN/bench_attention" --iters 10 >"$OUT/bench_attn.log" 2>&1; tail -8 "$OUT/bench_attn.log"
timeout 90 python3 tools/bench_sdpa.py --iters 10 >"$OUT/bench_sdpa.log" 2>&1; tail -3 "$OUT/bench_sdpa.log"
log "end to end"
timeout 200 "$BIN/qwentune" bench --preset 2b --steps 4 --warmup 2 >"$OUT/bench_2b.log" 2>&1; tail -3 "$OUT/bench_2b.log"
timeout 150 python3 tools/hf_baseline.py --preset 2b --steps 3 --warmup 1 >"$OUT/hf_2b.log" 2>&1; tail -2 "$OUT/hf_2b.log"
