// The CUDA gated delta rule (src/ops/cuda/gdn/) against the CPU per-token recurrence
// (qt::ref::gdn_forward/gdn_backward, the math CpuBackend runs), on the same bf16-rounded inputs.
//
// Tolerances, from precision (relative RMS error over a whole tensor, ||x - truth|| / ||truth||;
// truth = the reference in double):
//  * bf16 outputs (o, dq, dk, dv): the kernel computes in fp32 and rounds once, so its error is
//    the rounding of the output plus fp32 noise. floor_bf16 = error of bf16(truth) itself
//    (~2^-9/sqrt(3) ~ 1e-3); allowed: 2 * floor_bf16 + 1e-3. (Rounding the forward's operands to
//    bf16 instead of splitting them, as FLA does, gave o 6.4e-3 > 4.3e-3 on GateNearZeroBetaNearOne.)
//    Operands that feed only these outputs may be bf16: the plain forward's output products, and
//    the backward's Y, Pa, Pb (dq, dk ~2.9e-3 with them, 2.35e-3 with hi + lo; H200, 22nd round).
//  * fp32 outputs (dg, dbeta): no output rounding; the kernel sums in another order (chunked WY
//    form) than the reference. floor_f32 = error of the fp32 reference vs truth; allowed:
//    10 * floor_f32 + 1e-3 (1e-3 is thousands of fp32 ulps, still far below what a wrong term in
//    the gradient gives: O(1e-2 .. 1)).
//    The kernels run every product on bf16 tensor cores with each fp32 operand split into bf16
//    hi + lo (|a - hi - lo| <= 2^-18 |a|; the dropped lo lo term <= 2^-18): <= 3 2^-18 ~ 1.1e-5
//    relative per product, fp32 accumulation. Plain TF32 operands (2 2^-11 ~ 1e-3 per product) gave
//    dg 1.37e-3 on GateNearZeroBetaNearOne, i.e. ~1.4x the per-product error; the split scales that
//    to ~1.6e-5, well inside 1e-3, so the bound needs no bf16 term (measured on the H200: dg
//    <= 3.5e-5, dbeta <= 1.5e-5 over every case, GateStrong* and OneLongSegment8192 included).
// Any NaN/inf fails; 256 sentinel bytes after each output buffer must come back untouched, and
// every output buffer and the workspace start as NaN garbage (0xFF bytes).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/cpu/reference_ops.h"
#include "ops/cuda/gdn/gdn.h"

namespace {

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

constexpr size_t kGuard = 256;
constexpr unsigned char kGuardByte = 0xA5;

// A device buffer of `bytes` plus a guard tail; the payload starts as 0xFF (NaN) garbage.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  void alloc(size_t n) {
    bytes = n;
    ASSERT_EQ(cudaMalloc(&p, n + kGuard), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, 0xFF, n), cudaSuccess);
    ASSERT_EQ(cudaMemset(static_cast<char*>(p) + n, kGuardByte, kGuard), cudaSuccess);
  }
  bool guard_ok() const {
    std::vector<unsigned char> g(kGuard);
    if (cudaMemcpy(g.data(), static_cast<const char*>(p) + bytes, kGuard, cudaMemcpyDeviceToHost) != cudaSuccess)
      return false;
    return std::all_of(g.begin(), g.end(), [](unsigned char c) { return c == kGuardByte; });
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
};

struct Err {
  double rel = 0, max_abs = 0;
  bool finite = true;
};
template <typename A>
Err rel_rms(const std::vector<A>& x, const std::vector<double>& truth) {
  Err e;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = static_cast<double>(x[i]);
    if (!std::isfinite(v)) e.finite = false;
    const double d = v - truth[i];
    num += d * d;
    den += truth[i] * truth[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  e.rel = std::sqrt(num / std::max(den, 1e-300));
  return e;
}

enum class Gate { Normal, NearZero, Strong };
enum class Beta { Normal, NearZero, NearOne };

struct Case {
  int Hk, Hv, K, V;
  std::vector<int> lens;
  Gate gate = Gate::Normal;
  Beta beta = Beta::Normal;
  uint32_t seed = 1;
  bool keep_state = false;  // the forward keeps its state for the backward (the training path)
  qt::GdnKeep keep = qt::GdnKeep::States;  // what it keeps (Prep: the backward must equal a recomputing one)
  int min_segments = 0;     // the forward's plan must split into at least this many segments
  float do_scale = 1.f;     // dO's magnitude (the fp16 backward scales each tile into range)
  float v_scale = 1.f;      // v's magnitude (the states' and D's)
  bool split = true;        // GdnArgs::split (off: no sample is split, whatever its length)
  bool mma_sync = false;    // GdnArgs::mma_sync (the mma.sync kernels at dk = dv = 128 too)
};

void check_tensor(const char* name, bool bf16_out, const Err& gpu, const Err& floor) {
  const double tol = bf16_out ? 2.0 * floor.rel + 1e-3 : 10.0 * floor.rel + 1e-3;
  EXPECT_TRUE(gpu.finite) << name << " has NaN/inf";
  EXPECT_LE(gpu.rel, tol) << name << ": rel RMS " << gpu.rel << " > tol " << tol << " (floor " << floor.rel
                          << ", max abs " << gpu.max_abs << ")";
  std::printf("  %-6s rel %.3e  floor %.3e  tol %.3e  max_abs %.3e\n", name, gpu.rel, floor.rel, tol, gpu.max_abs);
}

void run_case(const Case& c) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const int Hk = c.Hk, Hv = c.Hv, K = c.K, V = c.V;
  const int N = static_cast<int>(c.lens.size());
  std::vector<int32_t> cu(static_cast<size_t>(N) + 1, 0);
  for (int s = 0; s < N; ++s) cu[static_cast<size_t>(s) + 1] = cu[static_cast<size_t>(s)] + c.lens[static_cast<size_t>(s)];
  const int T = cu.back();
  int max_len = 0;
  for (int l : c.lens) max_len = std::max(max_len, l);
  const int CD = 2 * Hk * K + Hv * V;
  std::printf("case Hk %d Hv %d K %d V %d T %d samples %d\n", Hk, Hv, K, V, T, N);

  // Inputs, rounded to bf16 (qkv, d_o) before the reference sees them.
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> u11(-1.f, 1.f), u01(0.f, 1.f);
  std::vector<uint16_t> qkv_h(static_cast<size_t>(T) * CD), do_h(static_cast<size_t>(T) * Hv * V);
  std::vector<double> qkv_d(qkv_h.size()), do_d(do_h.size());
  for (size_t i = 0; i < qkv_h.size(); ++i) {
    const bool is_v = static_cast<int>(i % static_cast<size_t>(CD)) >= 2 * Hk * K;
    qkv_h[i] = to_bf16(u11(rng) * (is_v ? c.v_scale : 1.f));
    qkv_d[i] = from_bf16(qkv_h[i]);
  }
  for (size_t i = 0; i < do_h.size(); ++i) {
    do_h[i] = to_bf16(u11(rng) * c.do_scale);
    do_d[i] = from_bf16(do_h[i]);
  }
  std::vector<float> g_h(static_cast<size_t>(T) * Hv), b_h(g_h.size());
  for (size_t i = 0; i < g_h.size(); ++i) {
    switch (c.gate) {
      case Gate::Normal: g_h[i] = -u01(rng); break;
      case Gate::NearZero: g_h[i] = u01(rng) < 0.5f ? 0.f : -1e-3f * u01(rng); break;
      case Gate::Strong: g_h[i] = -20.f - u01(rng); break;
    }
    switch (c.beta) {
      case Beta::Normal: b_h[i] = u01(rng); break;
      case Beta::NearZero: b_h[i] = 1e-3f * u01(rng); break;
      case Beta::NearOne: b_h[i] = 1.f - 1e-3f * u01(rng); break;
    }
  }
  std::vector<double> g_d(g_h.begin(), g_h.end()), b_d(b_h.begin(), b_h.end());
  std::vector<float> qkv_f(qkv_d.begin(), qkv_d.end()), do_f(do_d.begin(), do_d.end());

  // References: double (truth) and float (the fp32 floor).
  const qt::GdnDims dims{Hk, Hv, K, V};
  std::vector<double> o_d(static_cast<size_t>(T) * Hv * V), dqkv_d(qkv_h.size()), dg_d(g_h.size()), db_d(g_h.size());
  std::vector<float> o_f(o_d.size()), dqkv_f(qkv_h.size()), dg_f(g_h.size()), db_f(g_h.size());
  qt::ref::gdn_forward(o_d.data(), qkv_d.data(), g_d.data(), b_d.data(), dims, T, cu.data(), N);
  qt::ref::gdn_backward(dqkv_d.data(), dg_d.data(), db_d.data(), do_d.data(), qkv_d.data(), g_d.data(), b_d.data(),
                        dims, T, cu.data(), N);
  qt::ref::gdn_backward(dqkv_f.data(), dg_f.data(), db_f.data(), do_f.data(), qkv_f.data(), g_h.data(), b_h.data(),
                        dims, T, cu.data(), N);

  // Device.
  DevBuf qkv, d_o, g, beta, cu_d, o, dqkv, dg, dbeta, ws;
  qkv.alloc(qkv_h.size() * 2);
  d_o.alloc(do_h.size() * 2);
  g.alloc(g_h.size() * 4);
  beta.alloc(b_h.size() * 4);
  cu_d.alloc(cu.size() * 4);
  o.alloc(o_d.size() * 2);
  dqkv.alloc(qkv_h.size() * 2);
  dg.alloc(g_h.size() * 4);
  dbeta.alloc(g_h.size() * 4);
  CK(cudaMemcpy(qkv.p, qkv_h.data(), qkv.bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_o.p, do_h.data(), d_o.bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(g.p, g_h.data(), g.bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(beta.p, b_h.data(), beta.bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(cu_d.p, cu.data(), cu_d.bytes, cudaMemcpyHostToDevice));
  qt::cuda::GdnArgs a{static_cast<const int32_t*>(cu_d.p), N, max_len, T, Hk, Hv, K, V};
  a.split = c.split;
  a.mma_sync = c.mma_sync;
  ws.alloc(qt::cuda::gdn_workspace_bytes(a));
  DevBuf state;
  if (c.keep_state) state.alloc(qt::cuda::gdn_state_bytes(a, c.keep));
  const bool prep_only = c.keep_state && c.keep == qt::GdnKeep::Prep;
  if (prep_only && K == 128 && V == 128 && !c.mma_sync) {
    EXPECT_GT(state.bytes, 0u) << "the wgmma path keeps prep's results";
    EXPECT_LT(state.bytes * 4, qt::cuda::gdn_state_bytes(a)) << "prep's part is a small part of the whole state";
  }

  qt::cuda::gdn_forward(o.p, qkv.p, static_cast<const float*>(g.p), static_cast<const float*>(beta.p), a, ws.p, nullptr,
                        state.p, c.keep);
  CK(cudaDeviceSynchronize());
  if (c.min_segments > 0) {
    const int segs = qt::cuda::gdn_planned_segments(a, ws.p, state.p, c.keep);
    std::printf("  forward scan segments %d (samples %d)\n", segs, N);
    EXPECT_GE(segs, c.min_segments) << "the forward did not split the long samples";
  }
  if (!c.split) {
    EXPECT_EQ(qt::cuda::gdn_planned_segments(a, ws.p, state.p, c.keep), N) << "a sample split with the split off";
  }
  CK(cudaMemset(ws.p, 0xFF, ws.bytes));  // the backward must not rely on what the forward left there
  // A kept state may be read more than once (the second backward's results are checked).
  for (int pass = 0; pass < (c.keep_state ? 2 : 1); ++pass) {
    qt::cuda::gdn_backward(dqkv.p, static_cast<float*>(dg.p), static_cast<float*>(dbeta.p), d_o.p, qkv.p,
                           static_cast<const float*>(g.p), static_cast<const float*>(beta.p), a, ws.p, nullptr,
                           state.p, c.keep);
    CK(cudaDeviceSynchronize());
    if (pass == 0 && c.keep_state) {
      CK(cudaMemset(ws.p, 0xFF, ws.bytes));
    }
  }
  if (c.min_segments > 0 && (!c.keep_state || prep_only)) {  // the recomputed forward and the reverse scan split too
    const int segs = qt::cuda::gdn_planned_segments(a, ws.p, state.p, c.keep);  // Prep: the plan is in ws
    std::printf("  backward segments %d\n", segs);
    EXPECT_GE(segs, c.min_segments) << "the backward did not split the long samples";
  }

  std::vector<uint16_t> o_gh(o_d.size()), dqkv_gh(qkv_h.size());
  std::vector<float> dg_g(g_h.size()), db_g(g_h.size());
  CK(cudaMemcpy(o_gh.data(), o.p, o.bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dqkv_gh.data(), dqkv.p, dqkv.bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(dg_g.data(), dg.p, dg.bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(db_g.data(), dbeta.p, dbeta.bytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(o.guard_ok()) << "write past o";
  EXPECT_TRUE(dqkv.guard_ok()) << "write past dqkv";
  EXPECT_TRUE(dg.guard_ok()) << "write past dg";
  EXPECT_TRUE(dbeta.guard_ok()) << "write past dbeta";
  EXPECT_TRUE(ws.guard_ok()) << "write past the workspace";
  if (c.keep_state) {
    EXPECT_TRUE(state.guard_ok()) << "write past the kept state";
  }
  if (prep_only) {
    // The same kernels as a backward that recomputes prep too, on the same T and gates: bit-equal.
    DevBuf dqkv2, dg2, dbeta2;
    dqkv2.alloc(dqkv.bytes);
    dg2.alloc(dg.bytes);
    dbeta2.alloc(dbeta.bytes);
    qt::cuda::gdn_backward(dqkv2.p, static_cast<float*>(dg2.p), static_cast<float*>(dbeta2.p), d_o.p, qkv.p,
                           static_cast<const float*>(g.p), static_cast<const float*>(beta.p), a, ws.p, nullptr);
    CK(cudaDeviceSynchronize());
    auto same = [](const DevBuf& x, const DevBuf& y) {
      std::vector<unsigned char> hx(x.bytes), hy(y.bytes);
      EXPECT_EQ(cudaMemcpy(hx.data(), x.p, x.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(hy.data(), y.p, y.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      return hx == hy;
    };
    EXPECT_TRUE(same(dqkv, dqkv2)) << "dqkv from prep's kept results differs from the recomputing backward's";
    EXPECT_TRUE(same(dg, dg2)) << "dg from prep's kept results differs from the recomputing backward's";
    EXPECT_TRUE(same(dbeta, dbeta2)) << "dbeta from prep's kept results differs from the recomputing backward's";
  }

  // Split dqkv into dq, dk, dv (GPU as float, truth, bf16(truth)).
  auto section = [&](int begin, int width, auto get) {
    std::vector<double> out;
    out.reserve(static_cast<size_t>(T) * width);
    for (int t = 0; t < T; ++t)
      for (int x = 0; x < width; ++x) out.push_back(get(static_cast<size_t>(t) * CD + begin + x));
    return out;
  };
  auto bf16_round = [](const std::vector<double>& v) {
    std::vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = from_bf16(to_bf16(static_cast<float>(v[i])));
    return r;
  };
  std::vector<double> o_g(o_gh.size());
  for (size_t i = 0; i < o_gh.size(); ++i) o_g[i] = from_bf16(o_gh[i]);
  check_tensor("o", true, rel_rms(o_g, o_d), rel_rms(bf16_round(o_d), o_d));
  const int off[3] = {0, Hk * K, 2 * Hk * K}, width[3] = {Hk * K, Hk * K, Hv * V};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; ++p) {
    const auto truth = section(off[p], width[p], [&](size_t i) { return dqkv_d[i]; });
    const auto gpu = section(off[p], width[p], [&](size_t i) { return static_cast<double>(from_bf16(dqkv_gh[i])); });
    check_tensor(names[p], true, rel_rms(gpu, truth), rel_rms(bf16_round(truth), truth));
  }
  check_tensor("dg", false, rel_rms(dg_g, dg_d), rel_rms(dg_f, dg_d));
  check_tensor("dbeta", false, rel_rms(db_g, db_d), rel_rms(db_f, db_d));
}

TEST(CudaGdn, SegmentEdgesGrouped) {
  run_case({2, 4, 16, 32, {1, 2, 3, 63, 64, 65, 127, 129}, Gate::Normal, Beta::Normal, 11});
}
TEST(CudaGdn, SegmentEdgesEqualHeadsKWide) {
  run_case({2, 2, 32, 16, {129, 1, 64, 3, 65, 2, 127, 63}, Gate::Normal, Beta::Normal, 12});
}
TEST(CudaGdn, GroupOfThree) { run_case({1, 3, 16, 32, {70, 1, 130}, Gate::Normal, Beta::Normal, 13}); }
// dk = 48, dv = 80: head dims whose rows are not a power-of-two count of 16-byte pieces (the L2
// norm's one-warp-per-row path, non-power-of-two cp.async row pieces).
TEST(CudaGdn, HeadDimsNotPowersOfTwo) { run_case({1, 2, 48, 80, {70, 1, 130}, Gate::Normal, Beta::Normal, 23}); }
TEST(CudaGdn, RealHeadDims) { run_case({1, 2, 128, 128, {65, 200, 1}, Gate::Normal, Beta::Normal, 14}); }
// dk = dv = 128 with the segment edges and strong gates; and the same on the mma.sync kernels
// (GdnArgs::mma_sync): at 4 value heads their scans run 32 columns per CTA and dD_local by its own
// kernel.
TEST(CudaGdn, RealHeadDimsSegmentEdgesStrongGates) {
  run_case({2, 4, 128, 128, {1, 2, 3, 63, 64, 65, 127, 129, 300}, Gate::Strong, Beta::NearOne, 21});
}
TEST(CudaGdn, RealHeadDimsSegmentEdgesStrongGatesMmaSync) {
  Case c{2, 4, 128, 128, {1, 2, 3, 63, 64, 65, 127, 129, 300}, Gate::Strong, Beta::NearOne, 21};
  c.mma_sync = true;
  run_case(c);
}
// The 4B / 9B head layout (16 key heads, 32 value heads, dk = dv = 128): the default scans then run
// at bv = 128 (column_block), one 512-thread CTA per (sample, head).
TEST(CudaGdn, FourBHeadsDefaultScanOneCtaPerHead) {
  run_case({16, 32, 128, 128, {1, 65, 300, 2, 129}, Gate::Normal, Beta::Normal, 22});
}
// The same layout on the mma.sync kernels, with the state kept: their scans at bv = 128 (one
// 512-thread CTA per (sample, head)), the reverse scan forming dD_local itself.
TEST(CudaGdn, FourBHeadsMmaSyncKeptState) {
  Case c{16, 32, 128, 128, {1, 65, 300, 2, 129}, Gate::Normal, Beta::Normal, 22};
  c.keep_state = true;
  c.mma_sync = true;
  run_case(c);
}
// The training path: the forward keeps its state (h, D, W, T, ...) and the backward reads it. With
// 9 samples x 32 heads (more scan CTAs than SMs) the wgmma forward scan forms the output and stores
// h and D in the same kernel; with the segment edges (fewer CTAs than SMs) the output kernel runs.
TEST(CudaGdn, FourBHeadsKeptState) {
  Case c{16, 32, 128, 128, {1, 65, 300, 2, 129, 64, 3, 200, 70}, Gate::Normal, Beta::Normal, 25};
  c.keep_state = true;
  run_case(c);
}
// The segment edges and strong gates at the 4B head layout: 17 chunks x 32 heads = 544 items, so the
// persistent wgmma bwd_chunk walks ~4 per CTA and prefetches partial chunks (1, 2, 3, 63 rows: zero
// filled tiles, gates and scales) while it finishes another item.
TEST(CudaGdn, FourBHeadsSegmentEdgesStrongGates) {
  run_case({16, 32, 128, 128, {1, 2, 3, 63, 64, 65, 127, 129, 300}, Gate::Strong, Beta::NearOne, 27});
}
// The 27B head layout (16 key heads, 48 value heads, dk = dv = 128): three value heads per key head,
// so qk_grad sums each key head's three bf16 dq^ / dk^ rows (one batch of up to four); the kept state too.
TEST(CudaGdn, TwentySevenBHeadsKeptState) {
  Case c{16, 48, 128, 128, {1, 65, 300, 2, 129, 64, 3}, Gate::Normal, Beta::Normal, 35};
  c.keep_state = true;
  run_case(c);
}
TEST(CudaGdn, TwentySevenBHeadsSegmentEdges) {
  run_case({16, 48, 128, 128, {1, 2, 3, 63, 64, 65, 127, 129}, Gate::Strong, Beta::NearZero, 36});
}
// Six value heads per key head at dk = dv = 128: qk_grad sums them in two batches (four, then two).
TEST(CudaGdn, SixValueHeadsPerKeyHead) {
  run_case({2, 12, 128, 128, {65, 200, 1, 129, 64}, Gate::Normal, Beta::Normal, 37});
}
// The 2B head layout (one value head per key head, dk = dv = 128): the wgmma bwd_chunk applies the
// L2-norm backward itself and writes dq, dk (no qk_grad). 17 chunks x 16 heads = 272 items, so the
// persistent bwd_chunk walks two or three per CTA.
TEST(CudaGdn, TwoBHeadsSegmentEdgesStrongGates) {
  run_case({16, 16, 128, 128, {1, 2, 3, 63, 64, 65, 127, 129, 300}, Gate::Strong, Beta::NearOne, 28});
}
TEST(CudaGdn, TwoBHeadsKeptState) {
  Case c{4, 4, 128, 128, {1, 65, 300, 2, 129, 64, 3, 200, 70}, Gate::Normal, Beta::Normal, 29};
  c.keep_state = true;
  run_case(c);
}
TEST(CudaGdn, RealHeadDimsSegmentEdgesKeptState) {
  Case c{2, 4, 128, 128, {1, 2, 3, 63, 64, 65, 127, 129, 300}, Gate::Strong, Beta::NearOne, 26};
  c.keep_state = true;
  run_case(c);
}
// Magnitudes far from 1 at dk = dv = 128, where the backward keeps h, D, dh and dD as fp16 tiles
// times a power of two each and bwd_chunk multiplies in fp16: gradients of a mean loss over many
// tokens (1e-7, below fp16's normal range unscaled) and large ones (3e4, dS past fp16's largest
// unscaled), large values (v: the states and D); 2B heads too (bwd_chunk's L2-norm instance).
TEST(CudaGdn, TinyGradientsFp16Tiles) {
  Case c{4, 8, 128, 128, {1, 65, 300, 129, 64}, Gate::NearZero, Beta::Normal, 42};
  c.do_scale = 1e-7f;
  run_case(c);
}
TEST(CudaGdn, LargeGradientsAndValuesFp16Tiles) {
  Case c{4, 8, 128, 128, {1, 65, 300, 129, 64}, Gate::NearZero, Beta::NearOne, 43};
  c.do_scale = 3e4f;
  c.v_scale = 300.f;
  run_case(c);
}
TEST(CudaGdn, TwoBHeadsTinyGradientsFp16Tiles) {
  Case c{8, 8, 128, 128, {200, 3, 129, 64}, Gate::Normal, Beta::Normal, 44};
  c.do_scale = 1e-6f;
  c.v_scale = 40.f;
  run_case(c);
}
TEST(CudaGdn, ManyShortSegments) {
  std::mt19937 rng(5);
  std::vector<int> lens(300);
  for (int& l : lens) l = 1 + static_cast<int>(rng() % 40);
  run_case({2, 4, 16, 32, lens, Gate::Normal, Beta::Normal, 15});
}
TEST(CudaGdn, GateNearZeroBetaNearOne) {
  run_case({2, 4, 16, 32, {64, 129, 1, 200}, Gate::NearZero, Beta::NearOne, 16});
}
TEST(CudaGdn, GateStrongBetaNearZero) {
  run_case({2, 4, 16, 32, {64, 129, 1, 200}, Gate::Strong, Beta::NearZero, 17});
}
TEST(CudaGdn, GateStrongBetaNearOne) {
  run_case({1, 2, 32, 16, {64, 129, 1, 200}, Gate::Strong, Beta::NearOne, 18});
}
TEST(CudaGdn, GateNearZeroBetaNearZero) {
  run_case({1, 3, 16, 32, {64, 129, 1, 200}, Gate::NearZero, Beta::NearZero, 19});
}
TEST(CudaGdn, OneLongSegment8192) { run_case({2, 4, 64, 64, {8192}, Gate::Normal, Beta::Normal, 20}); }
// The real head dims over 128 chunks of one sample: the wgmma forward scan's state stays in its
// accumulators across every chunk step (and its two load buffers alternate 64 times).
TEST(CudaGdn, RealHeadDimsOneLongSegment8192) {
  Case c{1, 2, 128, 128, {8192}, Gate::Normal, Beta::Normal, 24};
  c.min_segments = 3;  // the forward and the backward split it
  run_case(c);
}
// The same sample with the split off (GdnArgs::split): one plain scan CTA per head through it.
TEST(CudaGdn, RealHeadDimsOneLongSegment8192SplitOff) {
  Case c{1, 2, 128, 128, {8192}, Gate::Normal, Beta::Normal, 24};
  c.split = false;
  run_case(c);
}
// The intra-sample split (gdn/plan.cu's plan): a long sample among short ones, its state kept for
// thousands of rows (gates near 0), so every segment's entering state S_s = M S + E matters; and
// two long samples split at once (their state slots side by side), at the 4B head layout too.
TEST(CudaGdn, SplitLongSampleAmongShortGatesNearZero) {
  Case c{2, 4, 128, 128, {700, 5000, 1, 129}, Gate::NearZero, Beta::Normal, 30};
  c.min_segments = 6;
  run_case(c);
}
TEST(CudaGdn, SplitTwoLongSamplesStrongBeta) {
  Case c{1, 3, 128, 128, {3000, 65, 2600}, Gate::NearZero, Beta::NearOne, 31};
  c.min_segments = 7;
  run_case(c);
}
TEST(CudaGdn, SplitFourBHeadsOneLongSample) {
  Case c{16, 32, 128, 128, {6000}, Gate::Normal, Beta::Normal, 32};
  c.min_segments = 3;
  run_case(c);
}
// The training path splits too: the kept forward stores h and D from its split items and keeps the
// maps' M, which the backward's reverse split combines with. Few heads: the output kernel runs
// beside the scan; 4B heads with more (sample, head) pairs than the H200's 132 SMs: the output is
// formed in the scan (its ticket instance with the state stores). The plan splits the long sample
// in 5 (tests/test_gdn_plan.cpp's rules; at 27B heads it splits none of these rows).
TEST(CudaGdn, SplitKeptStateGatesNearZero) {
  Case c{2, 4, 128, 128, {700, 5000, 1, 129}, Gate::NearZero, Beta::Normal, 33};
  c.keep_state = true;
  c.min_segments = 6;
  run_case(c);
}
// Prep's results kept (GdnKeep::Prep, flash-linear-attention's saved set): the backward runs the
// chunk table and the forward scan again but not prep, and must equal the recomputing backward bit
// for bit (run_case); at the 27B and 2B head layouts, with a split, and where the mma.sync scans run
// (dk, dv != 128: nothing is kept there, the backward recomputes prep).
TEST(CudaGdn, TwentySevenBHeadsPrepKept) {
  Case c{16, 48, 128, 128, {1, 65, 300, 2, 129, 64, 3}, Gate::Normal, Beta::Normal, 38};
  c.keep_state = true;
  c.keep = qt::GdnKeep::Prep;
  run_case(c);
}
TEST(CudaGdn, TwoBHeadsSegmentEdgesPrepKept) {
  Case c{16, 16, 128, 128, {1, 2, 3, 63, 64, 65, 127, 129, 300}, Gate::Strong, Beta::NearOne, 39};
  c.keep_state = true;
  c.keep = qt::GdnKeep::Prep;
  run_case(c);
}
TEST(CudaGdn, SplitPrepKeptGatesNearZero) {
  Case c{2, 4, 128, 128, {700, 5000, 1, 129}, Gate::NearZero, Beta::Normal, 40};
  c.keep_state = true;
  c.keep = qt::GdnKeep::Prep;
  c.min_segments = 6;
  run_case(c);
}
TEST(CudaGdn, HeadDimsNotPowersOfTwoPrepKept) {
  Case c{1, 2, 48, 80, {70, 1, 130}, Gate::Normal, Beta::Normal, 41};
  c.keep_state = true;
  c.keep = qt::GdnKeep::Prep;
  run_case(c);
}
TEST(CudaGdn, SplitKeptStateFourBHeadsOutputInScan) {
  Case c{16, 32, 128, 128, {6000, 100, 100, 100, 64}, Gate::Normal, Beta::Normal, 34};
  c.keep_state = true;
  c.min_segments = 9;
  run_case(c);
}

}  // namespace
