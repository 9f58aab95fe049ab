// Benchmark of the CUDA gated delta rule (src/ops/cuda/gdn/) at the Qwen3.5 shapes: T = 8192
// packed as 8 chat-like samples, dk = dv = 128, Hk = 16, Hv = 16 (2B), 32 (4B/9B), 48 (27B).
// TFLOP/s from the executed FLOPs per token per value head (C = 64; docs/gdn_kernels.md):
//   fwd 6CK + 4CV + 6KV + C^2/3,  bwd 18CK + 10CV + 16KV + 4C^2.
// Usage: bench_gdn [iters] [shape] [--stage-times] [--static-bound]
//   (prints one `key value unit` row per figure; shape 2b, 4b or 27b runs that one only, e.g. under
//   a profiler)
// Single long samples, where the scans' serial chains over chunks set the time unless the plan
// splits them across CTAs, run only when named: 2b_one8k (one 8192-token sample, Hv = 16) and
// 4b_one32k (one 32768-token sample, Hv = 32: the shape of the flash-linear-attention / FlashQLA
// comparisons in docs/gdn_kernels.md), 2b_mix2600 and 4b_mix4400 (a chat row with one sample just
// long enough to split), or all of them with shape "long".
// The backward (gdn_bwd_*) reads what the forward saved as flash-linear-attention's does (the
// gates' cumsum, T = (I + A)^-1, the q / k row scales; GdnKeep::Prep) and recomputes the chunk
// states, the work the backward formula above counts; gdn_bwd_recompute_* is the backward that
// recomputes prep too (the triangular solve, which that formula counts in the forward only).
// Also times the training path (gdn_train_ms: forward keeping its state + backward reading it).
// --stage-times adds a per-stage breakdown: each stage of gdn/gdn_stages.h run alone, timed with
// events and synchronized (so the kernels launched beside one another do not overlap: use it for the
// breakdown, never for the totals).
// --static-bound passes max_seqlen = T, the bound a captured training step with static shapes passes
// (the host then always allows a split, and the plan on the device decides).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/gdn/gdn.h"
#include "ops/cuda/gdn/gdn_stages.h"

#define BCHECK(x)                                                                        \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

__global__ void fill_bf16(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.f - 1.f);
  }
}
__global__ void fill_f32(float* x, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = lo + (hi - lo) * ((h & 0xffff) / 65536.f);
  }
}

// Per-stage device times of gdn_forward / gdn_backward calls (--stage-times): each stage of the call
// that launches work runs between two events and is waited for.
struct StageTimes {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  std::vector<std::pair<std::string, double>> ms;  // in the order first seen
  using Stage = bool (*)(const qt::cuda::gdn::Call&, cudaStream_t);
  void run(const char* name, Stage stage, const qt::cuda::gdn::Call& c) {
    if (e0 == nullptr) {
      BCHECK(cudaEventCreate(&e0));
      BCHECK(cudaEventCreate(&e1));
    }
    BCHECK(cudaEventRecord(e0));
    if (!stage(c, nullptr)) return;
    BCHECK(cudaEventRecord(e1));
    BCHECK(cudaEventSynchronize(e1));
    float t = 0.f;
    BCHECK(cudaEventElapsedTime(&t, e0, e1));
    for (auto& kv : ms)
      if (kv.first == name) {
        kv.second += t;
        return;
      }
    ms.emplace_back(name, t);
  }
  // gdn_forward's and gdn_backward's sequences of stages (gdn.cu).
  void forward(const qt::cuda::gdn::Call& c) {
    namespace g = qt::cuda::gdn;
    qt::cuda::gdn::reset_flags(c, nullptr);
    run("chunk_table", g::chunk_table, c);
    run("prep", g::prep, c);
    run("scan_fwd", g::scan_fwd, c);
    run("output", g::output, c);
  }
  void backward(const qt::cuda::gdn::Call& c) {
    namespace g = qt::cuda::gdn;
    qt::cuda::gdn::reset_flags(c, nullptr);
    run("chunk_table", g::chunk_table, c);
    run("prep", g::prep, c);
    run("scan_fwd", g::scan_fwd, c);
    run("dlocal", g::dlocal, c);
    run("scan_bwd", g::scan_bwd, c);
    run("bwd_chunk", g::bwd_chunk, c);
    run("qk_grad", g::qk_grad, c);
  }
  void report(const std::string& label, int calls) {
    double total = 0;
    for (const auto& kv : ms) total += kv.second;
    for (const auto& kv : ms)
      std::printf("# stage %s %-24s %8.3f ms  %5.1f%%\n", label.c_str(), kv.first.c_str(), kv.second / calls,
                  100.0 * kv.second / (total > 0 ? total : 1));
    ms.clear();
  }
};

}  // namespace

int main(int argc, char** argv) {
  // Positional: iterations, shape; flags anywhere.
  bool stage_times = false, static_bound = false;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stage-times") == 0) {
      stage_times = true;
    } else if (std::strcmp(argv[i], "--static-bound") == 0) {
      static_bound = true;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      std::fprintf(stderr, "bench_gdn: unknown flag %s\nusage: bench_gdn [iters] [shape] [--stage-times] [--static-bound]\n",
                   argv[i]);
      return 2;
    } else {
      pos.emplace_back(argv[i]);
    }
  }
  const int iters = pos.size() > 0 ? std::atoi(pos[0].c_str()) : 20;
  const std::string only = pos.size() > 1 ? pos[1] : "";
  // A fixed chat-like mix of 8 samples summing to 8192.
  const std::vector<int> mix = {1187, 412, 1603, 256, 977, 1420, 731, 1606};
  const int Hk = 16, K = 128, V = 128, C = 64;
  struct Shape {
    const char* name;
    int Hv;
    std::vector<int> lens;
    bool long_sample;
  };
  const Shape shapes[] = {{"2b", 16, mix, false},
                          {"4b", 32, mix, false},
                          {"27b", 48, mix, false},
                          {"2b_one8k", 16, {8192}, true},
                          {"4b_one32k", 32, {32768}, true},
                          // A chat row with one sample long enough for the split (at 2B heads from
                          // ~2000 tokens, at 4B from ~4200): whether it pays among short samples.
                          {"2b_mix2600", 16, {2600, 412, 1603, 256, 977, 731, 1187, 426}, true},
                          {"4b_mix4400", 32, {4400, 1187, 412, 977, 256, 731, 229}, true}};
  const double fwd_per = 6.0 * C * K + 4.0 * C * V + 6.0 * K * V + C * C / 3.0;
  const double bwd_per = 18.0 * C * K + 10.0 * C * V + 16.0 * K * V + 4.0 * C * C;

  cudaEvent_t e0, e1;
  BCHECK(cudaEventCreate(&e0));
  BCHECK(cudaEventCreate(&e1));
  std::printf("| key | value | unit |\n|---|---|---|\n");
  // No shape named: the chat-mix shapes; "long": the long-sample ones; else the one named.
  auto wanted = [&](const Shape& s) {
    if (only.empty()) return !s.long_sample;
    return only == s.name || (only == "long" && s.long_sample);
  };
  for (const Shape& s : shapes) {
    if (!wanted(s)) continue;
    std::vector<int32_t> cu(1, 0);
    int max_len = 0;
    for (int l : s.lens) {
      cu.push_back(cu.back() + l);
      max_len = l > max_len ? l : max_len;
    }
    const int T = cu.back(), N = static_cast<int>(s.lens.size());
    if (static_bound) max_len = T;
    int32_t* cu_d = nullptr;
    BCHECK(cudaMalloc(&cu_d, cu.size() * sizeof(int32_t)));
    BCHECK(cudaMemcpy(cu_d, cu.data(), cu.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    std::printf("# %s: T %d, %d samples, Hk %d, dk = dv = %d, %d iterations\n", s.name, T, N, Hk, K, iters);
    const int Hv = s.Hv, CD = 2 * Hk * K + Hv * V;
    qt::cuda::GdnArgs a{cu_d, N, max_len, T, Hk, Hv, K, V};
    __nv_bfloat16 *qkv, *o, *d_o, *dqkv;
    float *g, *beta, *dg, *dbeta;
    void* ws;
    const size_t nqkv = static_cast<size_t>(T) * CD, no = static_cast<size_t>(T) * Hv * V,
                 ng = static_cast<size_t>(T) * Hv;
    BCHECK(cudaMalloc(&qkv, nqkv * 2));
    BCHECK(cudaMalloc(&dqkv, nqkv * 2));
    BCHECK(cudaMalloc(&o, no * 2));
    BCHECK(cudaMalloc(&d_o, no * 2));
    BCHECK(cudaMalloc(&g, ng * 4));
    BCHECK(cudaMalloc(&beta, ng * 4));
    BCHECK(cudaMalloc(&dg, ng * 4));
    BCHECK(cudaMalloc(&dbeta, ng * 4));
    const size_t ws_bytes = qt::cuda::gdn_workspace_bytes(a);
    BCHECK(cudaMalloc(&ws, ws_bytes));
    fill_bf16<<<1024, 256>>>(qkv, nqkv, 1u);
    fill_bf16<<<1024, 256>>>(d_o, no, 2u);
    fill_f32<<<256, 256>>>(g, ng, 3u, -1.f, 0.f);
    fill_f32<<<256, 256>>>(beta, ng, 4u, 0.f, 1.f);
    BCHECK(cudaGetLastError());
    BCHECK(cudaDeviceSynchronize());

    auto time_ms = [&](auto fn) {
      fn();  // warm-up
      BCHECK(cudaDeviceSynchronize());
      BCHECK(cudaEventRecord(e0));
      for (int i = 0; i < iters; ++i) fn();
      BCHECK(cudaEventRecord(e1));
      BCHECK(cudaEventSynchronize(e1));
      float ms = 0;
      BCHECK(cudaEventElapsedTime(&ms, e0, e1));
      return static_cast<double>(ms) / iters;
    };
    const double fwd_ms = time_ms([&] { qt::cuda::gdn_forward(o, qkv, g, beta, a, ws, nullptr); });
    // The scan's segments in that forward (more than the samples where it split a long one).
    const int fwd_segments = qt::cuda::gdn_planned_segments(a, ws);
    const double bwd_recompute_ms =
        time_ms([&] { qt::cuda::gdn_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, a, ws, nullptr); });
    // The forward keeping prep's results (which it writes either way) and the backward reading them.
    void* prep;
    BCHECK(cudaMalloc(&prep, qt::cuda::gdn_state_bytes(a, qt::GdnKeep::Prep)));
    const double fp_ms =
        time_ms([&] { qt::cuda::gdn_forward(o, qkv, g, beta, a, ws, nullptr, prep, qt::GdnKeep::Prep); });
    const double bwd_ms = time_ms(
        [&] { qt::cuda::gdn_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, a, ws, nullptr, prep, qt::GdnKeep::Prep); });
    // The training path: the forward keeps its state (computed at the backward's precision) and the
    // backward reads it instead of recomputing (Backend::gdn_forward / gdn_backward with a state).
    void* kept;
    BCHECK(cudaMalloc(&kept, qt::cuda::gdn_state_bytes(a)));
    const double fk_ms = time_ms([&] { qt::cuda::gdn_forward(o, qkv, g, beta, a, ws, nullptr, kept); });
    const int kept_segments = qt::cuda::gdn_planned_segments(a, ws, kept);
    const double bk_ms =
        time_ms([&] { qt::cuda::gdn_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, a, ws, nullptr, kept); });
    const double th = static_cast<double>(T) * Hv;
    std::printf("| gdn_fwd_tflops_%s | %.2f | TFLOP/s |\n", s.name, fwd_per * th / (fwd_ms * 1e-3) / 1e12);
    std::printf("| gdn_bwd_tflops_%s | %.2f | TFLOP/s |\n", s.name, bwd_per * th / (bwd_ms * 1e-3) / 1e12);
    std::printf("| gdn_fwd_ms_%s | %.3f | ms |\n| gdn_bwd_ms_%s | %.3f | ms |\n", s.name, fwd_ms, s.name, bwd_ms);
    std::printf("| gdn_bwd_recompute_tflops_%s | %.2f | TFLOP/s |\n| gdn_bwd_recompute_ms_%s | %.3f | ms |\n", s.name,
                bwd_per * th / (bwd_recompute_ms * 1e-3) / 1e12, s.name, bwd_recompute_ms);
    std::printf("| gdn_fwd_keep_prep_ms_%s | %.3f | ms |\n", s.name, fp_ms);
    std::printf("| gdn_fwd_keep_ms_%s | %.3f | ms |\n| gdn_bwd_kept_ms_%s | %.3f | ms |\n", s.name, fk_ms, s.name,
                bk_ms);
    std::printf("| gdn_train_ms_%s | %.3f | ms |\n", s.name, fk_ms + bk_ms);
    std::printf("# %s: workspace %.1f MiB (kept state %.1f MiB), forward scan segments %d, kept forward's %d%s\n",
                s.name, ws_bytes / 1048576.0, qt::cuda::gdn_state_bytes(a) / 1048576.0, fwd_segments, kept_segments,
                static_bound ? " (max_seqlen = T)" : "");
    if (stage_times) {
      namespace gdn = qt::cuda::gdn;
      StageTimes st;
      const std::string name = s.name;
      const gdn::Call fwd = gdn::plan_forward(o, qkv, g, beta, a, ws, nullptr, qt::GdnKeep::States);
      for (int i = 0; i < iters; ++i) st.forward(fwd);
      st.report(name + "_fwd", iters);
      const gdn::Call bwd_rec =
          gdn::plan_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, a, ws, nullptr, qt::GdnKeep::States);
      for (int i = 0; i < iters; ++i) st.backward(bwd_rec);
      st.report(name + "_bwd_recompute", iters);
      // prep's results as the timed forward above left them
      const gdn::Call bwd = gdn::plan_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, a, ws, prep, qt::GdnKeep::Prep);
      for (int i = 0; i < iters; ++i) st.backward(bwd);
      st.report(name + "_bwd", iters);
      const gdn::Call fwd_keep = gdn::plan_forward(o, qkv, g, beta, a, ws, kept, qt::GdnKeep::States);
      for (int i = 0; i < iters; ++i) st.forward(fwd_keep);
      st.report(name + "_fwd_keep", iters);
      const gdn::Call bwd_kept = gdn::plan_backward(dqkv, dg, dbeta, d_o, qkv, g, beta, a, ws, kept, qt::GdnKeep::States);
      for (int i = 0; i < iters; ++i) st.backward(bwd_kept);
      st.report(name + "_bwd_kept", iters);
    }
    BCHECK(cudaFree(qkv));
    BCHECK(cudaFree(dqkv));
    BCHECK(cudaFree(o));
    BCHECK(cudaFree(d_o));
    BCHECK(cudaFree(g));
    BCHECK(cudaFree(beta));
    BCHECK(cudaFree(dg));
    BCHECK(cudaFree(dbeta));
    BCHECK(cudaFree(ws));
    BCHECK(cudaFree(kept));
    BCHECK(cudaFree(prep));
    BCHECK(cudaFree(cu_d));
  }
  return 0;
}
