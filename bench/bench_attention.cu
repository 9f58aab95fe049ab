// Benchmark of the varlen causal flash attention kernels (src/ops/cuda/attention/).
// T = 8192 tokens packed as 8 chat-like samples (fixed lengths below), head_dim 256, the head
// counts of Qwen3.5-2B (8 q / 2 kv) and 27B (24 q / 4 kv). CUDA-event timing of one forward and
// one backward launch sequence (median of --iters runs after warm-up), TFLOP/s with causal FLOPs
// counted per sample as flash-attention's benchmark_attn.py does:
//   fwd = sum over samples of 2 * 2 * L^2 / 2 * D per query head (QK^T and PV, half the square),
//   bwd = 2.5 * fwd.
// Output: a table, then one `key value` line per BENCHMARKS.md key. Same shapes as
// tools/bench_sdpa.py (cuDNN SDPA through PyTorch) for the speedup rows.
// Usage: bench_attention [--iters N] [--atomic] [--mma-sync]
//   default: the training configuration, the deterministic backward (dQ by its own kernel, no
//   atomics; at D = 256 dQ and dK / dV on wgmma); --atomic: AttnArgs::deterministic off (dQ by fp32
//   atomics inside the mma.sync dK / dV kernel), backward keys end in _atomic; --mma-sync:
//   AttnArgs::mma_sync, the mma.sync kernels instead of wgmma, keys end in _mma.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/kernels.h"

#define BENCH_CUDA(expr)                                                                              \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));     \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace {

// 8 samples, 256..1600 tokens, sum 8192 (the same list is in tools/bench_sdpa.py).
const std::vector<int> kLens = {1024, 512, 1600, 768, 1280, 256, 1152, 1600};
constexpr int kHeadDim = 256;

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void* upload_random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> h(n);
  for (auto& e : h) e = to_bf16(dist(rng));
  void* d = nullptr;
  BENCH_CUDA(cudaMalloc(&d, n * 2));
  BENCH_CUDA(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}

template <typename F>
double median_ms(F&& fn, int iters) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();  // warm-up
  BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(a));
    fn();
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    BENCH_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], a, b));
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Result {
  double fwd_ms, bwd_ms, fwd_tflops, bwd_tflops;
};

Result run(int hq, int hkv, int iters, bool deterministic, bool mma_sync) {
  std::vector<int32_t> cu = {0};
  int max_len = 0;
  double fwd_flops = 0;
  for (int l : kLens) {
    cu.push_back(cu.back() + l);
    max_len = std::max(max_len, l);
    fwd_flops += 2.0 * 2.0 * static_cast<double>(l) * l / 2.0 * kHeadDim * hq;
  }
  const int T = cu.back();
  const size_t nq = static_cast<size_t>(T) * hq * kHeadDim, nk = static_cast<size_t>(T) * hkv * kHeadDim;
  std::mt19937_64 rng(1234);
  void* q = upload_random_bf16(nq, rng);
  void* k = upload_random_bf16(nk, rng);
  void* v = upload_random_bf16(nk, rng);
  void* d_o = upload_random_bf16(nq, rng);
  void *o, *dq, *dk, *dv, *ws, *dcu;
  float* lse;
  BENCH_CUDA(cudaMalloc(&o, nq * 2));
  BENCH_CUDA(cudaMalloc(&dq, nq * 2));
  BENCH_CUDA(cudaMalloc(&dk, nk * 2));
  BENCH_CUDA(cudaMalloc(&dv, nk * 2));
  BENCH_CUDA(cudaMalloc(&lse, sizeof(float) * static_cast<size_t>(T) * hq));
  BENCH_CUDA(cudaMalloc(&dcu, cu.size() * sizeof(int32_t)));
  BENCH_CUDA(cudaMemcpy(dcu, cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  qt::cuda::AttnArgs a{static_cast<const int32_t*>(dcu), static_cast<int>(kLens.size()), max_len, T, hq, hkv,
                       kHeadDim, 1.f / 16.f};
  a.deterministic = deterministic;
  a.mma_sync = mma_sync;
  BENCH_CUDA(cudaMalloc(&ws, qt::cuda::attention_workspace_bytes(a)));

  auto fwd = [&] { qt::cuda::attention_forward(o, lse, q, k, v, a, ws, nullptr); };
  auto bwd = [&] { qt::cuda::attention_backward(dq, dk, dv, d_o, q, k, v, o, lse, a, ws, nullptr); };
  fwd();
  BENCH_CUDA(cudaDeviceSynchronize());
  Result r;
  r.fwd_ms = median_ms(fwd, iters);
  r.bwd_ms = median_ms(bwd, iters);
  BENCH_CUDA(cudaGetLastError());
  r.fwd_tflops = fwd_flops / (r.fwd_ms * 1e-3) / 1e12;
  r.bwd_tflops = 2.5 * fwd_flops / (r.bwd_ms * 1e-3) / 1e12;
  for (void* p : {q, k, v, d_o, o, dq, dk, dv, ws, dcu}) BENCH_CUDA(cudaFree(p));
  BENCH_CUDA(cudaFree(lse));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  bool det = true, mma = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--atomic") == 0) {
      det = false;
    } else if (std::strcmp(argv[i], "--mma-sync") == 0) {
      mma = true;
    } else {
      std::fprintf(stderr,
                   "bench_attention: unknown argument '%s' (usage: [--iters N] [--atomic] [--mma-sync])\n",
                   argv[i]);
      return 2;
    }
  }
  const std::string sfx = std::string(det ? "" : "_atomic") + (mma ? "_mma" : "");
  const char* fsfx = mma ? "_mma" : "";
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (%d SMs); T = 8192 packed as", prop.name, prop.multiProcessorCount);
  for (int l : kLens) std::printf(" %d", l);
  std::printf("; D = %d; median of %d%s%s\n\n", kHeadDim, iters, det ? "; deterministic backward" : "; atomic dQ backward",
              mma ? "; mma.sync kernels" : "; wgmma kernels");
  const Result r2 = run(8, 2, iters, det, mma);
  const Result r27 = run(24, 4, iters, det, mma);
  std::printf("| heads (q/kv) | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |\n|---|---|---|---|---|\n");
  std::printf("| 2B (8/2) | %.3f | %.1f | %.3f | %.1f |\n", r2.fwd_ms, r2.fwd_tflops, r2.bwd_ms, r2.bwd_tflops);
  std::printf("| 27B (24/4) | %.3f | %.1f | %.3f | %.1f |\n\n", r27.fwd_ms, r27.fwd_tflops, r27.bwd_ms,
              r27.bwd_tflops);
  std::printf("attn_fwd_ms_2b%s %.4f\nattn_bwd_ms_2b%s %.4f\n", fsfx, r2.fwd_ms, sfx.c_str(), r2.bwd_ms);
  std::printf("attn_fwd_tflops_2b%s %.1f\nattn_bwd_tflops_2b%s %.1f\n", fsfx, r2.fwd_tflops, sfx.c_str(), r2.bwd_tflops);
  std::printf("attn_fwd_ms_27b%s %.4f\nattn_bwd_ms_27b%s %.4f\n", fsfx, r27.fwd_ms, sfx.c_str(), r27.bwd_ms);
  std::printf("attn_fwd_tflops_27b%s %.1f\nattn_bwd_tflops_27b%s %.1f\n", fsfx, r27.fwd_tflops, sfx.c_str(), r27.bwd_tflops);
  return 0;
}
