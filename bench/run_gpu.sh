#!/usr/bin/env bash
# One GPU-machine session in two phases, each logged to $OUT with a short summary:
#   kernels: the CUDA op harness and training-step tests (OpsTest, CudaGdn, CudaAttention,
#            CudaTrainStep) and the kernel benchmarks;
#   e2e:     qwentune bench --preset 2b (CUDA graph, and --no-graph) and 4b (also with GEMM tuning
#            off), the GPU correctness checks, the transformers baseline on the same shapes, the
#            cuDNN attention baseline.
#   BIN=dir-with-binaries LIB=dir-with-extra-.so bench/run_gpu.sh kernels|e2e
# Binaries are built elsewhere (the GPU machine lacks some -dev packages); LIB holds the shared
# libraries they need that the machine lacks.
set -u
phase=${1:-kernels}
BIN=${BIN:-build-cuda}
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=${LIB:-}:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
export QWENTUNE_THREADS=${QWENTUNE_THREADS:-16}
log() { echo "== $*"; }
if [ "$phase" = kernels ]; then
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  log "op harness"
  timeout 300 "$BIN/qwentune_tests" --gtest_filter='OpsTest.*:CudaGdn.*:CudaAttention.*:CudaTrainStep.*:CudaBackendEnv.*' >"$OUT/harness.log" 2>&1
  echo "harness exit $?"
  grep -E "^\[       OK|^\[  FAILED|tests ran|PASSED" "$OUT/harness.log" | sed 's/^\[       OK \] //' | cut -c1-110 | tail -45
  log "kernel benchmarks"
  timeout 100 "$BIN/bench_cuda_ops" >"$OUT/bench_ops.log" 2>&1; echo "rc $?"; tail -12 "$OUT/bench_ops.log"
  timeout 60 "$BIN/bench_gdn" 10 >"$OUT/bench_gdn.log" 2>&1; echo "rc $?"; tail -9 "$OUT/bench_gdn.log"
  timeout 60 "$BIN/bench_attention" --iters 10 >"$OUT/bench_attn.log" 2>&1; echo "rc $?"; tail -8 "$OUT/bench_attn.log"
  timeout 60 "$BIN/bench_attention" --iters 10 --atomic >"$OUT/bench_attn_atomic.log" 2>&1; echo "rc $?"; grep _atomic "$OUT/bench_attn_atomic.log"
else
  log "end to end"
  timeout 240 "$BIN/qwentune" bench --preset 2b --steps 5 --warmup 2 >"$OUT/bench_2b.log" 2>&1; echo "rc $?"; tail -1 "$OUT/bench_2b.log"
  timeout 240 "$BIN/qwentune" bench --preset 2b --steps 3 --warmup 2 --no-graph >"$OUT/bench_2b_eager.log" 2>&1; echo "rc $?"; tail -1 "$OUT/bench_2b_eager.log"
  timeout 240 "$BIN/qwentune" bench --preset 4b --steps 5 --warmup 2 >"$OUT/bench_4b.log" 2>&1; echo "rc $?"; tail -1 "$OUT/bench_4b.log"
  timeout 240 "$BIN/qwentune" bench --preset 4b --steps 5 --warmup 2 --no-gemm-tune >"$OUT/bench_4b_untuned.log" 2>&1; echo "rc $?"; tail -1 "$OUT/bench_4b_untuned.log"
  timeout 200 bash bench/gpu_correctness.sh "$BIN/qwentune" /tmp/qt_gpu_correctness >"$OUT/correctness.log" 2>&1; echo "rc $?"; grep -E "check|loss" "$OUT/correctness.log" | tail -4
  timeout 150 python3 tools/hf_baseline.py --preset 2b --steps 3 --warmup 1 >"$OUT/hf_2b.log" 2>&1; echo "rc $?"; tail -2 "$OUT/hf_2b.log"
  timeout 90 python3 tools/bench_sdpa.py --iters 10 >"$OUT/bench_sdpa.log" 2>&1; echo "rc $?"; tail -3 "$OUT/bench_sdpa.log"
fi
