// CUDA op benchmark: in one run, the ceilings (a large device-to-device copy: TB/s; an
// 8192^3 bf16 GEMM: TFLOP/s), then Qwen3.5-2B shapes at T = 8192 tokens: the step's projection
// GEMMs FLOP-weighted over forward + backward (one GDN layer, one attention layer, the MLP),
// RMSNorm / conv1d / AdamW bandwidth as a fraction of the copy bandwidth, and the fused linear
// cross-entropy (6 T H V matmul FLOPs for forward + backward) with its peak extra memory; `layer`
// times the layers' other elementwise ops (gated norm, GDN gates, attention prep, SwiGLU).
// Usage: bench_cuda_ops [--quick] [--only gemm,fp8,rmsnorm,conv1d,adamw,layer,ce,ce-parts] [--ce-rows N]
// (prints: key  value  unit  ceiling; --only runs just the named sections after the ceilings,
// ce-parts only when named; --ce-rows sets the cross-entropy chunk, 0 = the backend's default)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/ops_launch.h"

using namespace qt;

namespace {

#define BENCH_CUDA(stmt)                                                                 \
  do {                                                                                   \
    cudaError_t e_ = (stmt);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #stmt, cudaGetErrorString(e_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// Mean milliseconds of fn over iters runs after warmup runs, timed with events on the stream.
double time_ms(CudaBackend& be, const std::function<void()>& fn, int iters, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  BENCH_CUDA(cudaEventRecord(a, be.stream()));
  for (int i = 0; i < iters; ++i) fn();
  BENCH_CUDA(cudaEventRecord(b, be.stream()));
  BENCH_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) / iters;
}

// Fills a bf16 tensor with small random values (host generated once, then device copies).
void fill(CudaBackend& be, const Tensor& t, float scale, uint64_t seed) {
  std::vector<bf16> h(static_cast<size_t>(t.numel()));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
  for (auto& x : h) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = float_to_bf16(scale * (float(s >> 40) / float(1ull << 24) * 2.0f - 1.0f));
  }
  be.copy_from_host(t, h.data());
}

struct Row {
  std::string key;
  double value;
  std::string unit, ceiling;
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  int64_t ce_rows = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = "," + std::string(argv[++i]) + ",";
    else if (std::strcmp(argv[i], "--ce-rows") == 0 && i + 1 < argc) ce_rows = std::atoll(argv[++i]);
  }
  auto run = [&](const char* section) { return only.empty() || only.find("," + std::string(section) + ",") != std::string::npos; };
  const int iters = quick ? 3 : 10;
  CudaBackend be;
  be.set_cross_entropy_chunk_rows(ce_rows);
  std::vector<Row> rows;

  // ---- ceilings ----
  const int64_t copy_bytes = int64_t(2) << 30;
  Tensor src = be.alloc(DType::U8, {copy_bytes}), dst = be.alloc(DType::U8, {copy_bytes});
  const double copy_ms = time_ms(be, [&] { be.copy(dst, src); }, iters);
  const double copy_tbs = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e12;
  rows.push_back({"copy_tbs", copy_tbs, "TB/s", "device-to-device copy, 2 GiB (read + write)"});
  be.reset_arena();

  {
    const int64_t n = 8192;
    Tensor x = be.alloc(DType::BF16, {n, n}), w = be.alloc(DType::BF16, {n, n}), y = be.alloc(DType::BF16, {n, n});
    fill(be, x, 1.0f, 1);
    fill(be, w, 0.02f, 2);
    const double ms = time_ms(be, [&] { be.linear_forward(y, x, w); }, iters);
    rows.push_back({"gemm_peak_tflops", 2.0 * n * n * n / (ms * 1e-3) / 1e12, "TFLOP/s", "bf16 8192^3 cuBLASLt"});
    be.reset_arena();
  }
  const double gemm_peak = rows.back().value;

  const int64_t T = 8192, H = 2048, I = 6144, V = 248320;
  // ---- projection GEMMs of one GDN layer, one attention layer and the MLP (fwd + bwd) ----
  if (run("gemm")) {
    struct Proj {
      const char* name;
      int64_t N, K;
    };
    const Proj projs[] = {{"gdn.in_proj_qkv", 6144, H}, {"gdn.in_proj_z", 2048, H}, {"gdn.in_proj_b", 16, H},
                          {"gdn.in_proj_a", 16, H},     {"gdn.out_proj", H, 2048},  {"attn.q_proj", 4096, H},
                          {"attn.k_proj", 512, H},      {"attn.v_proj", 512, H},    {"attn.o_proj", H, 2048},
                          {"mlp.gate", I, H},           {"mlp.up", I, H},           {"mlp.down", H, I}};
    double flops = 0, ms_total = 0;
    for (const Proj& p : projs) {
      Tensor x = be.alloc(DType::BF16, {T, p.K}), w = be.alloc(DType::BF16, {p.N, p.K}),
             y = be.alloc(DType::BF16, {T, p.N}), dx = be.alloc(DType::BF16, {T, p.K}),
             dw = be.alloc(DType::BF16, {p.N, p.K});
      fill(be, x, 1.0f, 3);
      fill(be, w, 0.02f, 4);
      fill(be, y, 1.0f, 5);
      const double ms = time_ms(be, [&] {
        be.linear_forward(y, x, w);
        be.linear_backward(dx, dw, y, x, w, false, false);
      }, iters);
      const double f = 6.0 * double(T) * double(p.N) * double(p.K);
      std::printf("  %-18s N %5lld K %5lld: %7.1f TFLOP/s (fwd+bwd %.3f ms)\n", p.name, (long long)p.N,
                  (long long)p.K, f / (ms * 1e-3) / 1e12, ms);
      flops += f;
      ms_total += ms;
      be.reset_arena();
    }
    rows.push_back({"gemm_tflops_2b", flops / (ms_total * 1e-3) / 1e12, "TFLOP/s",
                    "gemm_peak_tflops " + std::to_string(gemm_peak)});
  }

  // ---- FP8 projection GEMMs: the forward, dgrad and wgrad shapes of the same projections as
  // x W^T products of e4m3 operands (the layout the FP8 tensor cores take), against bf16 on the
  // same shapes; then the per-tensor quantize's bandwidth ----
  if (run("fp8")) {
    struct Proj {
      int64_t N, K;
    };
    const Proj projs[] = {{6144, H}, {2048, H}, {16, H},   {16, H},   {H, 2048}, {4096, H},
                          {512, H},  {512, H},  {H, 2048}, {I, H},    {I, H},    {H, I}};
    double flops = 0, ms_fp8 = 0, ms_precise = 0, ms_bf16 = 0;
    for (const Proj& p : projs) {
      const int64_t shapes[3][3] = {{T, p.N, p.K}, {T, p.K, p.N}, {p.N, p.K, T}};  // M, N, K: fwd, dgrad, wgrad
      for (int s = 0; s < 3; ++s) {
        const bool fwd = s == 0;  // the recipe: fast accumulation in the forward only
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        Tensor a = be.alloc(DType::BF16, {M, K}), b = be.alloc(DType::BF16, {N, K}), c = be.alloc(DType::BF16, {M, N});
        Tensor aq = be.alloc(DType::F8E4M3, {M, K}), bq = be.alloc(DType::F8E4M3, {N, K});
        Tensor as = be.alloc(DType::F32, {1}), bs = be.alloc(DType::F32, {1});
        fill(be, a, 1.0f, 11);
        fill(be, b, 0.02f, 12);
        be.quantize_fp8(aq, Tensor(), as, a, Tensor());
        be.quantize_fp8(bq, Tensor(), bs, b, Tensor());
        const double precise = time_ms(be, [&] { be.linear_fp8(c, aq, as, bq, bs, false, false); }, iters);
        ms_precise += precise;
        ms_fp8 += fwd ? time_ms(be, [&] { be.linear_fp8(c, aq, as, bq, bs, false, true); }, iters) : precise;
        ms_bf16 += time_ms(be, [&] { be.linear_forward(c, a, b); }, iters);
        flops += 2.0 * double(M) * double(N) * double(K);
        be.reset_arena();
      }
    }
    rows.push_back({"gemm_fp8_tflops_2b", flops / (ms_fp8 * 1e-3) / 1e12, "TFLOP/s",
                    "fast-accumulated forward; all fp32-promoted " + std::to_string(flops / (ms_precise * 1e-3) / 1e12) +
                        ", bf16 on the same shapes " + std::to_string(flops / (ms_bf16 * 1e-3) / 1e12)});
    Tensor x = be.alloc(DType::BF16, {T, I}), xq = be.alloc(DType::F8E4M3, {T, I}), xs = be.alloc(DType::F32, {1});
    fill(be, x, 1.0f, 13);
    const double ms = time_ms(be, [&] { be.quantize_fp8(xq, Tensor(), xs, x, Tensor()); }, iters);
    const double bytes = double(T * I) * (2 + 2 + 1);  // x read twice (amax, cast), q written
    rows.push_back({"fp8_quantize_bw_frac", bytes / (ms * 1e-3) / 1e12 / copy_tbs, "of copy",
                    "x [8192, 6144] bf16 -> e4m3, two passes"});
    Tensor xq_t = be.alloc(DType::F8E4M3, {I, T});
    const double ms_t = time_ms(be, [&] { be.quantize_fp8(Tensor(), xq_t, xs, x, Tensor()); }, iters);
    rows.push_back({"fp8_quantize_t_bw_frac", bytes / (ms_t * 1e-3) / 1e12 / copy_tbs, "of copy",
                    "the same, the codes written transposed [6144, 8192]"});
    be.reset_arena();
  }

  // ---- RMSNorm fwd + bwd [T, H] ----
  if (run("rmsnorm")) {
    Tensor x = be.alloc(DType::BF16, {T, H}), w = be.alloc(DType::BF16, {H}), y = be.alloc(DType::BF16, {T, H}),
           rstd = be.alloc(DType::F32, {T}), dx = be.alloc(DType::BF16, {T, H}), dw = be.alloc(DType::BF16, {H});
    fill(be, x, 1.0f, 6);
    fill(be, w, 0.1f, 7);
    const double ms = time_ms(be, [&] {
      be.rmsnorm_forward(y, rstd, x, w, 1e-6, Tensor());
      be.rmsnorm_backward(dx, dw, y, x, w, rstd, false, Tensor());
    }, iters);
    const double fms = time_ms(be, [&] { be.rmsnorm_forward(y, rstd, x, w, 1e-6, Tensor()); }, iters);
    const double bms = time_ms(be, [&] { be.rmsnorm_backward(dx, dw, y, x, w, rstd, false, Tensor()); }, iters);
    std::printf("  rmsnorm  fwd %.1f us (%.2f TB/s), bwd+dw %.1f us (%.2f TB/s)\n", fms * 1e3,
                4.0 * T * H / (fms * 1e-3) / 1e12, bms * 1e3, 6.0 * T * H / (bms * 1e-3) / 1e12);
    const double bytes = 10.0 * double(T) * double(H) + 8.0 * double(T);  // fwd x,y; bwd x,dy,dx (bf16)
    rows.push_back({"rmsnorm_bw_frac", bytes / (ms * 1e-3) / 1e12 / copy_tbs, "of copy",
                    "copy_tbs " + std::to_string(copy_tbs)});
    be.reset_arena();
  }

  // ---- causal conv1d + SiLU fwd + bwd [T, 6144], 8 samples ----
  if (run("conv1d")) {
    const int64_t C = 6144;
    Tensor x = be.alloc(DType::BF16, {T, C}), w = be.alloc(DType::BF16, {C, 4}), y = be.alloc(DType::BF16, {T, C}),
           dx = be.alloc(DType::BF16, {T, C}), dw = be.alloc(DType::BF16, {C, 4});
    std::vector<int32_t> cu;
    for (int s = 0; s <= 8; ++s) cu.push_back(int32_t(T / 8 * s));
    Tensor cut = be.alloc(DType::I32, {9});
    be.copy_from_host(cut, cu.data());
    const SeqInfo seqs{cut, 8, int(T / 8), int(T)};
    fill(be, x, 1.0f, 8);
    fill(be, w, 0.5f, 9);
    const double ms = time_ms(be, [&] {
      be.conv1d_silu_forward(y, x, w, seqs);
      be.conv1d_silu_backward(dx, dw, y, x, w, seqs);
    }, iters);
    const double fms = time_ms(be, [&] { be.conv1d_silu_forward(y, x, w, seqs); }, iters);
    const double bms = time_ms(be, [&] { be.conv1d_silu_backward(dx, dw, y, x, w, seqs); }, iters);
    std::printf("  conv1d   fwd %.1f us (%.2f TB/s), bwd+dw %.1f us (%.2f TB/s)\n", fms * 1e3,
                4.0 * T * C / (fms * 1e-3) / 1e12, bms * 1e3, 6.0 * T * C / (bms * 1e-3) / 1e12);
    const double bytes = 10.0 * double(T) * double(C);  // fwd x,y; bwd x,dy,dx
    rows.push_back({"conv1d_bw_frac", bytes / (ms * 1e-3) / 1e12 / copy_tbs, "of copy",
                    "copy_tbs " + std::to_string(copy_tbs)});
    be.reset_arena();
  }

  // ---- AdamW: grad norm + update over 8 x 64M parameters ----
  if (run("adamw")) {
    const int64_t per = int64_t(64) << 20, count = 8;
    std::vector<cuda::AdamWTensor> ts;
    for (int64_t i = 0; i < count; ++i) {
      Tensor master = be.alloc(DType::F32, {per}), m = be.alloc(DType::F32, {per}), v = be.alloc(DType::F32, {per}),
             g = be.alloc(DType::BF16, {per}), p = be.alloc(DType::BF16, {per});
      fill(be, g, 0.01f, uint64_t(10 + i));
      ts.push_back({master.ptr<float>(), m.ptr<float>(), v.ptr<float>(), g.data, p.data, per, i % 2 == 0});
    }
    be.synchronize();
    cuda::AdamWMultiTensor opt(ts);
    AdamWConfig cfg;
    int64_t step = 0;
    const double ms = time_ms(be, [&] {
      opt.grad_norm(1.0, be.stream());
      opt.update(1e-4, 0.1, cfg, ++step, be.stream());
    }, iters);
    const double nms = time_ms(be, [&] { opt.grad_norm(1.0, be.stream()); }, iters);
    const double ums = time_ms(be, [&] { opt.update(1e-4, 0.1, cfg, ++step, be.stream()); }, iters);
    std::printf("  adamw    norm %.1f us (%.2f TB/s), update %.1f us (%.2f TB/s)\n", nms * 1e3,
                2.0 * per * count / (nms * 1e-3) / 1e12, ums * 1e3, 28.0 * per * count / (ums * 1e-3) / 1e12);
    const double bytes = 30.0 * double(per * count);  // norm: g; update: master, m, v r/w + g + p
    rows.push_back({"adamw_bw_frac", bytes / (ms * 1e-3) / 1e12 / copy_tbs, "of copy",
                    "copy_tbs " + std::to_string(copy_tbs)});
    be.reset_arena();
  }

  // ---- the layers' other elementwise ops at 2B shapes: time and bytes moved (not a goal key) ----
  if (run("layer")) {
    auto report = [&](const char* name, double ms, double bytes) {
      std::printf("  %-24s %7.1f us  %5.2f TB/s  %.3f of copy\n", name, ms * 1e3, bytes / (ms * 1e-3) / 1e12,
                  bytes / (ms * 1e-3) / 1e12 / copy_tbs);
    };
    const int64_t Hv = 16, dv = 128, Hq = 8, Hkv = 2, Dh = 256;
    {  // gated RMSNorm over each value head's dv: fwd x,z -> y; bwd x,z,dy -> dx,dz
      Tensor x = be.alloc(DType::BF16, {T, Hv, dv}), z = be.alloc(DType::BF16, {T, Hv, dv}),
             w = be.alloc(DType::BF16, {dv}), y = be.alloc(DType::BF16, {T, Hv, dv}),
             rstd = be.alloc(DType::F32, {T * Hv}), dx = be.alloc(DType::BF16, {T, Hv, dv}),
             dz = be.alloc(DType::BF16, {T, Hv, dv}), dw = be.alloc(DType::F32, {dv});
      fill(be, x, 1.0f, 30);
      fill(be, z, 2.0f, 31);
      fill(be, w, 1.0f, 32);
      const double n = double(T * Hv * dv);
      report("gated_rmsnorm fwd", time_ms(be, [&] { be.gated_rmsnorm_forward(y, rstd, x, z, w, 1e-6); }, iters), 6 * n);
      report("gated_rmsnorm bwd", time_ms(be, [&] { be.gated_rmsnorm_backward(dx, dz, dw, y, x, z, w, rstd); }, iters),
             10 * n);
      be.reset_arena();
    }
    {  // GDN gates: b, a -> beta, g (fp32); backward dbeta, dg (fp32), b, a -> db, da
      Tensor b = be.alloc(DType::BF16, {T, Hv}), a = be.alloc(DType::BF16, {T, Hv}), alog = be.alloc(DType::BF16, {Hv}),
             dtb = be.alloc(DType::BF16, {Hv}), beta = be.alloc(DType::F32, {T, Hv}), g = be.alloc(DType::F32, {T, Hv}),
             db = be.alloc(DType::BF16, {T, Hv}), da = be.alloc(DType::BF16, {T, Hv}),
             dalog = be.alloc(DType::F32, {Hv}), ddt = be.alloc(DType::F32, {Hv});
      fill(be, b, 2.0f, 33);
      fill(be, a, 2.0f, 34);
      fill(be, alog, 1.0f, 35);
      fill(be, dtb, 1.0f, 36);
      be.gdn_gates_forward(beta, g, b, a, alog, dtb);
      const double n = double(T * Hv);
      report("gdn_gates fwd", time_ms(be, [&] { be.gdn_gates_forward(beta, g, b, a, alog, dtb); }, iters), 12 * n);
      report("gdn_gates bwd",
             time_ms(be, [&] { be.gdn_gates_backward(db, da, dalog, ddt, beta, g, b, a, alog, dtb); }, iters), 16 * n);
      be.reset_arena();
    }
    {  // attention q/k norm + partial RoPE: qg [T, Hq, 2 D], kr [T, Hkv, D]
      Tensor qg = be.alloc(DType::BF16, {T, Hq * 2 * Dh}), kr = be.alloc(DType::BF16, {T, Hkv * Dh}),
             qw = be.alloc(DType::BF16, {Dh}), kw = be.alloc(DType::BF16, {Dh}),
             q = be.alloc(DType::BF16, {T, Hq, Dh}), k = be.alloc(DType::BF16, {T, Hkv, Dh}),
             gate = be.alloc(DType::BF16, {T, Hq * Dh}), qr = be.alloc(DType::F32, {T * Hq}),
             krs = be.alloc(DType::F32, {T * Hkv}), pos = be.alloc(DType::I32, {T}),
             dqg = be.alloc(DType::BF16, {T, Hq * 2 * Dh}), dkr = be.alloc(DType::BF16, {T, Hkv * Dh}),
             dqw = be.alloc(DType::F32, {Dh}), dkw = be.alloc(DType::F32, {Dh});
      fill(be, qg, 2.0f, 37);
      fill(be, kr, 2.0f, 38);
      fill(be, qw, 0.5f, 39);
      fill(be, kw, 0.5f, 40);
      std::vector<int32_t> p(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) p[size_t(t)] = int32_t(t % 1024);
      be.copy_from_host(pos, p.data());
      const AttnDims dims{Hq, Hkv, Dh, Dh / 4, 1e7};
      const double n = double(T * (2 * Hq + Hkv) * Dh);  // elements of qg and kr
      report("attn_prep fwd",
             time_ms(be, [&] { be.attn_prep_forward(q, k, gate, qr, krs, qg, kr, qw, kw, pos, dims, 1e-6); }, iters),
             4 * n);
      report("attn_prep bwd", time_ms(be, [&] {
               be.attn_prep_backward(dqg, dkr, dqw, dkw, q, k, gate, qg, kr, qw, kw, qr, krs, pos, dims);
             }, iters), 6 * n);
      be.reset_arena();
    }
    {  // SwiGLU over the MLP width, attention output gate over Hq * D
      Tensor gt = be.alloc(DType::BF16, {T, I}), up = be.alloc(DType::BF16, {T, I}), h = be.alloc(DType::BF16, {T, I}),
             dg = be.alloc(DType::BF16, {T, I}), du = be.alloc(DType::BF16, {T, I});
      fill(be, gt, 2.0f, 41);
      fill(be, up, 2.0f, 42);
      const double n = double(T * I);
      report("swiglu fwd", time_ms(be, [&] { be.swiglu_forward(h, gt, up, Tensor()); }, iters), 6 * n);
      report("swiglu bwd", time_ms(be, [&] { be.swiglu_backward(dg, du, h, gt, up, Tensor(), Tensor()); }, iters), 10 * n);
      be.reset_arena();
    }
  }

  // ---- fused cross-entropy, part by part (only with --only ce-parts): where the chunk's time goes ----
  // One 2048-row chunk (the training step's) at the 2B and 4B hidden sizes: the fp32 logits GEMM,
  // the softmax / gradient kernel, the dX GEMM over the in-place bf16 gradient (row stride 2V) and
  // the dW GEMM accumulating into fp32 [V, H]; ms and TFLOP/s each (printed, not table rows).
  if (only.find(",ce-parts,") != std::string::npos) {
    const int64_t n = 2048;
    for (const int64_t Hc : {int64_t(2048), int64_t(2560)}) {
      Tensor h = be.alloc(DType::BF16, {n, Hc}), w = be.alloc(DType::BF16, {V, Hc});
      Tensor dh = be.alloc(DType::BF16, {n, Hc});
      Tensor logits = be.alloc(DType::F32, {n, V}), dw = be.alloc(DType::F32, {V, Hc});
      Tensor loss = be.alloc(DType::F32, {n}), targets = be.alloc(DType::I32, {n});
      fill(be, h, 1.0f, 30);
      fill(be, w, 0.02f, 31);
      std::vector<int32_t> tg(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) tg[size_t(t)] = int32_t((t * 7919) % V);
      be.copy_from_host(targets, tg.data());
      auto logits_gemm = [&] { be.gemm(false, true, n, V, Hc, h.data, Hc, w.data, Hc, logits.data, V, true, 0.0f); };
      auto softmax = [&] {
        cuda::launch_cross_entropy_chunk(logits.ptr<float>(), loss.ptr<float>(), targets.ptr<int32_t>(), n, V,
                                         1.0f / float(n), true, be.stream());
      };
      const double t_logits = time_ms(be, logits_gemm, iters);
      const double t_both = time_ms(be, [&] { logits_gemm(); softmax(); }, iters);
      const double t_dx = time_ms(be, [&] {
        be.gemm(false, false, n, Hc, V, logits.data, 2 * V, w.data, Hc, dh.data, Hc, false, 0.0f);
      }, iters);
      const double t_dw = time_ms(be, [&] {
        be.gemm(true, false, V, Hc, n, logits.data, 2 * V, h.data, Hc, dw.data, Hc, true, 1.0f);
      }, iters);
      const double f = 2.0 * double(n) * double(V) * double(Hc) / 1e9;  // GFLOP per GEMM
      std::printf("  ce part H %lld: logits gemm %.3f ms (%.0f TFLOP/s), softmax %.3f ms, dX gemm %.3f ms (%.0f), "
                  "dW gemm (+=, f32) %.3f ms (%.0f)\n",
                  static_cast<long long>(Hc), t_logits, f / t_logits, t_both - t_logits, t_dx, f / t_dx, t_dw,
                  f / t_dw);
      be.reset_arena();
    }
  }

  // ---- fused linear cross-entropy, T x H -> V ----
  if (run("ce")) {
    Tensor hidden = be.alloc(DType::BF16, {T, H}), w = be.alloc(DType::BF16, {V, H}), dh = be.alloc(DType::BF16, {T, H}),
           dw = be.alloc(DType::BF16, {V, H}), targets = be.alloc(DType::I32, {T});
    fill(be, hidden, 1.0f, 20);
    fill(be, w, 0.02f, 21);
    std::vector<int32_t> tg(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = t % 17 == 0 ? -100 : int32_t((t * 7919) % V);
    be.copy_from_host(targets, tg.data());
    const int64_t ws_before = be.workspace_bytes();
    const double ms = time_ms(be, [&] { be.linear_cross_entropy(dh, dw, Tensor(), hidden, w, targets, 1.0 / T, true); },
                              quick ? 2 : 5, 1);
    const double extra = double(std::max(be.workspace_bytes(), ws_before));
    const double flops = 6.0 * double(T) * double(H) * double(V);
    rows.push_back({"linear_ce_tflops", flops / (ms * 1e-3) / 1e12, "TFLOP/s",
                    "gemm_peak_tflops " + std::to_string(gemm_peak)});
    std::printf("  linear_ce chunk %lld rows: %.3f ms\n", static_cast<long long>(be.cross_entropy_chunk_rows(V, T)), ms);
    rows.push_back({"linear_ce_extra_gib", be.cross_entropy_workspace_bytes(V, T) / double(1 << 30), "GiB",
                    "workspace " + std::to_string(extra / double(1 << 30)) + " GiB (< 1 GiB goal)"});
    // The FP8 head (train.fp8_lm_head) on the same shapes: its three products from codes, the
    // e5m2 logit gradients and their transposes; the codes' quantize passes timed apart.
    const int64_t Tp = (T + 15) / 16 * 16;
    Fp8HeadCodes c{be.alloc(DType::F8E4M3, {T, H}), be.alloc(DType::F8E4M3, {H, Tp}), be.alloc(DType::F32, {64}),
                   be.alloc(DType::F8E4M3, {V, H}), be.alloc(DType::F8E4M3, {H, V}), be.alloc(DType::F32, {64})};
    c.h_scale_inv = Tensor(c.h_scale_inv.data, DType::F32, {1}, c.h_scale_inv.device);
    c.w_scale_inv = Tensor(c.w_scale_inv.data, DType::F32, {1}, c.w_scale_inv.device);
    Tensor sum = be.alloc(DType::F64, {1}), dw32 = be.alloc(DType::F32, {V, H});
    const double q_ms = time_ms(be, [&] {
      be.quantize_fp8(c.hq, c.hq_t, c.h_scale_inv, hidden, Tensor());
      be.quantize_fp8(c.wq, c.wq_t, c.w_scale_inv, w, Tensor());
    }, quick ? 2 : 5, 1);
    const double ms8 = time_ms(be, [&] { be.linear_cross_entropy_fp8(sum, dh, dw32, Tensor(), c, targets, 1.0 / T, true); },
                               quick ? 2 : 5, 1);
    rows.push_back({"linear_ce_fp8_tflops", flops / (ms8 * 1e-3) / 1e12, "TFLOP/s",
                    "bf16 head " + std::to_string(ms) + " ms, fp8 " + std::to_string(ms8) + " ms + its quantize passes " +
                        std::to_string(q_ms) + " ms, same call"});
    be.reset_arena();
  }

  std::printf("\n| key | value | unit | ceiling |\n|---|---|---|---|\n");
  for (const Row& r : rows) std::printf("| %s | %.3f | %s | %s |\n", r.key.c_str(), r.value, r.unit.c_str(), r.ceiling.c_str());
  return 0;
}
