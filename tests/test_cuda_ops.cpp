// CudaBackend vs the fp32 CpuBackend reference on the same random inputs (bf16-rounded values fed
// to both; the CPU gets f32 copies). Every GPU output has a sentinel guard region after it (must be
// untouched), NaN/inf fail, and the tolerance is derived from the output precision:
//
//   max|gpu - ref| <= k * max|bf16(ref) - ref| + atol,   atol = 2^-10 * max|ref| + 1e-6
//
// ref is the fp32 CPU result, bf16(ref) its rounding to the GPU's storage type (flash-attention's
// rule: the GPU may be at most k times worse than just storing the exact answer in bf16). k = 2 for
// ops whose only bf16 rounding is the output's (one rounding, plus a possible tie flip and fp32
// reordering); k = 4 where the GPU path rounds an intermediate to bf16 by design (the cross-entropy
// gradient feeding its GEMMs, the tensor-core mixers). atol is a quarter bf16 ulp of the output's
// scale, for outputs whose exact values are near zero (where the bf16 rounding error vanishes but
// fp32 reordering does not). Every test GTEST_SKIPs when no CUDA device exists.
// AdamW is checked bit-exact against ops/cpu/adamw.cpp.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "ops/cpu/cpu_backend.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/cuda_backend.h"
#include "test_util.h"
#include "ops/cpu/adamw.h"

namespace qt {
namespace {

float max_abs(const std::vector<float>& v) {
  float r = 0;
  for (float x : v) r = std::max(r, std::fabs(x));
  return r;
}


bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define QT_REQUIRE_GPU() \
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device"

constexpr int64_t kGuard = 64;            // elements after every GPU output
constexpr uint16_t kSentinelBf16 = 0x4b1d;
constexpr uint32_t kSentinelF32 = 0x4b1d4b1du;

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) / float(1ull << 24); }
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }
};

float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// One logical tensor on both backends: `gpu` (bf16 or f32, followed by a guard region for
// outputs) and `cpu` (f32, or i32 for index tensors).
struct Pair {
  Tensor gpu, cpu;
  Tensor gpu_full;  // gpu plus its guard
  bool output = false;
};

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_gpu()) return;
    g_ = std::make_unique<CudaBackend>();
    c_ = std::make_unique<CpuBackend>();
  }

  // Random input in [lo, hi), rounded to bf16 (also for f32 GPU tensors: both sides identical).
  Pair input(const Shape& s, float lo = -1.0f, float hi = 1.0f, DType gd = DType::BF16) {
    std::vector<float> v(static_cast<size_t>(shape_numel(s)));
    for (auto& x : v) x = round_bf16(rng_.uniform(lo, hi));
    return from_values(s, v, gd);
  }
  Pair from_values(const Shape& s, const std::vector<float>& v, DType gd = DType::BF16) {
    Pair p;
    p.gpu = g_->alloc(gd, s);
    p.cpu = c_->alloc(DType::F32, s);
    upload(p.gpu, v);
    std::memcpy(p.cpu.data, v.data(), v.size() * 4);
    return p;
  }
  Pair ints(const Shape& s, const std::vector<int32_t>& v) {
    Pair p;
    p.gpu = g_->alloc(DType::I32, s);
    p.cpu = c_->alloc(DType::I32, s);
    g_->copy_from_host(p.gpu, v.data());
    std::memcpy(p.cpu.data, v.data(), v.size() * 4);
    return p;
  }
  // Output with a guard region; acc outputs start from the same random values on both sides.
  Pair output(const Shape& s, DType gd = DType::BF16, bool random_init = false) {
    Pair p;
    p.output = true;
    const int64_t n = shape_numel(s);
    p.gpu_full = g_->alloc(gd, {n + kGuard});
    p.gpu = Tensor(p.gpu_full.data, gd, s, p.gpu_full.device);
    p.cpu = c_->alloc(DType::F32, s);
    if (gd == DType::BF16) {
      std::vector<uint16_t> h(static_cast<size_t>(n + kGuard), kSentinelBf16);
      g_->copy_from_host(p.gpu_full, h.data());
    } else {
      std::vector<uint32_t> h(static_cast<size_t>(n + kGuard), kSentinelF32);
      g_->copy_from_host(p.gpu_full, h.data());
    }
    if (random_init) {
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = round_bf16(rng_.uniform(-1.0f, 1.0f));
      upload(p.gpu, v);
      std::memcpy(p.cpu.data, v.data(), v.size() * 4);
    }
    return p;
  }
  void upload(const Tensor& t, const std::vector<float>& v) {
    if (t.dtype == DType::BF16) {
      std::vector<bf16> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = float_to_bf16(v[i]);
      g_->copy_from_host(t, h.data());
    } else {
      g_->copy_from_host(t, v.data());
    }
  }
  std::vector<float> download(const Tensor& t) {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::BF16) {
      std::vector<bf16> h(out.size());
      g_->copy_to_host(h.data(), t);
      for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_float(h[i]);
    } else {
      g_->copy_to_host(out.data(), t);
    }
    return out;
  }

  // An output's guard region is untouched.
  void expect_guards(const char* what, const Pair& p) {
    if (p.output) {
      const size_t n = static_cast<size_t>(p.gpu.numel()), es = dtype_size(p.gpu.dtype);
      std::vector<uint8_t> raw((n + kGuard) * es);
      g_->copy_to_host(raw.data(), p.gpu_full);
      for (int64_t i = 0; i < kGuard; ++i) {
        if (es == 2) {
          uint16_t b;
          std::memcpy(&b, raw.data() + (n + i) * 2, 2);
          ASSERT_EQ(b, kSentinelBf16) << what << ": guard element " << i << " after the output was overwritten";
        } else {
          uint32_t b;
          std::memcpy(&b, raw.data() + (n + i) * 4, 4);
          ASSERT_EQ(b, kSentinelF32) << what << ": guard element " << i << " after the output was overwritten";
        }
      }
    }
  }

  // Compares an output against the CPU reference with the precision-derived tolerance.
  void expect_close(const char* what, const Pair& p, double k = 2.0) {
    SCOPED_TRACE(what);
    expect_guards(what, p);
    const std::vector<float> got = download(p.gpu);
    const float* ref = p.cpu.ptr<float>();
    double err = 0, err_bf16 = 0, ref_max = 0;
    int64_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] = " << got[i];
      ASSERT_TRUE(std::isfinite(ref[i])) << what << " reference[" << i << "] = " << ref[i];
      const double e = std::fabs(double(got[i]) - ref[i]);
      if (e > err) {
        err = e;
        worst = int64_t(i);
      }
      err_bf16 = std::max(err_bf16, std::fabs(double(round_bf16(ref[i])) - ref[i]));
      ref_max = std::max(ref_max, std::fabs(double(ref[i])));
    }
    const double atol = ref_max / 1024.0 + 1e-6;
    const double tol = k * err_bf16 + atol;
    EXPECT_LE(err, tol) << what << ": max error " << err << " at " << worst << " (gpu " << got[size_t(worst)]
                        << ", ref " << ref[worst] << "); bf16 rounding error of the reference " << err_bf16
                        << ", k " << k << ", atol " << atol;
  }

  // (1+w) RMSNorm forward, then backward into fresh and accumulated dx, dw of type dw_type.
  void rmsnorm_case(int64_t T, int64_t H, DType dw_type) {
    SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H));
    Pair x = input({T, H}, -3, 3), w = input({H}, -0.5, 0.5), y = output({T, H}), rstd = output({T}, DType::F32);
    g_->rmsnorm_forward(y.gpu, rstd.gpu, x.gpu, w.gpu, 1e-6, Tensor());
    c_->rmsnorm_forward(y.cpu, rstd.cpu, x.cpu, w.cpu, 1e-6, Tensor());
    expect_close("y", y);
    expect_close("rstd", rstd);
    for (bool acc : {false, true}) {
      Pair dy = input({T, H}), dx = output({T, H}, DType::BF16, acc), dw = output({H}, dw_type, true);
      g_->rmsnorm_backward(dx.gpu, dw.gpu, dy.gpu, x.gpu, w.gpu, rstd.gpu, acc, Tensor());
      c_->rmsnorm_backward(dx.cpu, dw.cpu, dy.cpu, x.cpu, w.cpu, rstd.cpu, acc, Tensor());
      expect_close(acc ? "dx (acc)" : "dx", dx);
      expect_close("dw", dw);
    }
    // The amax outputs on every kernel path (folded in by the wide-row and ring kernels, by a pass
    // after the others): max|out| of the stored values.
    Pair m = output({2}, DType::F32), y2 = output({T, H});
    upload(m.gpu, {0.0f, 0.0f});
    const auto word = [&](int i) { return Tensor(m.gpu.ptr<float>() + i, DType::F32, {1}, m.gpu.device); };
    g_->rmsnorm_forward(y2.gpu, rstd.gpu, x.gpu, w.gpu, 1e-6, word(0));
    EXPECT_EQ(download(y2.gpu), download(y.gpu));
    Pair dy = input({T, H}), dx = output({T, H}, DType::BF16, true);
    g_->rmsnorm_backward(dx.gpu, Tensor(), dy.gpu, x.gpu, w.gpu, rstd.gpu, true, word(1));
    EXPECT_EQ(download(m.gpu)[0], max_abs(download(y.gpu)));
    EXPECT_EQ(download(m.gpu)[1], max_abs(download(dx.gpu)));
  }

  // Sample lengths: many short samples (1- and 2-token ones included), then one long sample.
  std::vector<int32_t> varlen_cu(int64_t T) {
    const int pattern[] = {1, 2, 1, 3, 2, 1, 5, 2, 4, 1, 2, 7, 3};
    std::vector<int32_t> cu{0};
    int64_t at = 0;
    for (int len : pattern) {
      if (at + len >= T) break;
      if (T < 40 && at > T / 2) break;
      at += len;
      cu.push_back(int32_t(at));
    }
    cu.push_back(int32_t(T));  // the long remainder
    return cu;
  }
  struct Seqs {
    Pair cu;
    SeqInfo gpu, cpu;
  };
  Seqs seqs(int64_t T) {
    Seqs s;
    const std::vector<int32_t> cu = varlen_cu(T);
    const int n = int(cu.size()) - 1;
    s.cu = ints({n + 1}, cu);
    int longest = 0;
    for (int i = 0; i < n; ++i) longest = std::max(longest, cu[i + 1] - cu[i]);
    s.gpu = SeqInfo{s.cu.gpu, n, longest, int(T)};
    s.cpu = SeqInfo{s.cu.cpu, n, longest, int(T)};
    return s;
  }

  Rng rng_{12345};
  std::unique_ptr<CudaBackend> g_;
  std::unique_ptr<CpuBackend> c_;
};

const int64_t kTokens[] = {1, 7, 133, 1021};

// ---- dense ---------------------------------------------------------------------------------------

TEST_F(OpsTest, Linear) {
  QT_REQUIRE_GPU();
  for (int64_t T : kTokens) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{96, 200}, {200, 96}, {7, 13}}) {
      SCOPED_TRACE("T " + std::to_string(T) + " N " + std::to_string(N) + " K " + std::to_string(K));
      Pair x = input({T, K}), w = input({N, K}), y = output({T, N});
      g_->linear_forward(y.gpu, x.gpu, w.gpu);
      c_->linear_forward(y.cpu, x.cpu, w.cpu);
      expect_close("y", y);
      for (bool acc : {false, true}) {
        // acc: dx and dw accumulate into prefilled values; else both are written over NaN fill.
        Pair dy = input({T, N}), dx = output({T, K}, DType::BF16, acc), dw = output({N, K}, DType::BF16, acc);
        Pair dw32 = output({N, K}, DType::F32, acc);
        g_->linear_backward(dx.gpu, dw.gpu, dy.gpu, x.gpu, w.gpu, acc, acc);
        c_->linear_backward(dx.cpu, dw.cpu, dy.cpu, x.cpu, w.cpu, acc, acc);
        expect_close(acc ? "dx (acc)" : "dx", dx);
        expect_close(acc ? "dw bf16 (acc)" : "dw bf16", dw);
        g_->linear_backward(Tensor(), dw32.gpu, dy.gpu, x.gpu, w.gpu, false, acc);
        c_->linear_backward(Tensor(), dw32.cpu, dy.cpu, x.cpu, w.cpu, false, acc);
        expect_close(acc ? "dw f32 (acc)" : "dw f32", dw32);
      }
    }
  }
}

// FP8 (quantize_fp8, linear_fp8). The codes must match the CPU reference (core/fp8.h) bit
// for bit, the scale too; the GEMM of the codes then matches the CPU product of the decoded values
// to fp32 reordering plus the bf16 output rounding (k = 2), and the unquantized bf16 product to the
// fp8 rounding bound: each operand's error is at most e = max(|v| / 16, u) (e4m3's half ulp, or
// u = 2^-10 amax / 448, half the subnormal step, for values far below the amax), so
// |y8 - y| <= sum_k (e_x |w| + e_w |x| + e_x e_w) + the bf16 output rounding. Odd token counts,
// zeros and an outlier (the amax) in x, a tensor of tiny values (the scale lifts them out of
// e4m3's subnormals), and guard bytes after every output.
TEST_F(OpsTest, Fp8QuantizeAndLinear) {
  QT_REQUIRE_GPU();
  for (int64_t T : kTokens) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{96, 208}, {200, 96}, {8, 16}, {48, 4096}}) {
      SCOPED_TRACE("T " + std::to_string(T) + " N " + std::to_string(N) + " K " + std::to_string(K));
      const float xr = T == 7 ? 1e-3f : 3.0f;  // 1e-3: below e4m3's normal range unless scaled
      Pair x = input({T, K}, -xr, xr), w = input({N, K}, -0.05f, 0.05f);
      // A few exact zeros and one large outlier (the amax): most values then fall far below it.
      {
        std::vector<float> v = download(x.gpu);
        for (size_t i = 0; i < v.size(); i += 5) v[i] = 0.0f;
        v[v.size() / 2] = round_bf16(40.0f * xr);
        upload(x.gpu, v);
        std::memcpy(x.cpu.data, v.data(), v.size() * 4);
      }
      const auto codes = [&](const Tensor& q) {
        std::vector<uint8_t> h(size_t(q.numel()));
        if (q.device.kind == DeviceKind::CUDA) g_->copy_to_host(h.data(), q);
        else std::memcpy(h.data(), q.data, h.size());
        return h;
      };
      Tensor xq_full = g_->alloc(DType::F8E4M3, {T * K + kGuard}), wq_full = g_->alloc(DType::F8E4M3, {N * K + kGuard});
      {
        std::vector<uint8_t> guard(size_t(T * K + kGuard), 0xA5), guard_w(size_t(N * K + kGuard), 0xA5);
        g_->copy_from_host(xq_full, guard.data());
        g_->copy_from_host(wq_full, guard_w.data());
      }
      Tensor xq(xq_full.data, DType::F8E4M3, {T, K}, xq_full.device), wq(wq_full.data, DType::F8E4M3, {N, K}, wq_full.device);
      Pair xs = output({1}, DType::F32), ws = output({1}, DType::F32);
      Tensor xq_c = c_->alloc(DType::F8E4M3, {T, K}), wq_c = c_->alloc(DType::F8E4M3, {N, K});
      g_->quantize_fp8(xq, Tensor(), xs.gpu, x.gpu, Tensor());
      g_->quantize_fp8(wq, Tensor(), ws.gpu, w.gpu, Tensor());
      c_->quantize_fp8(xq_c, Tensor(), xs.cpu, x.cpu, Tensor());
      c_->quantize_fp8(wq_c, Tensor(), ws.cpu, w.cpu, Tensor());
      {
        const std::vector<uint8_t> gx = codes(Tensor(xq_full.data, DType::F8E4M3, {T * K + kGuard}, xq_full.device));
        const std::vector<uint8_t> cx = codes(xq_c), gw = codes(wq), cw = codes(wq_c);
        for (size_t i = 0; i < cx.size(); ++i) ASSERT_EQ(gx[i], cx[i]) << "x code " << i;
        for (int64_t i = 0; i < kGuard; ++i) ASSERT_EQ(gx[cx.size() + size_t(i)], 0xA5) << "guard byte " << i << " after xq";
        for (size_t i = 0; i < cw.size(); ++i) ASSERT_EQ(gw[i], cw[i]) << "w code " << i;
        EXPECT_EQ(download(xs.gpu)[0], xs.cpu.ptr<float>()[0]);
        EXPECT_EQ(download(ws.gpu)[0], ws.cpu.ptr<float>()[0]);
        // The amax element maps onto 448 exactly.
        EXPECT_EQ(cx[cx.size() / 2], 0x7E);
      }
      {
        // The transposed codes, alone (they then write the scale too) and with q from the same pass,
        // into q_t padded to a multiple of 16 tokens: the CPU's codes, x's codes transposed, zero
        // padding; guards after both.
        const int64_t Tp = (T + 15) / 16 * 16;
        for (bool with_q : {false, true}) {
          SCOPED_TRACE(with_q ? "q and q_t" : "q_t alone");
          Tensor qt_full = g_->alloc(DType::F8E4M3, {K * Tp + kGuard}), q_full = g_->alloc(DType::F8E4M3, {T * K + kGuard});
          std::vector<uint8_t> guard(size_t(K * Tp + kGuard), 0x5A), guard_q(size_t(T * K + kGuard), 0x5A);
          g_->copy_from_host(qt_full, guard.data());
          g_->copy_from_host(q_full, guard_q.data());
          Tensor q_t(qt_full.data, DType::F8E4M3, {K, Tp}, qt_full.device), q_tc = c_->alloc(DType::F8E4M3, {K, Tp});
          Tensor q(q_full.data, DType::F8E4M3, {T, K}, q_full.device);
          Pair ts = output({1}, DType::F32);
          g_->quantize_fp8(with_q ? q : Tensor(), q_t, ts.gpu, x.gpu, Tensor());
          c_->quantize_fp8(Tensor(), q_tc, ts.cpu, x.cpu, Tensor());
          const std::vector<uint8_t> gt = codes(qt_full), ct = codes(q_tc), cx = codes(xq_c), gq = codes(q_full);
          for (int64_t k = 0; k < K; ++k)
            for (int64_t t = 0; t < Tp; ++t) {
              ASSERT_EQ(gt[size_t(k * Tp + t)], ct[size_t(k * Tp + t)]) << "q_t[" << k << ", " << t << "]";
              ASSERT_EQ(ct[size_t(k * Tp + t)], t < T ? cx[size_t(t * K + k)] : 0) << "q_t[" << k << ", " << t << "] vs q";
            }
          for (int64_t i = 0; i < kGuard; ++i) ASSERT_EQ(gt[size_t(K * Tp + i)], 0x5A) << "guard byte " << i << " after q_t";
          for (int64_t i = 0; i < T * K + kGuard; ++i)
            ASSERT_EQ(gq[size_t(i)], with_q && i < T * K ? cx[size_t(i)] : 0x5A) << "q byte " << i;
          EXPECT_EQ(download(ts.gpu)[0], xs.cpu.ptr<float>()[0]);
        }
      }
      Pair y = output({T, N});
      g_->linear_fp8(y.gpu, xq, xs.gpu, wq, ws.gpu, false, false);
      c_->linear_fp8(y.cpu, xq_c, xs.cpu, wq_c, ws.cpu, false, false);
      expect_close("y (fp8 codes)", y);
      // Fast accumulation (the forward's recipe) sums the same codes in the FP8 tensor cores' own
      // reduced precision: each element within 2^-7 of sum |x||w| (DeepSeek-V3 reports ~2^-6
      // relative at K = 4096) of the fp32-summed product, the whole within 2^-8 rms (bf16's half ulp).
      Pair yf = output({T, N});
      g_->linear_fp8(yf.gpu, xq, xs.gpu, wq, ws.gpu, false, true);
      expect_guards("y (fast accumulation)", yf);
      const std::vector<float> fast = download(yf.gpu);
      const float* summed = y.cpu.ptr<float>();
      double fast_err2 = 0, summed2 = 0;
      // Against the unquantized product.
      const std::vector<float> got = download(y.gpu);
      const float* xv = x.cpu.ptr<float>();
      const float* wv = w.cpu.ptr<float>();
      const double ux = std::ldexp(1.0, -10) * double(xs.cpu.ptr<float>()[0]),
                   uw = std::ldexp(1.0, -10) * double(ws.cpu.ptr<float>()[0]);  // scale_inv = amax / 448
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          double exact = 0, bound = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double a = xv[t * K + k], b = wv[n * K + k];
            const double ea = std::max(std::fabs(a) / 16, ux), eb = std::max(std::fabs(b) / 16, uw);
            exact += a * b;
            mag += std::fabs(a * b);
            bound += ea * std::fabs(b) + eb * std::fabs(a) + ea * eb;
          }
          bound += std::fabs(exact) / 128 + 1e-30;
          ASSERT_LE(std::fabs(got[size_t(t * N + n)] - exact), bound) << "y[" << t << ", " << n << "] = "
                                                                      << got[size_t(t * N + n)] << ", bf16 product "
                                                                      << exact;
          const size_t e = size_t(t * N + n);
          const double d = double(fast[e]) - summed[e];
          fast_err2 += d * d;
          summed2 += double(summed[e]) * summed[e];
          ASSERT_LE(std::fabs(d), mag / 128 + std::fabs(summed[e]) / 128 + 1e-30)
              << "fast-accumulated y[" << t << ", " << n << "] = " << fast[e] << ", fp32 sum " << summed[e];
        }
      EXPECT_LE(std::sqrt(fast_err2), std::sqrt(summed2) / 256) << "fast accumulation's rms error";
    }
  }
}

// The backward's products through linear_fp8, from the transposed codes: dgrad dx = dy W (dy's
// codes, W's transposed ones) and wgrad dW = dy^T x (both transposed), written and accumulated, into
// bf16 and f32, against the CPU product of the same codes. The inner dims (N for dgrad, T for
// wgrad) must be multiples of 16 here, so the token counts are.
TEST_F(OpsTest, Fp8BackwardProducts) {
  QT_REQUIRE_GPU();
  for (int64_t T : {16, 48, 1024}) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{96, 208}, {208, 96}}) {
      SCOPED_TRACE("T " + std::to_string(T) + " N " + std::to_string(N) + " K " + std::to_string(K));
      Pair x = input({T, K}, -2, 2), w = input({N, K}, -0.05f, 0.05f), dy = input({T, N}, -0.5f, 0.5f);
      struct Codes {
        Tensor g, c;
      };
      Pair xs = output({1}, DType::F32), ws = output({1}, DType::F32), dys = output({1}, DType::F32);
      const auto codes_t = [&](const Pair& v, int64_t R, int64_t C, Pair& s, bool transposed) {
        Codes q{g_->alloc(DType::F8E4M3, transposed ? Shape{C, R} : Shape{R, C}),
                c_->alloc(DType::F8E4M3, transposed ? Shape{C, R} : Shape{R, C})};
        g_->quantize_fp8(transposed ? Tensor() : q.g, transposed ? q.g : Tensor(), s.gpu, v.gpu, Tensor());
        c_->quantize_fp8(transposed ? Tensor() : q.c, transposed ? q.c : Tensor(), s.cpu, v.cpu, Tensor());
        return q;
      };
      const Codes dyq = codes_t(dy, T, N, dys, false), dyq_t = codes_t(dy, T, N, dys, true);
      const Codes wq_t = codes_t(w, N, K, ws, true), xq_t = codes_t(x, T, K, xs, true);
      for (bool acc : {false, true}) {
        for (DType out : {DType::BF16, DType::F32}) {
          SCOPED_TRACE(std::string(acc ? "accumulate " : "write ") + dtype_name(out));
          Pair dx = output({T, K}, out, acc), dw = output({N, K}, out, acc);
          g_->linear_fp8(dx.gpu, dyq.g, dys.gpu, wq_t.g, ws.gpu, acc, false);
          c_->linear_fp8(dx.cpu, dyq.c, dys.cpu, wq_t.c, ws.cpu, acc, false);
          expect_close("dx = dy W", dx);
          g_->linear_fp8(dw.gpu, dyq_t.g, dys.gpu, xq_t.g, xs.gpu, acc, false);
          c_->linear_fp8(dw.cpu, dyq_t.c, dys.cpu, xq_t.c, xs.cpu, acc, false);
          expect_close("dW = dy^T x", dw);
        }
      }
    }
  }
}

// Shapes off the vectorized cast's layout (13 columns, 7 rows unpadded) take the scalar tile: the
// same codes as the CPU, both outputs.
TEST_F(OpsTest, Fp8QuantizeOddShapes) {
  QT_REQUIRE_GPU();
  for (auto [R, C] : {std::pair<int64_t, int64_t>{7, 13}, {133, 9}, {66, 200}}) {
    SCOPED_TRACE(std::to_string(R) + " x " + std::to_string(C));
    Pair x = input({R, C}, -2, 2), s = output({1}, DType::F32);
    Tensor q = g_->alloc(DType::F8E4M3, {R, C}), q_t = g_->alloc(DType::F8E4M3, {C, R});
    Tensor qc = c_->alloc(DType::F8E4M3, {R, C}), q_tc = c_->alloc(DType::F8E4M3, {C, R});
    g_->quantize_fp8(q, q_t, s.gpu, x.gpu, Tensor());
    c_->quantize_fp8(qc, q_tc, s.cpu, x.cpu, Tensor());
    std::vector<uint8_t> a(size_t(R * C)), b(size_t(R * C));
    g_->copy_to_host(a.data(), q);
    g_->copy_to_host(b.data(), q_t);
    for (int64_t i = 0; i < R * C; ++i) {
      ASSERT_EQ(a[size_t(i)], static_cast<uint8_t*>(qc.data)[i]) << "q " << i;
      ASSERT_EQ(b[size_t(i)], static_cast<uint8_t*>(q_tc.data)[i]) << "q_t " << i;
    }
    EXPECT_EQ(download(s.gpu)[0], s.cpu.ptr<float>()[0]);
  }
}

// quantize_fp8 given the amax its producer folded in: the codes and scale of the pass that takes
// it, the word reset to zero for the next producer; untapped quantizes between them (each cast
// resets the backend's own word and block counter, no memset) stay exact.
TEST_F(OpsTest, Fp8QuantizeReadsTheProducersAmax) {
  QT_REQUIRE_GPU();
  for (auto [R, C] : {std::pair<int64_t, int64_t>{333, 96}, {7, 13}, {1024, 256}}) {
    SCOPED_TRACE(std::to_string(R) + " x " + std::to_string(C));
    const int64_t Rp = (R + 15) / 16 * 16;
    Pair x = input({R, C}, -3, 3), s = output({1}, DType::F32), m = output({1}, DType::F32);
    float amax = 0;
    for (float v : download(x.gpu)) amax = std::max(amax, std::fabs(v));
    Tensor q = g_->alloc(DType::F8E4M3, {R, C}), q_t = g_->alloc(DType::F8E4M3, {C, Rp});
    Tensor qc = c_->alloc(DType::F8E4M3, {R, C}), q_tc = c_->alloc(DType::F8E4M3, {C, Rp});
    c_->quantize_fp8(qc, q_tc, s.cpu, x.cpu, Tensor());
    std::vector<uint8_t> a(size_t(R * C)), b(size_t(C * Rp));
    for (int round = 0; round < 3; ++round) {
      const bool tapped = round != 1;
      if (tapped) upload(m.gpu, {amax});
      g_->quantize_fp8(q, q_t, s.gpu, x.gpu, tapped ? m.gpu : Tensor());
      if (tapped) {
        EXPECT_EQ(download(m.gpu)[0], 0.0f) << "round " << round;
      }
      g_->copy_to_host(a.data(), q);
      g_->copy_to_host(b.data(), q_t);
      for (int64_t i = 0; i < R * C; ++i) ASSERT_EQ(a[size_t(i)], static_cast<uint8_t*>(qc.data)[i]) << round;
      for (int64_t i = 0; i < C * Rp; ++i) ASSERT_EQ(b[size_t(i)], static_cast<uint8_t*>(q_tc.data)[i]) << round;
      EXPECT_EQ(download(s.gpu)[0], s.cpu.ptr<float>()[0]) << round;
    }
  }
}

TEST_F(OpsTest, Fp8BadShapesNamed) {
  QT_REQUIRE_GPU();
  Pair x = input({4, 24}), y = output({4, 8}), s = output({1}, DType::F32);
  Tensor xq = g_->alloc(DType::F8E4M3, {4, 24}), wq = g_->alloc(DType::F8E4M3, {8, 24});
  g_->quantize_fp8(xq, Tensor(), s.gpu, x.gpu, Tensor());
  try {
    g_->linear_fp8(y.gpu, xq, s.gpu, wq, s.gpu, false, false);
    FAIL() << "K = 24 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 16"), std::string::npos) << e.what();
  }
  Tensor bad = g_->alloc(DType::BF16, {4, 24});
  EXPECT_THROW(g_->quantize_fp8(bad, Tensor(), s.gpu, x.gpu, Tensor()), Error);
}

// LoRA (lora_forward / lora_backward): four thin GEMMs around the projection's, at the ranks
// users pick; y and dx start from prefilled values (the base projection's), the adapter gradients
// are written (f32) and then accumulated.
TEST_F(OpsTest, Lora) {
  QT_REQUIRE_GPU();
  for (int64_t T : kTokens) {
    for (auto [N, K, r] : {std::tuple<int64_t, int64_t, int64_t>{96, 200, 16}, {200, 96, 8}, {40, 24, 64}}) {
      SCOPED_TRACE("T " + std::to_string(T) + " N " + std::to_string(N) + " K " + std::to_string(K) + " r " + std::to_string(r));
      Pair x = input({T, K}), a = input({r, K}), b = input({N, r}), y = output({T, N}, DType::BF16, true);
      Pair t = output({T, r});
      const double scale = 2.0 / double(r) * 3.0;
      g_->lora_forward(y.gpu, t.gpu, x.gpu, {a.gpu, b.gpu, scale});
      c_->lora_forward(y.cpu, t.cpu, x.cpu, {a.cpu, b.cpu, scale});
      expect_close("t", t);
      expect_close("y (+=)", y);
      for (bool acc : {false, true}) {
        Pair dy = input({T, N}), dx = output({T, K}, DType::BF16, true), dt = output({T, r});
        Pair da = output({r, K}, DType::F32, acc), db = output({N, r}, DType::F32, acc);
        g_->lora_backward(dx.gpu, {da.gpu, db.gpu, acc}, dt.gpu, dy.gpu, x.gpu, t.gpu, {a.gpu, b.gpu, scale});
        c_->lora_backward(dx.cpu, {da.cpu, db.cpu, acc}, dt.cpu, dy.cpu, x.cpu, t.cpu, {a.cpu, b.cpu, scale});
        expect_close("dt", dt);
        expect_close(acc ? "dA (acc)" : "dA", da);
        expect_close(acc ? "dB (acc)" : "dB", db);
        // dt is a bf16 intermediate on the GPU (as t is): dx carries its rounding times A on top
        // of dx's own, so one more bf16 rounding error is allowed.
        expect_close("dx (+=)", dx, 3.0);
      }
    }
  }
}

// Dropout: the GPU drops exactly the CPU reference's elements (one hash), written and accumulated.
TEST_F(OpsTest, Dropout) {
  QT_REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(8 * 1021), int64_t(133 * 200 + 3)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    Pair x = input({n}), seed = ints({2}, {987654321, 42});
    for (bool acc : {false, true}) {
      Pair out = output({n}, DType::BF16, acc);
      g_->dropout(out.gpu, x.gpu, {seed.gpu, 17, 0.3}, acc);
      c_->dropout(out.cpu, x.cpu, {seed.cpu, 17, 0.3}, acc);
      expect_close(acc ? "out (+=)" : "out", out);
      const std::vector<float> got = download(out.gpu);
      if (!acc) {
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(got[size_t(i)] == 0.0f, out.cpu.ptr<float>()[i] == 0.0f) << "mask differs at " << i;
      }
    }
  }
}

// Out-of-range options stop the backend's construction with a message naming the config key (the
// options are checked before any device call, so this runs without a GPU too).
TEST(CudaBackendOptions, BadOptionsNamed) {
  for (int bad : {0, 65, -3}) {
    BackendOptions o;
    o.gemm_candidates = bad;
    EXPECT_ERROR_CONTAINS([&] { CudaBackend be(o); }, "train.cuda.gemm_candidates", "from 1 to 64");
  }
  BackendOptions o;
  o.arena_mib = 8;
  EXPECT_ERROR_CONTAINS([&] { CudaBackend be(o); }, "train.cuda.arena_mib", "at least 16");
}

// GEMM tuning (on in g_) only picks among cuBLASLt's candidates those that write the bits of the
// heuristic's first choice: a backend with tuning off gives bit-identical y, dx and f32 dw, on the
// call that tunes and on the next one. Shapes: the 4B k projection (where the candidates' speeds
// differ) and odd ones.
TEST_F(OpsTest, GemmTuningKeepsBits) {
  QT_REQUIRE_GPU();
  CudaBackend plain;
  plain.set_gemm_tuning(false);
  g_->set_gemm_tuning(true);
  struct Shape3 {
    int64_t T, N, K;
  };
  for (const Shape3 sh : {Shape3{8192, 1024, 2560}, Shape3{1021, 520, 2048}, Shape3{133, 96, 200}}) {
    SCOPED_TRACE("T " + std::to_string(sh.T) + " N " + std::to_string(sh.N) + " K " + std::to_string(sh.K));
    auto random = [&](int64_t n) {
      std::vector<bf16> v(static_cast<size_t>(n));
      for (auto& b : v) b = float_to_bf16(rng_.uniform(-1.0f, 1.0f));
      return v;
    };
    const std::vector<bf16> xv = random(sh.T * sh.K), wv = random(sh.N * sh.K), dyv = random(sh.T * sh.N);
    // y, dx (bf16) and dw (f32) of one forward + backward, as raw bytes.
    auto run = [&](CudaBackend& be) {
      Tensor x = be.alloc(DType::BF16, {sh.T, sh.K}), w = be.alloc(DType::BF16, {sh.N, sh.K}),
             dy = be.alloc(DType::BF16, {sh.T, sh.N}), y = be.alloc(DType::BF16, {sh.T, sh.N}),
             dx = be.alloc(DType::BF16, {sh.T, sh.K}), dw = be.alloc(DType::F32, {sh.N, sh.K});
      be.copy_from_host(x, xv.data());
      be.copy_from_host(w, wv.data());
      be.copy_from_host(dy, dyv.data());
      be.linear_forward(y, x, w);
      be.linear_backward(dx, dw, dy, x, w, false, false);
      std::vector<std::vector<uint8_t>> out;
      for (const Tensor* t : {&y, &dx, &dw}) {
        out.emplace_back(t->nbytes());
        be.copy_to_host(out.back().data(), *t);
      }
      return out;
    };
    const auto want = run(plain);
    for (int pass = 0; pass < 2; ++pass) {  // the tuning call, then the tuned plan
      const auto got = run(*g_);
      const char* names[] = {"y", "dx", "dw"};
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_TRUE(got[i] == want[i]) << names[i] << " differs from the untuned backend's (pass " << pass << ")";
    }
  }
}

TEST_F(OpsTest, Embedding) {
  QT_REQUIRE_GPU();
  for (int64_t T : {int64_t(1), int64_t(133), int64_t(1021)}) {
    for (int64_t H : {int64_t(96), int64_t(200), int64_t(7)}) {
      const int64_t V = 50;
      std::vector<int32_t> id(static_cast<size_t>(T));
      for (auto& i : id) i = int32_t(rng_.below(rng_.below(2) ? 3 : V));  // many repeats
      Pair ids = ints({T}, id), table = input({V, H}), out = output({T, H});
      g_->embedding_forward(out.gpu, table.gpu, ids.gpu);
      c_->embedding_forward(out.cpu, table.cpu, ids.cpu);
      expect_close("out", out);
      Pair dout = input({T, H}), dt = output({V, H}, DType::BF16, true);
      g_->embedding_backward(dt.gpu, dout.gpu, ids.gpu);
      c_->embedding_backward(dt.cpu, dout.cpu, ids.cpu);
      expect_close("dtable", dt);
      // Deterministic: a second run from the same start is bit-identical.
      Pair d1 = output({V, H}, DType::F32), d2 = output({V, H}, DType::F32);
      g_->zero(d1.gpu);
      g_->zero(d2.gpu);
      g_->embedding_backward(d1.gpu, dout.gpu, ids.gpu);
      g_->embedding_backward(d2.gpu, dout.gpu, ids.gpu);
      EXPECT_EQ(download(d1.gpu), download(d2.gpu));
    }
  }
}

TEST_F(OpsTest, AddSwiGluAttnGate) {
  QT_REQUIRE_GPU();
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(133 * 200), int64_t(1021 * 96 + 3)}) {
    Pair a = input({n}, -4, 4), b = input({n}, -4, 4), out = output({n});
    g_->add(out.gpu, a.gpu, b.gpu);
    c_->add(out.cpu, a.cpu, b.cpu);
    expect_close("add", out);
    Pair h = output({n});
    g_->swiglu_forward(h.gpu, a.gpu, b.gpu, Tensor());
    c_->swiglu_forward(h.cpu, a.cpu, b.cpu, Tensor());
    expect_close("swiglu h", h);
    Pair dh = input({n}), dg = output({n}), du = output({n});
    g_->swiglu_backward(dg.gpu, du.gpu, dh.gpu, a.gpu, b.gpu, Tensor(), Tensor());
    c_->swiglu_backward(dg.cpu, du.cpu, dh.cpu, a.cpu, b.cpu, Tensor(), Tensor());
    expect_close("swiglu dgate", dg);
    expect_close("swiglu dup", du);
    {  // the amax outputs: max|out| of the stored bf16 values, folded into what the words held
      Pair m = output({3}, DType::F32);
      upload(m.gpu, {0.0f, 0.0f, 0.0f});
      const auto word = [&](int i) { return Tensor(m.gpu.ptr<float>() + i, DType::F32, {1}, m.gpu.device); };
      Pair h2 = output({n}), dg2 = output({n}), du2 = output({n});
      g_->swiglu_forward(h2.gpu, a.gpu, b.gpu, word(0));
      g_->swiglu_backward(dg2.gpu, du2.gpu, dh.gpu, a.gpu, b.gpu, word(1), word(2));
      const auto amax = max_abs;
      const std::vector<float> got = download(m.gpu);
      EXPECT_EQ(download(h2.gpu), download(h.gpu));
      EXPECT_EQ(download(dg2.gpu), download(dg.gpu));
      EXPECT_EQ(got[0], amax(download(h.gpu)));
      EXPECT_EQ(got[1], amax(download(dg.gpu)));
      EXPECT_EQ(got[2], amax(download(du.gpu)));
      g_->swiglu_forward(h2.gpu, a.gpu, b.gpu, word(2));  // folds: keeps the larger of the two
      EXPECT_EQ(download(m.gpu)[2], std::max(got[0], got[2]));
    }
    Pair y = output({n});
    g_->attn_gate_forward(y.gpu, a.gpu, b.gpu);
    c_->attn_gate_forward(y.cpu, a.cpu, b.cpu);
    expect_close("attn_gate y", y);
    Pair d_o = output({n}), dgate = output({n});
    g_->attn_gate_backward(d_o.gpu, dgate.gpu, dh.gpu, a.gpu, b.gpu);
    c_->attn_gate_backward(d_o.cpu, dgate.cpu, dh.cpu, a.cpu, b.cpu);
    expect_close("attn_gate d_o", d_o);
    expect_close("attn_gate dgate", dgate);
  }
}

TEST_F(OpsTest, RmsNorm) {
  QT_REQUIRE_GPU();
  for (int64_t T : kTokens) {
    // 2312 / 2560: 10 vectors per lane (the ring backward's widest), 3080: 12 and 4096: 16 (forward
    // wide-row path, generic backward), 5128: wider than every wide-row path.
    for (int64_t H : {int64_t(96), int64_t(200), int64_t(7), int64_t(520), int64_t(2048), int64_t(2312), int64_t(2560),
                      int64_t(3080), int64_t(4096), int64_t(5128)})
      rmsnorm_case(T, H, DType::BF16);
  }
}

// Enough rows that every warp of the ring backward's one-wave grid (one block of 8 warps per SM
// at 2048 or 2560 columns) cycles its row stages several times, and the warps get unequal row counts.
TEST_F(OpsTest, RmsNormManyRows) {
  QT_REQUIRE_GPU();
  for (int64_t H : {int64_t(2048), int64_t(1032), int64_t(2560)}) rmsnorm_case(7001, H, DType::F32);
}

// The fused residual add + RMSNorm against the CPU's add then norm; h in place over r as the model
// uses it, and widths off the fused kernel's wide-row path (7, 5128: fallback to the two ops).
TEST_F(OpsTest, AddRmsNorm) {
  QT_REQUIRE_GPU();
  for (int64_t T : kTokens) {
    for (int64_t H : {int64_t(96), int64_t(7), int64_t(520), int64_t(2048), int64_t(2056), int64_t(2560), int64_t(4096),
                      int64_t(5128)}) {
      SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H));
      Pair x = input({T, H}, -3, 3), r = input({T, H}, -3, 3), w = input({H}, -0.5, 0.5);
      Pair h = output({T, H}), y = output({T, H}), rstd = output({T}, DType::F32);
      g_->add_rmsnorm_forward(h.gpu, y.gpu, rstd.gpu, x.gpu, r.gpu, w.gpu, 1e-6, Tensor());
      c_->add_rmsnorm_forward(h.cpu, y.cpu, rstd.cpu, x.cpu, r.cpu, w.cpu, 1e-6, Tensor());
      expect_close("h", h);
      // The op normalizes h as stored (bf16 on the GPU): the reference norm reads the rounded h.
      Pair hr = output({T, H});
      std::vector<float> hv(static_cast<size_t>(T * H));
      std::memcpy(hv.data(), h.cpu.data, hv.size() * 4);
      for (float& v : hv) v = round_bf16(v);
      std::memcpy(hr.cpu.data, hv.data(), hv.size() * 4);
      c_->rmsnorm_forward(y.cpu, rstd.cpu, hr.cpu, w.cpu, 1e-6, Tensor());
      expect_close("y", y);
      expect_close("rstd", rstd);
      {  // its amax output
        Pair m = output({1}, DType::F32), y2 = output({T, H}), h2 = output({T, H});
        upload(m.gpu, {0.0f});
        g_->add_rmsnorm_forward(h2.gpu, y2.gpu, rstd.gpu, x.gpu, r.gpu, w.gpu, 1e-6, m.gpu);
        EXPECT_EQ(download(y2.gpu), download(y.gpu));
        EXPECT_EQ(download(m.gpu)[0], max_abs(download(y.gpu)));
      }
      // In place (h over r) gives the same bits as the separate output.
      g_->add_rmsnorm_forward(r.gpu, y.gpu, rstd.gpu, x.gpu, r.gpu, w.gpu, 1e-6, Tensor());
      std::vector<uint16_t> a(static_cast<size_t>(T * H)), b(a.size());
      g_->copy_to_host(a.data(), r.gpu);
      g_->copy_to_host(b.data(), h.gpu);
      EXPECT_EQ(a, b);
    }
  }
}

TEST_F(OpsTest, GatedRmsNorm) {
  QT_REQUIRE_GPU();
  // dv 8..128 (multiples of 8) take the narrow-row kernels (1..16 lanes per row); 20 and 136 don't.
  // 3001 x 16 rows give every block of the backward several passes and unequal row counts.
  for (int64_t T : {int64_t(1), int64_t(7), int64_t(133), int64_t(1021), int64_t(3001)}) {
    for (int64_t dv : {int64_t(8), int64_t(32), int64_t(72), int64_t(128), int64_t(20), int64_t(136)}) {
      SCOPED_TRACE("T " + std::to_string(T) + " dv " + std::to_string(dv));
      const int64_t Hv = T == 3001 ? 16 : 4;
      Pair x = input({T, Hv, dv}, -3, 3), z = input({T, Hv, dv}, -4, 4), w = input({dv}, 0.5, 1.5);
      Pair y = output({T, Hv, dv}), rstd = output({T * Hv}, DType::F32);
      g_->gated_rmsnorm_forward(y.gpu, rstd.gpu, x.gpu, z.gpu, w.gpu, 1e-6);
      c_->gated_rmsnorm_forward(y.cpu, rstd.cpu, x.cpu, z.cpu, w.cpu, 1e-6);
      expect_close("y", y);
      expect_close("rstd", rstd);
      Pair dy = input({T, Hv, dv}), dx = output({T, Hv, dv}), dz = output({T, Hv, dv}), dw = output({dv}, DType::F32, true);
      g_->gated_rmsnorm_backward(dx.gpu, dz.gpu, dw.gpu, dy.gpu, x.gpu, z.gpu, w.gpu, rstd.gpu);
      c_->gated_rmsnorm_backward(dx.cpu, dz.cpu, dw.cpu, dy.cpu, x.cpu, z.cpu, w.cpu, rstd.cpu);
      expect_close("dx", dx);
      expect_close("dz", dz);
      expect_close("dw", dw);
    }
  }
}

TEST_F(OpsTest, GdnGates) {
  QT_REQUIRE_GPU();
  for (int64_t T : kTokens) {
    for (int64_t H : {int64_t(4), int64_t(16), int64_t(48)}) {  // 48: a tile shorter than 64 rows
      Pair b = input({T, H}, -5, 5), a = input({T, H}, -6, 6), alog = input({H}, -1, 1.5), dtb = input({H}, -2, 2);
      Pair beta = output({T, H}, DType::F32), g = output({T, H}, DType::F32);
      g_->gdn_gates_forward(beta.gpu, g.gpu, b.gpu, a.gpu, alog.gpu, dtb.gpu);
      c_->gdn_gates_forward(beta.cpu, g.cpu, b.cpu, a.cpu, alog.cpu, dtb.cpu);
      expect_close("beta", beta);
      expect_close("g", g);
      Pair dbeta = input({T, H}, -1, 1, DType::F32), dg = input({T, H}, -1, 1, DType::F32);
      Pair db = output({T, H}), da = output({T, H}), dalog = output({H}, DType::BF16, true),
           ddt = output({H}, DType::F32, true);
      g_->gdn_gates_backward(db.gpu, da.gpu, dalog.gpu, ddt.gpu, dbeta.gpu, dg.gpu, b.gpu, a.gpu, alog.gpu, dtb.gpu);
      c_->gdn_gates_backward(db.cpu, da.cpu, dalog.cpu, ddt.cpu, dbeta.cpu, dg.cpu, b.cpu, a.cpu, alog.cpu, dtb.cpu);
      expect_close("db", db);
      expect_close("da", da);
      expect_close("dA_log", dalog);
      expect_close("ddt_bias", ddt);
    }
  }
}

TEST_F(OpsTest, Conv1dVarlen) {
  QT_REQUIRE_GPU();
  for (int64_t T : kTokens) {
    // 96, 200, 520: the shared-memory tiled kernels (C % 8 == 0; 520 = two full 256-channel
    // blocks + a partial one); 36, 13: the register kernels.
    for (int64_t C : {int64_t(96), int64_t(200), int64_t(520), int64_t(36), int64_t(13)}) {
      SCOPED_TRACE("T " + std::to_string(T) + " C " + std::to_string(C));
      Seqs s = seqs(T);
      Pair x = input({T, C}, -2, 2), w = input({C, 4}, -1, 1), y = output({T, C});
      g_->conv1d_silu_forward(y.gpu, x.gpu, w.gpu, s.gpu);
      c_->conv1d_silu_forward(y.cpu, x.cpu, w.cpu, s.cpu);
      expect_close("y", y);
      Pair dy = input({T, C}), dx = output({T, C}), dw = output({C, 4}, DType::BF16, true);
      g_->conv1d_silu_backward(dx.gpu, dw.gpu, dy.gpu, x.gpu, w.gpu, s.gpu);
      c_->conv1d_silu_backward(dx.cpu, dw.cpu, dy.cpu, x.cpu, w.cpu, s.cpu);
      expect_close("dx", dx);
      expect_close("dw", dw);
    }
  }
}

// Many short samples everywhere (lengths 1..40), so sample starts fall inside and across the
// tiled kernels' tiles and spans; the fp32 weight gradient is bit-identical across runs.
TEST_F(OpsTest, Conv1dManySamples) {
  QT_REQUIRE_GPU();
  for (int64_t T : {int64_t(300), int64_t(2500)}) {
    for (int64_t C : {int64_t(264), int64_t(40)}) {
      SCOPED_TRACE("T " + std::to_string(T) + " C " + std::to_string(C));
      std::vector<int32_t> cu{0};
      while (cu.back() < T) cu.push_back(int32_t(std::min<int64_t>(T, cu.back() + 1 + rng_.below(40))));
      const int n = int(cu.size()) - 1;
      int longest = 0;
      for (int i = 0; i < n; ++i) longest = std::max(longest, cu[i + 1] - cu[i]);
      Pair cut = ints({n + 1}, cu);
      const SeqInfo sg{cut.gpu, n, longest, int(T)}, sc{cut.cpu, n, longest, int(T)};
      Pair x = input({T, C}, -2, 2), w = input({C, 4}, -1, 1), y = output({T, C});
      g_->conv1d_silu_forward(y.gpu, x.gpu, w.gpu, sg);
      c_->conv1d_silu_forward(y.cpu, x.cpu, w.cpu, sc);
      expect_close("y", y);
      Pair dy = input({T, C}), dx = output({T, C}), dw = output({C, 4}, DType::F32, true);
      g_->conv1d_silu_backward(dx.gpu, dw.gpu, dy.gpu, x.gpu, w.gpu, sg);
      c_->conv1d_silu_backward(dx.cpu, dw.cpu, dy.cpu, x.cpu, w.cpu, sc);
      expect_close("dx", dx);
      expect_close("dw", dw);
      Pair d1 = output({C, 4}, DType::F32), d2 = output({C, 4}, DType::F32);
      g_->zero(d1.gpu);
      g_->zero(d2.gpu);
      g_->conv1d_silu_backward(dx.gpu, d1.gpu, dy.gpu, x.gpu, w.gpu, sg);
      g_->conv1d_silu_backward(dx.gpu, d2.gpu, dy.gpu, x.gpu, w.gpu, sg);
      EXPECT_EQ(download(d1.gpu), download(d2.gpu));
    }
  }
}

TEST_F(OpsTest, AttnPrep) {
  QT_REQUIRE_GPU();
  // 9001 tokens: the backward's 1024 blocks get 9 tokens each, so warps reuse their cos/sin row.
  for (int64_t T : {int64_t(1), int64_t(7), int64_t(133), int64_t(9001)}) {
    for (int64_t D : {int64_t(64), int64_t(256)}) {
      if (T == 9001 && D == 64) continue;
      SCOPED_TRACE("T " + std::to_string(T) + " D " + std::to_string(D));
      const AttnDims dims{4, 2, D, D / 4, 1e7};
      std::vector<int32_t> pos(static_cast<size_t>(T));
      const std::vector<int32_t> cu = varlen_cu(T);
      for (size_t i = 0; i + 1 < cu.size(); ++i)
        for (int32_t t = cu[i]; t < cu[i + 1]; ++t) pos[size_t(t)] = t - cu[i] + (i == cu.size() - 2 ? 3000 : 0);
      Pair positions = ints({T}, pos);
      Pair qg = input({T, 4 * 2 * D}, -3, 3), kr = input({T, 2 * D}, -3, 3), qw = input({D}, -0.5, 0.5),
           kw = input({D}, -0.5, 0.5);
      Pair q = output({T, 4, D}), k = output({T, 2, D}), gate = output({T, 4 * D}), qr = output({T * 4}, DType::F32),
           kr_rstd = output({T * 2}, DType::F32);
      g_->attn_prep_forward(q.gpu, k.gpu, gate.gpu, qr.gpu, kr_rstd.gpu, qg.gpu, kr.gpu, qw.gpu, kw.gpu,
                            positions.gpu, dims, 1e-6);
      c_->attn_prep_forward(q.cpu, k.cpu, gate.cpu, qr.cpu, kr_rstd.cpu, qg.cpu, kr.cpu, qw.cpu, kw.cpu,
                            positions.cpu, dims, 1e-6);
      expect_close("q", q);
      expect_close("k", k);
      expect_close("gate", gate);
      expect_close("q_rstd", qr);
      expect_close("k_rstd", kr_rstd);
      Pair dq = input({T, 4, D}), dk = input({T, 2, D}), dgate = input({T, 4 * D});
      Pair dqg = output({T, 4 * 2 * D}), dkr = output({T, 2 * D}), dqw = output({D}, DType::BF16, true),
           dkw = output({D}, DType::F32, true);
      g_->attn_prep_backward(dqg.gpu, dkr.gpu, dqw.gpu, dkw.gpu, dq.gpu, dk.gpu, dgate.gpu, qg.gpu, kr.gpu, qw.gpu,
                             kw.gpu, qr.gpu, kr_rstd.gpu, positions.gpu, dims);
      c_->attn_prep_backward(dqg.cpu, dkr.cpu, dqw.cpu, dkw.cpu, dq.cpu, dk.cpu, dgate.cpu, qg.cpu, kr.cpu, qw.cpu,
                             kw.cpu, qr.cpu, kr_rstd.cpu, positions.cpu, dims);
      expect_close("dqg", dqg);
      expect_close("dkr", dkr);
      expect_close("dq_norm_w", dqw);
      expect_close("dk_norm_w", dkw);
    }
  }
}

TEST_F(OpsTest, LinearCrossEntropy) {
  QT_REQUIRE_GPU();
  // V % 4 == 0 takes the float4 softmax kernel (1000, and the real vocabulary 248,320), 1001 the
  // scalar one.
  for (int64_t T : {int64_t(1), int64_t(133), int64_t(300)}) {
    for (int64_t V : {int64_t(1000), int64_t(1001), int64_t(248320)}) {
      if (V > 100000 && T > 133) continue;  // the CPU reference's time
      SCOPED_TRACE("T " + std::to_string(T) + " V " + std::to_string(V));
      const int64_t H = 96;
      std::vector<int32_t> tg(static_cast<size_t>(T));
      for (auto& t : tg) t = rng_.below(5) == 0 ? -100 : int32_t(rng_.below(V));
      Pair targets = ints({T}, tg), hidden = input({T, H}, -2, 2), w = input({V, H}, -0.5, 0.5);
      Pair dh = output({T, H}), dw = output({V, H}, DType::BF16, true), tl = output({T}, DType::F32);
      g_->set_cross_entropy_chunk_rows(64);
      c_->set_cross_entropy_chunk_rows(64);
      const double lg = g_->linear_cross_entropy(dh.gpu, dw.gpu, tl.gpu, hidden.gpu, w.gpu, targets.gpu, 0.37, true);
      const double lc = c_->linear_cross_entropy(dh.cpu, dw.cpu, tl.cpu, hidden.cpu, w.cpu, targets.cpu, 0.37, true);
      EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc) + 1e-3);
      expect_close("token_loss", tl);
      expect_close("dhidden", dh, 4.0);
      expect_close("dw", dw, 4.0);
      // accumulate_dw false: the first chunk writes dw (f32, over the sentinel fill), later chunks add.
      Pair dw_set = output({V, H}, DType::F32);
      g_->linear_cross_entropy(Tensor(), dw_set.gpu, Tensor(), hidden.gpu, w.gpu, targets.gpu, 0.37, false);
      c_->linear_cross_entropy(Tensor(), dw_set.cpu, Tensor(), hidden.cpu, w.cpu, targets.cpu, 0.37, false);
      expect_close("dw (=)", dw_set, 4.0);
      // Loss only (no gradients, no token_loss).
      const double l2 = g_->linear_cross_entropy(Tensor(), Tensor(), Tensor(), hidden.gpu, w.gpu, targets.gpu, 1.0, true);
      EXPECT_NEAR(l2, lc, 1e-4 * std::fabs(lc) + 1e-3);
    }
  }
}

// The FP8 head against the CPU reference of the same codes: the loss and token losses to the
// logits' summation (the FP8 tensor cores accumulate a K-group in fewer bits than fp32 before
// promoting, ~2^-14 of the magnitude); dhidden and dw (written, accumulated; f32 and bf16) to the
// bf16 tolerance of the other ops except where those logit differences move a probability across
// an e5m2 rounding midpoint: such a flip changes one gradient term by an ulp (2 mantissa bits: up
// to a quarter of it). At V = 1008 (peaked softmaxes, large p) that leaves up to ~0.6 % of
// dhidden outside the bf16 tolerance (an H100 run: 162 of 28,800, rms error 0.6 %). So: at most
// 2 % of the elements outside it, none beyond a quarter of the largest, and the rms error under
// 2 % of the reference's (a wrong scale, a swapped code pair or a stale chunk is O(1)). Several chunks with a short last one, ignored rows, the real vocabulary,
// guards after every output.
TEST_F(OpsTest, Fp8LinearCrossEntropy) {
  QT_REQUIRE_GPU();
  const auto expect_close_flips = [&](const char* what, const Pair& p) {
    SCOPED_TRACE(what);
    expect_guards(what, p);
    const std::vector<float> got = download(p.gpu);
    const float* ref = p.cpu.ptr<float>();
    double err_bf16 = 0, ref_max = 0, num = 0, den = 0, worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] = " << got[i];
      err_bf16 = std::max(err_bf16, std::fabs(double(round_bf16(ref[i])) - ref[i]));
      ref_max = std::max(ref_max, std::fabs(double(ref[i])));
    }
    const double tol = 4.0 * err_bf16 + ref_max / 1024.0 + 1e-6;
    int64_t outside = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = std::fabs(double(got[i]) - ref[i]);
      outside += e > tol;
      worst = std::max(worst, e);
      num += e * e;
      den += double(ref[i]) * ref[i];
    }
    std::printf("  %s: %lld of %zu beyond the bf16 tolerance, rms error %.2e\n", what, static_cast<long long>(outside),
                got.size(), std::sqrt(num / std::max(den, 1e-30)));
    EXPECT_LE(outside, std::max<int64_t>(2, int64_t(got.size()) / 50)) << what << ": elements beyond " << tol;
    EXPECT_LE(worst, 0.25 * ref_max + tol) << what;
    EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 0.02) << what << ": rms error";
  };
  for (int64_t T : {int64_t(1), int64_t(133), int64_t(300)}) {
    for (int64_t V : {int64_t(1008), int64_t(248320)}) {
      if (V > 100000 && T > 133) continue;  // the CPU reference's time
      SCOPED_TRACE("T " + std::to_string(T) + " V " + std::to_string(V));
      const int64_t H = 96, Tp = (T + 15) / 16 * 16;
      std::vector<int32_t> tg(static_cast<size_t>(T));
      for (auto& t : tg) t = rng_.below(5) == 0 ? -100 : int32_t(rng_.below(V));
      Pair targets = ints({T}, tg), hidden = input({T, H}, -2, 2), w = input({V, H}, -0.5, 0.5);
      Pair hs = output({1}, DType::F32), ws = output({1}, DType::F32);
      Fp8HeadCodes g{g_->alloc(DType::F8E4M3, {T, H}), g_->alloc(DType::F8E4M3, {H, Tp}), hs.gpu,
                     g_->alloc(DType::F8E4M3, {V, H}), g_->alloc(DType::F8E4M3, {H, V}), ws.gpu};
      Fp8HeadCodes c{c_->alloc(DType::F8E4M3, {T, H}), c_->alloc(DType::F8E4M3, {H, Tp}), hs.cpu,
                     c_->alloc(DType::F8E4M3, {V, H}), c_->alloc(DType::F8E4M3, {H, V}), ws.cpu};
      g_->quantize_fp8(g.hq, g.hq_t, g.h_scale_inv, hidden.gpu, Tensor());
      g_->quantize_fp8(g.wq, g.wq_t, g.w_scale_inv, w.gpu, Tensor());
      c_->quantize_fp8(c.hq, c.hq_t, c.h_scale_inv, hidden.cpu, Tensor());
      c_->quantize_fp8(c.wq, c.wq_t, c.w_scale_inv, w.cpu, Tensor());
      g_->set_cross_entropy_chunk_rows(64);
      c_->set_cross_entropy_chunk_rows(64);
      struct {
        Tensor gpu, cpu;
      } sum{g_->alloc(DType::F64, {1}), c_->alloc(DType::F64, {1})};
      Pair dh = output({T, H}), dw = output({V, H}, DType::F32, true), tl = output({T}, DType::F32);
      g_->linear_cross_entropy_fp8(sum.gpu, dh.gpu, dw.gpu, tl.gpu, g, targets.gpu, 0.37, true);
      c_->linear_cross_entropy_fp8(sum.cpu, dh.cpu, dw.cpu, tl.cpu, c, targets.cpu, 0.37, true);
      double lg = 0;
      g_->copy_to_host(&lg, sum.gpu);
      const double lc = sum.cpu.ptr<double>()[0];
      EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc) + 1e-3);
      expect_close("token_loss", tl);
      expect_close_flips("dhidden", dh);
      expect_close_flips("dw (+=, f32)", dw);
      Pair dw_set = output({V, H});  // bf16, written over the sentinel fill
      g_->linear_cross_entropy_fp8(sum.gpu, Tensor(), dw_set.gpu, Tensor(), g, targets.gpu, 0.37, false);
      c_->linear_cross_entropy_fp8(sum.cpu, Tensor(), dw_set.cpu, Tensor(), c, targets.cpu, 0.37, false);
      expect_close_flips("dw (=, bf16)", dw_set);
      g_->linear_cross_entropy_fp8(sum.gpu, Tensor(), Tensor(), Tensor(), g, targets.gpu, 1.0, true);
      g_->copy_to_host(&lg, sum.gpu);
      EXPECT_NEAR(lg, lc, 1e-4 * std::fabs(lc) + 1e-3);
    }
  }
  g_->set_cross_entropy_chunk_rows(0);
  c_->set_cross_entropy_chunk_rows(0);
}

// ---- mixers (the other engineers' kernels, through CudaBackend's entries) ------------------------

TEST_F(OpsTest, GdnEntries) {
  QT_REQUIRE_GPU();
  const GdnDims dims{2, 4, 16, 32};
  for (int64_t T : {int64_t(1), int64_t(7), int64_t(133)}) {
    SCOPED_TRACE("T " + std::to_string(T));
    Seqs s = seqs(T);
    Pair qkv = input({T, dims.conv_dim()}, -1, 1), g = input({T, 4}, -1, -0.01f, DType::F32),
         beta = input({T, 4}, 0.05f, 0.95f, DType::F32);
    Pair o = output({T, 4, 32});
    g_->gdn_forward(o.gpu, qkv.gpu, g.gpu, beta.gpu, dims, s.gpu, Tensor(), GdnKeep::States);
    c_->gdn_forward(o.cpu, qkv.cpu, g.cpu, beta.cpu, dims, s.cpu, Tensor(), GdnKeep::States);
    expect_close("o", o, 4.0);
    Pair d_o = input({T, 4, 32}), dqkv = output({T, dims.conv_dim()}), dg = output({T, 4}, DType::F32),
         dbeta = output({T, 4}, DType::F32);
    g_->gdn_backward(dqkv.gpu, dg.gpu, dbeta.gpu, d_o.gpu, qkv.gpu, g.gpu, beta.gpu, dims, s.gpu, Tensor(), GdnKeep::States);
    c_->gdn_backward(dqkv.cpu, dg.cpu, dbeta.cpu, d_o.cpu, qkv.cpu, g.cpu, beta.cpu, dims, s.cpu, Tensor(), GdnKeep::States);
    expect_close("dqkv", dqkv, 4.0);
    expect_close("dg", dg, 4.0);
    expect_close("dbeta", dbeta, 4.0);
  }
}

TEST_F(OpsTest, AttentionEntries) {
  QT_REQUIRE_GPU();
  for (int64_t D : {int64_t(64), int64_t(256)}) {
    for (int64_t T : {int64_t(1), int64_t(7), int64_t(133)}) {
      SCOPED_TRACE("T " + std::to_string(T) + " D " + std::to_string(D));
      const AttnDims dims{4, 2, D, D / 4, 1e7};
      Seqs s = seqs(T);
      Pair q = input({T, 4, D}, -1, 1), k = input({T, 2, D}, -1, 1), v = input({T, 2, D}, -1, 1);
      Pair o = output({T, 4, D}), lse = output({4, T}, DType::F32);
      g_->attention_forward(o.gpu, lse.gpu, q.gpu, k.gpu, v.gpu, dims, s.gpu);
      c_->attention_forward(o.cpu, lse.cpu, q.cpu, k.cpu, v.cpu, dims, s.cpu);
      expect_close("o", o, 4.0);
      expect_close("lse", lse, 4.0);
      // Backward from the CPU's o (rounded to bf16 on both sides) so only the backward is tested.
      std::vector<float> ov(o.cpu.ptr<float>(), o.cpu.ptr<float>() + o.cpu.numel());
      for (auto& x : ov) x = round_bf16(x);
      Pair o_in = from_values({T, 4, D}, ov);
      Pair d_o = input({T, 4, D}), dq = output({T, 4, D}), dk = output({T, 2, D}), dv = output({T, 2, D});
      g_->attention_backward(dq.gpu, dk.gpu, dv.gpu, d_o.gpu, q.gpu, k.gpu, v.gpu, o_in.gpu, lse.gpu, dims, s.gpu);
      c_->attention_backward(dq.cpu, dk.cpu, dv.cpu, d_o.cpu, q.cpu, k.cpu, v.cpu, o_in.cpu, lse.cpu, dims, s.cpu);
      expect_close("dq", dq, 4.0);
      expect_close("dk", dk, 4.0);
      expect_close("dv", dv, 4.0);
    }
  }
}

// ---- AdamW: bit-exact with ops/cpu/adamw.cpp ----------------------------------------------------

TEST_F(OpsTest, AdamWBitExact) {
  QT_REQUIRE_GPU();
  // bf16 gradients and the fp32 gradients the model keeps (accumulated without bf16 rounding).
  for (const DType gdt : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(gdt == DType::F32 ? "f32 gradients" : "bf16 gradients");
    const std::vector<int64_t> sizes{1, 1000, 70001, 65536, 7};
    const std::vector<bool> decay{true, false, true, true, false};
    AdamWConfig cfg;
    cfg.lr = 3e-4;
    cfg.weight_decay = 0.1;
    struct Host {
      std::vector<float> master, m, v, g;
    };
    std::vector<Host> host(sizes.size());
    std::vector<cuda::AdamWTensor> dev;
    std::vector<Tensor> dm, dmm, dvv, dg, dp;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i];
      Host& h = host[i];
      h.master.resize(size_t(n));
      h.m.assign(size_t(n), 0.0f);
      h.v.assign(size_t(n), 0.0f);
      for (auto& x : h.master) x = rng_.uniform(-1, 1);
      dm.push_back(g_->alloc(DType::F32, {n}));
      dmm.push_back(g_->alloc(DType::F32, {n}));
      dvv.push_back(g_->alloc(DType::F32, {n}));
      dg.push_back(g_->alloc(gdt, {n}));
      dp.push_back(g_->alloc(DType::BF16, {n}));
      g_->copy_from_host(dm.back(), h.master.data());
      dev.push_back({dm.back().ptr<float>(), dmm.back().ptr<float>(), dvv.back().ptr<float>(), dg.back().data,
                     dp.back().data, n, decay[i], gdt == DType::F32});
    }
    g_->synchronize();
    cuda::AdamWMultiTensor opt(dev);
    for (int64_t step = 1; step <= 3; ++step) {
      const float gscale = step == 2 ? 50.0f : 0.01f;  // step 2 clips
      std::vector<const float*> gp;
      std::vector<int64_t> gs;
      for (size_t i = 0; i < sizes.size(); ++i) {
        Host& h = host[i];
        h.g.resize(size_t(sizes[i]));
        for (auto& x : h.g) x = gdt == DType::F32 ? rng_.uniform(-gscale, gscale) : round_bf16(rng_.uniform(-gscale, gscale));
        upload(dg[i], h.g);
        gp.push_back(h.g.data());
        gs.push_back(sizes[i]);
      }
      const double max_norm = 1.0;
      opt.grad_norm(max_norm, g_->stream());
      const double lr = cfg.lr * (1.0 - 0.1 * double(step));
      opt.update(lr, cfg.weight_decay, cfg, step, g_->stream());
      double nc[2];
      cudaMemcpyAsync(nc, opt.norm_clip(), sizeof(nc), cudaMemcpyDeviceToHost, g_->stream());
      g_->synchronize();
      const double norm_cpu = global_grad_norm(gp, gs);
      EXPECT_NEAR(nc[0], norm_cpu, 1e-12 * norm_cpu) << "step " << step;
      const double clip = clip_factor(nc[0], max_norm);
      EXPECT_EQ(clip, nc[1]) << "step " << step;
      if (step == 2) {
        EXPECT_LT(clip, 1.0);
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        Host& h = host[i];
        std::vector<float> g = h.g;
        if (clip != 1.0)
          for (float& x : g) x = static_cast<float>(x * clip);
        adamw_update(h.master.data(), g.data(), h.m.data(), h.v.data(), sizes[i], lr,
                     decay[i] ? cfg.weight_decay : 0.0, cfg, step);
        const std::vector<float> master = download(dm[i]), m = download(dmm[i]), v = download(dvv[i]),
                                 p = download(dp[i]);
        ASSERT_EQ(0, std::memcmp(master.data(), h.master.data(), master.size() * 4)) << "master, tensor " << i;
        ASSERT_EQ(0, std::memcmp(m.data(), h.m.data(), m.size() * 4)) << "m, tensor " << i;
        ASSERT_EQ(0, std::memcmp(v.data(), h.v.data(), v.size() * 4)) << "v, tensor " << i;
        for (size_t j = 0; j < p.size(); ++j) ASSERT_EQ(p[j], round_bf16(h.master[j])) << "param " << i << "[" << j << "]";
      }
    }
  }
}

TEST_F(OpsTest, ErrorsNameOpAndTensor) {
  QT_REQUIRE_GPU();
  Tensor x = g_->alloc(DType::BF16, {4, 8}), w = g_->alloc(DType::BF16, {6, 9}), y = g_->alloc(DType::BF16, {4, 6});
  try {
    g_->linear_forward(y, x, w);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_forward: x is"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qt
